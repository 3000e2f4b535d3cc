"""The planted family with redundancy (mechlab.prune.planted_redundant).

Every member's ground truth is confirmed by exhaustive subset ablation of its planted
edges (on 16 held-out traces: the designs are exact, so few are enough); single-edge
ablation (mechlab.prune.exact) scores the redundant edges near 0 while removing them
together costs nearly everything; the controls' edges each matter alone; the dead zone
has zero gradients at the corrupted run; off-circuit edges are small but not zero.
"""

from __future__ import annotations

import pytest
import torch

from mechlab.prune.attribution import attribute
from mechlab.prune.planted import single_edge_effects
from mechlab.prune.planted_redundant import (
    JOINT_FLOOR,
    KINDS,
    OFF_CEILING,
    REDUNDANT_CEILING,
    REDUNDANT_FAMILY,
    REDUNDANT_KINDS,
    RedundantModel,
    RedundantSpec,
    _Scorer,
    check_redundant_ground_truth,
    redundant_model,
    subset_faithfulness,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
_BUILT: dict[str, RedundantModel] = {}


def built(name: str) -> RedundantModel:
    if name not in _BUILT:
        _BUILT[name] = redundant_model(REDUNDANT_FAMILY[name])
    return _BUILT[name]


def small(rm: RedundantModel, seed: int = 0):
    return rm.data(seed, n_train=8, n_test=16)


def test_the_family_has_every_kind():
    assert {s.kind for s in REDUNDANT_FAMILY.values()} == set(KINDS)
    assert set(REDUNDANT_KINDS) < set(KINDS)


@pytest.mark.parametrize("name", list(REDUNDANT_FAMILY))
def test_ground_truth_by_exhaustive_subset_ablation(name):
    rm = built(name)
    found = check_redundant_ground_truth(rm, small(rm, seed=3))  # other traces than the build's
    assert found["planted_faithfulness"] >= 0.9 and found["minimal_faithfulness"] >= rm.goal
    assert rm.minimal <= rm.edges and rm.minimal_budget == found["minimal_size"]
    assert rm.edges == frozenset().union(*rm.paths.values())
    assert 0.9 <= rm.goal <= rm.planted_faithfulness
    if rm.redundant:  # a smaller circuit suffices: one of the redundant paths
        assert rm.minimal_budget < rm.planted_budget
        assert any(rm.minimal == path for path in rm.paths.values())
    else:
        assert rm.minimal == rm.edges


@pytest.mark.parametrize("name", [n for n in REDUNDANT_FAMILY if REDUNDANT_FAMILY[n].kind in REDUNDANT_KINDS])
def test_single_edge_ablation_misses_redundant_edges(name):
    """mechlab.prune.exact's scores of the redundant edges are near 0; removing them all costs > 0.5."""
    rm = built(name)
    data = small(rm)
    scores = attribute(rm.model, data.test, "all", "exact")
    total, by_edge = scores.total_effect, scores.by_edge()
    assert rm.redundant_edges and all(abs(by_edge[e]) < REDUNDANT_CEILING * total for e in rm.redundant_edges)
    assert _Scorer(rm.model, data).effect(rm.redundant_edges) > JOINT_FLOOR
    for name, path in rm.paths.items():  # every path alone is (nearly) enough, all ablated is not
        if name == "detector":  # the backup's Q-composition path: it only silences the backup
            continue
        rest = rm.redundant_edges - path
        assert _Scorer(rm.model, data).effect(rest) < REDUNDANT_CEILING


def test_equal_or_is_exact_and_unequal_or_costs_the_weak_share():
    for name, cost in (("or2-equal", 0.0), ("or2-unequal", (1 - 0.75) ** 2)):
        rm = built(name)
        effects = single_edge_effects(rm.model, small(rm))
        strong = rm.paths["h0"] - rm.paths["h1"]
        weak = rm.paths["h1"] - rm.paths["h0"]
        assert all(effects[e] == pytest.approx(cost, abs=5e-3) for e in strong)
        assert all(effects[e] < 5e-3 for e in weak)


def test_backup_takes_over_when_the_primary_is_removed_for_every_reader():
    rm = built("backup")
    scorer = _Scorer(rm.model, small(rm))
    P, B = (rm.components[p][1] for p in ("primary", "backup"))
    m = rm.components["primary"][-1]
    out_only = scorer.effect({(P, f"{m}.in")})  # B still sees P: it stays idle (0.8 of the output)
    everywhere = scorer.effect({(P, f"{m}.in"), (P, f"{B}.q")})  # B sees P gone: it takes over
    both = scorer.effect({("embed", f"{P}.v"), ("embed", f"{B}.v")})
    assert out_only == pytest.approx((1 - 0.8) ** 2, abs=5e-3)
    assert everywhere < 5e-3 < out_only and both > 0.9


def test_controls_need_every_edge():
    for name in ("and2", "single", "deadzone"):
        rm = built(name)
        effects = single_edge_effects(rm.model, small(rm))
        assert min(effects[e] for e in rm.edges) > 0.5, name


@pytest.mark.parametrize("name", ["deadzone", "deadzone-or2"])
def test_dead_zone_has_no_gradient_at_the_corrupted_run(name):
    """EAP at the corrupted run sees nothing behind the dead relu (only the read-out leak
    of the heads' slots reaches their input edges); EAP-IG crosses the threshold."""
    rm = built(name)
    data = small(rm)
    eap = attribute(rm.model, data.test, "all", "eap").by_edge()
    ig = attribute(rm.model, data.test, "all", "eap-ig").by_edge()
    m = next(iter(rm.paths.values()))
    m = next(w for w, r in m if r == "out")
    behind = [e for e in rm.edges if e[1] != "out"]
    total = abs(eap[(m, "out")])
    assert all(eap[e] == 0.0 for e in behind if e[1] == f"{m}.in")
    assert all(abs(eap[e]) < 0.1 * total for e in behind)
    assert all(abs(ig[e]) > 0.1 * abs(ig[(m, "out")]) for e in behind)


def test_off_circuit_edges_are_small_but_not_zero():
    rm = built("or2-equal")
    effects = single_edge_effects(rm.model, small(rm))
    from mechlab.prune.graph import build_graph, countable_edges

    graph = build_graph(rm.model)
    countable = countable_edges(graph, "interchange")
    off = [effects[e] for i, e in enumerate(graph.edges) if countable[i] and e not in rm.edges]
    assert max(off) < OFF_CEILING and sum(e > 1e-6 for e in off) > len(off) / 2
    W_O = torch.stack([b.attn.W_O for b in rm.model.blocks])  # every head writes
    assert int((W_O.flatten(2).abs().sum(-1) > 0).sum()) == rm.spec.n_layers * rm.spec.n_heads


def test_subset_faithfulness_agrees_with_the_fast_scorer():
    rm = built("backup")
    data = small(rm)
    scorer = _Scorer(rm.model, data)
    for edges in (set(rm.edges), set(rm.paths["backup"]), set(rm.paths["detector"])):
        assert subset_faithfulness(rm.model, data, edges) == pytest.approx(scorer.faithfulness(edges), abs=1e-6)
    with pytest.raises(ValueError, match="not in the model's graph"):
        subset_faithfulness(rm.model, data, {("embed", "a9.h0.v")})


def test_a_claim_that_fails_is_refused():
    rm = built("or2-equal")
    wrong = RedundantModel(rm.model, rm.spec, rm.edges, rm.paths, minimal=rm.edges,
                           planted_faithfulness=rm.planted_faithfulness)  # fmt: skip
    with pytest.raises(ValueError, match="is not a smallest"):
        check_redundant_ground_truth(wrong, small(rm))
    idle = redundant_model(RedundantSpec("backup", seed=4, idle=0.0))  # a silent backup
    with pytest.raises(ValueError, match="redundant edge .* has single-edge effect"):
        check_redundant_ground_truth(idle, small(idle))


def test_bad_specs_are_refused():
    for bad, message in [
        ({"kind": "xor"}, "kind must be one of"),
        ({"kind": "or2-equal", "n_layers": 5}, "n_layers must be an integer from 2 to 4"),
        ({"kind": "lstm-or2", "n_layers": 2}, "n_layers must be an integer from 3 to 4"),
        ({"kind": "or2-equal", "n_heads": 9}, "n_heads must be an integer from 2 to 8"),
        ({"kind": "or2-equal", "d_noise": 4}, "d_noise must be an integer >= 6"),
        ({"kind": "or2-equal", "leak": -0.1}, "leak must be a number from 0 to 0.2"),
        ({"kind": "or2-unequal", "weak": 1.0}, "weak must be a number in"),
        ({"kind": "backup", "idle": 1.0}, "idle must be a number in"),
    ]:
        with pytest.raises(ValueError, match=message):
            RedundantSpec(**bad)


def test_budget_cases_carry_budgets_and_goals():
    from tests.prune.planted_cases import redundant_budget_cases

    cases = redundant_budget_cases(seeds=(0,))
    assert len(cases) == len(REDUNDANT_FAMILY)
    for case, budgets, goal in cases:
        assert budgets["minimal"] <= budgets["planted"] == len(case.truth) and 0.9 <= goal <= 1.0
        assert case.data.test.corrupted is not None and case.target == "all"


# ---------------------------------------------------------------------------------------
# The default search finds them (docs/pruning.md, "Redundancy")
# ---------------------------------------------------------------------------------------


def _default_circuit(rm: RedundantModel, budget: int, seed: int, n_train: int = 32):
    from mechlab.prune.engine import prune
    from mechlab.prune.graph import build_graph, countable_edges

    n = int(countable_edges(build_graph(rm.model), "interchange").sum())
    return prune(rm.model, rm.data(seed, n_train=n_train), "all", 1 - budget / n, seed=seed, progress=False)


def _check_found(name: str, seed: int, n_train: int = 32) -> None:
    rm = built(name)
    for label, budget in (("minimal", rm.minimal_budget), ("planted", rm.planted_budget)):
        circuit = _default_circuit(rm, budget, seed, n_train)
        f = circuit.metadata["metrics"]["faithfulness"]
        assert f >= rm.goal, f"{name} seed {seed}, {label} budget {budget}: faithfulness {f:.3f} < {rm.goal:.3f}"
        assert len(circuit.edges) <= budget
        if label == "minimal" and rm.redundant:  # one whole path: a minimal circuit is one of them
            assert any(set(circuit.edges) == set(p) for p in rm.paths.values()), circuit.edges


@pytest.mark.parametrize("name", list(REDUNDANT_FAMILY))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_default_search_finds_a_faithful_circuit_at_both_budgets(name, seed):
    """At the defaults a user gets (prune(model, data, "all", sparsity)), told only the
    budget: faithful at the minimal and at the planted budget, where single-edge ablation
    (the previous default's warm start) finds nothing on the OR members."""
    _check_found(name, seed)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REDUNDANT_FAMILY))
@pytest.mark.parametrize("seed", [2, 3, 4, 5, 6])
def test_the_default_search_finds_them_over_more_seeds(name, seed):
    _check_found(name, seed)


@pytest.mark.parametrize("name", ["or2-equal", "or3", "lstm-or2"])
def test_with_traces_to_validate_on_the_redundant_circuit_beats_the_reference(name):
    """With more training traces than the selection scores (256: 128 left to validate on),
    the selection's circuit must beat exact ablation's own circuit on them, and it does
    where that circuit misses the redundancy (OR members: single-edge ablation scores their
    edges 0): found as with few traces."""
    rm = built(name)
    _check_found(name, 0, n_train=256)
    circuit = _default_circuit(rm, rm.minimal_budget, 0, n_train=256)
    check = circuit.metadata["selection"]["validation"]
    assert check is not None and check["traces"] == 128 and check["chosen"] == "selection", check


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REDUNDANT_FAMILY))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_traces_to_validate_on_every_member_is_found(name, seed):
    _check_found(name, seed, n_train=256)
