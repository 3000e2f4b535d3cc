"""One circuit per method (mechlab.prune.methods): the same graph, budget and evaluation for all."""

from __future__ import annotations

import math

import pytest
import torch

from mechlab.prune.circuit import Circuit
from mechlab.prune.evaluate import evaluate_circuit
from mechlab.prune.graph import build_graph, countable_edges, pruning_graph
from mechlab.prune.masks import keep_count
from mechlab.prune.methods import METHODS, circuit_from_scores, circuit_scores_of, find_circuit
from mechlab.prune.paths import live_edges
from mechlab.traces import PruneData
from tests.prune.test_attribution import WINDOWS, random_traces, small_model
from tests.prune.test_planted import PLANTED, planted_data

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def circuits():
    model, planted = PLANTED["qk-61"]()
    data = planted_data(0)
    found = {m: find_circuit(model, data, "all", m, sparsity=0.9, steps=200 if m == "prune" else None)
             for m in METHODS}  # fmt: skip
    return model, data, planted, found


def test_every_method_has_the_same_graph_budget_and_evaluation(circuits, tmp_path):
    model, data, _, found = circuits
    graph = build_graph(model)
    n = int(countable_edges(graph, "interchange").sum())
    for method, circuit in found.items():
        meta = circuit.metadata
        assert meta["graph"] == graph.summary(), method
        assert meta["n_edges_asked"] == keep_count(n, 0.9) and meta["n_edges_countable"] == n, (
            method
        )
        assert 0 < meta["n_edges_kept"] <= meta["n_edges_asked"], method
        mask = torch.tensor([e in circuit.edges for e in graph.edges])
        assert torch.equal(live_edges(graph, mask), mask), f"{method}: an edge off every path"
        again = evaluate_circuit(model, data, circuit)  # the held-out evaluation, recomputed
        for key in ("faithfulness", "complement_faithfulness", "circuit_vs_full", "n_positions"):
            assert again[key] == pytest.approx(meta["metrics"][key], rel=1e-6), (method, key)
        assert meta["seconds"] > 0
        if method != "prune":
            assert meta["method"] == method and meta["metric"] == "loss"
            assert len(meta["attribution"]["scores"]) == graph.n_edges
            assert all(0 <= s <= 1 for s in circuit.edges.values())
            path = circuit.to_json(tmp_path / f"{method}.json")
            back = Circuit.from_json(path)
            assert back.edges == circuit.edges
            torch.testing.assert_close(
                circuit_scores_of(back, graph), circuit_scores_of(circuit, graph)
            )


def test_every_method_finds_the_planted_circuit_given_its_size():
    model, planted = PLANTED["value-61"]()
    for method in METHODS:
        kw = {"steps": 300} if method == "prune" else {}
        circuit = find_circuit(model, planted_data(1), "all", method, n_edges=len(planted), **kw)
        assert set(circuit.edges) == planted, method


@pytest.mark.parametrize("arch, windows", [("transformer", None), ("lstm", None), ("mamba", WINDOWS),
                                           ("dense_ssm", WINDOWS)])  # fmt: skip
def test_every_family_gets_circuits_from_every_scoring_method(arch, windows):
    model = small_model(arch)
    data = PruneData(
        random_traces(model, windows=windows), random_traces(model, seed=3, windows=windows)
    )
    graph = pruning_graph(model, windows)
    for method in ("eap", "eap-ig", "eap-ig-inputs", "exact", "acdc"):
        circuit = find_circuit(model, data, "all", method, n_edges=4)
        assert 0 < circuit.metadata["n_edges_kept"] <= 4, method
        assert circuit.metadata["graph"] == graph.summary()
        assert math.isfinite(circuit.metadata["metrics"]["faithfulness"])


def test_mean_and_zero_ablation_and_the_projection_metric():
    model, planted = PLANTED["qk-61"]()
    data = planted_data(0)
    for ablation in ("mean", "zero"):
        for method, kw in (
            ("eap", {"at": "clean", "metric": "projection"}),
            ("eap-ig", {}),
            ("exact", {}),
        ):
            circuit = find_circuit(model, data, "all", method, n_edges=8, ablation=ablation, **kw)
            assert circuit.metadata["ablation"] == ablation
            assert circuit.metadata["metrics"]["faithfulness"] > 0.5, (ablation, method)


def test_circuit_from_your_own_scores():
    model, planted = PLANTED["value-61"]()
    graph = build_graph(model)
    scores = torch.zeros(graph.n_edges)
    for edge in planted:
        scores[graph.edge_index[edge]] = 1.0
    circuit = circuit_from_scores(model, planted_data(0), "all", scores, n_edges=len(planted))
    assert set(circuit.edges) == planted and circuit.metadata["method"] == "scores"
    assert circuit.metadata["metrics"]["faithfulness"] > 0.999


@pytest.mark.parametrize("method", ["eap", "exact"])
def test_a_method_shows_the_references_its_scoring_and_the_evaluation(method, capsys):
    model, _ = PLANTED["value-61"]()
    data = planted_data(0, n_train=4, n_test=4)
    quiet = find_circuit(model, data, "all", method, sparsity=0.9)
    assert capsys.readouterr().err == ""  # no bar unless asked
    shown = find_circuit(model, data, "all", method, sparsity=0.9, progress=True)
    assert shown.edges == quiet.edges  # the bars change nothing
    err = capsys.readouterr().err
    stages = ["references: interchange ablation, full outputs, loss ablated and full: 100%|██████████| 3/3",
              f"{method}: ", "evaluation: circuit, complement, ablated on 4 held-out traces: 100%"]  # fmt: skip
    where = [err.find(stage) for stage in stages]
    assert -1 not in where and where == sorted(where), err


def _bad(method="eap-ig", **kw):
    model, _ = PLANTED["value-61"]()
    return model, planted_data(0), method, kw


BAD = [
    (dict(method="magic"), "unknown method 'magic'"),
    (dict(n_edges=60), "asks for 60 edges, but only 46 of this graph.s 61"),
    (dict(n_edges=0), "keeps no edge"),
    (dict(sparsity=0.999), "keeps no edge"),
    (dict(sparsity=1.5), r"sparsity must be in \(0, 1\)"),
    (dict(method="eap-ig", steps=0), "must be an integer >= 1"),
    (dict(method="eap", ablation="zero"), "needs interchange ablation"),
    (dict(method="exact", lr=0.1), "unknown setting"),
    (dict(method="prune", metric="projection"), "minimises the task loss"),
    (dict(method="acdc", tau=-1.0), "tau must be"),
]


@pytest.mark.parametrize("kwargs, message", BAD)
def test_bad_input_is_refused_in_one_line_before_any_work(kwargs, message, monkeypatch):
    model, data, method, kw = _bad(**kwargs)

    def no_work(*args, **kwargs):
        raise AssertionError("work was done before the input was checked")

    monkeypatch.setattr("mechlab.prune.methods.build_objective", no_work)
    monkeypatch.setattr("mechlab.prune.methods.prune", no_work)
    with pytest.raises(ValueError, match=message) as err:
        find_circuit(model, data, "all", method, **kw)
    assert "\n" not in str(err.value)


def test_bad_scores_are_refused():
    model, _ = PLANTED["value-61"]()
    graph = build_graph(model)
    scores = torch.ones(graph.n_edges)
    scores[3] = float("nan")
    with pytest.raises(ValueError, match=r"1 edge score\(s\) are NaN"):
        circuit_from_scores(model, planted_data(0), "all", scores, n_edges=5)
    with pytest.raises(ValueError, match="tensor of 61 numbers"):
        circuit_from_scores(model, planted_data(0), "all", torch.ones(3), n_edges=5)
