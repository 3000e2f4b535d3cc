"""The greedy ACDC-style search (mechlab.prune.acdc): its pass, its budget, its limit."""

from __future__ import annotations

import pytest
import torch

from mechlab.prune.acdc import ACDC_MAX_EDGES, acdc_pass, acdc_search, check_acdc_size
from mechlab.prune.attribution import build_objective, metric_value
from mechlab.prune.forward import frozen_eval
from mechlab.prune.graph import build_graph, countable_edges
from mechlab.prune.methods import find_circuit
from tests.prune.test_attribution import random_traces, small_model
from tests.prune.test_planted import PLANTED, planted_data

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_a_pass_follows_its_rule_edge_by_edge():
    model = small_model("transformer")
    traces = random_traces(model)
    with frozen_eval(model):
        obj = build_objective(model, traces, "all")
        total = metric_value(obj, torch.zeros(obj.graph.n_edges))
        tau = 0.02 * total
        kept, scores = acdc_pass(obj, tau)
        # replay the pass by hand from the read-out backwards
        z = torch.ones(obj.graph.n_edges)
        current = metric_value(obj, z)
        for k in reversed(range(obj.graph.n_edges)):
            if not obj.countable[k]:
                continue
            z[k] = 0.0
            value = metric_value(obj, z)
            assert float(scores[k]) == pytest.approx(value - current, abs=1e-12)
            if value - current < tau:
                current = value
            else:
                z[k] = 1.0
    assert torch.equal(kept, z.bool() & obj.countable)
    assert 0 < int(kept.sum()) < int(obj.countable.sum())


@pytest.mark.parametrize("name", ["value-61", "qk-302"])
def test_the_search_meets_the_budget_and_recovers_planted_circuits(name):
    model, planted = PLANTED[name]()
    circuit = find_circuit(model, planted_data(0), "all", "acdc", n_edges=len(planted))
    assert set(circuit.edges) == planted
    meta = circuit.metadata
    assert meta["method"] == "acdc" and meta["settings"]["n_kept_by_acdc"] == len(planted)
    assert meta["metrics"]["faithfulness"] > 0.999


def test_a_fixed_tau_is_one_pass():
    model, planted = PLANTED["value-61"]()
    with frozen_eval(model):
        obj = build_objective(model, planted_data(0).train, "all")
        result = acdc_search(obj, n_keep=3, tau=1e-9)
    assert len(result.passes) == 1 and int(result.kept.sum()) == len(planted)


def test_large_graphs_are_refused_with_the_limit():
    check_acdc_size(ACDC_MAX_EDGES)
    with pytest.raises(ValueError, match=f"above its limit of {ACDC_MAX_EDGES}"):
        check_acdc_size(ACDC_MAX_EDGES + 1)
    model, _ = PLANTED["qk-302"]()  # 300 countable edges
    n = int(countable_edges(build_graph(model), "interchange").sum())
    with pytest.raises(ValueError, match="limit of 100") as err:
        find_circuit(model, planted_data(0), "all", "acdc", n_edges=5, max_edges=100)
    assert f"{n} countable" in str(err.value) and "\n" not in str(err.value)
