"""hook_axes, pos_dim and is_step_hook against the real activation shapes of every family."""

import pytest
import torch

from mechlab.models import build_model

torch.set_num_threads(1)

CONFIGS = {
    "transformer": {"arch": "transformer", "d_model": 8, "n_heads": 2, "d_mlp": 12},
    "lstm": {"arch": "lstm", "d_model": 8, "d_hidden": 6},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 8, "d_state": 5},
    "mamba": {"arch": "mamba", "d_model": 8, "d_state": 3, "expand": 2},
    # the options imported models need: rotary, RMSNorm, SwiGLU, grouped key/value heads
    "transformer-llama": {
        "arch": "transformer", "d_model": 8, "n_heads": 4, "n_key_value_heads": 2, "d_mlp": 12,
        "positional": "rotary", "normalization": "RMS", "gated_mlp": True, "act_fn": "silu",
    },
    "transformer-neox": {
        "arch": "transformer", "d_model": 8, "n_heads": 2, "d_mlp": 12, "positional": "rotary",
        "rotary_dim": 2, "parallel_attn_mlp": True,
    },
    "transformer-attn-only": {"arch": "transformer", "d_model": 8, "n_heads": 2, "attn_only": True},
    # Qwen3's query/key norms (head_dim independent of d_model / n_heads), OLMo's weightless
    # LayerNorms and clip, GPT-J's interleaved rotary
    "transformer-qwen3": {
        "arch": "transformer", "d_model": 8, "n_heads": 4, "n_key_value_heads": 2, "d_head": 6,
        "positional": "rotary", "normalization": "RMS", "qk_norm": True,
    },  # fmt: skip
    "transformer-olmo-gptj": {
        "arch": "transformer", "d_model": 8, "n_heads": 2, "normalization": "LNPre", "clip_qkv": 1.0,
        "positional": "rotary", "rotary_dim": 2, "rotary_adjacent_pairs": True,
    },  # fmt: skip
    # OLMo 2's post-norms without pre-norms and query/key norms over every head; Gemma's
    # pre- and post-norms, soft-caps, sliding layer and per-head query/key norms
    "transformer-olmo2": {
        "arch": "transformer", "d_model": 8, "n_heads": 4, "n_key_value_heads": 2, "d_head": 6,
        "positional": "rotary", "normalization": "RMS", "qk_norm": True, "qk_norm_over": "all",
        "pre_norms": False, "post_norms": True,
    },  # fmt: skip
    "transformer-gemma": {
        "arch": "transformer", "d_model": 8, "n_heads": 2, "positional": "rotary", "normalization": "RMS",
        "qk_norm": True, "post_norms": True, "attn_softcap": 5.0, "final_softcap": 5.0, "sliding_window": 3,
        "layer_types": ["sliding_attention", "full_attention"], "rotary_base_local": 10.0,
    },  # fmt: skip
}
IO = {"n_layers": 2, "d_in": 7, "d_out": 3, "n_ctx": 10}


def axis_sizes(cfg, batch: int, n_pos: int) -> dict[str, int]:
    """Size of every axis name, from the config (independent of the model code)."""
    sizes = {"batch": batch, "pos": n_pos, "query_pos": n_pos, "key_pos": n_pos, "one": 1}
    sizes |= {"d_model": cfg.d_model, "d_output": cfg.d_out}
    for field in ("d_head", "d_mlp", "d_hidden", "d_state"):
        if hasattr(cfg, field):
            sizes[field] = getattr(cfg, field)
    if hasattr(cfg, "n_heads"):
        sizes["head"] = cfg.n_heads
        sizes["kv_head"] = cfg.n_key_value_heads
    if cfg.arch == "dense_ssm":
        sizes["d_state_in"] = cfg.d_state
    if cfg.arch == "mamba":
        sizes["d_inner"] = cfg.expand * cfg.d_model
    return sizes


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_hook_axes_match_real_shapes(family):
    model = build_model({**CONFIGS[family], **IO})
    sizes = axis_sizes(model.cfg, batch=2, n_pos=6)
    shapes = model.hook_shapes(batch=2, n_pos=6)
    assert set(shapes) == set(model.hook_dict)
    for name, shape in shapes.items():
        axes = model.hook_axes(name)
        assert tuple(sizes[a] for a in axes) == shape, name
        assert axes[0] == "batch"
        assert axes[model.pos_dim(name)] in ("pos", "query_pos")


def test_hook_axes_examples():
    model = build_model({**CONFIGS["transformer"], **IO})
    assert model.hook_axes("blocks.1.attn.hook_pattern") == (
        "batch",
        "head",
        "query_pos",
        "key_pos",
    )
    assert model.pos_dim("blocks.1.attn.hook_pattern") == 2
    assert model.hook_axes("blocks.0.attn.hook_z") == ("batch", "pos", "head", "d_head")
    assert model.hook_axes("ln_final.hook_scale") == ("batch", "pos", "one")
    assert model.pos_dim("blocks.0.attn.hook_z") == 1
    mamba = build_model({**CONFIGS["mamba"], **IO})
    assert mamba.hook_axes("blocks.1.mixer.hook_ssm_state") == (
        "batch",
        "pos",
        "d_inner",
        "d_state",
    )
    ssm = build_model({**CONFIGS["dense_ssm"], **IO})
    assert ssm.hook_axes("blocks.0.ssm.hook_A") == ("batch", "pos", "d_state", "d_state_in")


STEP = {
    "transformer": set(),
    "lstm": {f"blocks.{i}.lstm.hook_{g}" for i in range(2) for g in "ifgoch"},
    "dense_ssm": {f"blocks.{i}.ssm.hook_{n}" for i in range(2) for n in "Ah"},
    "mamba": {f"blocks.{i}.mixer.hook_ssm_state" for i in range(2)},
}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_is_step_hook(family):
    model = build_model({**CONFIGS[family], **IO})
    assert {n for n in model.hook_dict if model.is_step_hook(n)} == STEP[family.split("-")[0]]


@pytest.mark.parametrize("method", ["hook_axes", "is_step_hook", "pos_dim"])
def test_unknown_hook_name_is_refused(method):
    model = build_model({**CONFIGS["lstm"], **IO})
    with pytest.raises(ValueError, match=r"unknown hook name 'blocks.5.lstm.hook_h'.*mechlab info"):
        getattr(model, method)("blocks.5.lstm.hook_h")
