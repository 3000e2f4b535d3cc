"""Consensus: how often each edge is kept across seeds and nearby budgets.

One pruning run gives one circuit; whether an edge in it is the model's or the seed's
shows only across runs. :func:`consensus_prune` prunes a target with several seeds at
the asked budget and at nearby ones (by default 0.8x and 1.25x the asked edge count,
where those differ from it) and records on the asked run's circuit, for every edge any
run kept, the fraction of runs that kept it: its **consensus score**, in (0, 1].

The scores are plain data in the circuit's metadata (so its JSON carries them and
:mod:`mechlab.prune.circuit_file` checks them)::

    metadata["consensus"] = {
        "scores": [[writer, reader, fraction], ...],   # every edge some run kept
        "n_runs": 9, "seeds": [0, 1, 2], "sparsities": [0.96, 0.95, 0.9375],
        "stable_at": 0.8,                               # STABLE_CONSENSUS
    }

:func:`consensus_scores` reads them back; :func:`attach_consensus` computes them from
circuits pruned before (the committed seeds of a target, say);
:func:`mechlab.prune.stats.overlap_report` reports which shared and unshared edges of two
targets are stable (kept in at least :data:`STABLE_CONSENSUS` of a target's runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from mechlab.prune import masks as hc
from mechlab.prune.circuit import Circuit
from mechlab.prune.config import PruneConfig, prune_config
from mechlab.prune.engine import prune
from mechlab.prune.graph import countable_edges, pruning_graph
from mechlab.traces import PruneData, Target, target_positions

Edge = tuple[str, str]
STABLE_CONSENSUS = 0.8  # an edge kept in at least this fraction of runs is "stable"
BUDGET_FACTORS = (0.8, 1.0, 1.25)  # nearby budgets, as factors of the asked edge count


def edge_frequencies(circuits: Sequence[Circuit]) -> dict[Edge, float]:
    """Edge -> the fraction of ``circuits`` that keep it (edges some circuit keeps), in
    order of decreasing fraction (ties: first appearance)."""
    if not circuits:
        raise ValueError("edge_frequencies needs at least one circuit")
    counts: dict[Edge, int] = {}
    for circuit in circuits:
        for edge in circuit.edges:
            counts[edge] = counts.get(edge, 0) + 1
    n = len(circuits)
    return dict(sorted(((e, c / n) for e, c in counts.items()), key=lambda kv: -kv[1]))


def attach_consensus(
    circuit: Circuit,
    runs: Sequence[Circuit],
    seeds: Sequence[int] | None = None,
    sparsities: Sequence[float] | None = None,
) -> Circuit:
    """Record on ``circuit`` the consensus of ``runs`` (which should include it).

    Args:
        circuit: The circuit to annotate (its metadata is updated in place).
        runs: Circuits of the same target and graph (other seeds, nearby budgets).
        seeds: The runs' seeds (default: read from their metadata).
        sparsities: The runs' asked sparsities (default: read from their metadata).

    Returns:
        ``circuit``.
    """
    freq = edge_frequencies(runs)
    seeds = sorted({r.metadata.get("seed") for r in runs if r.metadata.get("seed") is not None}) \
        if seeds is None else list(seeds)  # fmt: skip
    if sparsities is None:
        sparsities = sorted({r.metadata.get("sparsity_asked") for r in runs
                             if r.metadata.get("sparsity_asked") is not None}, reverse=True)  # fmt: skip
    circuit.metadata["consensus"] = {
        "scores": [[w, r, f] for (w, r), f in freq.items()],
        "n_runs": len(runs),
        "seeds": [int(s) for s in seeds],
        "sparsities": [float(s) for s in sparsities],
        "stable_at": STABLE_CONSENSUS,
    }
    return circuit


def attach_seed_consensus(circuits: Sequence[Circuit]) -> None:
    """Record on each of one target's ``circuits`` (one per seed, at one budget) the
    consensus of them all (what ``mechlab prune`` and ``mechlab report`` record when they
    run two or more seeds); nothing with fewer than two."""
    if len(circuits) >= 2:
        for circuit in circuits:
            attach_consensus(circuit, circuits)


def consensus_scores(circuit: Circuit) -> dict[Edge, float] | None:
    """Edge -> consensus score recorded on ``circuit`` (None when it records none);
    an edge of the circuit that no recorded run kept cannot occur (the circuit is a run)."""
    entry = circuit.metadata.get("consensus")
    if not entry:
        return None
    return {(w, r): float(f) for w, r, f in entry["scores"]}


def nearby_sparsities(
    n_countable: int, sparsity: float, factors: Sequence[float] = BUDGET_FACTORS
) -> list[float]:
    """The asked sparsity and the nearby ones: edge counts ``round(f * k)`` (at least 1,
    at most ``n_countable - 1``; duplicates dropped), as sparsities, densest last."""
    k = hc.keep_count(n_countable, sparsity)
    counts = sorted({min(max(1, round(f * k)), n_countable - 1) for f in factors} | {k})
    return [sparsity if c == k else 1.0 - c / n_countable for c in counts]


def consensus_prune(
    model: nn.Module,
    data: PruneData,
    target: Target,
    sparsity: float | None = None,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    budget_factors: Sequence[float] = BUDGET_FACTORS,
    config: PruneConfig | None = None,
    progress: bool = False,
    **settings: Any,
) -> Circuit:
    """Prune with every seed at the asked and nearby budgets; return the first seed's
    circuit at the asked budget with the consensus of all the runs (module docstring).

    Args:
        model: The model.
        data: The traces (the same for every run; vary them by pruning per data seed and
            combining with :func:`attach_consensus`).
        target: The target.
        sparsity: The asked sparsity (None: the config's).
        seeds: Pruning seeds (at least one).
        budget_factors: Nearby budgets as factors of the asked edge count (1 is always run).
        config: The search settings.
        progress: Show the runs' progress bars.
        **settings: :class:`~mechlab.prune.config.PruneConfig` fields or
            :func:`~mechlab.prune.engine.prune`'s ``position_aware`` / ``checkpoint_sha256``.

    Returns:
        The circuit (``len(seeds) * len(budgets)`` runs; metadata ``consensus``).
    """
    if not seeds:
        raise ValueError("consensus_prune needs at least one seed")
    run_args = {
        k: settings.pop(k) for k in ("position_aware", "checkpoint_sha256") if k in settings
    }
    config = prune_config(sparsity, config, **settings)
    graph = pruning_graph(model, data.train.windows, run_args.get("position_aware"))
    scored = target_positions(target, data.train) if graph.windows else None
    n = int(countable_edges(graph, config.ablation, scored).sum())
    budgets = nearby_sparsities(n, config.sparsity, budget_factors)
    runs, main = [], None
    for seed in seeds:
        for s in budgets:
            circuit = prune(
                model, data, target, s, config=config, seed=seed, progress=progress, **run_args
            )
            runs.append(circuit)
            if main is None and s == config.sparsity:
                main = circuit
    return attach_consensus(main, runs, seeds, budgets)


def target_consensus(circuits: Sequence[Circuit]) -> dict[Edge, float]:
    """Edge -> how often one target's circuits keep it: the fraction of its circuits
    (its seeds) when there are several, else the consensus the circuit records
    (:mod:`mechlab.prune.consensus`), else 1 for each of its edges."""
    if len(circuits) == 1:
        recorded = consensus_scores(circuits[0])
        if recorded is not None:
            return dict(sorted(recorded.items(), key=lambda kv: -kv[1]))
    return edge_frequencies(circuits)


def stable_edges(a: dict[Edge, float], b: dict[Edge, float], stable: float = STABLE_CONSENSUS) -> dict[str, Any]:
    """The two targets' edges by sharing and stability.

    An edge is *shared* when both targets keep it in some run, and *stable* in a target
    when its consensus there is at least ``stable``. Lists of ``[writer, reader, score a,
    score b]`` (0 where a target never keeps it): ``shared_stable`` (stable in both),
    ``shared_unstable``, ``a_only_stable``, ``a_only_unstable``, ``b_only_stable``,
    ``b_only_unstable``, with their counts.
    """
    out: dict[str, list[list[Any]]] = {k: [] for k in (
        "shared_stable", "shared_unstable", "a_only_stable", "a_only_unstable",
        "b_only_stable", "b_only_unstable")}  # fmt: skip
    for edge in list(a) + [e for e in b if e not in a]:
        fa, fb = a.get(edge, 0.0), b.get(edge, 0.0)
        if fa > 0 and fb > 0:
            key = "shared_stable" if min(fa, fb) >= stable else "shared_unstable"
        elif fa > 0:
            key = "a_only_stable" if fa >= stable else "a_only_unstable"
        else:
            key = "b_only_stable" if fb >= stable else "b_only_unstable"
        out[key].append([edge[0], edge[1], fa, fb])
    return {**out, **{f"n_{k}": len(v) for k, v in out.items()}, "stable_at": stable}


__all__ = [
    "BUDGET_FACTORS",
    "STABLE_CONSENSUS",
    "attach_consensus",
    "attach_seed_consensus",
    "consensus_prune",
    "consensus_scores",
    "edge_frequencies",
    "nearby_sparsities",
    "stable_edges",
    "target_consensus",
]
