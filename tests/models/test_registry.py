"""Tests of mechlab.models.registry's family contract: every registered family builds, its
edge graph builds (and rebuilds from its summary), and its masked forward with every mask
open is its plain forward (every mask shut: its forward on the corrupted input); a toy
family registered through the registry alone is built, pruned and batched from its entry."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
import torch

from mechlab.models.dense_ssm import DenseSSM, DenseSSMConfig
from mechlab.models.registry import (
    FAMILIES,
    Family,
    build_model,
    ensemble_families,
    get_family,
    graph_kind,
    make_config,
    prunable_families,
    recurrent_families,
    register_family,
    unregister_family,
)
from mechlab.prune.forward import WindowedAblation, masked_forward, window_states, writer_outputs
from mechlab.prune.graph import build_graph, graph_from_summary, pruning_graph

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = {"n_heads": 2, "d_state": 4, "d_mlp": 32}  # the sizes a family's config has of these
WINDOWS = (("a", 0, 4), ("b", 4, 7), ("c", 7, 9))


@dataclasses.dataclass
class ToyConfig(DenseSSMConfig):
    """A dense SSM under another name: a family no layer above the models knows by name."""

    arch: ClassVar[str] = "toy_ssm"


class Toy(DenseSSM):
    """The toy family's model."""


@dataclasses.dataclass
class PlainConfig(DenseSSMConfig):
    """A family registered with its three names only (not pruned)."""

    arch: ClassVar[str] = "toy_plain"


class Plain(DenseSSM):
    """The plain toy family's model."""


@pytest.fixture
def toy_family():
    """The toy family, registered (and removed again) through the registry alone."""
    register_family("toy_ssm", Family(__name__, "ToyConfig", "Toy", graph="recurrent", mixer="ssm"))
    try:
        yield "toy_ssm"
    finally:
        unregister_family("toy_ssm")


def small_model(arch: str, seed: int = 0):
    known = {f.name for f in dataclasses.fields(type(make_config(arch)))}
    torch.manual_seed(seed)
    fields = {"d_model": 16, "n_layers": 2, "d_in": 5, "d_out": 3, "n_ctx": 16}
    return build_model(arch, **fields, **{k: v for k, v in SMALL.items() if k in known}).eval()


def inputs(seed: int) -> torch.Tensor:
    return torch.randn(3, 9, 5, generator=torch.Generator().manual_seed(seed))


def check_contract(arch: str) -> None:
    """What pruning and training need of a family, checked against its plain forward."""
    family = get_family(arch)
    model = small_model(arch)
    assert model.cfg.arch == arch  # the config class the entry names is the family's
    assert isinstance(family.ensemble, bool)
    if not family.prunable:
        with pytest.raises(ValueError, match=rf"^edge pruning supports .* not '{arch}'$"):
            build_graph(model)
        return
    graph = build_graph(model)
    assert graph.n_edges > 0 and graph_kind(arch) == family.graph
    assert graph_from_summary(graph.summary()).summary() == graph.summary()
    x, x_corrupt = inputs(1), inputs(2)
    ablated = writer_outputs(model, x_corrupt)
    with torch.no_grad():
        clean, corrupt = model(x), model(x_corrupt)
        ones = masked_forward(model, graph, x, ablated, torch.ones(graph.n_edges))
        zeros = masked_forward(model, graph, x, ablated, torch.zeros(graph.n_edges))
    torch.testing.assert_close(ones, clean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(zeros, corrupt, atol=1e-5, rtol=1e-5)
    assert (clean - corrupt).abs().max() > 1e-2  # the two checks are not one
    if family.recurrent:  # position windows: the mixer run window by window from its state
        windowed = pruning_graph(model, WINDOWS)
        assert windowed.windows and windowed.n_edges > graph.n_edges
        states = window_states(model, x_corrupt, WINDOWS)
        windowed_ablation = WindowedAblation(ablated, states)
        with torch.no_grad():
            ones = masked_forward(model, windowed, x, windowed_ablation, torch.ones(windowed.n_edges))
            zeros = masked_forward(model, windowed, x, windowed_ablation, torch.zeros(windowed.n_edges))
        torch.testing.assert_close(ones, clean, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(zeros, corrupt, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_every_registered_family_keeps_its_contract(arch):
    check_contract(arch)


def test_the_built_in_entries_say_what_the_layers_above_read():
    assert list(FAMILIES) == ["transformer", "lstm", "dense_ssm", "mamba"]
    assert prunable_families() == ("transformer", "lstm", "dense_ssm", "mamba")
    assert recurrent_families() == ("lstm", "dense_ssm", "mamba")
    assert ensemble_families() == ("transformer", "lstm", "dense_ssm")
    assert {a: get_family(a).mixer for a in recurrent_families()} == {"lstm": "lstm", "dense_ssm": "ssm", "mamba": "mixer"}
    assert FAMILIES["lstm"][0] == "mechlab.models.lstm" and FAMILIES["lstm"][2] == "LSTM"  # indexable as before
    from mechlab.prune.graph import ARCHS, RECURRENT_ARCHS
    from mechlab.train.dispatch import ENSEMBLE_FAMILIES

    assert ARCHS == prunable_families() and RECURRENT_ARCHS == recurrent_families()
    assert ENSEMBLE_FAMILIES == ensemble_families()


def test_a_toy_family_is_pruned_from_its_registry_entry_alone(toy_family):
    assert toy_family in prunable_families() and toy_family in recurrent_families()
    assert toy_family not in ensemble_families()  # the default: one trial after another
    check_contract(toy_family)
    # its masked forward is the dense SSM's, whose weights it shares
    toy, ssm = small_model(toy_family, seed=3), small_model("dense_ssm", seed=3)
    assert isinstance(toy, Toy) and type(toy.cfg) is ToyConfig
    x = inputs(4)
    ablated = writer_outputs(ssm, inputs(5))
    z = torch.rand(build_graph(ssm).n_edges, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(masked_forward(toy, build_graph(toy), x, ablated, z),
                                   masked_forward(ssm, build_graph(ssm), x, ablated, z))  # fmt: skip


def test_a_family_given_as_three_names_builds_but_is_not_pruned(toy_family):
    register_family("toy_plain", (__name__, "PlainConfig", "Plain"))
    try:
        entry = get_family("toy_plain")
        assert entry.graph is None and not entry.prunable and not entry.ensemble
        assert "toy_plain" not in prunable_families()
        check_contract("toy_plain")  # builds; its graph is refused
        with pytest.raises(ValueError, match=r"^edge pruning supports \('transformer', 'lstm', 'dense_ssm', "
                                             r"'mamba', 'toy_ssm'\), not 'toy_plain'$"):  # fmt: skip
            build_graph(small_model("toy_plain"))
    finally:
        unregister_family("toy_plain")


def test_an_inconsistent_entry_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^family 'x': unknown graph 'tree'; choose one of"):
        register_family("x", Family("m", "C", "M", graph="tree"))
    with pytest.raises(ValueError, match=r"^family 'x': a recurrent graph needs mixer="):
        register_family("x", Family("m", "C", "M", graph="recurrent"))
    with pytest.raises(ValueError, match=r"^family 'x': mixer= is for recurrent graphs"):
        register_family("x", Family("m", "C", "M", graph="transformer", mixer="ssm"))
    with pytest.raises(ValueError, match=r"^family 'lstm' is registered already$"):
        register_family("lstm", get_family("lstm"))
    with pytest.raises(ValueError, match=r"^unknown architecture 'x'; choose one of \['dense_ssm', 'lstm'"):
        get_family("x")
    assert "x" not in FAMILIES and graph_kind("x") is None and graph_kind(None) is None
