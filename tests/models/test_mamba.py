"""Tests of mechlab's Mamba-1: shapes, hooks, recurrent patching, nnsight, HF parity."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from nnsight import NNsight

from mechlab.models import build_model
from mechlab.models.mamba import (
    Mamba,
    MambaConfig,
    load_hf_mamba_weights,
    mamba_config_from_hf,
    to_hf_state_dict,
)

IO_MODES = ["continuous", "tokens"]
N_POS = 8
BATCH = 2

MIXER_HOOKS = [
    "hook_conv_in", "hook_z", "hook_x", "hook_delta", "hook_B", "hook_C",
    "hook_ssm_state", "hook_y", "hook_y_gated",
]  # fmt: skip


def make_model(io: str, **overrides) -> Mamba:
    torch.manual_seed(0)
    fields = dict(d_model=16, n_layers=2, d_state=4, n_ctx=32)
    if io == "continuous":
        fields.update(io="continuous", d_in=5, d_out=3)
    else:
        fields.update(io="tokens", d_vocab=11)
    return build_model({"arch": "mamba", **fields, **overrides}).eval()


def make_input(model: Mamba, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if model.cfg.io == "continuous":
        return torch.randn(BATCH, N_POS, model.cfg.d_in, generator=gen)
    return torch.randint(0, model.cfg.d_vocab, (BATCH, N_POS), generator=gen)


# ----------------------------------------------------------------------------- config


def test_config_defaults_match_hf_and_dt_rank_auto():
    cfg, hf = MambaConfig(), transformers.MambaConfig()
    assert (cfg.d_state, cfg.d_conv, cfg.expand) == (hf.state_size, hf.conv_kernel, hf.expand)
    assert (cfg.dt_min, cfg.dt_max, cfg.dt_init_floor) == (
        hf.time_step_min, hf.time_step_max, hf.time_step_floor,
    )  # fmt: skip
    assert (cfg.conv_bias, cfg.bias, cfg.norm_eps) == (
        hf.use_conv_bias, hf.use_bias, hf.layer_norm_epsilon,
    )  # fmt: skip
    assert MambaConfig(d_model=32).resolved_dt_rank == 2
    assert MambaConfig(d_model=33).resolved_dt_rank == 3
    assert MambaConfig(d_model=32, dt_rank=5).resolved_dt_rank == 5
    assert MambaConfig(d_model=24, expand=3).d_inner == 72
    # "auto" survives a round trip, so a later d_model override still resolves afresh
    values = MambaConfig(d_model=32).to_dict()
    assert values["arch"] == "mamba" and values["dt_rank"] == "auto"
    assert MambaConfig.from_dict({**values, "d_model": 64}).resolved_dt_rank == 4


@pytest.mark.parametrize(
    "bad",
    [dict(d_state=0), dict(d_conv=-1), dict(expand=1.5), dict(dt_rank="big"), dict(dt_rank=0),
     dict(dt_min=0.2, dt_max=0.1), dict(dt_min=0.0), dict(dt_init_floor=0.0), dict(norm_eps=0.0),
     dict(bogus=1)],
)  # fmt: skip
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        build_model({"arch": "mamba", **bad})


def test_init_like_hf():
    model = make_model("tokens", d_model=32, dt_min=0.01, dt_max=0.05)
    cfg = model.cfg
    for block in model.blocks:
        mixer = block.mixer
        expected_A_log = torch.log(torch.arange(1, cfg.d_state + 1, dtype=torch.float32))
        torch.testing.assert_close(mixer.A_log, expected_A_log.expand(cfg.d_inner, -1))
        assert torch.equal(mixer.D, torch.ones(cfg.d_inner))
        dt0 = F.softplus(mixer.dt_proj.bias)
        assert dt0.min() >= 0.01 * (1 - 1e-4) and dt0.max() <= 0.05 * (1 + 1e-4)
        assert dt0.std() > 0  # drawn, not constant
        assert mixer.dt_proj.weight.abs().max() <= cfg.resolved_dt_rank**-0.5
        assert torch.equal(mixer.conv1d.bias, torch.zeros(cfg.d_inner))
        assert tuple(mixer.conv1d.weight.shape) == (cfg.d_inner, 1, cfg.d_conv)
        assert tuple(mixer.x_proj.weight.shape) == (
            cfg.resolved_dt_rank + 2 * cfg.d_state, cfg.d_inner,
        )  # fmt: skip
        assert mixer.in_proj.bias is None and mixer.out_proj.bias is None


# ----------------------------------------------------------------------------- shapes and hooks


@pytest.mark.parametrize("io", IO_MODES)
def test_output_shape_and_length_check(io):
    model = make_model(io)
    out = model(make_input(model))
    assert out.shape == (BATCH, N_POS, model.cfg.d_output)
    too_long = model.cfg.n_ctx + 1
    x = torch.zeros(1, too_long, 5) if io == "continuous" else torch.zeros(1, too_long).long()
    with pytest.raises(ValueError, match="n_ctx"):
        model(x)


@pytest.mark.parametrize("io", IO_MODES)
def test_exact_hook_names_and_cache_shapes(io):
    model = make_model(io)
    cfg = model.cfg
    d, e, n = cfg.d_model, cfg.d_inner, cfg.d_state
    mixer_shapes = dict(
        hook_conv_in=(e,), hook_z=(e,), hook_x=(e,), hook_delta=(e,), hook_B=(n,), hook_C=(n,),
        hook_ssm_state=(e, n), hook_y=(e,), hook_y_gated=(e,),
    )  # fmt: skip
    expected = {"hook_embed": (d,)}
    for i in range(2):
        expected[f"blocks.{i}.hook_resid_pre"] = (d,)
        expected[f"blocks.{i}.hook_mixer_in"] = (d,)
        for name in MIXER_HOOKS:
            expected[f"blocks.{i}.mixer.{name}"] = mixer_shapes[name]
        expected[f"blocks.{i}.hook_mixer_out"] = (d,)
        expected[f"blocks.{i}.hook_resid_post"] = (d,)
    expected["hook_out"] = (cfg.d_output,)

    assert set(model.hook_dict) == set(expected)
    with torch.no_grad():
        _, cache = model.run_with_cache(make_input(model))
    assert list(cache.keys()) == list(expected)  # every hook, in forward order
    for name, tail in expected.items():
        assert tuple(cache[name].shape) == (BATCH, N_POS, *tail), name
    # the step hook's cache holds the whole trajectory: no position left at its zero fill
    state = cache["blocks.1.mixer.hook_ssm_state"]
    assert (state.abs().flatten(2).amax(-1) > 0).all()


@pytest.mark.parametrize("io", IO_MODES)
def test_cache_matches_independent_recomputation(io):
    """Rebuild each block's mixer from its cached input with explicit loops."""
    model = make_model(io, conv_bias=True, bias=True)
    with torch.no_grad():
        for p in model.parameters():  # leave the init so biases and D are not trivial
            p.add_(0.1 * torch.randn_like(p))
        out, cache = model.run_with_cache(make_input(model))
    cfg = model.cfg
    for i, block in enumerate(model.blocks):
        mixer = block.mixer
        c = {name: cache[f"blocks.{i}.mixer.{name}"] for name in MIXER_HOOKS}
        u = cache[f"blocks.{i}.hook_mixer_in"]
        resid_pre = cache[f"blocks.{i}.hook_resid_pre"]
        rms = resid_pre.pow(2).mean(-1, keepdim=True).add(cfg.norm_eps).sqrt()
        torch.testing.assert_close(u, block.norm.weight * resid_pre / rms)

        xz = u @ mixer.in_proj.weight.T + mixer.in_proj.bias
        torch.testing.assert_close(c["hook_conv_in"], xz[..., : cfg.d_inner])
        torch.testing.assert_close(c["hook_z"], xz[..., cfg.d_inner :])
        # causal depthwise conv: x_t = sum_k w[k] * xin_{t - (d_conv-1) + k}
        xin, w = c["hook_conv_in"], mixer.conv1d.weight[:, 0]  # w: [d_inner, d_conv]
        conv = mixer.conv1d.bias.expand(BATCH, N_POS, -1).clone()
        for t in range(N_POS):
            for k in range(cfg.d_conv):
                s = t - (cfg.d_conv - 1) + k
                if s >= 0:
                    conv[:, t] += w[:, k] * xin[:, s]
        x = c["hook_x"]
        torch.testing.assert_close(x, conv * torch.sigmoid(conv))

        proj = x @ mixer.x_proj.weight.T
        r = cfg.resolved_dt_rank
        delta = F.softplus(proj[..., :r] @ mixer.dt_proj.weight.T + mixer.dt_proj.bias)
        torch.testing.assert_close(c["hook_delta"], delta)
        torch.testing.assert_close(c["hook_B"], proj[..., r : r + cfg.d_state])
        torch.testing.assert_close(c["hook_C"], proj[..., r + cfg.d_state :])

        A = -torch.exp(mixer.A_log)
        h = torch.zeros(BATCH, cfg.d_inner, cfg.d_state)
        for t in range(N_POS):
            for b in range(BATCH):
                dA = torch.exp(delta[b, t][:, None] * A)
                h[b] = dA * h[b] + torch.outer(delta[b, t] * x[b, t], c["hook_B"][b, t])
            torch.testing.assert_close(c["hook_ssm_state"][:, t], h)
        y = torch.einsum("bten,btn->bte", c["hook_ssm_state"], c["hook_C"]) + mixer.D * x
        torch.testing.assert_close(c["hook_y"], y)
        gated = y * F.silu(c["hook_z"])
        torch.testing.assert_close(c["hook_y_gated"], gated)
        mixer_out = gated @ mixer.out_proj.weight.T + mixer.out_proj.bias
        torch.testing.assert_close(cache[f"blocks.{i}.hook_mixer_out"], mixer_out)
        torch.testing.assert_close(cache[f"blocks.{i}.hook_resid_post"], resid_pre + mixer_out)
    torch.testing.assert_close(cache["hook_out"], out)


@pytest.mark.parametrize("io", IO_MODES)
def test_hooked_and_unhooked_paths_agree(io):
    model = make_model(io)
    x = make_input(model)
    with torch.no_grad():
        plain = model(x)
        cached, _ = model.run_with_cache(x)
    torch.testing.assert_close(cached, plain, rtol=0, atol=1e-6)


@pytest.mark.parametrize("io", IO_MODES)
def test_zeroing_every_mixer_leaves_readout_of_embedding(io):
    model = make_model(io)
    x = make_input(model)
    zero = lambda act, hook: torch.zeros_like(act)  # noqa: E731
    with torch.no_grad():
        clean = model(x)
        ablated = model.run_with_hooks(
            x, fwd_hooks=[(lambda name: name.endswith("hook_mixer_out"), zero)]
        )
        expected = model.read_out(model.ln_final(model.read_in(x)))
    assert (ablated - clean).abs().max() > 1e-3
    torch.testing.assert_close(ablated, expected)


# ----------------------------------------------------------------------------- recurrent patching


def assert_causal_change(clean: torch.Tensor, patched: torch.Tensor, t: int, until: int) -> None:
    """Positions < t are bit-identical; every position in [t, until) changed."""
    assert torch.equal(patched[:, :t], clean[:, :t])
    change = (patched - clean).abs().amax(dim=(0, 2))  # [pos]
    assert (change[t:until] > 1e-4).all(), change


@pytest.mark.parametrize("io", IO_MODES)
@pytest.mark.parametrize("layer", [0, 1])
def test_patching_ssm_state_at_step_t_propagates(io, layer):
    model = make_model(io)
    x, t = make_input(model), 3
    name = f"blocks.{layer}.mixer.hook_ssm_state"

    def set_state(act, hook):
        act[:, t] = 1.0  # idempotent across the per-step calls

    with torch.no_grad():
        clean = model(x)
        model.add_hook(name, set_state)
        patched, cache = model.run_with_cache(x)
        model.reset_hooks()
    assert_causal_change(clean, patched, t, N_POS)

    # the patched state is what the recurrence carried on with
    mixer = model.blocks[layer].mixer
    state = cache[name]
    assert torch.equal(state[:, t], torch.ones_like(state[:, t]))
    delta, B = cache[f"blocks.{layer}.mixer.hook_delta"], cache[f"blocks.{layer}.mixer.hook_B"]
    x_in = cache[f"blocks.{layer}.mixer.hook_x"]
    decay = torch.exp(delta[:, t + 1, :, None] * -torch.exp(mixer.A_log))
    drive = (delta * x_in)[:, t + 1, :, None] * B[:, t + 1, None, :]
    torch.testing.assert_close(state[:, t + 1], decay + drive)


@pytest.mark.parametrize("io", IO_MODES)
def test_patching_x_and_conv_input_at_step_t_is_causal(io):
    model = make_model(io)
    x, t = make_input(model), 3

    def set_pos(act, hook):
        act[:, t] = 2.0

    with torch.no_grad():
        clean = model(x)
        after_x = model.run_with_hooks(x, fwd_hooks=[("blocks.0.mixer.hook_x", set_pos)])
        after_conv_in = model.run_with_hooks(
            x, fwd_hooks=[("blocks.1.mixer.hook_conv_in", set_pos)]
        )
    assert_causal_change(clean, after_x, t, N_POS)  # the scan carries it on
    assert_causal_change(clean, after_conv_in, t, t + model.cfg.d_conv)  # the conv window


# ----------------------------------------------------------------------------- nnsight


@pytest.mark.parametrize("io", IO_MODES)
def test_nnsight_save_and_overwrite(io):
    model = make_model(io)
    x = make_input(model)
    with torch.no_grad():
        clean, cache = model.run_with_cache(x)
        tl_zeroed = model.run_with_hooks(
            x, fwd_hooks=[("blocks.0.hook_mixer_out", lambda act, hook: torch.zeros_like(act))]
        )
    nn_model = NNsight(model)
    with torch.no_grad():
        with nn_model.trace(x):
            delta = nn_model.blocks[0].mixer.hook_delta.output.save()
            y = nn_model.blocks[1].mixer.hook_y.output.save()
            out = nn_model.output.save()
        torch.testing.assert_close(delta, cache["blocks.0.mixer.hook_delta"], rtol=0, atol=0)
        # (the cache comes from the chunked scan, nnsight's trace from the loop)
        torch.testing.assert_close(y, cache["blocks.1.mixer.hook_y"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out, clean, rtol=0, atol=1e-6)

        with nn_model.trace(x):
            nn_model.blocks[0].hook_mixer_out.output[:] = 0
            zeroed = nn_model.output.save()
    assert (zeroed - clean).abs().max() > 1e-3
    torch.testing.assert_close(zeroed, tl_zeroed, rtol=0, atol=1e-6)


@pytest.mark.parametrize("io", IO_MODES)
def test_nnsight_iter_addresses_ssm_state_per_step(io):
    """The t-th call of hook_ssm_state is step t: read it and patch it there."""
    model = make_model(io)
    x, t = make_input(model), 3
    name = "blocks.0.mixer.hook_ssm_state"

    def set_state(act, hook):
        act[:, t] = 1.0

    with torch.no_grad():
        _, cache = model.run_with_cache(x)
        tl_patched = model.run_with_hooks(x, fwd_hooks=[(name, set_state)])
    nn_model = NNsight(model)
    with torch.no_grad():
        with nn_model.trace(x) as tracer:
            for _ in tracer.iter[t]:
                seen = nn_model.blocks[0].mixer.hook_ssm_state.output.clone().save()
        # the buffer seen at call t is filled up to step t and empty after it
        # (the cache comes from the chunked scan, nnsight's trace from the loop)
        torch.testing.assert_close(seen[:, : t + 1], cache[name][:, : t + 1], rtol=1e-5, atol=1e-6)
        assert not seen[:, t + 1 :].any()

        with nn_model.trace(x) as tracer:
            for _ in tracer.iter[t]:
                nn_model.blocks[0].mixer.hook_ssm_state.output[:, t] = 1.0
            patched = nn_model.output.save()
    assert_causal_change(model(x).detach(), patched, t, N_POS)
    torch.testing.assert_close(patched, tl_patched, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- Hugging Face parity


def make_hf(causal_lm: bool, **overrides):
    torch.manual_seed(0)
    hf_cfg = transformers.MambaConfig(
        vocab_size=23, hidden_size=32, num_hidden_layers=2, state_size=16, use_cache=False,
        **overrides,
    )  # fmt: skip
    hf = (transformers.MambaForCausalLM if causal_lm else transformers.MambaModel)(hf_cfg)
    with torch.no_grad():  # move off the structured init (D = 1, conv bias 0, ...)
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return hf.eval()


def mechlab_hidden_and_logits(model: Mamba, ids: torch.Tensor, hooked: bool):
    """ln_final's output and the logits, via a plain torch hook so no HookPoint is active."""
    seen = {}
    handle = model.ln_final.register_forward_hook(lambda mod, inp, out: seen.update(h=out))
    try:
        with torch.no_grad():
            if hooked:
                logits, cache = model.run_with_cache(ids)
                assert "blocks.1.mixer.hook_ssm_state" in cache
            else:
                logits = model(ids)
    finally:
        handle.remove()
    return seen["h"], logits


@pytest.mark.parametrize("hooked", [False, True])
@pytest.mark.parametrize("hf_overrides", [{}, dict(use_bias=True, use_conv_bias=False)])
def test_parity_with_hf_mamba(hooked, hf_overrides):
    ids = torch.randint(0, 23, (BATCH, 12), generator=torch.Generator().manual_seed(3))

    hf_lm = make_hf(causal_lm=True, **hf_overrides)
    model = Mamba.from_hf(hf_lm).eval()
    assert model.cfg.bias == hf_overrides.get("use_bias", False)
    with torch.no_grad():
        ref = hf_lm(ids, use_cache=False)
        ref_hidden = hf_lm.backbone(ids, use_cache=False).last_hidden_state
    hidden, logits = mechlab_hidden_and_logits(model, ids, hooked)
    torch.testing.assert_close(hidden, ref_hidden, rtol=0, atol=1e-4)
    torch.testing.assert_close(logits, ref.logits, rtol=0, atol=1e-4)

    # a bare MambaModel: backbone weights only, into a model built beforehand
    hf_backbone = make_hf(causal_lm=False, **hf_overrides)
    model = build_model(mamba_config_from_hf(hf_backbone.config)).eval()
    read_out_before = model.read_out.proj.weight.clone()
    load_hf_mamba_weights(model, hf_backbone)
    assert torch.equal(model.read_out.proj.weight, read_out_before)
    with torch.no_grad():
        ref_hidden = hf_backbone(ids, use_cache=False).last_hidden_state
    hidden, _ = mechlab_hidden_and_logits(model, ids, hooked)
    torch.testing.assert_close(hidden, ref_hidden, rtol=0, atol=1e-4)


def test_export_to_hf_round_trip():
    model = make_model("tokens", d_model=32)  # fresh: its read-out bias starts at zero
    assert model.read_out.proj.bias.abs().max() == 0
    hf_cfg = transformers.MambaConfig(
        vocab_size=11, hidden_size=32, num_hidden_layers=2, state_size=4, use_cache=False,
        tie_word_embeddings=False,
    )  # fmt: skip
    hf = transformers.MambaForCausalLM(hf_cfg).eval()
    hf.load_state_dict(to_hf_state_dict(model), strict=True)
    ids = make_input(model)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids, use_cache=False).logits, model(ids), rtol=0, atol=1e-4)


def test_export_refuses_a_read_out_bias_hf_cannot_hold():
    model = make_model("tokens", d_model=32)
    with torch.no_grad():
        model.read_out.proj.bias[3] = 0.5  # as training may leave it
    with pytest.raises(ValueError, match="read_out.proj.bias is not zero"):
        to_hf_state_dict(model)


def test_load_rejects_mismatched_hf_model():
    hf = make_hf(causal_lm=False)
    wrong_width = build_model(dataclasses.replace(mamba_config_from_hf(hf.config), d_model=16))
    with pytest.raises(ValueError, match="shape mismatch"):
        load_hf_mamba_weights(wrong_width, hf)
    wrong_eps = build_model(mamba_config_from_hf(hf.config, norm_eps=1e-6))
    with pytest.raises(ValueError, match="norm_eps"):
        load_hf_mamba_weights(wrong_eps, hf)


# ----------------------------------------------------------------------------- training


def test_every_parameter_gets_a_gradient():
    model = make_model("continuous").train()
    model(make_input(model)).pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert math.isfinite(sum(p.grad.sum().item() for p in model.parameters()))
