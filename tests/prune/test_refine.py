"""The default search's selection (mechlab.prune.refine.select_edges): elimination from the
ranked pool, the fill up to the budget while an edge measurably helps, each kept edge's
effect, and what the circuit's metadata says when the budget is not met."""

from __future__ import annotations

import pytest
import torch

from mechlab.prune.engine import prune
from mechlab.prune.graph import build_graph
from mechlab.prune.refine import select_edges
from tests.prune.test_planted_hard import PATHS, keep_sparsity, planted_data, two_path_transformer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_a_budget_that_no_further_edge_can_use_is_reported():
    """Two interchangeable two-edge paths, three edges asked: one whole path, and no single
    edge that would help (an edge of the other path alone carries nothing)."""
    model, paths = two_path_transformer()
    circuit = prune(model, planted_data(0), "all", keep_sparsity(model, 3), seed=0, progress=False)
    meta = circuit.metadata
    assert set(circuit.edges) in [set(p) for p in paths]
    assert meta["n_edges_asked"] == 3 and circuit.n_edges == 2
    assert meta["selection"]["fill_stopped"] in ("no effect", "no candidate")
    assert all(abs(v) < meta["min_effect"] for *_, v in meta["selection"]["rejected"])
    assert set(meta["edge_effects"]) == {f"{w} -> {r}" for w, r in circuit.edges}
    assert min(meta["edge_effects"].values()) > 0.1 and meta["edges_without_effect"] == []


def test_selection_keeps_the_ranking_when_elimination_has_nothing_live():
    model, _ = two_path_transformer()
    graph = build_graph(model)
    index = {e: i for i, e in enumerate(graph.edges)}
    countable = torch.tensor([w != "pos" for w, _ in graph.edges])

    def loss_of(kept: torch.Tensor) -> float:  # 1 - half per path kept whole
        return 1.0 - 0.5 * sum(all(kept[index[e]] for e in p) for p in PATHS)

    la = torch.full((graph.n_edges,), -5.0)
    la[index[("embed", "a0.h0.v")]], la[index[("embed", "a0.h1.v")]] = 3.0, 2.0
    la[index[("a0.h0", "out")]] = -4.0
    # the pool (the two best edges) has no complete path; the ranking's complete paths do
    sel = select_edges(graph, la, countable, 2, loss_of, extra=0, min_effect=1e-3)
    assert {graph.edges[i] for i in sel.edges.nonzero().flatten().tolist()} == PATHS[0]
    assert sel.loss == 0.5 and sel.effects == {index[e]: pytest.approx(0.5) for e in PATHS[0]}
    # three asked, from a pool whose fourth edge is on no path: the path's two edges, then
    # the fill's best-ranked live candidate (embed -> a0.h0.q, first of the tied rest in
    # graph order) does nothing, so the fill stops and says so
    la[index[("a1.h0", "out")]] = -4.5
    sel = select_edges(graph, la, countable, 3, loss_of, extra=1, min_effect=1e-3)
    assert int(sel.edges.sum()) == 2 and sel.fill_stopped == "no effect"
    assert sel.rejected == {index[("embed", "a0.h0.q")]: 0.0}
    la[index[("a1.h0", "out")]] = -5.0
    # from a larger pool the quota is filled with a live edge, and its effect (0) says it
    # does nothing (the circuit's metadata lists it under edges_without_effect)
    sel = select_edges(graph, la, countable, 3, loss_of, extra=4, min_effect=1e-3)
    assert int(sel.edges.sum()) == 3 and sorted(sel.effects.values()) == [0.0, 0.5, 0.5]


def test_verified_elimination_keeps_one_of_two_redundant_paths():
    """Two heads that each alone saturate an MLP: every branch edge costs ~0 alone, so
    dropping the two cheapest together (the excess) would cut both paths; the check on the
    joint loss refuses that, one path goes, and the other stays whole and faithful."""
    from mechlab.prune.config import PruneConfig
    from mechlab.prune.planted_redundant import REDUNDANT_FAMILY, redundant_model
    from mechlab.prune.refine import loss_function, removal_costs, verified_eliminate
    from mechlab.prune.setup import prepare_search

    rm = redundant_model(REDUNDANT_FAMILY["or2-equal"])
    setup = prepare_search(rm.model, rm.data(0), ["all"], PruneConfig(warm_start="none", refine_pool="none"))
    loss_of = loss_function(rm.model, setup.graph, setup.train, setup.positions, setup.reference,
                            setup.ablated, setup.norms)([0])  # fmt: skip
    pool = torch.tensor([e in rm.edges for e in setup.graph.edges])
    costs = removal_costs(setup.graph, pool, loss_of(pool), loss_of, "interchange")
    cheapest = sorted(costs, key=costs.get)[:2]
    both_cut = pool.clone()
    both_cut[cheapest] = False
    assert max(costs[e] for e in cheapest) < 0.05 and loss_of(both_cut) > 0.5  # the trap
    kept, loss, effects = verified_eliminate(setup.graph, pool, 3, loss_of)
    edges = {e for e, k in zip(setup.graph.edges, kept.tolist(), strict=True) if k}
    assert edges in [set(p) for p in rm.paths.values()] and loss < 0.1
    assert min(effects.values()) > 0.5  # now every kept edge is the only way through


def test_paired_difference_is_the_sum_and_its_standard_error_over_traces():
    from mechlab.prune.refine import paired_difference

    a = torch.tensor([0.10, 0.30, 0.20, 0.40], dtype=torch.float64)
    b = torch.tensor([0.15, 0.20, 0.25, 0.20], dtype=torch.float64)
    d = [x - y for x, y in zip(a.tolist(), b.tolist(), strict=True)]  # -0.05, 0.1, -0.05, 0.2
    mean = sum(d) / 4
    se = (4 / 3 * sum((x - mean) ** 2 for x in d)) ** 0.5
    assert paired_difference(a, b) == (pytest.approx(sum(d)), pytest.approx(se))
    assert paired_difference(a[:1], b[:1])[1] == float("inf")  # one trace: no error estimate


def test_per_trace_shares_add_up_to_the_selection_loss():
    from mechlab.prune.config import PruneConfig
    from mechlab.prune.planted_redundant import REDUNDANT_FAMILY, redundant_model
    from mechlab.prune.refine import loss_function
    from mechlab.prune.setup import prepare_search

    rm = redundant_model(REDUNDANT_FAMILY["or2-equal"])
    setup = prepare_search(rm.model, rm.data(0), ["all"], PruneConfig(warm_start="none", refine_pool="none"))
    args = (rm.model, setup.graph, setup.train, setup.positions, setup.reference, setup.ablated, setup.norms)
    gen = torch.Generator().manual_seed(0)
    for first, n in ((0, 16), (5, 9)):
        loss_of = loss_function(*args, n, first=first)([0])
        shares_of = loss_function(*args, n, first=first, per_trace=True)([0])
        for _ in range(3):
            kept = torch.rand(setup.graph.n_edges, generator=gen) < 0.6
            shares = shares_of(kept)
            assert shares.shape == (n,) and float(shares.sum()) == pytest.approx(loss_of(kept), rel=1e-5)


def _two_path_graph():
    model, _ = two_path_transformer()
    graph = build_graph(model)
    return graph, {e: i for i, e in enumerate(graph.edges)}


def _two_path_selection(validate):
    """A selection whose elimination keeps path 0 (loss 0.5) while the reference ranking's
    own circuit is path 1 (loss 0.51)."""
    graph, index = _two_path_graph()
    countable = torch.tensor([w != "pos" for w, _ in graph.edges])

    def loss_of(kept: torch.Tensor) -> float:
        whole = [all(kept[index[e]] for e in p) for p in PATHS]
        return 1.0 - 0.5 * whole[0] - 0.49 * whole[1]

    la = torch.full((graph.n_edges,), -5.0)
    for e in PATHS[0]:
        la[index[e]] = 3.0
    reference = torch.zeros(graph.n_edges)
    for e in PATHS[1]:
        reference[index[e]] = 1.0
    sel = select_edges(graph, la, countable, 2, loss_of, extra=0, min_effect=1e-3, rankings=[reference],
                       validate=validate)  # fmt: skip
    return sel, {graph.edges[i] for i in sel.edges.nonzero().flatten().tolist()}


@pytest.mark.parametrize("gap", [0.2, 0.0])
def test_the_selection_must_beat_the_reference_circuit_on_fresh_traces(gap):
    """Path 0 wins on the selection's traces; on fresh traces it is kept only when it is
    better there by two standard errors, else the reference ranking's circuit is taken."""
    _, index = _two_path_graph()
    noise = torch.randn(64, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 1e-3
    seen = []

    def validate(kept):  # per-trace shares: path 0's lower by `gap` in all, plus noise
        seen.append(kept.clone())
        shares = torch.full((64,), 0.5 / 64, dtype=torch.float64)
        return shares + noise - gap / 64 if bool(kept[index[("a0.h0", "out")]]) else shares

    sel, edges = _two_path_selection(validate)
    assert len(seen) == 2 and sel.validation["traces"] == 64
    if gap:
        assert edges == PATHS[0] and sel.validation["chosen"] == "selection" and sel.loss == 0.5
        assert sel.validation["selected_loss"] == pytest.approx(0.3, abs=0.01)
    else:
        assert edges == PATHS[1] and sel.validation["chosen"] == "reference" and sel.loss == pytest.approx(0.51)
        assert set(sel.effects) == {index[e] for e in PATHS[1]}  # the effects are the taken circuit's


def test_no_validation_without_fresh_traces():
    sel, edges = _two_path_selection(None)
    assert edges == PATHS[0] and sel.validation is None
