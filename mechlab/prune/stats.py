"""Overlap statistics for circuits: bootstrap intervals, null models, cross-evaluation.

A low Jaccard between the circuits of two targets means little on its own. This module
says how it compares with

* **seed noise** (:func:`bootstrap_overlap`): the mean pairwise Jaccard (and overlap
  coefficient) with a percentile bootstrap interval. What is resampled: each target's
  list of circuits (one per pruning seed), with replacement and independently per
  target; the statistic is recomputed from the precomputed pairwise matrix. Across
  targets: mean over all ``(a_i, b_j)`` pairs of the resample. Within a target: mean
  over pairs of resampled draws that are different circuits (a circuit is never
  compared with itself; a resample drawing one circuit only is skipped);
* **chance** (:func:`null_model`): the same statistic between random circuits of the
  same sizes over the same edges. ``"uniform"``: every circuit replaced by a uniformly
  random edge set of its size; for one pair, ``|A & B|`` is hypergeometric
  (``N`` edges, ``|A|`` marked, ``|B|`` drawn) and the Jaccard ``X / (|A| + |B| - X)``
  is monotone in it, so the expected value and tail probabilities are exact
  (:func:`jaccard_null_exact`); for several circuits per target the expectation is the
  mean of the pairs' exact values and the tails are Monte Carlo. ``"degree"``: every
  circuit replaced by a random edge set in which each writer keeps its out-degree and
  each reader its in-degree, drawn by a Markov chain of edge swaps ``(w1, r1), (w2, r2)
  -> (w1, r2), (w2, r1)`` accepted only when both new edges are graph edges not yet
  in the circuit (:func:`degree_preserving_sample`);
* **function** (:func:`cross_evaluate`): each target's circuit scored on the other
  target's positions.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.stats import hypergeom
from torch import nn

from mechlab.limits import check_elements
from mechlab.progress import tqdm
from mechlab.prune.circuit import Circuit, has_interval, jaccard, no_interval, overlap
from mechlab.prune.consensus import STABLE_CONSENSUS, stable_edges, target_consensus
from mechlab.prune.evaluate import evaluate_circuit
from mechlab.prune.graph import graph_from_summary
from mechlab.traces import PruneData

Edge = tuple[str, str]
NULLS = ("uniform", "degree")
STATISTICS = ("jaccard", "overlap_coefficient")


# ---------------------------------------------------------------------------------------
# Pairwise statistics
# ---------------------------------------------------------------------------------------


def _statistic(a: set, b: set, statistic: str) -> float:
    if statistic == "jaccard":
        return jaccard(a, b)
    smallest = min(len(a), len(b))
    return len(a & b) / smallest if smallest else 0.0


def _check_statistic(statistic: str) -> None:
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {STATISTICS}")


def graph_edges(circuit: Circuit) -> list[Edge]:
    """Every edge of the graph a circuit was pruned from, rebuilt from its metadata.

    Args:
        circuit: A circuit whose ``metadata["graph"]`` records ``arch``, ``n_layers``,
            (transformers) ``n_heads`` and (windowed recurrent graphs) ``windows``.

    Returns:
        The graph's edges in graph order.
    """
    info = circuit.metadata.get("graph")
    if not info or "arch" not in info:
        raise ValueError("the circuit records no graph (metadata['graph']); pass the edges")
    try:
        graph = graph_from_summary(info)
    except ValueError as exc:
        raise ValueError(f"{exc} (the circuit's metadata); pass the edges explicitly") from None
    return list(graph.edges)


def _universe(edges: Iterable[Edge], circuits: Iterable[Circuit]) -> list[Edge]:
    universe = list(dict.fromkeys((str(w), str(r)) for w, r in edges))
    known = set(universe)
    for c in circuits:
        missing = c.edge_set() - known
        if missing:
            raise ValueError(
                f"circuit edge {sorted(missing)[0]} is not among the {len(universe)} graph edges "
                "given; pass the edges of the graph the circuits come from"
            )
    return universe


# ---------------------------------------------------------------------------------------
# Bootstrap over seeds
# ---------------------------------------------------------------------------------------


@dataclass
class Interval:
    """A point estimate with a percentile bootstrap interval.

    Attributes:
        value: The statistic on the circuits as given.
        low, high: Percentile bounds at ``level``.
        level: Coverage asked (e.g. 0.95).
        n_boot: Resamples used (fewer than asked when some were skipped).
        resampled: What was resampled, in words.
    """

    value: float
    low: float
    high: float
    level: float
    n_boot: int
    resampled: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_boot(n_boot: int, level: float) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    check_elements("the bootstrap's resamples", {"n_boot": n_boot}, lower="n_boot (--boot)")
    if not (isinstance(level, (int, float)) and 0 < level < 1):
        raise ValueError(f"level must be in (0, 1), got {level!r}")


def _interval(value: float, samples: list[float], level: float, resampled: str) -> Interval:
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(samples, [tail, 100 - tail]) if samples else (math.nan, math.nan)
    return Interval(float(value), float(low), float(high), float(level), len(samples), resampled)


def bootstrap_overlap(
    circuits_a: Sequence[Circuit],
    circuits_b: Sequence[Circuit] | None = None,
    *,
    statistic: str = "jaccard",
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Mean pairwise overlap of circuits with a percentile bootstrap interval over seeds.

    Across targets (``circuits_b`` given): the mean of ``stat(a_i, b_j)`` over all pairs;
    each resample draws ``len(circuits_a)`` of A's circuits and ``len(circuits_b)`` of
    B's, with replacement, independently. Within a target (``circuits_b`` None): the
    mean of ``stat(a_i, a_j)`` over pairs of draws that are different circuits.

    Args:
        circuits_a: Circuits of one target, one per seed (at least 2).
        circuits_b: Circuits of another target (at least 1), or None for within-target.
        statistic: ``"jaccard"`` or ``"overlap_coefficient"``.
        n_boot: Bootstrap resamples.
        level: Interval coverage.
        seed: Seed of the resampling.

    Returns:
        The :class:`Interval`.
    """
    _check_statistic(statistic)
    _check_boot(n_boot, level)
    rng = np.random.default_rng(seed)
    sets_a = [c.edge_set() for c in circuits_a]
    if len(sets_a) < 2:
        raise ValueError(f"bootstrap over seeds needs >= 2 circuits per target, got {len(sets_a)}")
    if circuits_b is not None:
        sets_b = [c.edge_set() for c in circuits_b]
        if not sets_b:
            raise ValueError("circuits_b is empty; give at least one circuit per target")
        for a, b in zip(circuits_a[:1], circuits_b[:1], strict=False):
            overlap(a, b)  # refuses circuits of different graphs
        m = np.array([[_statistic(a, b, statistic) for b in sets_b] for a in sets_a])
        samples = [
            float(m[np.ix_(rng.integers(0, len(sets_a), len(sets_a)),
                           rng.integers(0, len(sets_b), len(sets_b)))].mean())
            for _ in range(n_boot)
        ]  # fmt: skip
        what = (
            f"each target's circuits (A: {len(sets_a)}, B: {len(sets_b)}) with replacement, "
            "independently; statistic = mean over all A x B pairs"
        )
        return _interval(float(m.mean()), samples, level, what)
    n = len(sets_a)
    m = np.array([[_statistic(a, b, statistic) for b in sets_a] for a in sets_a])
    upper = np.triu_indices(n, k=1)
    samples = []
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        i, j = idx[upper[0]], idx[upper[1]]
        distinct = i != j
        if distinct.any():
            samples.append(float(m[i[distinct], j[distinct]].mean()))
    what = (
        f"the target's {n} circuits with replacement; statistic = mean over pairs of draws "
        "that are different circuits (resamples of one circuit skipped)"
    )
    return _interval(float(m[upper].mean()), samples, level, what)


# ---------------------------------------------------------------------------------------
# Null models
# ---------------------------------------------------------------------------------------


def shared_edges_pmf(n_edges: int, size_a: int, size_b: int) -> tuple[np.ndarray, np.ndarray]:
    """Distribution of ``|A & B|`` for uniformly random edge sets of sizes ``size_a``, ``size_b``.

    Args:
        n_edges: Edges in the graph ``N``.
        size_a: ``|A|``.
        size_b: ``|B|``.

    Returns:
        ``(x, pmf)``: possible shared counts and their hypergeometric probabilities.
    """
    for name, v in (("n_edges", n_edges), ("size_a", size_a), ("size_b", size_b)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    if max(size_a, size_b) > n_edges:
        raise ValueError(f"circuit sizes {size_a}, {size_b} exceed the graph's {n_edges} edges")
    x = np.arange(max(0, size_a + size_b - n_edges), min(size_a, size_b) + 1)
    return x, hypergeom(n_edges, size_a, size_b).pmf(x)


def _stat_of_shared(x: np.ndarray, size_a: int, size_b: int, statistic: str) -> np.ndarray:
    if statistic == "jaccard":
        union = size_a + size_b - x
        return np.where(union > 0, x / np.maximum(union, 1), 1.0)
    smallest = min(size_a, size_b)
    return x / smallest if smallest else np.zeros_like(x, dtype=float)


def jaccard_null_exact(
    n_edges: int, size_a: int, size_b: int, observed: float | None = None,
    statistic: str = "jaccard",
) -> dict[str, float]:  # fmt: skip
    """Exact uniform null of one pair's overlap statistic.

    Args:
        n_edges: Edges in the graph.
        size_a: Edges of circuit A.
        size_b: Edges of circuit B.
        observed: The observed statistic, for the tail probabilities.
        statistic: ``"jaccard"`` or ``"overlap_coefficient"``.

    Returns:
        ``expected`` (``sum_x pmf(x) stat(x)``), ``std``, and with ``observed`` given:
        ``p_greater`` = P(null >= observed), ``p_less`` = P(null <= observed),
        ``percentile`` = P(null < observed) + P(null = observed) / 2.
    """
    _check_statistic(statistic)
    x, pmf = shared_edges_pmf(n_edges, size_a, size_b)
    values = _stat_of_shared(x, size_a, size_b, statistic)
    mean = float((pmf * values).sum())
    out = {"expected": mean, "std": float(math.sqrt(max((pmf * (values - mean) ** 2).sum(), 0)))}
    if observed is not None:
        eq = np.isclose(values, observed, rtol=0, atol=1e-12)
        out["p_greater"] = float(pmf[(values > observed) | eq].sum())
        out["p_less"] = float(pmf[(values < observed) | eq].sum())
        out["percentile"] = float(pmf[(values < observed) & ~eq].sum() + pmf[eq].sum() / 2)
    return out


class DegreeSampler:
    """Random edge sets with the degrees of a given circuit, by edge swaps within the graph.

    Each swap picks two kept edges ``(w1, r1), (w2, r2)`` and, when ``(w1, r2)`` and
    ``(w2, r1)`` are graph edges not in the set, replaces the pair by them: every
    writer's out-degree and every reader's in-degree stay as they were.

    Args:
        edges: The circuit's edges (the chain's start).
        universe: Every edge the set may hold.
        rng: Source of randomness.
        swaps: Swaps attempted between two samples (default ``10 * len(edges)``).
        burn_in: Swaps attempted before the first sample (default ``10 * swaps``).
    """

    def __init__(
        self, edges: Iterable[Edge], universe: Iterable[Edge], rng: random.Random,
        swaps: int | None = None, burn_in: int | None = None,
    ) -> None:  # fmt: skip
        self.allowed = set(universe)
        self.current = sorted(set(edges))
        self.members = set(self.current)
        self.rng = rng
        self.swaps = 10 * len(self.current) if swaps is None else swaps
        self.accepted = 0
        self._run(10 * self.swaps if burn_in is None else burn_in)

    def _run(self, n: int) -> None:
        k = len(self.current)
        if k < 2:
            return
        for _ in range(n):
            i, j = self.rng.randrange(k), self.rng.randrange(k)
            (w1, r1), (w2, r2) = self.current[i], self.current[j]
            new1, new2 = (w1, r2), (w2, r1)
            if w1 == w2 or r1 == r2 or new1 in self.members or new2 in self.members:
                continue
            if new1 not in self.allowed or new2 not in self.allowed:
                continue
            self.members -= {self.current[i], self.current[j]}
            self.members |= {new1, new2}
            self.current[i], self.current[j] = new1, new2
            self.accepted += 1

    def sample(self) -> set[Edge]:
        """The next edge set of the chain (``swaps`` swaps after the previous one)."""
        self._run(self.swaps)
        return set(self.members)


def degree_preserving_sample(
    circuit: Circuit, universe: Sequence[Edge], n: int = 1, seed: int = 0
) -> list[set[Edge]]:
    """``n`` random edge sets with the circuit's writer out-degrees and reader in-degrees.

    Args:
        circuit: The circuit whose degrees are kept.
        universe: The graph's edges (:func:`graph_edges`).
        n: Samples.
        seed: Seed of the chain.

    Returns:
        ``n`` edge sets, each a subset of ``universe``.
    """
    universe = _universe(universe, [circuit])
    sampler = DegreeSampler(circuit.edge_set(), universe, random.Random(seed))
    return [sampler.sample() for _ in range(n)]


@dataclass
class NullResult:
    """Where an observed mean overlap falls among random circuits of the same sizes.

    Attributes:
        kind: ``"uniform"`` or ``"degree"``.
        statistic: ``"jaccard"`` or ``"overlap_coefficient"``.
        observed: Mean statistic over all ``(a_i, b_j)`` pairs of the given circuits.
        expected_exact: Its exact expectation under the uniform null (mean of the pairs'
            hypergeometric expectations), or None (degree null).
        mc_mean, mc_std: Mean and std of the statistic over the Monte Carlo samples.
        p_greater: ``(1 + #{null >= observed}) / (1 + n)`` (exact when one pair, uniform).
        p_less: ``(1 + #{null <= observed}) / (1 + n)`` (exact when one pair, uniform).
        percentile: Fraction of null samples below the observed value (ties count half).
        n_samples: Monte Carlo samples.
        n_universe: Edges the random circuits were drawn from.
    """

    kind: str
    statistic: str
    observed: float
    expected_exact: float | None
    mc_mean: float
    mc_std: float
    p_greater: float
    p_less: float
    percentile: float
    n_samples: int
    n_universe: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def null_model(
    circuits_a: Sequence[Circuit],
    circuits_b: Sequence[Circuit],
    universe: Sequence[Edge] | None = None,
    *,
    kind: str = "uniform",
    statistic: str = "jaccard",
    n_samples: int = 1000,
    seed: int = 0,
    progress: bool = False,
) -> NullResult:
    """Compare the mean overlap of two targets' circuits with random circuits of the same sizes.

    Each Monte Carlo sample replaces every circuit (of both targets) by an independent
    random edge set of its size (``"uniform"``) or of its degrees (``"degree"``) and
    recomputes the mean statistic over all ``(a_i, b_j)`` pairs.

    Args:
        circuits_a: Circuits of one target (one or more).
        circuits_b: Circuits of another target (one or more).
        universe: The graph's edges (default: rebuilt from the first circuit's metadata);
            pass a subset to leave out edges that cannot matter.
        kind: ``"uniform"`` or ``"degree"``.
        statistic: ``"jaccard"`` or ``"overlap_coefficient"``.
        n_samples: Monte Carlo samples.
        seed: Seed.
        progress: Show a progress bar.

    Returns:
        The :class:`NullResult`.
    """
    if kind not in NULLS:
        raise ValueError(f"unknown null model {kind!r}; choose one of {NULLS}")
    _check_statistic(statistic)
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
    check_elements("the null model's samples", {"n_samples": n_samples}, lower="n_samples (--null)")
    if not circuits_a or not circuits_b:
        raise ValueError("null_model needs at least one circuit of each target")
    overlap(circuits_a[0], circuits_b[0])  # refuses circuits of different graphs
    everything = [*circuits_a, *circuits_b]
    universe = _universe(graph_edges(everything[0]) if universe is None else universe, everything)
    pairs = [(a.edge_set(), b.edge_set()) for a in circuits_a for b in circuits_b]
    observed = float(np.mean([_statistic(a, b, statistic) for a, b in pairs]))
    expected = None
    if kind == "uniform":
        expected = float(np.mean([
            jaccard_null_exact(len(universe), len(a), len(b), statistic=statistic)["expected"]
            for a, b in pairs
        ]))  # fmt: skip
    rng = random.Random(seed)
    if kind == "degree":
        samplers = [DegreeSampler(c.edge_set(), universe, rng) for c in everything]
        draw = [s.sample for s in samplers]
    else:
        draw = [lambda k=c.n_edges: set(rng.sample(universe, k)) for c in everything]
    n_a = len(circuits_a)
    values = np.empty(n_samples)
    for s in tqdm(range(n_samples), disable=not progress, desc=f"{kind} null", unit="sample"):
        sets = [f() for f in draw]
        values[s] = np.mean([_statistic(a, b, statistic) for a in sets[:n_a] for b in sets[n_a:]])
    eq = np.isclose(values, observed, rtol=0, atol=1e-12)
    greater, less = int(((values > observed) | eq).sum()), int(((values < observed) | eq).sum())
    result = NullResult(
        kind=kind, statistic=statistic, observed=observed, expected_exact=expected,
        mc_mean=float(values.mean()), mc_std=float(values.std()),
        p_greater=(1 + greater) / (1 + n_samples), p_less=(1 + less) / (1 + n_samples),
        percentile=float(((values < observed) & ~eq).mean() + eq.mean() / 2),
        n_samples=n_samples, n_universe=len(universe),
    )  # fmt: skip
    if kind == "uniform" and len(pairs) == 1:  # one pair: the tails are exact
        a, b = pairs[0]
        exact = jaccard_null_exact(len(universe), len(a), len(b), observed, statistic)
        result.p_greater, result.p_less = exact["p_greater"], exact["p_less"]
        result.percentile = exact["percentile"]
    return result


# ---------------------------------------------------------------------------------------
# Cross-evaluation
# ---------------------------------------------------------------------------------------


def cross_evaluate(
    model: nn.Module,
    data: PruneData,
    circuits: Sequence[Circuit],
    targets: Sequence[str] | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Score every circuit on every target's positions (its own and the others').

    Args:
        model: The model the circuits were pruned from.
        data: Traces (held-out set scored).
        circuits: Circuits (each records its ``target``).
        targets: Targets to score on (default: the circuits' own targets, in order).
        progress: Show a bar for each (circuit, target) over its batches of traces
            (``cross-evaluation 1/4, 1-after seed 0 on 2-after: ...``).

    Returns:
        One row per (circuit, target): ``circuit_target``, ``seed``, ``evaluated_on``,
        ``own`` (True on the circuit's own target), ``faithfulness``,
        ``complement_faithfulness``, ``error_circuit`` (when the traces have a truth).
    """
    if not circuits:
        raise ValueError("cross_evaluate needs at least one circuit")
    own = [str(c.metadata.get("target")) for c in circuits]
    targets = list(dict.fromkeys(own)) if targets is None else list(targets)
    rows = []
    jobs = list(itertools.product(range(len(circuits)), targets))
    for k, (i, target) in enumerate(jobs, 1):
        stage = f"cross-evaluation {k}/{len(jobs)}, {own[i]} seed {circuits[i].metadata.get('seed')} on {target}"
        m = evaluate_circuit(model, data, circuits[i], target=target, progress=progress, stage=stage)
        rows.append({
            "circuit_target": own[i], "seed": circuits[i].metadata.get("seed"),
            "evaluated_on": target, "own": own[i] == target,
            "faithfulness": m["faithfulness"],
            "complement_faithfulness": m["complement_faithfulness"],
            "error_circuit": m.get("error_circuit"),
        })  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------
# Everything for a set of circuits
# ---------------------------------------------------------------------------------------


def overlap_report(
    circuits: Sequence[Circuit],
    universe: Sequence[Edge] | None = None,
    *,
    n_boot: int = 2000,
    n_null: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Bootstrap intervals and null models for circuits grouped by their recorded target.

    Args:
        circuits: Circuits of one or more targets (several seeds each for intervals).
        universe: The graph's edges (default: rebuilt from the first circuit).
        n_boot: Bootstrap resamples.
        n_null: Monte Carlo samples of each null model.
        level: Interval coverage.
        seed: Seed.
        progress: Show progress bars.

    Returns:
        JSON-ready dict: ``n_circuits`` (target -> its circuits), ``within`` (target -> its seed-baseline Jaccard with its interval,
        targets with >= 2 circuits; ``low``/``high`` None, ``n_boot`` 0, below
        :data:`~mechlab.prune.circuit.MIN_SEEDS_FOR_INTERVAL` circuits), ``consensus``
        (target -> :func:`target_consensus`) and ``across`` (``"a vs b"`` -> ``jaccard``,
        ``overlap_coefficient`` intervals (None unless both targets have
        :data:`~mechlab.prune.circuit.MIN_SEEDS_FOR_INTERVAL` circuits), ``jaccard_observed``
        (the cross-target Jaccard: mean over every pair) and ``overlap_coefficient_observed``,
        ``null_uniform``, ``null_degree``, and ``edges``: :func:`stable_edges` of the two
        targets). The names and the interval rule: :mod:`mechlab.prune.circuit`.
    """
    if not circuits:
        raise ValueError("overlap_report needs at least one circuit")
    groups: dict[str, list[Circuit]] = {}
    for c in circuits:
        groups.setdefault(str(c.metadata.get("target", "?")), []).append(c)
    universe = _universe(graph_edges(circuits[0]) if universe is None else universe, circuits)
    boot = {"n_boot": n_boot, "level": level, "seed": seed}
    report: dict[str, Any] = {"n_universe": len(universe), "within": {}, "across": {},
                              "n_circuits": {name: len(group) for name, group in groups.items()}}  # fmt: skip
    consensus = {name: target_consensus(group) for name, group in groups.items()}
    report["consensus"] = {name: {"scores": [[w, r, f] for (w, r), f in c.items()],
                                  "stable_at": STABLE_CONSENSUS}
                           for name, c in consensus.items()}  # fmt: skip
    for name, group in groups.items():
        if has_interval(len(group)):
            report["within"][name] = bootstrap_overlap(group, **boot).to_dict()
        elif len(group) >= 2:  # the seed baseline without an interval (MIN_SEEDS_FOR_INTERVAL)
            pairs = [jaccard(a.edge_set(), b.edge_set()) for a, b in itertools.combinations(group, 2)]
            report["within"][name] = Interval(sum(pairs) / len(pairs), None, None, level, 0,  # type: ignore[arg-type]
                                              no_interval(len(group))).to_dict()  # fmt: skip
    for (na, ga), (nb, gb) in itertools.combinations(groups.items(), 2):
        entry: dict[str, Any] = {}
        for stat in STATISTICS:
            # the statistic itself, mean over every (a, b) pair: there even with one circuit each
            pairs = [_statistic(a.edge_set(), b.edge_set(), stat) for a in ga for b in gb]
            entry[f"{stat}_observed"] = sum(pairs) / len(pairs)
            if has_interval(len(ga), len(gb)):
                entry[stat] = bootstrap_overlap(ga, gb, statistic=stat, **boot).to_dict()
            else:
                entry[stat] = None
        for kind in NULLS:
            entry[f"null_{kind}"] = null_model(
                ga, gb, universe, kind=kind, n_samples=n_null, seed=seed, progress=progress
            ).to_dict()
        entry["edges"] = stable_edges(consensus[na], consensus[nb])
        report["across"][f"{na} vs {nb}"] = entry
    return report

