"""Tests of mechlab.models.transformer_config: the names it holds (and those of the
block's parts: norms, rotary, sublayers) are the ones mechlab.models.transformer has always
exported, and the registry finds them there."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mechlab.models import (
    build_model,
    make_config,
    norms,
    rotary,
    sublayers,
    transformer,
    transformer_config,
)


@pytest.mark.parametrize(
    "name",
    ["ACT_FNS", "NORMALIZATIONS", "POSITIONALS", "PRESETS", "ROPE_SCALINGS", "TransformerConfig"],
)
def test_every_config_name_is_re_exported_as_the_same_object(name):
    assert getattr(transformer, name) is getattr(transformer_config, name)
    assert name in transformer.__all__


def _defined_names(module) -> set[str]:
    """Public names a module's own source binds at top level."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    names |= {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    names |= {
        n.target.id
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    return {name for name in names if not name.startswith("_")}


def test_transformer_all_lists_exactly_its_public_names_the_configs_and_the_parts():
    parts = (transformer_config, norms, rotary, sublayers)
    assert set(transformer.__all__) == _defined_names(transformer).union(
        *(_defined_names(part) for part in parts)
    )
    for part in (norms, rotary, sublayers):  # each part's own names, re-exported as themselves
        assert set(part.__all__) == _defined_names(part)
        assert all(getattr(transformer, name) is getattr(part, name) for name in part.__all__)
    assert _defined_names(transformer_config) == {
        "ACT_FNS",
        "LAYER_TYPES",
        "NORMALIZATIONS",
        "POSITIONALS",
        "PRESETS",
        "QK_NORM_OVER",
        "ROPE_SCALINGS",
        "TransformerConfig",
    }


def test_the_registry_builds_every_transformer_preset_from_it():
    for preset in transformer_config.PRESETS:
        cfg = make_config(preset)
        assert type(cfg) is transformer_config.TransformerConfig and cfg.arch == "transformer"
    model = build_model("st_transformer_small", io="tokens", d_vocab=7)
    assert type(model.cfg) is transformer.TransformerConfig


def test_a_bad_option_is_refused_with_its_choices():
    with pytest.raises(
        ValueError, match=r"act_fn must be one of \('gelu_new', 'gelu', 'relu', 'silu'\)"
    ):
        transformer_config.TransformerConfig(act_fn="tanh")
    with pytest.raises(ValueError, match="positional must be one of"):
        transformer_config.TransformerConfig(positional="alibi")


def test_the_imported_architectures_options_are_checked():
    TC = transformer_config.TransformerConfig
    rotary = {"positional": "rotary", "d_model": 8, "n_heads": 2}
    with pytest.raises(ValueError, match="rope_type is one of .'linear', 'llama3', 'yarn', 'longrope'."):
        TC(**rotary, rotary_scaling={"rope_type": "proportional"})
    longrope = {"rope_type": "longrope", "short_factor": [1.0, 2.0], "long_factor": [1.0, 3.0],
                "original_max_position_embeddings": 4, "attention_factor": 1.1}  # fmt: skip
    assert TC(**rotary, rotary_scaling=longrope).rotary_scaling == longrope  # d_head 4: two pairs
    with pytest.raises(ValueError, match=r"rotary_scaling\['long_factor'\] must be a list of rotary_dim / 2 = 2 "
                                         r"positive numbers, got 3 value\(s\)"):  # fmt: skip
        TC(**rotary, rotary_scaling={**longrope, "long_factor": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match=r"short_factor.*got 2 value\(s\), not all positive numbers"):
        TC(**rotary, rotary_scaling={**longrope, "short_factor": [1.0, 0.0]})
    with pytest.raises(ValueError, match=r"takes the keys \['factor'\], got \['rope_type'\]"):
        TC(**rotary, rotary_scaling={"rope_type": "linear"})
    with pytest.raises(ValueError, match="high_freq_factor > low_freq_factor"):
        TC(**rotary, rotary_scaling={"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
                                     "high_freq_factor": 1, "original_max_position_embeddings": 64})  # fmt: skip
    with pytest.raises(ValueError, match="rotary_adjacent_pairs needs positional='rotary'"):
        TC(rotary_adjacent_pairs=True)
    with pytest.raises(ValueError, match="clip_qkv must be a positive number or None, got 0"):
        TC(clip_qkv=0)
    with pytest.raises(ValueError, match="qk_norm must be True or False"):
        TC(qk_norm=1)
    cfg = TC(**rotary, rotary_scaling={"rope_type": "linear", "factor": 2.0}, qk_norm=True,
             rotary_adjacent_pairs=True, clip_qkv=3.0, normalization="LNPre")  # fmt: skip
    assert type(cfg).from_dict(cfg.to_dict()) == cfg  # what a checkpoint stores


def test_the_post_norm_architectures_options_are_checked():
    """OLMo 2's and Gemma's options: each bad value named in one line; a checkpoint keeps them."""
    TC = transformer_config.TransformerConfig
    rotary = {"positional": "rotary", "d_model": 8, "n_heads": 2, "n_layers": 2}
    for name in ("embed_scale", "attn_scale", "attn_softcap", "final_softcap"):
        with pytest.raises(ValueError, match=f"{name} must be a positive number or None, got -1"):
            TC(**{name: -1})
    with pytest.raises(ValueError, match="sliding_window must be a positive integer or None, got 2.5"):
        TC(sliding_window=2.5)
    with pytest.raises(ValueError, match="layer_types must be None or a list of n_layers=2 names"):
        TC(**rotary, sliding_window=4, layer_types=["sliding_attention"])
    with pytest.raises(ValueError, match="names a sliding_attention layer: set sliding_window"):
        TC(**rotary, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ValueError, match="rotary_base_local needs positional='rotary' and a sliding_window"):
        TC(**rotary, rotary_base_local=10.0)
    with pytest.raises(ValueError, match="qk_norm_over needs qk_norm=True"):
        TC(qk_norm_over="all")
    with pytest.raises(ValueError, match=r"qk_norm_over must be one of \('head', 'all'\)"):
        TC(qk_norm=True, qk_norm_over="group")
    with pytest.raises(ValueError, match="post_norms must be True or False"):
        TC(post_norms=None)
    cfg = TC(**rotary, normalization="RMS", pre_norms=False, post_norms=True, qk_norm=True,
             qk_norm_over="all", embed_scale=2.0, attn_scale=3.0, attn_softcap=5.0, final_softcap=9.0,
             sliding_window=3, layer_types=["sliding_attention", "full_attention"],
             rotary_base_local=10.0)  # fmt: skip
    assert type(cfg).from_dict(cfg.to_dict()) == cfg
    assert [cfg.sliding(i) for i in range(2)] == [True, False]
