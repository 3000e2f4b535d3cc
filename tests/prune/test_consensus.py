"""Consensus scores (mechlab.prune.consensus): how often each edge is kept across seeds and
nearby budgets, recorded in the circuit, serialised, checked by the schema, and reported by
the overlap statistics (which shared and unshared edges are stable)."""

from __future__ import annotations

import json

import pytest

from mechlab.prune.circuit import Circuit
from mechlab.prune.consensus import (
    STABLE_CONSENSUS,
    attach_consensus,
    consensus_prune,
    consensus_scores,
    edge_frequencies,
    nearby_sparsities,
    stable_edges,
)
from mechlab.prune.graph import build_graph, countable_edges
from mechlab.prune.planted import PLANTED_FAMILY, planted_model
from mechlab.prune.stats import overlap_report

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
GRAPH = {"arch": "transformer", "n_layers": 2, "n_heads": 2}


def circuit(edges, target="1-after", seed=0, sparsity=0.9):
    meta = {"target": target, "seed": seed, "sparsity_asked": sparsity, "graph": GRAPH}
    return Circuit.from_edges({e: 1.0 for e in edges}, metadata=meta)


A, B, C, D = ("embed", "a0.h0.v"), ("a0.h0", "out"), ("embed", "out"), ("embed", "a1.h1.q")


def test_frequencies_and_attach_by_hand(tmp_path):
    runs = [circuit([A, B], seed=0), circuit([A, C], seed=1), circuit([A, B], seed=2, sparsity=0.8)]
    assert edge_frequencies(runs) == {A: 1.0, B: 2 / 3, C: 1 / 3}
    main = attach_consensus(runs[0], runs)
    entry = main.metadata["consensus"]
    assert entry["n_runs"] == 3 and entry["seeds"] == [0, 1, 2] and entry["sparsities"] == [0.9, 0.8]
    assert entry["stable_at"] == STABLE_CONSENSUS
    path = main.to_json(tmp_path / "c.json")
    again = Circuit.from_json(path)  # through the file and its schema
    assert consensus_scores(again) == {A: 1.0, B: pytest.approx(2 / 3), C: pytest.approx(1 / 3)}
    assert consensus_scores(circuit([A])) is None
    values = json.loads(path.read_text())
    values["metadata"]["consensus"]["scores"][0][2] = "high"
    with pytest.raises(ValueError, match=r"metadata\.consensus\.scores\[0\]\[2\]"):
        Circuit.from_dict(values)
    with pytest.raises(ValueError, match="at least one circuit"):
        edge_frequencies([])


def test_nearby_budgets():
    assert nearby_sparsities(100, 0.9) == [0.92, 0.9, 1 - 12 / 100]  # 8, 10, 12 (12.5 rounds to 12)
    assert nearby_sparsities(10, 0.9) == [0.9]  # one edge: no other count nearby
    assert nearby_sparsities(5, 0.2, (0.5, 1.0, 2.0)) == [0.6, 0.2]  # capped below every edge


def test_stable_edges_by_hand():
    a = {A: 1.0, B: 0.6, C: 0.9}
    b = {A: 0.8, C: 0.2, D: 1.0}
    out = stable_edges(a, b)
    assert out["shared_stable"] == [[*A, 1.0, 0.8]]
    assert out["shared_unstable"] == [[*C, 0.9, 0.2]]
    assert out["a_only_unstable"] == [[*B, 0.6, 0.0]] and out["n_a_only_stable"] == 0
    assert out["b_only_stable"] == [[*D, 0.0, 1.0]] and out["n_b_only_stable"] == 1


def test_overlap_report_says_which_edges_are_stable():
    ones = [circuit([A, B], seed=s) for s in range(3)] + [circuit([A, C], seed=3)]
    twos = [circuit([A, D], target="2-after", seed=s) for s in range(4)]
    report = overlap_report(ones + twos, n_boot=20, n_null=20)
    assert {tuple(e[:2]): e[2] for e in report["consensus"]["1-after"]["scores"]} == {A: 1.0, B: 0.75, C: 0.25}
    edges = report["across"]["1-after vs 2-after"]["edges"]
    assert edges["shared_stable"] == [[*A, 1.0, 1.0]]
    assert [e[:2] for e in edges["a_only_unstable"]] == [list(B), list(C)]
    assert edges["b_only_stable"] == [[*D, 0.0, 1.0]]
    # one circuit per target: its own recorded consensus is used
    one = attach_consensus(circuit([A, B]), [circuit([A, B]), circuit([A])])
    report = overlap_report([one, circuit([A, D], target="2-after")], n_boot=20, n_null=20)
    assert report["across"]["1-after vs 2-after"]["edges"]["shared_stable"] == [[*A, 1.0, 1.0]]
    assert report["across"]["1-after vs 2-after"]["edges"]["a_only_unstable"] == [[*B, 0.5, 0.0]]


def test_consensus_prune_on_a_planted_model():
    planted = planted_model(PLANTED_FAMILY["ssm3-chain-1:3"])
    n = int(countable_edges(build_graph(planted.model), "interchange").sum())
    k = len(planted.edges)
    found = consensus_prune(planted.model, planted.data(0), "all", 1 - k / n, seeds=(0, 1),
                            budget_factors=(0.75, 1.0), steps=150)  # fmt: skip
    entry = found.metadata["consensus"]
    assert entry["n_runs"] == 4 and entry["seeds"] == [0, 1]
    assert entry["sparsities"] == [1 - 3 / n, 1 - k / n]
    assert set(found.edges) == planted.edges and found.metadata["sparsity_asked"] == 1 - k / n
    scores = consensus_scores(found)
    assert set(scores) == planted.edges  # no run keeps anything else
    assert min(scores.values()) >= 0.5 and max(scores.values()) == 1.0
