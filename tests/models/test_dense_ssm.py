"""Tests of mechlab.models.dense_ssm: shapes, hooks, fast == hooked path, bounded states,
state patching, nnsight."""

from __future__ import annotations

import pytest
import torch
from nnsight import NNsight

from mechlab.models import build_model
from mechlab.models.dense_ssm import DenseSSM, DenseSSMConfig, neutral_gain

BATCH, N_POS = 3, 7


def make_model(io: str = "continuous", seed: int = 0, **fields) -> DenseSSM:
    torch.manual_seed(seed)
    base = {"d_model": 12, "d_state": 10, "n_layers": 2, "d_in": 5, "d_out": 3, "n_ctx": 32}
    if io == "tokens":
        base.update(io="tokens", d_vocab=11)
    return DenseSSM(DenseSSMConfig(**{**base, **fields}))


def make_input(
    model: DenseSSM, batch: int = BATCH, n_pos: int = N_POS, seed: int = 1
) -> torch.Tensor:
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


def reference_states(mixer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h_t = A(x_t) h_{t-1} as a plain float64 loop over explicit sums: (A, h) for all steps."""
    W = mixer.W_A.detach().double()  # [i, j, k]
    x = x.double()
    h = mixer.h_init.detach().double().expand(x.shape[0], -1)
    As, hs = [], []
    for t in range(x.shape[1]):
        A = (W[None] * x[:, t, None, None, :]).sum(-1)  # [batch, i, j]
        h = (A * h[:, None, :]).sum(-1)  # [batch, i]
        As.append(A)
        hs.append(h)
    return torch.stack(As, 1), torch.stack(hs, 1)


@pytest.mark.parametrize("io", ["continuous", "tokens"])
def test_output_shape(io):
    model = make_model(io)
    out = model(make_input(model))
    assert out.shape == (BATCH, N_POS, model.cfg.d_output)


def test_exact_hook_names_two_layers():
    model = make_model()
    expected = {"hook_embed", "hook_out"}
    for i in range(2):
        expected |= {
            f"blocks.{i}.hook_resid_pre",
            f"blocks.{i}.hook_mixer_in",
            f"blocks.{i}.ssm.hook_A",
            f"blocks.{i}.ssm.hook_h",
            f"blocks.{i}.hook_mixer_out",
            f"blocks.{i}.hook_resid_post",
        }
    assert set(model.hook_dict) == expected


@pytest.mark.parametrize("io", ["continuous", "tokens"])
def test_cache_is_complete_with_batch_pos_shapes(io):
    model = make_model(io)
    _, cache = model.run_with_cache(make_input(model))
    assert set(cache.keys()) == set(model.hook_dict)
    d_model, d_state = model.cfg.d_model, model.cfg.d_state
    for name, act in cache.items():
        if name == "hook_out":
            expected = (BATCH, N_POS, model.cfg.d_output)
        elif name.endswith("ssm.hook_A"):
            expected = (BATCH, N_POS, d_state, d_state)
        elif name.endswith("ssm.hook_h"):
            expected = (BATCH, N_POS, d_state)
        else:
            expected = (BATCH, N_POS, d_model)
        assert act.shape == expected, name
    assert (cache["blocks.1.ssm.hook_h"].abs().sum(-1) > 0).all()


def test_config_defaults_and_validation():
    cfg = DenseSSMConfig()
    assert cfg.d_state == 64 and cfg.n_layers == 1
    assert DenseSSMConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="d_state"):
        DenseSSMConfig(d_state=0)


def test_build_model_by_dict_and_name():
    model = build_model({"arch": "dense_ssm", "d_model": 32})
    assert isinstance(model, DenseSSM)
    assert model.cfg.d_model == 32 and model.cfg.d_state == 64
    assert model.blocks[0].ssm.W_A.shape == (64, 64, 32)
    x = torch.randn(2, 5, model.cfg.d_in)
    assert model(x).shape == (2, 5, model.cfg.d_out)
    assert isinstance(build_model("dense_ssm"), DenseSSM)


@pytest.mark.parametrize("io", ["continuous", "tokens"])
def test_cached_states_equal_an_independent_loop(io):
    model = make_model(io)
    _, cache = model.run_with_cache(make_input(model))
    for i, block in enumerate(model.blocks):
        A_ref, h_ref = reference_states(block.ssm, cache[f"blocks.{i}.hook_mixer_in"])
        torch.testing.assert_close(
            cache[f"blocks.{i}.ssm.hook_A"].double(), A_ref, atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            cache[f"blocks.{i}.ssm.hook_h"].double(), h_ref, atol=1e-5, rtol=1e-5
        )
        mixer_out = block.ssm.W_out.weight.detach().double() @ h_ref[..., None]
        torch.testing.assert_close(
            cache[f"blocks.{i}.hook_mixer_out"].double(), mixer_out[..., 0], atol=1e-5, rtol=1e-5
        )


def test_fast_path_equals_hooked_path_and_never_forms_A(monkeypatch):
    model = make_model(n_ctx=40)
    x = make_input(model, n_pos=40)
    target = torch.randn(BATCH, 40, model.cfg.d_output)

    def loss_and_grads(out):
        model.zero_grad()
        ((out - target) ** 2).mean().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    # A no-op hook on hook_A forces the path that materialises A(x_t).
    noop = [(f"blocks.{i}.ssm.hook_A", lambda act, hook: None) for i in range(2)]
    out_hooked, grads_hooked = loss_and_grads(model.run_with_hooks(x, fwd_hooks=noop))
    for block in model.blocks:
        monkeypatch.setattr(block.ssm, "transition", lambda *_: pytest.fail("fast path formed A"))
    out_fast, grads_fast = loss_and_grads(model(x))
    torch.testing.assert_close(out_fast, out_hooked, atol=1e-5, rtol=0)
    for name in grads_fast:
        torch.testing.assert_close(
            grads_fast[name], grads_hooked[name], atol=1e-5, rtol=1e-4, msg=name
        )


def state_log_growth(model: DenseSSM, n_pos: int, batch: int, scale: float = 1.0) -> torch.Tensor:
    """log(|h_t| / |h_init|) for random continuous inputs: [batch, pos]."""
    mixer = model.blocks[0].ssm
    with torch.no_grad():
        mixer.W_A.mul_(scale)
        x = torch.randn(batch, n_pos, model.cfg.d_in, generator=torch.Generator().manual_seed(3))
        _, cache = model.run_with_cache(x, names_filter="blocks.0.ssm.hook_h")
        mixer.W_A.div_(scale)
    return (cache["blocks.0.ssm.hook_h"].norm(dim=-1) / mixer.h_init.norm()).log()


@pytest.mark.parametrize("d_state", [64, 256])
def test_state_norm_stays_bounded_over_1000_steps_at_init(d_state):
    """log|h_t| is a drift-free random walk with spread ~ sqrt(t / (2 d_state)) (64: ~2.8, 256: ~1.4)."""
    T = 1000
    model = DenseSSM(DenseSSMConfig(d_model=32 if d_state == 64 else 16, d_state=d_state, n_ctx=T))
    torch.manual_seed(0)
    model.blocks[0].ssm.reset_parameters()
    log_growth = state_log_growth(model, T, batch=16 if d_state == 64 else 4)
    assert torch.isfinite(log_growth).all()
    spread = (T / (2 * d_state)) ** 0.5
    # No blow-up, no collapse: every |log growth| within 5 spreads (+2).
    assert log_growth.abs().max() < 5 * spread + 2, log_growth.abs().max()
    drift_per_step = log_growth[:, -1].mean() / T
    assert abs(drift_per_step) < 0.004, drift_per_step
    # Control: 10% larger W_A entries give a drift the test sees (log 1.1 ~ 0.095 per step).
    assert state_log_growth(model, 200, batch=4, scale=1.1)[:, -1].mean() / 200 > 0.05


def test_neutral_gain_zeroes_the_log_growth_of_gaussian_matrices():
    n = 16
    gain = neutral_gain(n)
    assert 1 + 1 / n < gain < 1 + 1.5 / n
    A = torch.randn(20000, n, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u = torch.nn.functional.normalize(torch.randn(20000, n, 1, dtype=torch.float64), dim=1)
    log_growth = ((gain / n) ** 0.5 * A @ u).norm(dim=1).log().mean()
    assert abs(log_growth) < 0.005, log_growth


@pytest.mark.parametrize("name", ["hook_A", "hook_h", "hook_mixer_out"])
def test_hook_that_modifies_an_activation_changes_the_output(name):
    model = make_model()
    x = make_input(model)
    clean = model(x)
    point = f"blocks.0.ssm.{name}" if name != "hook_mixer_out" else "blocks.0.hook_mixer_out"
    patched = model.run_with_hooks(x, fwd_hooks=[(point, lambda act, hook: act * 0.5)])
    assert (patched - clean).abs().max() > 1e-3


@pytest.mark.parametrize("io", ["continuous", "tokens"])
@pytest.mark.parametrize("name", ["hook_h", "hook_A"])
def test_patching_at_step_t_propagates_forward_only(io, name):
    model = make_model(io)
    x = make_input(model)
    clean = model(x)
    t = 3
    d_state = model.cfg.d_state
    value = torch.eye(d_state).flip(0) if name == "hook_A" else torch.linspace(-1, 1, d_state)
    point = f"blocks.0.ssm.{name}"
    patched = model.run_with_hooks(x, fwd_hooks=[(point, set_at(t, value))])
    per_pos = (patched - clean).abs().amax(dim=(0, 2))  # [pos]
    assert (per_pos[:t] <= 1e-5).all(), per_pos
    assert (per_pos[t:] > 1e-4).all(), per_pos
    # The patched run's cache shows the patch at t and the clean states before it.
    _, clean_cache = model.run_with_cache(x)
    model.add_hook(point, set_at(t, value))
    try:
        _, cache = model.run_with_cache(x)
    finally:
        model.reset_hooks()
    assert torch.equal(cache[point][:, t], value.expand(BATCH, *value.shape))
    torch.testing.assert_close(cache[point][:, :t], clean_cache[point][:, :t])


def test_nnsight_save_of_a_state_equals_the_cache():
    model = make_model()
    x = make_input(model)
    _, cache = model.run_with_cache(x)
    nm = NNsight(model)
    with nm.trace(x):
        h0 = nm.blocks[0].ssm.hook_h.output.save()
        h1 = nm.blocks[1].ssm.hook_h.output.save()
        out = nm.output.save()
    # (nnsight's trace runs the step-by-step loop; caching reads, so it may take the scan)
    torch.testing.assert_close(h0, cache["blocks.0.ssm.hook_h"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h1, cache["blocks.1.ssm.hook_h"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=0)


def test_nnsight_overwrite_at_step_t_matches_the_tl_patch():
    model = make_model()
    x = make_input(model)
    t = 4
    value = torch.linspace(1, -1, model.cfg.d_state)
    tl_patched = model.run_with_hooks(x, fwd_hooks=[("blocks.0.ssm.hook_h", set_at(t, value))])
    clean = model(x)
    nm = NNsight(model)
    with nm.trace(x) as tracer:
        for _ in tracer.iter[t]:  # the t-th call of a step hook point is time step t
            nm.blocks[0].ssm.hook_h.output[:, t] = value
        out = nm.output.save()
    torch.testing.assert_close(out, tl_patched, atol=1e-6, rtol=0)
    per_pos = (out - clean).abs().amax(dim=(0, 2))
    assert (per_pos[:t] <= 1e-5).all() and (per_pos[t:] > 1e-4).all(), per_pos
