"""Tests of mechlab.models.lstm: shapes, hooks, fused == unrolled, state patching, nnsight."""

from __future__ import annotations

import time

import pytest
import torch
from nnsight import NNsight
from torch import nn

from mechlab.models import build_model
from mechlab.models.lstm import LSTM, LSTMConfig, LSTMMixer

BATCH, N_POS = 3, 7
STEP_NAMES = ("hook_i", "hook_f", "hook_g", "hook_o", "hook_c", "hook_h")


def make_model(io: str = "continuous", seed: int = 0, **fields) -> LSTM:
    torch.manual_seed(seed)
    base = {"d_model": 16, "n_layers": 2, "d_in": 5, "d_out": 3, "n_ctx": 32}
    if io == "tokens":
        base.update(io="tokens", d_vocab=11)
    return LSTM(LSTMConfig(**{**base, **fields}))


def make_input(model: LSTM, batch: int = BATCH, n_pos: int = N_POS, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if model.cfg.io == "continuous":
        return torch.randn(batch, n_pos, model.cfg.d_in, generator=g)
    return torch.randint(0, model.cfg.d_vocab, (batch, n_pos), generator=g)


def set_at(t: int, value: torch.Tensor):
    """A hook that sets position ``t`` to ``value`` (idempotent, so safe on every step's call)."""

    def hook(act, hook):
        act[:, t] = value
        return act

    return hook


@pytest.mark.parametrize("io", ["continuous", "tokens"])
def test_output_shape(io):
    model = make_model(io)
    out = model(make_input(model))
    assert out.shape == (BATCH, N_POS, model.cfg.d_output)
    assert model.cfg.d_output == (3 if io == "continuous" else 11)


def test_exact_hook_names_two_layers():
    model = make_model()
    expected = {"hook_embed", "hook_out"}
    for i in range(2):
        expected |= {
            f"blocks.{i}.hook_resid_pre",
            f"blocks.{i}.hook_mixer_in",
            f"blocks.{i}.hook_mixer_out",
            f"blocks.{i}.hook_resid_post",
        }
        expected |= {f"blocks.{i}.lstm.{name}" for name in STEP_NAMES}
    assert set(model.hook_dict) == expected


@pytest.mark.parametrize("io", ["continuous", "tokens"])
@pytest.mark.parametrize("d_hidden", [0, 24])
def test_cache_is_complete_with_batch_pos_shapes(io, d_hidden):
    model = make_model(io, d_hidden=d_hidden)
    d_hidden = d_hidden or model.cfg.d_model
    _, cache = model.run_with_cache(make_input(model))
    assert set(cache.keys()) == set(model.hook_dict)
    for name, act in cache.items():
        if name == "hook_out":
            trailing = model.cfg.d_output
        elif ".lstm." in name:
            trailing = d_hidden
        else:
            trailing = model.cfg.d_model
        assert act.shape == (BATCH, N_POS, trailing), name
    # The cache holds the whole trajectory, not just the last step's buffer state.
    assert (cache["blocks.0.lstm.hook_h"].abs().sum(-1) > 0).all()
    if d_hidden != model.cfg.d_model:
        assert isinstance(model.blocks[0].lstm.out_proj, nn.Linear)


def test_config_defaults_and_validation():
    cfg = LSTMConfig(d_model=20)
    assert cfg.d_hidden == 20 and cfg.n_layers == 1 and cfg.fused
    assert LSTMConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="d_hidden"):
        LSTMConfig(d_hidden=-3)
    with pytest.raises(ValueError, match="fused"):
        LSTMConfig(fused="yes")


def test_build_model_by_name_and_dict():
    model = build_model("lstm")
    assert isinstance(model, LSTM) and model.cfg == LSTMConfig()
    x = torch.randn(2, 4, model.cfg.d_in)
    assert model(x).shape == (2, 4, model.cfg.d_out)
    model = build_model({"arch": "lstm", "d_model": 32, "d_hidden": 8, "n_layers": 3})
    assert len(model.blocks) == 3 and model.blocks[2].lstm.rnn.hidden_size == 8


@pytest.mark.parametrize("io", ["continuous", "tokens"])
@pytest.mark.parametrize("d_hidden", [0, 24])
def test_fused_equals_unrolled_outputs_and_gradients(io, d_hidden):
    model = make_model(io, d_hidden=d_hidden)
    x = make_input(model)
    target = torch.randn(BATCH, N_POS, model.cfg.d_output)
    results = {}
    for fused in (True, False):
        model.fused = fused
        model.zero_grad()
        out = model(x)
        ((out - target) ** 2).mean().backward()
        results[fused] = (out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (out_f, grads_f), (out_u, grads_u) = results[True], results[False]
    torch.testing.assert_close(out_f, out_u, atol=1e-5, rtol=0)
    assert grads_f.keys() == grads_u.keys()
    for name in grads_f:
        torch.testing.assert_close(grads_f[name], grads_u[name], atol=1e-5, rtol=1e-4, msg=name)


def test_fused_kernel_taken_only_when_the_layer_is_unhooked():
    model = make_model()
    calls = [0, 0]
    for i, block in enumerate(model.blocks):
        block.lstm.rnn.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    x = make_input(model)
    model(x)
    assert calls == [1, 1]
    # A hook on one of layer 0's step points makes only layer 0 unroll.
    model.run_with_hooks(x, fwd_hooks=[("blocks.0.lstm.hook_f", lambda act, hook: None)])
    assert calls == [1, 2]
    # Block-level hooks do not force the loop.
    model.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_mixer_in", lambda act, hook: None)])
    assert calls == [2, 3]
    # Caching only reads: both layers keep the fused kernel (the gates and c are recovered).
    model.run_with_cache(x)
    assert calls == [3, 4]
    model.fused = False
    model(x)
    model.run_with_cache(x)
    assert calls == [3, 4]


def test_cached_states_equal_torch_lstm():
    """The unrolled loop's h (all steps) and c (last step) against torch.nn.LSTM itself."""
    model = make_model(d_hidden=24)
    _, cache = model.run_with_cache(make_input(model))
    for i, block in enumerate(model.blocks):
        with torch.no_grad():
            h_ref, (_, c_last) = block.lstm.rnn(cache[f"blocks.{i}.hook_mixer_in"])
        torch.testing.assert_close(cache[f"blocks.{i}.lstm.hook_h"], h_ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            cache[f"blocks.{i}.lstm.hook_c"][:, -1], c_last[0], atol=1e-5, rtol=0
        )
        # Gates and states obey the LSTM equations step by step.
        i_, f, g, o, c, h = (cache[f"blocks.{i}.lstm.{n}"] for n in STEP_NAMES)
        c_prev = torch.cat([torch.zeros_like(c[:, :1]), c[:, :-1]], dim=1)
        torch.testing.assert_close(c, f * c_prev + i_ * g, atol=1e-6, rtol=0)
        torch.testing.assert_close(h, o * torch.tanh(c), atol=1e-6, rtol=0)
        assert ((f > 0) & (f < 1)).all() and ((g > -1) & (g < 1)).all()


@pytest.mark.parametrize("name", ["hook_f", "hook_g", "hook_c", "hook_h"])
def test_hook_that_modifies_an_activation_changes_the_output(name):
    model = make_model()
    x = make_input(model)
    clean = model(x)
    patched = model.run_with_hooks(
        x, fwd_hooks=[(f"blocks.0.lstm.{name}", lambda act, hook: act * 0.5)]
    )
    assert (patched - clean).abs().max() > 1e-3
    zero_mixer = model.run_with_hooks(
        x, fwd_hooks=[("blocks.1.hook_mixer_out", lambda act, hook: torch.zeros_like(act))]
    )
    assert (zero_mixer - clean).abs().max() > 1e-3


@pytest.mark.parametrize("io", ["continuous", "tokens"])
@pytest.mark.parametrize("state", ["hook_h", "hook_c"])
def test_patching_a_state_at_step_t_propagates_forward_only(io, state):
    model = make_model(io)
    x = make_input(model)
    clean = model(x)
    t = 3
    value = torch.full((model.cfg.d_model,), 0.7)
    name = f"blocks.0.lstm.{state}"
    patched = model.run_with_hooks(x, fwd_hooks=[(name, set_at(t, value))])
    per_pos = (patched - clean).abs().amax(dim=(0, 2))  # [pos]
    assert (per_pos[:t] <= 1e-5).all(), per_pos
    assert (per_pos[t:] > 1e-4).all(), per_pos
    # The cache of a patched run records the patched state at t, and only there.
    _, clean_cache = model.run_with_cache(x)
    model.add_hook(name, set_at(t, value))
    try:
        _, cache = model.run_with_cache(x)
    finally:
        model.reset_hooks()
    assert torch.equal(cache[name][:, t], value.expand(BATCH, -1))
    torch.testing.assert_close(cache[name][:, :t], clean_cache[name][:, :t])


def test_nnsight_save_of_a_state_equals_the_cache():
    model = make_model()
    x = make_input(model)
    _, cache = model.run_with_cache(x)
    nm = NNsight(model)
    with nm.trace(x):
        # The hook point's output is the step buffer: after the run it holds every step.
        c0 = nm.blocks[0].lstm.hook_c.output.save()
        h1 = nm.blocks[1].lstm.hook_h.output.save()
        out = nm.output.save()
    torch.testing.assert_close(c0, cache["blocks.0.lstm.hook_c"], atol=1e-6, rtol=0)
    torch.testing.assert_close(h1, cache["blocks.1.lstm.hook_h"], atol=1e-6, rtol=0)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("state", ["hook_h", "hook_c"])
def test_nnsight_overwrite_at_step_t_matches_the_tl_patch(state):
    model = make_model()
    x = make_input(model)
    t = 4
    value = torch.full((model.cfg.d_model,), -0.3)
    tl_patched = model.run_with_hooks(x, fwd_hooks=[(f"blocks.0.lstm.{state}", set_at(t, value))])
    clean = model(x)
    nm = NNsight(model)
    with nm.trace(x) as tracer:
        for _ in tracer.iter[t]:  # the t-th call of a step hook point is time step t
            getattr(nm.blocks[0].lstm, state).output[:, t] = value
        out = nm.output.save()
    torch.testing.assert_close(out, tl_patched, atol=1e-6, rtol=0)
    per_pos = (out - clean).abs().amax(dim=(0, 2))
    assert (per_pos[:t] <= 1e-5).all() and (per_pos[t:] > 1e-4).all(), per_pos


@pytest.mark.slow
def test_fused_equals_unrolled_at_study_size_and_print_times():
    """Batch 64 x 251, d_model 64: outputs agree; prints both forward times (speed is not asserted)."""
    torch.manual_seed(0)
    model = LSTM(LSTMConfig(d_model=64, n_layers=1))
    x = torch.randn(64, 251, model.cfg.d_in)
    times, outs = {}, {}
    with torch.no_grad():
        for fused in (True, False):
            model.fused = fused
            model(x)  # warm-up
            start = time.perf_counter()
            outs[fused] = model(x)
            times[fused] = time.perf_counter() - start
    torch.testing.assert_close(outs[True], outs[False], atol=1e-5, rtol=0)
    print(
        f"\nLSTM forward, batch 64 x 251, d_model 64: fused {times[True] * 1e3:.1f} ms, "
        f"unrolled {times[False] * 1e3:.1f} ms, ratio {times[False] / times[True]:.1f}x"
    )


def lstm_equations(rnn: nn.LSTM, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> dict:
    """Every step's gates and states from the LSTM equations on ``rnn``'s weights, one step
    at a time (an independent reference for the read paths)."""
    out = {name: [] for name in "ifgoch"}
    for t in range(x.shape[1]):
        pre = (
            x[:, t] @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
        )
        i, f, g, o = pre.chunk(4, dim=-1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = f * c + i * g
        h = o * torch.tanh(c)
        for name, value in zip("ifgoch", (i, f, g, o, c, h), strict=True):
            out[name].append(value)
    return {name: torch.stack(values, dim=1) for name, values in out.items()}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("d_hidden", [16, 9])  # 9: a buffer row of 6 * 9 + 1 floats, padded
@pytest.mark.parametrize("n_pos", [1, 7])
@pytest.mark.parametrize("start", ["zeros", "state"])
def test_stepped_values_follow_the_lstm_equations(d_hidden, n_pos, start):
    torch.manual_seed(0)
    mixer = LSTMMixer(16, d_hidden).double()
    x = torch.randn(BATCH, n_pos, 16, dtype=torch.float64)
    state = None if start == "zeros" else torch.randn(BATCH, 2, d_hidden, dtype=torch.float64)
    h0, c0 = (
        (torch.zeros(BATCH, d_hidden, dtype=torch.float64),) * 2
        if state is None
        else state.unbind(1)
    )
    with torch.no_grad():
        values, final = mixer.stepped_values(x, state)
        ref = lstm_equations(mixer.rnn, x, h0, c0)
    for name in "ifgoch":
        assert values[name].shape == (BATCH, n_pos, d_hidden), name
        torch.testing.assert_close(values[name], ref[name], rtol=1e-12, atol=1e-12, msg=name)
    torch.testing.assert_close(final, torch.stack([ref["h"][:, -1], ref["c"][:, -1]], dim=1))
    if state is not None:  # the given state is read, not written
        assert torch.equal(torch.stack([h0, c0], dim=1), state)


@pytest.mark.usefixtures("one_thread")
def test_a_cache_of_h_alone_reads_the_fused_kernels_output(monkeypatch):
    model = make_model(d_hidden=12)
    x = make_input(model)
    with torch.no_grad():
        _, full = model.run_with_cache(x)
    calls = [0, 0]
    for i, block in enumerate(model.blocks):
        block.lstm.rnn.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))

    def refuse(*args, **kwargs):
        raise AssertionError("the step loop ran for a cache of h alone")

    monkeypatch.setattr(LSTMMixer, "stepped_values", refuse)
    monkeypatch.setattr(LSTMMixer, "step_values", refuse)
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names_filter=lambda name: name.endswith("lstm.hook_h"))
    assert calls == [1, 1]
    assert sorted(cache.keys()) == ["blocks.0.lstm.hook_h", "blocks.1.lstm.hook_h"]
    for name in cache.keys():
        torch.testing.assert_close(cache[name], full[name], atol=1e-6, rtol=0, msg=name)
