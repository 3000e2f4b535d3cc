"""Joint pruning: several targets pruned at once on one model, with a reward for sharing edges.

Two targets with little circuit overlap may use different mechanisms, or the model may
hold redundant routes and each pruning run may merely pick a different one. Pruning the
targets jointly, with a term that pays for using the same edges, tells these apart: if
the circuits can be made to share at no loss of faithfulness, the low overlap was
redundancy; if sharing costs faithfulness, the targets need different edges.

:func:`joint_prune` runs the search core :func:`prune` runs
(:func:`mechlab.prune.search.optimise_masks`), each target with its own hard-concrete edge
masks, task loss and sparsity budget (or Lagrangian). With
``share > 0`` each target's location parameters are a consensus plus a private part,

    log_alpha_t = log_alpha_0 + delta_t,
    penalty = share * mean over targets t of  sum_e |P_t(e) - P_0(e)| / k_t

(``P(e)`` the probability that a mask is non-zero, ``k_t`` the edges target ``t`` keeps),
so an edge that serves every target gathers every target's gradient in the consensus.
``share = "tied"`` (``math.inf``) is the limit: one mask set, its loss the sum of the
targets' losses. ``share = 0``: independent targets, each drawing the same batches and
mask noise as :func:`prune` with the same seed, so each circuit is :func:`prune`'s.

The search often ends with several equally useful routes still open; ranking them by
``log_alpha`` would break the tie by optimiser noise. By default (``select="refine"``)
the circuits are chosen on the objective (:mod:`mechlab.prune.refine`): independent
targets as :func:`prune` chooses; tied, one circuit by elimination and fill on the
summed losses; otherwise by backward elimination on the targets' losses plus ``share``
times the circuits' pairwise disagreement ``|A xor B| / k``. On the planted models of ``tests/prune/test_joint.py`` this makes
sharing pick the route both targets can use, every seed.

:func:`share_sweep` runs a small grid of ``share`` values over seeds and reports, per
target, faithfulness and complement faithfulness on held-out traces, the Jaccard of the
circuits, and how much faithfulness sharing costs against ``share = 0``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.prune.circuit import Circuit
from mechlab.prune.circuit import jaccard as jaccard_of
from mechlab.prune.config import JOINT_CONFIG, PruneConfig, prune_config
from mechlab.prune.engine import (
    SearchSetup,
    check_prune_args,
    finish_circuit,
    prepare_search,
    refine_result,
    run_searches,
    search_record,
)
from mechlab.prune.forward import frozen_eval
from mechlab.prune.paths import select_on_paths
from mechlab.prune.refine import (
    Selection,
    greedy_eliminate_joint,
    kept_log_alpha,
    loss_function,
    pair_disagreement,
    ranked_pool,
    select_edges,
)
from mechlab.prune.search import MaskResult, consensus_penalty  # noqa: F401 (re-exported)
from mechlab.traces import PruneData, Target, check_target, target_name

SHARES = (0.0, 0.3, 1.0, math.inf)  # the default sweep (inf: tied)
UNBALANCED = 2.0  # warn when the targets' fully ablated losses differ more than this


def check_share(share: Any) -> float:
    """Return ``share`` as a float, or raise a one-line ValueError.

    ``share`` is a number >= 0, or ``math.inf`` / ``"tied"`` (one circuit for every target).
    """
    if isinstance(share, str) and share.strip().lower() in ("tied", "inf"):
        return math.inf
    if isinstance(share, bool) or not isinstance(share, (int, float)) or math.isnan(share):
        raise ValueError(f"share must be a number >= 0 or 'tied', got {share!r}")
    if share < 0:
        raise ValueError(f"share must be >= 0 (0: independent targets), got {share!r}")
    return float(share)


def check_joint_targets(targets: Any, data: PruneData) -> list[Target]:
    """The targets as a list, or a one-line ValueError: at least two, distinct, known."""
    if isinstance(targets, str) or not isinstance(targets, Sequence):
        raise ValueError(f"targets must be a list of at least two targets, got {targets!r}")
    targets = list(targets)
    if len(targets) < 2:
        raise ValueError(f"joint pruning needs at least two targets, got {len(targets)}")
    names = [target_name(t) for t in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"targets must be distinct, got {names}")
    for t in targets:
        check_target(t, data.train)
    return targets


@dataclass
class JointResult:
    """What :func:`joint_prune` returns.

    Attributes:
        circuits: Target name -> its :class:`~mechlab.prune.circuit.Circuit` (metadata:
            ``joint=True``, ``share``, ``partners``, ``jaccard_with``).
        share: The sharing weight.
        jaccard: ``"a|b"`` -> Jaccard of the two circuits' edge sets.
    """

    circuits: dict[str, Circuit]
    share: float
    jaccard: dict[str, float] = field(default_factory=dict)


def pairwise_jaccard(circuits: dict[str, Circuit]) -> dict[str, float]:
    """``"a|b"`` -> the Jaccard of circuits ``a`` and ``b``'s edge sets, for every pair in order."""
    return {f"{a}|{b}": jaccard_of(circuits[a].edges, circuits[b].edges) for a, b in combinations(circuits, 2)}


def joint_prune(
    model: nn.Module,
    data: PruneData,
    targets: Sequence[Target],
    sparsity: float | None = None,
    share: float = 0.0,
    *,
    config: PruneConfig | None = None,
    seed: int = 0,
    progress: bool = True,
    checkpoint_sha256: str | None = None,
    **settings: Any,
) -> JointResult:
    """Prune several targets of one model at once, rewarding shared edges (module docstring).

    Args:
        model: A mechlab model.
        data: Training and held-out traces, the same for every target.
        targets: At least two distinct targets (``"k-after"``, ``"all"`` or callables).
        sparsity: Edge sparsity of every target's circuit, over the countable edges
            (None: the config's).
        share: Weight of the sharing term, >= 0 (0: independent targets), or
            ``math.inf`` / ``"tied"``: one circuit for every target, its loss the sum of
            the targets' losses.
        config: The search settings (:class:`~mechlab.prune.config.PruneConfig`, edge
            masks only; default :data:`~mechlab.prune.config.JOINT_CONFIG`); ``settings``
            override single fields. ``select="refine"``
            (default) chooses the circuits on the joint objective
            (:mod:`mechlab.prune.refine`), ``"rank"`` by ``log_alpha`` rank as
            :func:`~mechlab.prune.engine.prune` does with it.
        seed: Seed of the masks' initialisation, noise and batches (the same for every
            target, and the same as :func:`~mechlab.prune.engine.prune`'s).
        progress: Show a progress bar.
        checkpoint_sha256: Recorded in the circuits' metadata.
        **settings: Any :class:`~mechlab.prune.config.PruneConfig` field.

    Returns:
        The :class:`JointResult`.

    Raises:
        ValueError: Fewer than two or repeated targets, an unknown target, a bad
            ``share``, node masks, or any of :func:`prune`'s bad arguments, before any work.
    """
    share = check_share(share)
    config = prune_config(sparsity, JOINT_CONFIG if config is None else config, **settings)
    if config.node_sparsity is not None:
        raise ValueError("joint pruning masks edges only; leave node_sparsity unset")
    targets = check_joint_targets(targets, data)
    started = time.perf_counter()
    names = [target_name(t) for t in targets]
    with frozen_eval(model):
        # the fully ablated losses: the normalisation, or the balance check of a shared search
        setup = prepare_search(model, data, targets, config, ablated_losses=config.normalize_loss or share > 0,
                               pool_scores=config.select == "refine" and share == 0, progress=progress)  # fmt: skip
        losses = setup.ablated_losses
        spread = max(losses) / max(min(losses), 1e-12)
        if share > 0 and not config.normalize_loss and spread > UNBALANCED:
            warnings.warn(
                f"the targets' fully ablated losses differ {spread:.1f}x ("
                + ", ".join(f"{n} {v:.3g}" for n, v in zip(names, losses, strict=True))
                + "): the summed raw loss favours the larger; normalize_loss=True weighs the targets equally",
                UserWarning, stacklevel=2,
            )  # fmt: skip
        run = run_searches(
            model, setup, config,
            lambda results, cfg: list(zip(*_refine(model, setup, results, cfg, share, progress), strict=True)),
            share=share, seed=seed, progress=progress, desc="joint pruning",
        )  # fmt: skip
        results, selections = run.results, run.selections
        circuits: dict[str, Circuit] = {}
        for i, t in enumerate(targets):
            recorded = {
                "checkpoint_sha256": checkpoint_sha256, "seed": seed,
                **search_record(config, setup.norms[i]), **run.record(i),
                "joint": True, "share": "tied" if math.isinf(share) else share,
                "refined": config.select == "refine", "partners": [n for n in names if n != names[i]],
            }  # fmt: skip
            circuits[names[i]] = finish_circuit(
                model, setup.graph, data, t, config.ablation, results[i], config.sparsity, None,
                setup.countable[i], setup.scored[i], recorded, started, selection=selections[i],
                progress=progress,
            )  # fmt: skip
    jaccard = pairwise_jaccard(circuits)
    for name, circuit in circuits.items():
        circuit.metadata["jaccard_with"] = {
            other: jaccard_of(circuit.edges, circuits[other].edges) for other in names if other != name
        }
        for warning in circuit.metadata["warnings"]:
            warnings.warn(warning, UserWarning, stacklevel=2)
    return JointResult(circuits=circuits, share=share, jaccard=jaccard)


def _refine(
    model: nn.Module,
    setup: SearchSetup,
    results: list[MaskResult],
    config: PruneConfig,
    share: float,
    progress: bool = False,
) -> tuple[list[MaskResult], list[Selection | None]]:
    """The circuits chosen on the objective (:mod:`mechlab.prune.refine`): independent
    targets (``share = 0``) each as :func:`~mechlab.prune.engine.prune` chooses (so their
    circuits are its circuits); tied, one set by elimination and fill on the summed
    losses; otherwise one set per target, by joint elimination on each target's loss
    plus ``share`` times their disagreement."""
    graph = setup.graph
    loss_of = loss_function(model, graph, setup.train, setup.positions, setup.reference,
                            setup.ablated, setup.norms, config.refine_traces)  # fmt: skip
    n_t = len(results)
    if share == 0:
        pairs = [refine_result(model, setup, results[t], config, target=t, progress=progress) for t in range(n_t)]
        return [r for r, _ in pairs], [s for _, s in pairs]
    counted = [c.cpu() for c in setup.countable]
    if math.isinf(share):
        union = torch.stack(counted).any(0)
        selection = select_edges(graph, results[0].edge_log_alpha, union, min(setup.n_keep),
                                 loss_of(list(range(n_t))), config.ablation, config.refine_extra,
                                 config.min_effect, progress=progress)  # fmt: skip
        out = [MaskResult(kept_log_alpha(r.edge_log_alpha, selection.edges, union), None, r.history)
               for r in results]  # fmt: skip
        return out, [selection] * n_t
    pools = [ranked_pool(r.edge_log_alpha, c, k + config.refine_extra)
             for r, c, k in zip(results, counted, setup.n_keep, strict=True)]  # fmt: skip
    losses = [loss_of([t]) for t in range(n_t)]
    kept = greedy_eliminate_joint(graph, pools, setup.n_keep, losses, share, config.ablation)
    ranked = [select_on_paths(graph, r.edge_log_alpha, c, k, config.ablation)[0]
              for r, c, k in zip(results, counted, setup.n_keep, strict=True)]  # fmt: skip

    def objective(sets: list[Tensor]) -> float:
        return sum(f(k) for f, k in zip(losses, sets, strict=True)) + share * pair_disagreement(sets, setup.n_keep)

    if objective(ranked) < objective(kept):  # greedy steps can go astray (refine.select_edges)
        kept = ranked
    out = [MaskResult(kept_log_alpha(r.edge_log_alpha, k, c), None, r.history)
           for r, k, c in zip(results, kept, counted, strict=True)]  # fmt: skip
    return out, [None] * n_t


@dataclass
class ShareSweep:
    """A :func:`share_sweep`: per share and seed, each target's metrics and the overlap.

    Attributes:
        targets: Target names.
        rows: One dict per (share, seed): ``share``, ``seed``, per target
            ``faithfulness`` / ``complement_faithfulness`` / ``n_edges``, and ``jaccard``
            (mean over target pairs).
        results: The :class:`JointResult` of every row, in the same order.
    """

    targets: list[str]
    rows: list[dict[str, Any]]
    results: list[JointResult] = field(repr=False, default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """Per share: means over seeds, and the cost of sharing against ``share = 0``.

        ``cost[t] = mean faithfulness at share 0 - mean faithfulness at this share``
        (positive: sharing costs faithfulness); None when share 0 was not run.
        """
        shares = sorted({r["share"] for r in self.rows})
        mean = {}
        for sh in shares:
            rows = [r for r in self.rows if r["share"] == sh]
            entry: dict[str, Any] = {"share": sh, "n_seeds": len(rows),
                                     "jaccard": sum(r["jaccard"] for r in rows) / len(rows)}  # fmt: skip
            for t in self.targets:
                for key in ("faithfulness", "complement_faithfulness", "n_edges"):
                    entry[f"{t}.{key}"] = sum(r[t][key] for r in rows) / len(rows)
            mean[sh] = entry
        for entry in mean.values():
            for t in self.targets:
                base = mean.get(0.0)
                entry[f"{t}.cost"] = (
                    None if base is None else base[f"{t}.faithfulness"] - entry[f"{t}.faithfulness"]
                )
        return [mean[sh] for sh in shares]

    def table(self) -> str:
        """A plain-text table: one line per (share, seed), then the means per share."""
        head = ["share", "seed", "jaccard"] + [
            f"{t} {k}" for t in self.targets for k in ("edges", "faith", "compl")
        ]
        lines = ["  ".join(f"{h:>14}" for h in head)]
        for r in self.rows:
            cells = [f"{r['share']:.3g}", str(r["seed"]), f"{r['jaccard']:.3f}"]
            for t in self.targets:
                cells += [str(r[t]["n_edges"]), f"{r[t]['faithfulness']:.3f}",
                          f"{r[t]['complement_faithfulness']:.3f}"]  # fmt: skip
            lines.append("  ".join(f"{c:>14}" for c in cells))
        lines.append("")
        lines.append("means over seeds; cost = faithfulness at share 0 minus at this share")
        head = ["share", "jaccard"] + [f"{t} {k}" for t in self.targets for k in ("faith", "cost")]
        lines.append("  ".join(f"{h:>14}" for h in head))
        for e in self.summary():
            cells = [f"{e['share']:.3g}", f"{e['jaccard']:.3f}"]
            for t in self.targets:
                cost = e[f"{t}.cost"]
                cells += [f"{e[f'{t}.faithfulness']:.3f}", "-" if cost is None else f"{cost:+.3f}"]
            lines.append("  ".join(f"{c:>14}" for c in cells))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON; a tied share is written ``"tied"``): targets, rows and the summary."""

        def plain(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{**e, "share": "tied" if math.isinf(e["share"]) else e["share"]} for e in entries]

        return {"targets": self.targets, "rows": plain(self.rows), "summary": plain(self.summary())}


def check_shares(shares: Any) -> list[float]:
    """The shares as a non-empty list of floats, or a one-line ValueError."""
    if isinstance(shares, (str, bytes)) or not isinstance(shares, Sequence) or not shares:
        raise ValueError(f"shares must be a non-empty list of numbers >= 0, got {shares!r}")
    return [check_share(s) for s in shares]


def share_sweep(
    model: nn.Module,
    data: PruneData | Any,
    targets: Sequence[Target],
    shares: Sequence[float] = SHARES,
    seeds: Sequence[int] = (0,),
    *,
    load: Callable[[float, int], JointResult | None] | None = None,
    save: Callable[[JointResult, int], None] | None = None,
    **kwargs: Any,
) -> ShareSweep:
    """Run :func:`joint_prune` for every ``share`` and seed and tabulate the cost of sharing.

    Args:
        model: The model.
        data: Traces, or a function seed -> traces (so seeds vary the data too).
        targets: At least two targets.
        shares: Sharing weights (include 0 for the cost column).
        seeds: Seeds.
        load: ``(share, seed)`` -> a result finished before (a resumed sweep), or None.
        save: Called with each new result and its seed as soon as it is found.
        **kwargs: Passed to :func:`joint_prune`.

    Returns:
        The :class:`ShareSweep`.
    """
    shares = check_shares(shares)
    if not seeds:
        raise ValueError("seeds must not be empty")
    check_prune_args(**kwargs)
    rows, results = [], []
    names = [target_name(t) for t in targets]
    for seed in seeds:
        seed_data = None
        for sh in shares:
            res = load(sh, seed) if load is not None else None
            if res is None:
                if seed_data is None:
                    seed_data = data(seed) if callable(data) else data
                    check_joint_targets(targets, seed_data)
                res = joint_prune(model, seed_data, targets, share=sh, seed=seed, **kwargs)
                if callable(data):
                    for circuit in res.circuits.values():
                        circuit.metadata["data_seed"] = seed
                if save is not None:
                    save(res, seed)
            row: dict[str, Any] = {"share": sh, "seed": seed}
            for name, circuit in res.circuits.items():
                m = circuit.metadata["metrics"]
                row[name] = {"faithfulness": m["faithfulness"],
                             "complement_faithfulness": m["complement_faithfulness"],
                             "n_edges": circuit.n_edges}  # fmt: skip
            row["jaccard"] = sum(res.jaccard.values()) / len(res.jaccard)
            rows.append(row)
            results.append(res)
    return ShareSweep(targets=names, rows=rows, results=results)
