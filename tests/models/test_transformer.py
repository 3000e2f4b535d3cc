"""Tests of mechlab.models.transformer: config, shapes, hooks, patching, nnsight, presets."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from nnsight import NNsight

from mechlab.models import build_model
from mechlab.models.transformer import PRESETS, Transformer, TransformerConfig

BATCH, N_POS = 3, 7
D_MODEL, N_HEADS, N_LAYERS = 24, 3, 2


def make_model(
    io: str = "continuous", seed: int = 0, perturb: bool = True, **fields
) -> Transformer:
    """A small model; ``perturb`` moves every parameter off its init (non-zero biases, LN)."""
    torch.manual_seed(seed)
    base = {
        "d_model": D_MODEL,
        "n_heads": N_HEADS,
        "n_layers": N_LAYERS,
        "d_in": 5,
        "d_out": 3,
        "n_ctx": 16,
    }
    if io == "tokens":
        base.update(io="tokens", d_vocab=11)
    model = Transformer(TransformerConfig(**{**base, **fields})).eval()
    if perturb:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.2 * torch.randn_like(p))
    return model


def make_input(model: Transformer, batch: int = BATCH, n_pos: int = N_POS, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    if model.cfg.io == "continuous":
        return torch.randn(batch, n_pos, model.cfg.d_in, generator=g)
    return torch.randint(0, model.cfg.d_vocab, (batch, n_pos), generator=g)


def expected_hook_shapes(cfg: TransformerConfig, batch: int, n_pos: int) -> dict[str, tuple]:
    b, p, m, h, d = batch, n_pos, cfg.d_model, cfg.n_heads, cfg.d_head
    shapes = {"hook_embed": (b, p, m), "hook_pos_embed": (b, p, m)}
    for i in range(cfg.n_layers):
        block = {
            "hook_resid_pre": (b, p, m),
            "ln1.hook_scale": (b, p, 1),
            "ln1.hook_normalized": (b, p, m),
            "attn.hook_q": (b, p, h, d),
            "attn.hook_k": (b, p, h, d),
            "attn.hook_v": (b, p, h, d),
            "attn.hook_attn_scores": (b, h, p, p),
            "attn.hook_pattern": (b, h, p, p),
            "attn.hook_z": (b, p, h, d),
            "attn.hook_result": (b, p, h, m),
            "hook_attn_out": (b, p, m),
            "hook_resid_mid": (b, p, m),
            "ln2.hook_scale": (b, p, 1),
            "ln2.hook_normalized": (b, p, m),
            "mlp.hook_pre": (b, p, cfg.d_mlp),
            "mlp.hook_post": (b, p, cfg.d_mlp),
            "hook_mlp_out": (b, p, m),
            "hook_resid_post": (b, p, m),
        }
        shapes.update({f"blocks.{i}.{k}": v for k, v in block.items()})
    shapes.update(
        {
            "ln_final.hook_scale": (b, p, 1),
            "ln_final.hook_normalized": (b, p, m),
            "hook_out": (b, p, cfg.d_output),
        }
    )
    return shapes


def reference_forward(model: Transformer, x: torch.Tensor) -> torch.Tensor:
    """The same network from torch's own LayerNorm, SDPA and GELU, reading the weights."""
    cfg = model.cfg
    approximate = "tanh" if cfg.act_fn == "gelu_new" else "none"
    n_pos = x.shape[1]

    def ln(t, mod):
        return F.layer_norm(t, (cfg.d_model,), mod.w, mod.b, cfg.layer_norm_eps)

    resid = model.read_in(x) + model.W_pos[:n_pos]
    for block in model.blocks:
        a, h = block.attn, ln(resid, block.ln1)
        q, k, v = (
            torch.einsum("bpm,hmd->bhpd", h, w) + bias[:, None]
            for w, bias in ((a.W_Q, a.b_Q), (a.W_K, a.b_K), (a.W_V, a.b_V))
        )
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [b, h, p, d]
        resid = resid + torch.einsum("bhpd,hdm->bpm", z, a.W_O) + a.b_O
        h = ln(resid, block.ln2)
        post = F.gelu(h @ block.mlp.W_in + block.mlp.b_in, approximate=approximate)
        resid = resid + post @ block.mlp.W_out + block.mlp.b_out
    return model.read_out(ln(resid, model.ln_final))


# --- config -----------------------------------------------------------------------------


def test_config_defaults_and_validation():
    cfg = TransformerConfig(d_model=32, n_heads=4)
    assert (cfg.d_head, cfg.d_mlp) == (8, 128)
    assert TransformerConfig(d_model=32, n_heads=4, d_head=5, d_mlp=7).d_head == 5
    with pytest.raises(ValueError, match="divisible"):
        TransformerConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_heads"):
        TransformerConfig(n_heads=0)
    with pytest.raises(ValueError, match="act_fn"):
        TransformerConfig(act_fn="tanh")
    round_trip = TransformerConfig.from_dict(cfg.to_dict())
    assert round_trip == cfg and cfg.to_dict()["arch"] == "transformer"


# --- forward ----------------------------------------------------------------------------


@pytest.mark.parametrize("io", ["continuous", "tokens"])
@pytest.mark.parametrize("act_fn", ["gelu_new", "gelu"])
def test_forward_matches_independent_reference(io, act_fn):
    model = make_model(io, act_fn=act_fn)
    x = make_input(model)
    out = model(x)
    assert out.shape == (BATCH, N_POS, 3 if io == "continuous" else 11)
    torch.testing.assert_close(out, reference_forward(model, x), atol=1e-5, rtol=1e-5)


def test_unequal_d_head_and_d_mlp():
    model = make_model(d_head=5, d_mlp=40)
    x = make_input(model)
    torch.testing.assert_close(model(x), reference_forward(model, x), atol=1e-5, rtol=1e-5)
    _, cache = model.run_with_cache(x)
    assert cache["blocks.0.attn.hook_z"].shape == (BATCH, N_POS, N_HEADS, 5)
    assert cache["blocks.0.mlp.hook_post"].shape == (BATCH, N_POS, 40)


def test_too_long_and_wrong_inputs_raise():
    model = make_model()
    with pytest.raises(ValueError, match="n_ctx"):
        model(torch.randn(1, 17, 5))
    with pytest.raises(ValueError):
        model(torch.randn(1, 4, 6))


def test_causal_future_inputs_do_not_change_past_outputs():
    model = make_model("tokens")
    x = make_input(model)
    x2 = x.clone()
    x2[:, 4:] = (x2[:, 4:] + 1) % model.cfg.d_vocab
    out, out2 = model(x), model(x2)
    torch.testing.assert_close(out[:, :4], out2[:, :4])
    assert (out[:, 4:] - out2[:, 4:]).abs().amax(dim=(0, 2)).min() > 1e-4


def test_gradients_reach_every_parameter():
    model = make_model("tokens")
    model(make_input(model)).pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# --- hooks ------------------------------------------------------------------------------


@pytest.mark.parametrize("io", ["continuous", "tokens"])
def test_hook_names_and_cache_shapes_are_complete(io):
    model = make_model(io)
    expected = expected_hook_shapes(model.cfg, BATCH, N_POS)
    assert set(model.hook_dict) == set(expected)
    out, cache = model.run_with_cache(make_input(model))
    assert {k: tuple(v.shape) for k, v in cache.items()} == expected
    assert list(cache.keys())[0] == "hook_embed" and list(cache.keys())[-1] == "hook_out"
    torch.testing.assert_close(cache["hook_out"], out)


def test_cache_values_are_consistent():
    model = make_model()
    x = make_input(model)
    out, cache = model.run_with_cache(x)
    assert torch.equal(out, model(x))  # hooks change no numerics
    torch.testing.assert_close(cache["hook_pos_embed"][1], model.W_pos[:N_POS])
    torch.testing.assert_close(
        cache["blocks.0.hook_resid_pre"], cache["hook_embed"] + cache["hook_pos_embed"]
    )
    for i in range(N_LAYERS):

        def c(name: str, i: int = i) -> torch.Tensor:
            return cache[f"blocks.{i}.{name}"]

        attn = model.blocks[i].attn
        torch.testing.assert_close(c("attn.hook_result").sum(2) + attn.b_O, c("hook_attn_out"))
        per_head = torch.einsum("bphd,hdm->bphm", c("attn.hook_z"), attn.W_O)
        torch.testing.assert_close(c("attn.hook_result"), per_head)
        torch.testing.assert_close(c("hook_resid_mid"), c("hook_resid_pre") + c("hook_attn_out"))
        torch.testing.assert_close(c("hook_resid_post"), c("hook_resid_mid") + c("hook_mlp_out"))
        # scores are the scaled q.k with -inf above the diagonal; pattern is their softmax
        scores = torch.einsum("bqhd,bkhd->bhqk", c("attn.hook_q"), c("attn.hook_k"))
        scores = scores / math.sqrt(model.cfg.d_head)
        causal = torch.tril(torch.ones(N_POS, N_POS, dtype=torch.bool))
        torch.testing.assert_close(c("attn.hook_attn_scores")[..., causal], scores[..., causal])
        assert torch.isneginf(c("attn.hook_attn_scores")[..., ~causal]).all()
        pattern = c("attn.hook_pattern")
        torch.testing.assert_close(pattern.sum(-1), torch.ones(BATCH, N_HEADS, N_POS))
        assert (pattern[..., ~causal] == 0).all()
        # LayerNorm: normalized is pre-affine, zero mean and unit variance; scale its std
        normalized, scale = c("ln1.hook_normalized"), c("ln1.hook_scale")
        resid = c("hook_resid_pre")
        torch.testing.assert_close(
            normalized * scale, resid - resid.mean(-1, keepdim=True), atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(
            normalized.pow(2).mean(-1), torch.ones(BATCH, N_POS), atol=1e-3, rtol=1e-3
        )
        torch.testing.assert_close(
            c("mlp.hook_post"), F.gelu(c("mlp.hook_pre"), approximate="tanh")
        )


def test_modifying_a_hook_changes_the_output():
    model = make_model()
    x = make_input(model)
    clean = model(x)

    def double(act, hook):
        return 2 * act

    patched = model.run_with_hooks(x, fwd_hooks=[("blocks.1.mlp.hook_post", double)])
    assert (patched - clean).abs().max() > 1e-3
    # a hook that returns nothing and changes nothing leaves the output alone
    same = model.run_with_hooks(x, fwd_hooks=[("blocks.1.mlp.hook_post", lambda a, hook: None)])
    torch.testing.assert_close(same, clean)


@pytest.mark.parametrize(
    "name",
    [
        "blocks.0.hook_resid_pre",
        "blocks.0.attn.hook_v",
        "blocks.0.attn.hook_result",
        "blocks.1.mlp.hook_pre",
    ],
)
def test_patch_at_a_position_changes_only_that_and_later_positions(name):
    model = make_model()
    x = make_input(model)
    clean = model(x)
    t = 3

    def zero_at_t(act, hook):
        act[:, t] = 0.0
        return act

    patched = model.run_with_hooks(x, fwd_hooks=[(name, zero_at_t)])
    torch.testing.assert_close(patched[:, :t], clean[:, :t])
    assert (patched[:, t] - clean[:, t]).abs().max() > 1e-4


def test_ablating_one_head_result_equals_removing_its_contribution():
    model = make_model()
    x = make_input(model)
    _, cache = model.run_with_cache(x)
    head = 1

    def ablate(act, hook):
        act[:, :, head] = 0.0
        return act

    seen = []
    model.run_with_hooks(
        x,
        fwd_hooks=[
            ("blocks.1.attn.hook_result", ablate),
            ("blocks.1.hook_attn_out", lambda act, hook: seen.append(act.clone())),
        ],
    )
    expected = cache["blocks.1.hook_attn_out"] - cache["blocks.1.attn.hook_result"][:, :, head]
    torch.testing.assert_close(seen[0], expected, atol=1e-6, rtol=1e-5)


def test_backward_hook_on_hook_result_fires():
    model = make_model()
    seen = []
    model.blocks[0].attn.hook_result.add_hook(
        lambda grad, hook: seen.append(tuple(grad.shape)), dir="bwd"
    )
    model(make_input(model)).sum().backward()
    model.reset_hooks()
    assert seen == [(BATCH, N_POS, N_HEADS, D_MODEL)]


# --- nnsight ----------------------------------------------------------------------------


def test_nnsight_save_equals_the_cache():
    model = make_model("tokens")
    x = make_input(model)
    _, cache = model.run_with_cache(x)
    nm = NNsight(model)
    with nm.trace(x):
        pattern = nm.blocks[0].attn.hook_pattern.output.save()
        result = nm.blocks[1].attn.hook_result.output.save()
        resid = nm.blocks[1].hook_resid_post.output.save()
        out = nm.output.save()
    torch.testing.assert_close(pattern, cache["blocks.0.attn.hook_pattern"])
    torch.testing.assert_close(result, cache["blocks.1.attn.hook_result"])
    torch.testing.assert_close(resid, cache["blocks.1.hook_resid_post"])
    torch.testing.assert_close(out, cache["hook_out"])


def test_nnsight_overwrite_matches_the_transformer_lens_hook():
    model = make_model()
    x = make_input(model)
    head = 2

    def zero_head(act, hook):
        act[:, :, head] = 0.0
        return act

    tl_out = model.run_with_hooks(x, fwd_hooks=[("blocks.0.attn.hook_z", zero_head)])
    nm = NNsight(model)
    with nm.trace(x):
        nm.blocks[0].attn.hook_z.output[:, :, head] = 0.0
        nn_out = nm.output.save()
    torch.testing.assert_close(nn_out, tl_out)
    assert (nn_out - model(x)).abs().max() > 1e-4


# --- presets and registry ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name,count",
    [("tiny", 212_189), ("small", 701_381), ("medium", 2_419_717), ("big", 10_737_413)],
)
def test_preset_parameter_counts(name, count):
    model = build_model(name)
    assert isinstance(model, Transformer)
    d, n_layers = PRESETS[name]["d_model"], PRESETS[name]["n_layers"]
    formula = n_layers * (12 * d * d + 13 * d) + 2 * d + 251 * d + (57 * d + d) + (5 * d + 5)
    assert sum(p.numel() for p in model.parameters()) == formula == count


def test_build_model_from_name_and_dict():
    tiny = build_model("tiny")
    assert tiny.cfg.d_model == 72 and tiny.cfg.n_layers == 3
    assert (tiny.cfg.n_heads, tiny.cfg.d_head) == (6, 12)
    assert (tiny.cfg.d_in, tiny.cfg.d_out, tiny.cfg.n_ctx) == (57, 5, 251)
    assert tiny(torch.randn(2, 251, 57)).shape == (2, 251, 5)
    small = build_model({"arch": "transformer", "d_model": 32, "n_heads": 4})
    assert isinstance(small, Transformer)
    assert (small.cfg.d_head, small.cfg.d_mlp) == (8, 128)
    assert small(torch.randn(2, 6, 57)).shape == (2, 6, 5)


def test_init_scales():
    model = build_model({"arch": "transformer", "d_model": 64, "n_heads": 4, "n_layers": 8})
    std = model.cfg.init_std
    assert abs(model.blocks[0].attn.W_Q.std().item() - std) < 0.1 * std
    assert abs(model.blocks[0].mlp.W_out.std().item() - std / 4) < 0.1 * std / 4
    assert model.blocks[0].attn.b_O.abs().max() == 0 and (model.ln_final.w == 1).all()


def test_options_are_validated_and_round_trip():
    cfg = TransformerConfig(d_model=32, n_heads=4, positional="rotary", n_key_value_heads=2,
                            normalization="RMS", gated_mlp=True, act_fn="silu")  # fmt: skip
    assert (cfg.rotary_dim, cfg.n_groups, cfg.final_rms, cfg.positional_embedding_type) == (8, 2, True, "rotary")
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    assert TransformerConfig(d_model=32, n_heads=4).n_key_value_heads == 4
    bad = [
        ({"n_key_value_heads": 3}, "must divide n_heads"),
        ({"positional": "alibi"}, "positional must be one of"),
        ({"positional": "rotary", "rotary_dim": 3}, "even number"),
        ({"positional": "rotary", "rotary_dim": 10}, "even number"),
        ({"rotary_dim": 4}, "needs positional='rotary'"),
        ({"normalization": "batch"}, "normalization must be one of"),
        ({"attn_only": True, "gated_mlp": True}, "attn_only blocks have no MLP"),
        ({"tie_embeddings": True}, "tie_embeddings needs io='tokens'"),
        ({"qkv_bias": 1}, "qkv_bias must be True or False"),
        ({"positional": "rotary", "rotary_base": 0.0}, "rotary_base must be positive"),
    ]
    for fields, message in bad:
        with pytest.raises(ValueError, match=message):
            TransformerConfig(d_model=32, n_heads=4, **fields)


def test_biases_that_are_off_are_no_parameters_and_tied_embeddings_are_one():
    model = build_model("transformer", d_model=16, n_heads=2, qkv_bias=False, attn_out_bias=False,
                        mlp_bias=False, io="tokens", d_vocab=9, tie_embeddings=True)  # fmt: skip
    names = {n for n, _ in model.named_parameters()}
    assert not any(n.rsplit(".", 1)[-1].startswith("b_") for n in names)
    assert model.read_out.proj.weight is model.read_in.embed.weight
    assert "read_out.proj.weight" not in names  # counted once
    x = torch.randint(0, 9, (2, 5))
    assert model(x).shape == (2, 5, 9)
    assert model.accumulated_bias(2, mlp_input=False).abs().max() == 0


def test_rotary_attention_scores_depend_on_relative_positions_only():
    """Rotating q and k by their positions: a score depends on q_pos - k_pos, not on both."""
    from mechlab.models.transformer import Rotary

    rot = Rotary(8, 10000.0)
    q = torch.randn(1, 1, 1, 8).expand(1, 6, 1, 8)
    k = torch.randn(1, 1, 1, 8).expand(1, 6, 1, 8)
    scores = torch.einsum("bqhd,bkhd->qk", rot(q), rot(k))
    torch.testing.assert_close(scores[3, 1], scores[5, 3])
    torch.testing.assert_close(scores.diagonal(), torch.full((6,), float((q[0, 0] * k[0, 0]).sum())))
    assert not torch.allclose(scores[3, 1], scores[3, 2])
    x = torch.randn(1, 5, 2, 8)
    partial = Rotary(4, 10000.0)(x)  # dimensions 4.. pass unchanged, position 0 is not rotated
    assert torch.equal(partial[..., 4:], x[..., 4:]) and torch.equal(partial[:, 0], x[:, 0])
    assert not torch.allclose(partial[:, 1:, :, :4], x[:, 1:, :, :4])
