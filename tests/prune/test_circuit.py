"""Tests of mechlab.prune.circuit: JSON round trip, networkx view, plot and HTML, overlap
arithmetic, seed stability, and the metrics of hand-chosen circuits."""

from __future__ import annotations

import json

import networkx as nx
import pytest
import torch

from mechlab.models import build_model
from mechlab.prune.circuit import Circuit, overlap, seed_stability
from mechlab.prune.evaluate import circuit_edge_mask, evaluate_circuit
from mechlab.prune.graph import build_graph
from mechlab.traces import PruneData, Traces
from mechlab.viz import circuit_figure, write_html

GRAPH = {"arch": "transformer", "n_layers": 2, "n_heads": 2}


def make(edges, target="1-after", **meta) -> Circuit:
    return Circuit.from_edges(
        {e: 1.0 for e in edges}, metadata={"target": target, "graph": GRAPH, **meta}
    )


A = make([("embed", "a1.h0.v"), ("a1.h0", "out"), ("pos", "a0.h1.k"), ("a0.h1", "a1.h0.q")])
B = make([("embed", "a1.h0.v"), ("a1.h0", "out"), ("m0", "out")], target="2-after")


def test_nodes_are_components_with_embeddings():
    assert A.nodes == ["embed", "pos", "a0.h1", "a1.h0", "out"]
    assert A.n_nodes == 5 and A.n_edges == 4
    assert B.nodes == ["embed", "m0", "a1.h0", "out"]


def test_overlap_arithmetic():
    o = overlap(A, B)
    assert o.n_edges_a == 4 and o.n_edges_b == 3
    assert o.shared_edges == [("a1.h0", "out"), ("embed", "a1.h0.v")]
    assert o.jaccard == pytest.approx(2 / 5)
    assert o.overlap_coefficient == pytest.approx(2 / 3)
    assert o.shared_nodes == ["embed", "a1.h0", "out"]
    assert o.node_jaccard == pytest.approx(3 / 6)
    assert overlap(A, A).jaccard == 1.0
    disjoint = make([("m0", "m1.in")])
    assert overlap(A, disjoint).jaccard == 0.0 and overlap(A, disjoint).overlap_coefficient == 0.0
    assert overlap(A, B).to_dict()["n_shared_edges"] == 2


def test_overlap_refuses_different_graphs():
    other = Circuit.from_edges(
        {("embed", "out"): 1.0}, metadata={"graph": {"arch": "lstm", "n_layers": 2, "n_heads": 0}}
    )
    with pytest.raises(ValueError, match="different graphs"):
        overlap(A, other)
    grouped = {"arch": "transformer", "n_layers": 2, "n_heads": 4}
    llama = Circuit.from_edges({("embed", "out"): 1.0}, metadata={"graph": {**grouped, "n_key_value_heads": 2}})
    gpt2 = Circuit.from_edges({("embed", "out"): 1.0}, metadata={"graph": grouped})
    with pytest.raises(ValueError, match="different graphs"):
        overlap(llama, gpt2)
    assert overlap(llama, llama).jaccard == 1.0


def test_seed_stability_means():
    a1 = make([("embed", "out"), ("pos", "out")])
    a2 = make([("embed", "out"), ("m0", "out")])
    a3 = make([("embed", "out"), ("pos", "out")])
    b1 = make([("m1", "out")], target="2-after")
    b2 = make([("m1", "out"), ("m0", "out")], target="2-after")
    s = seed_stability({"1-after": [a1, a2, a3], "2-after": [b1, b2]})
    # within 1-after: J(a1,a2)=1/3, J(a1,a3)=1, J(a2,a3)=1/3 -> 5/9; within 2-after: 1/2
    assert s.within["1-after"] == pytest.approx(5 / 9)
    assert s.within["2-after"] == pytest.approx(1 / 2)
    # across: a1-b1 0, a1-b2 0, a2-b1 0, a2-b2 1/3, a3-b1 0, a3-b2 0 -> 1/18
    assert s.across["1-after vs 2-after"] == pytest.approx(1 / 18)
    assert s.across_below_within
    assert "lower than the seed-to-seed agreement" in s.summary()
    with pytest.raises(ValueError, match=">= 2"):
        seed_stability({"1-after": [a1]})


def test_json_round_trip(tmp_path):
    c = Circuit.from_edges(
        {("embed", "a1.h0.v"): 0.75, ("a1.h0", "out"): 1.0},
        metadata={
            "target": "1-after",
            "sparsity_asked": 0.9,
            "metrics": {"faithfulness": 0.5},
            "graph": GRAPH,
        },
        log_alpha={("embed", "a1.h0.v"): 1.25, ("a1.h0", "out"): 7.5, ("pos", "out"): -3.0},
    )
    path = c.to_json(tmp_path / "sub" / "c.json")
    assert [p.name for p in path.parent.iterdir()] == ["c.json"]  # no temporary file left
    back = Circuit.from_json(path)
    assert back == c
    assert json.loads(path.read_text())["format"] == "mechlab-circuit"
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a mechlab circuit"):
        Circuit.from_json(tmp_path / "bad.json")


def test_to_networkx_follows_paths():
    g = A.to_networkx()
    assert (
        g.number_of_edges() == 4 + 3
    )  # kept edges + internal a1.h0.v/q -> a1.h0, a0.h1.k -> a0.h1
    assert g.edges["embed", "a1.h0.v"]["score"] == 1.0
    assert g.edges["a1.h0.v", "a1.h0"]["internal"]
    assert nx.has_path(g, "embed", "out")
    assert nx.has_path(g, "pos", "out")  # pos -> a0.h1.k -> a0.h1 -> a1.h0.q -> a1.h0 -> out


def test_plot_and_html(tmp_path):
    fig = circuit_figure(A)
    names = [t.name for t in fig.data]
    assert {"→ v", "→ q", "→ k", "→ out", "edge (hover)", "component in the circuit",
            "component not in the circuit", "q port (query input)"} <= set(names)  # every mark named
    hover = next(t for t in fig.data if t.name == "edge (hover)")
    assert len(hover.x) == A.n_edges and "score 1.000" in hover.hovertext[0]
    pruned = next(t for t in fig.data if t.name == "component not in the circuit")
    assert "m1" in pruned.hovertext[-1] or any("m1" in h for h in pruned.hovertext)
    path = write_html(circuit_figure(A), tmp_path / "a.html")
    text = path.read_text()
    assert "plotly" in text and len(text) > 1_000_000  # plotly.js embedded: works offline


def test_recurrent_plot():
    c = Circuit.from_edges({("embed", "l0.in"): 1.0, ("l0", "out"): 0.5},
                           metadata={"graph": {"arch": "lstm", "n_layers": 2, "n_heads": 0}})  # fmt: skip
    fig = circuit_figure(c)
    inside = next(t for t in fig.data if t.name == "component in the circuit")
    assert len(inside.x) == 3
    # named on a white ground, so that edges passing under a label do not cross its text
    labels = [a for a in fig.layout.annotations if a.name == "node label"]
    assert [a.text for a in labels] == ["embed", "l0", "out"] and all(a.bgcolor for a in labels)


def test_metrics_of_full_and_empty_circuits():
    torch.manual_seed(0)
    model = build_model(
        "transformer", d_model=16, n_layers=2, n_heads=2, d_in=5, d_out=3, n_ctx=16
    ).eval()
    graph = build_graph(model)
    g = torch.Generator().manual_seed(0)

    def traces(n):
        return Traces(
            torch.randn(n, 6, 5, generator=g),
            torch.randn(n, 6, 5, generator=g),
            torch.randn(n, 6, 3, generator=g),
        )

    data = PruneData(traces(8), traces(20))
    full = Circuit.from_edges(
        {e: 1.0 for e in graph.edges}, metadata={"target": "all", "ablation": "interchange"}
    )
    m = evaluate_circuit(model, data, full)
    assert m["circuit_vs_full"] == pytest.approx(0.0, abs=1e-10)
    assert m["faithfulness"] == pytest.approx(1.0)
    assert m["complement_vs_full"] == pytest.approx(
        m["ablated_vs_full"]
    )  # complement: nothing kept
    assert m["error_circuit"] == pytest.approx(m["error_full"], rel=1e-5)
    empty = Circuit.from_edges({}, metadata={"target": "all", "ablation": "interchange"})
    m = evaluate_circuit(model, data, empty)
    assert m["faithfulness"] == pytest.approx(0.0, abs=1e-6)
    assert m["complement_vs_full"] == pytest.approx(0.0, abs=1e-10)
    # cross-evaluation on another target (a single position)
    m = evaluate_circuit(model, data, full, target=lambda t: torch.tensor([3]))
    assert m["n_positions"] == 20 and m["faithfulness"] == pytest.approx(1.0)
    assert circuit_edge_mask(full, graph).all()
    with pytest.raises(ValueError, match="not in the model's graph"):
        circuit_edge_mask(make([("embed", "a5.h0.q")]), graph)
