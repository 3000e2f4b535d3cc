"""Tests of mechlab.prune.edge_graph: the graph as data (its networkx view, its summary)."""

from __future__ import annotations

import itertools

import networkx as nx

from mechlab.prune.graph import transformer_edge_count, transformer_graph


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
