"""Backward hooks on the per-step recurrent hook points: one [batch, pos, ...] gradient
whose position t is the total derivative of the loss w.r.t. the state carried from step t."""

import pytest
import torch

from mechlab.models import build_model

torch.set_num_threads(1)

IO = {"d_in": 5, "d_out": 3, "n_ctx": 12}
FAMILIES = {
    "lstm": {"arch": "lstm", "d_model": 6, "n_layers": 1},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 6, "d_state": 4, "n_layers": 2},
    "mamba": {"arch": "mamba", "d_model": 6, "d_state": 3, "n_layers": 2},
}


def make(family: str, seed: int):
    torch.manual_seed(seed)
    return build_model({**FAMILIES[family], **IO}).double().eval()


def make_x(seed: int, batch: int = 2, n_pos: int = 7):
    return torch.randn(
        batch, n_pos, 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


def metric(out):
    return (out[..., 0] * out[..., 1]).sum() + out[:, -1, 2].pow(2).sum()


def step_grads(model, x, names, fn=metric):
    """Gradients the backward hooks of ``names`` receive, and how often each fires."""
    got, calls = {}, {n: 0 for n in names}

    def keep(grad, hook):
        got[hook.name] = grad.detach().clone()
        calls[hook.name] += 1

    with model.hooks(bwd_hooks=[(n, keep) for n in names]):
        fn(model(x)).backward()
    return got, calls


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lstm_step_gradients_equal_a_hand_unrolled_lstm(seed):
    model = make("lstm", seed)
    x = make_x(seed + 5)
    got, calls = step_grads(
        model, x, ["blocks.0.lstm.hook_h", "blocks.0.lstm.hook_c", "blocks.0.lstm.hook_f"]
    )
    assert calls == {
        "blocks.0.lstm.hook_h": 1,
        "blocks.0.lstm.hook_c": 1,
        "blocks.0.lstm.hook_f": 1,
    }

    # The same model written out by hand, each step's tensors kept with retain_grad.
    block, rnn = model.blocks[0], model.blocks[0].lstm.rnn
    resid = model.read_in(x)
    u = block.norm(resid)
    h = c = torch.zeros(2, 6, dtype=torch.float64)
    hs, cs, fs = [], [], []
    for t in range(x.shape[1]):
        gates = (
            u[:, t] @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
        )
        i, f, g, o = gates.chunk(4, dim=-1)
        f = torch.sigmoid(f)
        c = f * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        for kept, lst in ((h, hs), (c, cs), (f, fs)):
            kept.retain_grad()
            lst.append(kept)
    out = model.read_out(model.ln_final(resid + torch.stack(hs, dim=1)))
    torch.testing.assert_close(out, model(x), rtol=0, atol=1e-12)
    metric(out).backward()
    for name, lst in (("hook_h", hs), ("hook_c", cs), ("hook_f", fs)):
        by_hand = torch.stack([v.grad for v in lst], dim=1)  # [batch, pos, d_hidden]
        torch.testing.assert_close(got[f"blocks.0.lstm.{name}"], by_hand, rtol=0, atol=1e-12)


def patch_once(t: int, index: tuple, eps: float):
    """A forward hook that adds ``eps`` to one entry of step ``t`` (called once per step)."""
    calls = []

    def hook(buffer, hook):
        if len(calls) == t:
            buffer[(slice(None), t, *index)] += eps
        calls.append(1)

    return hook


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["blocks.0.ssm.hook_h", "blocks.1.ssm.hook_A"])
def test_dense_ssm_step_gradients_match_finite_differences(seed, name):
    model = make("dense_ssm", seed)
    x = make_x(seed)
    got, _ = step_grads(model, x, [name])
    shape = got[name].shape
    g = torch.Generator().manual_seed(seed)
    eps = 1e-6
    for t in (0, 3, shape[1] - 1):
        index = tuple(int(torch.randint(0, s, (1,), generator=g)) for s in shape[2:])
        with torch.no_grad():
            values = []
            for sign in (1, -1):
                with model.hooks(fwd_hooks=[(name, patch_once(t, index, sign * eps))]):
                    values.append(metric(model(x)))
        fd = (values[0] - values[1]) / (2 * eps)  # summed over the batch
        analytic = got[name][(slice(None), t, *index)].sum()
        torch.testing.assert_close(analytic, fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mamba_state_gradient_follows_the_scan_backwards(seed):
    """dL/dh_t = dL/dy_t (x) C_t + exp(delta_{t+1} A) * dL/dh_{t+1}, from cached pieces."""
    model = make("mamba", seed)
    x = make_x(seed)
    _, cache = model.run_with_cache(x, incl_bwd=True, metric=metric)
    mixer = model.blocks[1].mixer
    A = -torch.exp(mixer.A_log.float())  # [d_inner, d_state]
    dy = cache["blocks.1.mixer.hook_y_grad"].float()  # [batch, pos, d_inner]
    C = cache["blocks.1.mixer.hook_C"].float()  # [batch, pos, d_state]
    delta = cache["blocks.1.mixer.hook_delta"].float()  # [batch, pos, d_inner]
    grad = cache["blocks.1.mixer.hook_ssm_state_grad"]  # [batch, pos, d_inner, d_state]
    carry = torch.zeros_like(grad[:, 0])
    for t in reversed(range(x.shape[1])):
        carry = dy[:, t, :, None] * C[:, t, None, :] + carry
        torch.testing.assert_close(grad[:, t], carry, rtol=1e-5, atol=1e-6)
        carry = torch.exp(delta[:, t, :, None] * A) * carry  # what h_{t-1} gets back


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("t", [1, 4])
def test_a_metric_that_reads_only_earlier_positions_gives_later_steps_zero_gradient(family, t):
    model = make(family, t)
    names = [n for n in model.hook_dict if model.is_step_hook(n)]
    got, calls = step_grads(model, make_x(t), names, fn=lambda out: out[:, :t].pow(2).sum())
    assert set(calls.values()) == {1}
    for name in names:
        assert got[name][:, t:].abs().max() == 0, name
        first = 1 if name.endswith("lstm.hook_f") else 0  # f_0 multiplies c_{-1} = 0
        if first < t:
            assert got[name][:, first:t].abs().max() > 0, name


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_backward_hooks_leave_the_forward_numbers_bit_identical(family):
    model = make(family, 0)
    x = make_x(3)
    names = [n for n in model.hook_dict if model.is_step_hook(n)]
    # the reference takes the same (unfused) path: a forward hook that changes nothing
    with model.hooks(fwd_hooks=[(n, lambda a, hook: None) for n in names]):
        reference = model(x)
    with model.hooks(bwd_hooks=[(n, lambda g, hook: None) for n in names]):
        with_taps = model(x)
    assert torch.equal(with_taps, reference)
    with torch.no_grad(), model.hooks(bwd_hooks=[(n, lambda g, hook: None) for n in names]):
        assert torch.equal(model(x), reference)


def test_backward_hook_sees_a_patched_step_and_run_with_hooks_works():
    model = make("lstm", 4)
    x = make_x(4)
    seen = {}

    def zero_step_2(h, hook):
        h[:, 2] = 0.0

    def keep(grad, hook):
        seen["g"] = grad.clone()

    out = model.run_with_hooks(
        x,
        fwd_hooks=[("blocks.0.lstm.hook_h", zero_step_2)],
        bwd_hooks=[("blocks.0.lstm.hook_h", keep)],
        reset_hooks_end=False,
    )
    metric(out).backward()
    model.reset_hooks()
    assert seen["g"].shape == (2, 7, 6)
    assert seen["g"][:, 2].abs().max() > 0  # the patched value still has a loss derivative
    assert not any(p._backward_hooks for p in model.hook_dict.values())
