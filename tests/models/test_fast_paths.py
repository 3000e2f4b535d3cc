"""Read-only hooks on per-step points take the fast paths (fused LSTM, chunked scans) and
see what the step-by-step paths show them; writing hooks keep the step-by-step paths.

The step-by-step reference is the same caching with the read-only mark taken off the
hooks (an unmarked hook may write, so the model runs step by step), and the models'
own switches (``fused = False``, ``scan = "loop"``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from mechlab.checkpoint import load_checkpoint
from mechlab.models import build_model
from mechlab.models.cache import caching_hooks
from mechlab.models.recurrence import hook_use, reads_only

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = {
    "lstm": {"arch": "lstm", "d_model": 12, "n_layers": 2, "d_hidden": 10},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 8, "d_state": 6, "n_layers": 2},
    "mamba": {"arch": "mamba", "d_model": 8, "n_layers": 2, "d_state": 4},
}
STATE = {"lstm": "lstm.hook_h", "dense_ssm": "ssm.hook_h", "mamba": "mixer.hook_ssm_state"}
BATCH, N_POS = 3, 11
# Mamba runs its scan in float32 whatever the model's dtype (as HF's), so its paths agree
# to float32 rounding; the others to float64's.
TOL = {"lstm": {"rtol": 1e-9, "atol": 1e-10}, "dense_ssm": {"rtol": 1e-9, "atol": 1e-10},
       "mamba": {"rtol": 1e-5, "atol": 1e-6}}  # fmt: skip
LSTM_CKPT = Path(__file__).resolve().parents[2] / "examples/checkpoints/recall-lstm-cpu/last.pt"


def make(family: str, dtype: torch.dtype = torch.float64):
    torch.manual_seed(0)
    model = build_model({**CONFIGS[family], "d_in": 5, "d_out": 3, "n_ctx": 32}).to(dtype)
    x = torch.randn(BATCH, N_POS, 5, generator=torch.Generator().manual_seed(1), dtype=dtype)
    return model, x


def step_by_step_cache(model, x, with_grad: bool = False):
    """run_with_cache's caching with unmarked hooks: every per-step point runs step by step."""
    cache = {}
    fwd, _, finalize = caching_hooks(model, cache)
    with (
        torch.set_grad_enabled(with_grad),
        model.hooks(fwd_hooks=[(n, partial(f)) for n, f in fwd]),
    ):
        out = model(x)
    finalize()
    return out, cache


def step_names(model):
    return [name for name in model.hook_dict if model.is_step_hook(name)]


@pytest.mark.parametrize("family", list(CONFIGS))
def test_cached_trajectories_equal_the_step_by_step_path(family):
    model, x = make(family)
    with torch.no_grad():
        out_fast, fast = model.run_with_cache(x)
    out_steps, steps = step_by_step_cache(model, x)
    assert fast.keys() == steps.keys() == set(model.hook_dict)
    for name in steps:
        assert fast[name].shape == steps[name].shape, name
        torch.testing.assert_close(fast[name], steps[name], **TOL[family], msg=name)
    torch.testing.assert_close(out_fast, out_steps, **TOL[family])
    torch.testing.assert_close(out_fast, model(x), **TOL[family])


@pytest.mark.parametrize("family", list(CONFIGS))
def test_float32_cache_equals_the_step_by_step_path(family):
    model, x = make(family, torch.float32)
    with torch.no_grad():
        _, fast = model.run_with_cache(x)
    _, steps = step_by_step_cache(model, x)
    for name in steps:
        torch.testing.assert_close(fast[name], steps[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_gradients_through_a_cached_forward_equal_the_step_by_step_path(family):
    """Caching with gradients on: the fast path's output and every parameter's gradient."""
    model, x = make(family)
    target = torch.randn(BATCH, N_POS, 3, generator=torch.Generator().manual_seed(2), dtype=x.dtype)
    results = []
    for run in (
        lambda: model.run_with_cache(x)[0],
        lambda: step_by_step_cache(model, x, with_grad=True)[0],
    ):
        model.zero_grad(set_to_none=True)
        out = run()
        ((out - target) ** 2).mean().backward()
        results.append(
            (
                out.detach(),
                {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
            )
        )
    (out_f, grads_f), (out_s, grads_s) = results
    torch.testing.assert_close(out_f, out_s, **TOL[family])
    assert grads_f.keys() == grads_s.keys() and len(grads_f) > 0
    for name in grads_f:
        torch.testing.assert_close(grads_f[name], grads_s[name], **TOL[family], msg=name)


@pytest.mark.parametrize("family", ["mamba", "dense_ssm"])
def test_chunked_scan_equals_the_loop_in_training(family):
    """scan='chunked' vs scan='loop' on the whole model: outputs and parameter gradients."""
    model, x = make(family)
    results = {}
    for scan in ("loop", "chunked"):
        model.scan = scan
        for block in model.blocks:
            block._modules[block.mixer_name].chunk = 4  # chunks that do not divide 11 positions
        model.zero_grad(set_to_none=True)
        out = model(x)
        out.square().mean().backward()
        results[scan] = (out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(results["chunked"][0], results["loop"][0], **TOL[family])
    for name, grad in results["loop"][1].items():
        torch.testing.assert_close(results["chunked"][1][name], grad, **TOL[family], msg=name)
    with pytest.raises(ValueError, match="scan must be one of"):
        model.scan = "parallel"


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_read_only_hook_is_called_once_an_unmarked_one_per_step(family):
    model, x = make(family)
    name = f"blocks.0.{STATE[family]}"
    seen = []

    def record(act, hook):
        seen.append(act.clone())

    model.run_with_hooks(x, fwd_hooks=[(name, reads_only(partial(record)))])  # (marks the partial)
    assert len(seen) == 1 and seen[0].shape[:2] == (BATCH, N_POS)
    once = seen.pop()
    model.run_with_hooks(x, fwd_hooks=[(name, record)])  # unmarked: possibly writing
    assert len(seen) == N_POS
    torch.testing.assert_close(once, seen[-1], **TOL[family])  # the last call's buffer is complete


@pytest.mark.parametrize("family", list(CONFIGS))
def test_patching_through_a_writing_hook_still_changes_later_positions_only(family):
    model, x = make(family)
    name, t = f"blocks.0.{STATE[family]}", 4

    def patch(act, hook):
        act[:, t] = 0.5
        return act

    with torch.no_grad():
        clean = model(x)
        patched = model.run_with_hooks(x, fwd_hooks=[(name, patch)])
        # with a read-only hook attached as well, the writing hook still forces the steps
        both = [(name, patch), (name, reads_only(lambda act, hook: None))]
        patched_and_read = model.run_with_hooks(x, fwd_hooks=both)
    torch.testing.assert_close(patched[:, :t], clean[:, :t], rtol=1e-9, atol=1e-10)
    assert (patched[:, t:] - clean[:, t:]).abs().amax(dim=(0, 2)).min() > 1e-6
    torch.testing.assert_close(patched, model.run_with_hooks(x, fwd_hooks=[(name, patch)]))
    torch.testing.assert_close(patched_and_read, patched)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_read_only_hook_that_writes_is_refused(family):
    model, x = make(family)
    name = f"blocks.0.{STATE[family]}"

    def sneaky(act, hook):
        act.zero_()

    with pytest.raises(ValueError, match="marked reads_only but changed"):
        model.run_with_hooks(x, fwd_hooks=[(name, reads_only(sneaky))])
    with pytest.raises(ValueError, match="marked reads_only but changed"):
        model.run_with_hooks(x, fwd_hooks=[(name, reads_only(lambda act, hook: act * 2))])


def test_which_hooks_count_as_writing():
    model, _ = make("lstm")
    mixer = model.blocks[0].lstm
    points = mixer.step_points()
    assert hook_use(*points) == "none"
    mixer.hook_c.add_hook(reads_only(lambda act, hook: None))
    assert hook_use(*points) == "read"
    mixer.hook_h.add_hook(lambda act, hook: None)  # unmarked
    assert hook_use(*points) == "write"
    model.reset_hooks()
    handle = mixer.hook_h.register_forward_hook(lambda *args: None)  # outside TransformerLens
    assert hook_use(*points) == "write"
    handle.remove()
    mixer.hook_h.add_hook(
        reads_only(lambda grad, hook: None), dir="bwd"
    )  # gradients need the steps
    assert hook_use(*points) == "write"
    model.reset_hooks()
    assert hook_use(*points) == "none"


def test_lstm_cache_takes_the_fused_kernel_and_unmarked_hooks_the_loop():
    model, x = make("lstm")
    calls = []
    model.blocks[0].lstm.rnn.register_forward_hook(lambda *_: calls.append(1))
    model.run_with_cache(x)
    assert len(calls) == 1
    step_by_step_cache(model, x)
    assert len(calls) == 1


def test_initial_state_and_return_state_on_the_read_only_paths():
    """A window of a sequence, started from the state the previous window ended with."""
    for family in CONFIGS:
        model, x = make(family)
        mixer = model.blocks[0]._modules[model.blocks[0].mixer_name]
        inner = torch.randn(
            BATCH,
            N_POS,
            model.cfg.d_model,
            generator=torch.Generator().manual_seed(3),
            dtype=x.dtype,
        )
        whole = mixer(inner)
        _, state = mixer(inner[:, :5], return_state=True)
        point = getattr(mixer, STATE[family].split(".")[1])
        seen = []
        point.add_hook(
            reads_only(partial(lambda act, hook, seen: seen.append(act.clone()), seen=seen))
        )
        try:
            rest, _ = mixer(inner[:, 5:], initial_state=state, return_state=True)
        finally:
            point.remove_hooks()
        torch.testing.assert_close(rest, whole[:, 5:], **TOL[family], msg=family)
        assert len(seen) == 1 and seen[0].shape[1] == N_POS - 5, family


@pytest.mark.skipif(not LSTM_CKPT.exists(), reason="bundled LSTM checkpoint not present")
def test_bundled_lstm_checkpoint_caches_what_it_did_step_by_step():
    model = load_checkpoint(LSTM_CKPT).model
    x = torch.randn(2, 40, model.cfg.d_in, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out_fast, fast = model.run_with_cache(x)
    out_steps, steps = step_by_step_cache(model, x)
    torch.testing.assert_close(out_fast, out_steps, rtol=1e-4, atol=1e-5)
    for name in step_names(model):
        torch.testing.assert_close(fast[name], steps[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("read_path", ["fused", "stepped"])
def test_both_lstm_read_paths_cache_what_the_step_by_step_path_does(read_path):
    model, x = make("lstm")
    for block in model.blocks:
        block.lstm.read_path = read_path
    with torch.no_grad():
        out_fast, fast = model.run_with_cache(x)
    out_steps, steps = step_by_step_cache(model, x)
    for name in steps:
        torch.testing.assert_close(fast[name], steps[name], **TOL["lstm"], msg=name)
    torch.testing.assert_close(out_fast, out_steps, **TOL["lstm"])
    model.blocks[0].lstm.read_path = "sideways"
    with pytest.raises(ValueError, match="read_path must be one of"):
        model.run_with_cache(x)
