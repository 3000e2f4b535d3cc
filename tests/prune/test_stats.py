"""Tests of mechlab.prune.stats: the uniform null's closed form against enumeration and
Monte Carlo, degree-preserving samples, bootstrap coverage on synthetic circuits whose
true mean Jaccard is known, cross-evaluation, and errors."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import numpy as np
import pytest
import torch

from mechlab.prune.circuit import Circuit
from mechlab.prune.graph import transformer_graph
from mechlab.prune.stats import (
    bootstrap_overlap,
    cross_evaluate,
    degree_preserving_sample,
    graph_edges,
    jaccard_null_exact,
    null_model,
    overlap_report,
    shared_edges_pmf,
)

torch.set_num_threads(1)

GRAPH = transformer_graph(1, 1)  # 13 edges
INFO = GRAPH.summary()


def circuit(edges, target: str = "a", seed: int = 0) -> Circuit:
    return Circuit.from_edges(
        {e: 1.0 for e in edges}, metadata={"graph": INFO, "target": target, "seed": seed}
    )


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


# ---------------------------------------------------------------------------------------
# Uniform null: closed form
# ---------------------------------------------------------------------------------------


def test_closed_form_matches_exhaustive_enumeration():
    edges = GRAPH.edges
    n, ka, kb = len(edges), 3, 4
    a = set(edges[:ka])  # by symmetry, fixing A changes nothing
    values = [jaccard(a, set(b)) for b in itertools.combinations(edges, kb)]
    exact = jaccard_null_exact(n, ka, kb, observed=1 / 6)
    assert exact["expected"] == pytest.approx(np.mean(values), abs=1e-12)
    assert exact["std"] == pytest.approx(np.std(values), abs=1e-12)
    assert exact["p_greater"] == pytest.approx(np.mean([v >= 1 / 6 - 1e-12 for v in values]))
    assert exact["p_less"] == pytest.approx(np.mean([v <= 1 / 6 + 1e-12 for v in values]))
    # hand: |A & B| = 1 has probability C(3,1) C(10,3) / C(13,4) = 360/715, Jaccard 1/6
    x, pmf = shared_edges_pmf(n, ka, kb)
    assert dict(zip(x.tolist(), pmf, strict=True))[1] == pytest.approx(360 / 715)


def test_overlap_coefficient_closed_form_by_enumeration():
    edges = GRAPH.edges
    a = set(edges[:2])
    values = [len(a & set(b)) / 2 for b in itertools.combinations(edges, 5)]
    exact = jaccard_null_exact(len(edges), 2, 5, statistic="overlap_coefficient")
    assert exact["expected"] == pytest.approx(np.mean(values), abs=1e-12)
    assert exact["expected"] == pytest.approx(5 / 13)  # E|A & B| / |A| = 2 * 5/13 / 2


def test_closed_form_matches_monte_carlo_for_groups():
    rng = random.Random(0)
    group_a = [circuit(rng.sample(GRAPH.edges, 4), "a") for _ in range(2)]
    group_b = [circuit(rng.sample(GRAPH.edges, 6), "b") for _ in range(3)]
    res = null_model(group_a, group_b, n_samples=4000, seed=1)
    assert res.n_universe == 13
    sem = res.mc_std / np.sqrt(res.n_samples)
    assert abs(res.mc_mean - res.expected_exact) < 4 * sem + 1e-3
    assert 0.0 < res.p_greater <= 1.0 and 0.0 < res.p_less <= 1.0


def test_one_pair_uses_exact_tails():
    a = circuit(GRAPH.edges[:3], "a")
    b = circuit(GRAPH.edges[3:7], "b")  # disjoint: Jaccard 0
    res = null_model([a], [b], n_samples=50)
    x, pmf = shared_edges_pmf(13, 3, 4)
    assert res.observed == 0.0
    assert res.p_less == pytest.approx(pmf[0])  # P(|A & B| = 0) = C(10,4)/C(13,4)
    assert res.p_less == pytest.approx(210 / 715)
    assert res.p_greater == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------
# Degree-preserving null
# ---------------------------------------------------------------------------------------


def degrees(edges):
    return Counter(w for w, _ in edges), Counter(r for _, r in edges)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_degree_preserving_samples_keep_degrees_and_stay_in_graph(seed):
    graph = transformer_graph(2, 2)
    rng = random.Random(seed)
    c = circuit(rng.sample(graph.edges, 15))
    samples = degree_preserving_sample(c, graph.edges, n=30, seed=seed)
    allowed = set(graph.edges)
    assert all(len(s) == 15 and s <= allowed for s in samples)
    assert all(degrees(s) == degrees(c.edges) for s in samples)
    assert len({frozenset(s) for s in samples}) > 5  # the chain moves


def test_degree_null_of_a_rigid_circuit_is_its_own_overlap():
    # every edge into 'out' from every writer: the degrees leave no freedom
    out_edges = [e for e in GRAPH.edges if e[1] == "out"]
    a, b = circuit(out_edges, "a"), circuit(out_edges, "b")
    res = null_model([a], [b], kind="degree", n_samples=20)
    assert res.mc_mean == 1.0 and res.mc_std == 0.0 and res.observed == 1.0


def test_degree_null_reaches_every_valid_set_on_a_small_graph():
    # degrees of {embed -> a0.h0.q, pos -> a0.h0.k}: embed and pos one out-edge each,
    # a0.h0.q and a0.h0.k one in-edge each; enumerate every 2-edge set with those degrees
    c = circuit([("embed", "a0.h0.q"), ("pos", "a0.h0.k")])
    expected = {
        frozenset(s) for s in itertools.combinations(GRAPH.edges, 2)
        if degrees(s) == degrees(c.edges)
    }
    assert len(expected) == 2  # the swap pos -> a0.h0.q, embed -> a0.h0.k
    seen = Counter(frozenset(s) for s in degree_preserving_sample(c, GRAPH.edges, 400, seed=3))
    assert set(seen) == expected
    assert min(seen.values()) > 120  # both about equally often


# ---------------------------------------------------------------------------------------
# Bootstrap over seeds
# ---------------------------------------------------------------------------------------


def test_bootstrap_point_value_and_degenerate_cases():
    a = [circuit(GRAPH.edges[:4], "a", s) for s in range(3)]
    b = [circuit(GRAPH.edges[2:6], "b", s) for s in range(3)]
    ci = bootstrap_overlap(a, b, n_boot=200)
    assert ci.value == pytest.approx(2 / 6) and ci.low == ci.high == pytest.approx(2 / 6)
    within = bootstrap_overlap(a, n_boot=50)
    assert within.value == 1.0 and within.low == 1.0
    assert "with replacement" in ci.resampled


def test_bootstrap_interval_covers_the_true_mean_jaccard():
    # circuits = uniformly random 5-edge sets of 13: the true mean cross Jaccard is the
    # hypergeometric expectation; a 90% interval from 8 seeds per target should cover it
    truth = jaccard_null_exact(13, 5, 5)["expected"]
    covered = 0
    for rep in range(40):
        rng = random.Random(100 + rep)
        a = [circuit(rng.sample(GRAPH.edges, 5), "a") for _ in range(8)]
        b = [circuit(rng.sample(GRAPH.edges, 5), "b") for _ in range(8)]
        ci = bootstrap_overlap(a, b, n_boot=300, level=0.9, seed=rep)
        covered += ci.low <= truth <= ci.high
    assert covered >= 30  # nominal 36 of 40; percentile bootstraps undercover a little


def test_bootstrap_within_skips_self_pairs():
    a = [circuit(GRAPH.edges[:4], "a"), circuit(GRAPH.edges[4:8], "a")]  # disjoint
    ci = bootstrap_overlap(a, n_boot=100)
    assert ci.value == 0.0 and ci.high == 0.0  # never compared with itself (which gives 1)
    assert 20 < ci.n_boot < 80  # about half the resamples draw one circuit twice


# ---------------------------------------------------------------------------------------
# Report, graph, cross-evaluation, errors
# ---------------------------------------------------------------------------------------


def test_graph_edges_and_report_keys():
    assert graph_edges(circuit([])) == GRAPH.edges
    a = [circuit(GRAPH.edges[:3], "a", s) for s in range(2)]
    b = [circuit(GRAPH.edges[1:4], "b", s) for s in range(2)]
    report = overlap_report(a + b, n_boot=50, n_null=50)
    entry = report["across"]["a vs b"]
    assert entry["jaccard_observed"] == pytest.approx(0.5)
    assert entry["null_uniform"]["expected_exact"] == pytest.approx(
        jaccard_null_exact(13, 3, 3)["expected"]
    )
    assert set(report["within"]) == {"a", "b"} and report["n_circuits"] == {"a": 2, "b": 2}
    # two seeds per target: the seed baseline and the cross-target Jaccard, no interval
    assert entry["jaccard"] is None and entry["overlap_coefficient"] is None
    assert report["within"]["a"]["value"] == 1.0 and report["within"]["a"]["low"] is None
    three = overlap_report([*a, circuit(GRAPH.edges[:2], "a", 2), *b, circuit(GRAPH.edges[1:3], "b", 2)],
                           n_boot=50, n_null=20)  # fmt: skip
    assert three["across"]["a vs b"]["jaccard"]["value"] == pytest.approx(
        three["across"]["a vs b"]["jaccard_observed"]
    )
    assert three["within"]["a"]["low"] is not None and three["within"]["a"]["n_boot"] > 0


def test_cross_evaluation_of_a_planted_circuit():
    from tests.prune.test_engine import planted_data, planted_transformer

    model = planted_transformer()
    data = planted_data()
    good = Circuit.from_edges(
        {("embed", "a1.h0.v"): 1.0, ("a1.h0", "out"): 1.0},
        metadata={"target": "all", "ablation": "interchange", "seed": 0},
    )
    first = lambda traces: torch.tensor([0])  # noqa: E731
    first.__name__ = "first"
    rows = cross_evaluate(model, data, [good], targets=["all", first])
    assert [r["evaluated_on"] for r in rows] == ["all", first]
    assert [r["own"] for r in rows] == [True, False]
    assert all(r["faithfulness"] > 0.999 for r in rows)  # the path serves every position
    assert all(r["complement_faithfulness"] < 0.01 for r in rows)


def test_cross_evaluation_shows_one_bar_per_circuit_and_target(capsys):
    from tests.prune.test_engine import planted_data, planted_transformer

    model, data = planted_transformer(), planted_data()
    good = Circuit.from_edges({("embed", "a1.h0.v"): 1.0, ("a1.h0", "out"): 1.0},
                              metadata={"target": "all", "ablation": "interchange", "seed": 0})  # fmt: skip
    quiet = cross_evaluate(model, data, [good])
    assert capsys.readouterr().err == ""  # no bar unless asked
    assert cross_evaluate(model, data, [good], progress=True) == quiet  # the bar changes nothing
    err = capsys.readouterr().err
    assert "cross-evaluation 1/1, all seed 0 on all: circuit, complement, ablated on" in err, err


def test_bad_input():
    a = circuit(GRAPH.edges[:3], "a")
    b = circuit(GRAPH.edges[3:6], "b")
    with pytest.raises(ValueError, match="null model"):
        null_model([a], [b], kind="random")
    with pytest.raises(ValueError, match="statistic"):
        bootstrap_overlap([a, a], [b], statistic="dice")
    with pytest.raises(ValueError, match=">= 2 circuits"):
        bootstrap_overlap([a], [b])
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_overlap([a, a], [b], n_boot=0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_overlap([a, a], [b], level=1.5)
    with pytest.raises(ValueError, match="not among"):
        null_model([a], [b], universe=GRAPH.edges[:4])
    with pytest.raises(ValueError, match="exceed"):
        shared_edges_pmf(5, 6, 2)
    other = Circuit.from_edges({}, metadata={"graph": transformer_graph(2, 1).summary()})
    with pytest.raises(ValueError, match="different graphs"):
        null_model([a], [other])
    with pytest.raises(ValueError, match="records no graph"):
        graph_edges(Circuit.from_edges({}))
