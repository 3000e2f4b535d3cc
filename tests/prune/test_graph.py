"""Tests of mechlab.prune.graph: writers, readers, edges and the closed-form edge counts."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from mechlab.models.dense_ssm import DenseSSMConfig
from mechlab.models.lstm import LSTMConfig
from mechlab.models.mamba import MambaConfig
from mechlab.models.transformer import TransformerConfig
from mechlab.prune.graph import (
    build_graph,
    component_of,
    parse_component,
    recurrent_edge_count,
    recurrent_graph,
    transformer_edge_count,
    transformer_graph,
)


def reads(writer: str, reader: str) -> bool:
    """The edge rule written out independently of the graph builder."""
    wkind, wlayer, _ = parse_component(writer)
    rcomp = component_of(reader)
    rkind, rlayer, _ = parse_component(rcomp)
    if rkind == "out":
        return True
    if wkind in ("embed", "pos"):
        return True
    if rkind == "head":  # heads read strictly earlier layers
        return wlayer < rlayer
    if rkind == "mlp":  # MLP l reads earlier layers and the heads of its own layer
        return wlayer < rlayer or (wlayer == rlayer and wkind == "head")
    if rkind == "mixer":
        return wlayer < rlayer
    raise AssertionError(reader)


def test_gpt2_small_numbers_from_the_paper():
    g = transformer_graph(12, 12)
    assert g.n_writers == 158  # 144 heads + 12 MLPs + token and position embeddings
    assert g.n_edges == 32936
    assert transformer_edge_count(12, 12) == 32936


@pytest.mark.parametrize("n_layers,n_heads", [(1, 1), (1, 4), (2, 2), (3, 6), (5, 3), (12, 8)])
def test_transformer_edge_count_formula(n_layers, n_heads):
    g = transformer_graph(n_layers, n_heads)
    assert g.n_edges == transformer_edge_count(n_layers, n_heads)
    assert g.n_writers == 2 + n_layers * (n_heads + 1)
    assert g.n_readers == n_layers * (3 * n_heads + 1) + 1
    # the formula is not symmetric in L and H: a mix-up of n_layers and n_heads is caught
    if n_layers != n_heads:
        assert transformer_edge_count(n_heads, n_layers) != g.n_edges or n_layers * n_heads == 1


@pytest.mark.parametrize("n_layers,n_heads", [(1, 2), (2, 2), (3, 4)])
def test_transformer_edges_follow_the_rule(n_layers, n_heads):
    g = transformer_graph(n_layers, n_heads)
    expected = {(w.name, r.name) for w in g.writers for r in g.readers if reads(w.name, r.name)}
    assert set(g.edges) == expected
    assert len(g.edges) == len(expected)  # no duplicates
    # every reader's writers are a prefix of the writer order, as the masked pass assumes
    for r in g.readers:
        start = g.edge_offset[r.name]
        assert [w for w, _ in g.edges[start : start + r.n_upstream]] == [
            w.name for w in g.writers[: r.n_upstream]
        ]


@pytest.mark.parametrize("arch", ["lstm", "dense_ssm", "mamba"])
@pytest.mark.parametrize("n_layers", [1, 2, 3, 6])
def test_recurrent_edge_count_formula(arch, n_layers):
    g = recurrent_graph(arch, n_layers)
    assert g.n_edges == recurrent_edge_count(n_layers) == (n_layers + 1) * (n_layers + 2) // 2
    assert g.n_writers == n_layers + 1  # embed + every layer
    expected = {(w.name, r.name) for w in g.writers for r in g.readers if reads(w.name, r.name)}
    assert set(g.edges) == expected


def test_build_graph_from_models_and_configs():
    t = TransformerConfig(d_model=8, n_layers=3, n_heads=2, d_in=3, d_out=2, n_ctx=8)
    assert build_graph(t).n_edges == transformer_edge_count(3, 2)
    for cfg in (
        LSTMConfig(d_model=8, n_layers=2, d_in=3, d_out=2, n_ctx=8),
        DenseSSMConfig(d_model=8, n_layers=2, d_state=3, d_in=3, d_out=2, n_ctx=8),
        MambaConfig(d_model=8, n_layers=2, d_state=3, d_in=3, d_out=2, n_ctx=8),
    ):
        g = build_graph(cfg)
        assert g.arch == cfg.arch and g.n_edges == 6
    with pytest.raises(TypeError):
        build_graph("transformer")


def test_networkx_graph():
    g = transformer_graph(2, 3)
    nxg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(nxg)
    assert nxg.number_of_nodes() == g.n_writers + g.n_readers
    maskable = [e for e in nxg.edges(data=True) if not e[2]["internal"]]
    assert len(maskable) == g.n_edges
    # internal edges connect each q/k/v/MLP reader to its component
    internal = {(u, v) for u, v, d in nxg.edges(data=True) if d["internal"]}
    assert ("a1.h2.k", "a1.h2") in internal and ("m0.in", "m0") in internal
    assert len(internal) == 2 * (3 * 3 + 1)
    # embed reaches out through a head of layer 1
    assert nx.has_path(nxg, "embed", "out")
    assert nx.has_path(nxg, "a0.h0", "a1.h1")
    assert not nx.has_path(nxg, "a1.h0", "a0.h0")
    # heads of the same layer never read each other
    for h1, h2 in itertools.product(range(3), repeat=2):
        for kind in "qkv":
            assert not nxg.has_edge(f"a1.h{h1}", f"a1.h{h2}.{kind}")


def test_summary_counts_embedding_nodes():
    s = transformer_graph(3, 6).summary()
    assert s == {"arch": "transformer", "n_layers": 3, "n_heads": 6, "n_writers": 23,
                 "n_readers": 58, "n_edges": transformer_edge_count(3, 6)}  # fmt: skip
