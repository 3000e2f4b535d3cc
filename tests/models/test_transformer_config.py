"""Tests of mechlab.models.transformer_config: the names it holds are the ones
mechlab.models.transformer has always exported, and the registry finds them there."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mechlab.models import build_model, make_config, transformer, transformer_config


@pytest.mark.parametrize(
    "name", ["ACT_FNS", "NORMALIZATIONS", "POSITIONALS", "PRESETS", "TransformerConfig"]
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


def test_transformer_all_lists_exactly_its_public_names_and_the_configs():
    assert set(transformer.__all__) == _defined_names(transformer) | _defined_names(
        transformer_config
    )
    assert _defined_names(transformer_config) == {
        "ACT_FNS",
        "NORMALIZATIONS",
        "POSITIONALS",
        "PRESETS",
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
