"""One circuit per method: edge pruning, attribution scores or ACDC, built and scored the same way.

:func:`find_circuit` runs a method on a model's pruning graph and returns a
:class:`~mechlab.prune.circuit.Circuit`:

* ``prune``: :func:`mechlab.prune.engine.prune` (imported when called, so the engine can
  import the attribution modules without a circle);
* ``eap``, ``eap-ig``, ``eap-ig-inputs``, ``exact``: scores from
  :func:`mechlab.prune.attribution.attribute`, ranked by ``|score|`` (``absolute=False``:
  the signed score);
* ``acdc``: :func:`mechlab.prune.acdc.acdc_search` at the threshold that fits the budget.

Every circuit from scores (:func:`circuit_from_scores`) is chosen as pruning's is: the
largest set of whole input-to-read-out paths among the best-ranked countable edges that
fits the budget (:func:`~mechlab.prune.paths.select_on_paths`), the budget being
``round((1 - sparsity) n)`` of the ``n`` countable edges
(:func:`~mechlab.prune.graph.countable_edges`, :func:`~mechlab.prune.masks.keep_count`)
or ``n_edges``; it is scored on the held-out traces by
:func:`~mechlab.prune.evaluate.evaluate_masks` (faithfulness and complement), with the
training traces as the reference of a ``mean`` ablation. The circuit's edge scores are
``|score|`` divided by the largest kept one (in ``[0, 1]``, as the plots expect); the
signed scores of every edge are in ``metadata["attribution"]["scores"]``
(:func:`circuit_scores_of`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.circuit_methods import get_method, method_names
from mechlab.progress import tqdm
from mechlab.prune.acdc import ACDC_PASSES, acdc_search, acdc_settings, check_acdc_size
from mechlab.prune.attribution import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_STEPS,
    EdgeScores,
    build_objective,
    check_attribution_args,
    check_scores,
    metric_value,
    score_edges,
    scoring_settings,
)
from mechlab.prune.circuit import Circuit
from mechlab.prune.engine import faithfulness_warning, prune
from mechlab.prune.evaluate import evaluate_masks
from mechlab.prune.forward import ABLATIONS, frozen_eval
from mechlab.prune.graph import EdgeGraph, countable_edges, pruning_graph
from mechlab.prune.masks import keep_count
from mechlab.prune.objective import Objective
from mechlab.prune.paths import select_on_paths
from mechlab.traces import PruneData, Target, check_target, target_name, target_positions

METHODS = method_names()
"""The built-in circuit methods (:mod:`mechlab.circuit_methods`, the registry, has every one)."""


def edge_budget(
    graph: EdgeGraph,
    ablation: str,
    sparsity: float | None,
    n_edges: int | None,
    scored: list[int] | None = None,
) -> tuple[int, int]:
    """``(edges kept at most, countable edges)`` of a sparsity or an edge count; one-line ValueError
    when the budget keeps no edge or more edges than can matter."""
    n = int(countable_edges(graph, ablation, scored).sum())
    if n_edges is not None:
        if isinstance(n_edges, bool) or not isinstance(n_edges, int):
            raise ValueError(f"n_edges must be an integer, got {n_edges!r}")
        n_keep = n_edges
    else:
        ok = isinstance(sparsity, (int, float)) and not isinstance(sparsity, bool)
        if not (ok and math.isfinite(sparsity) and 0 < sparsity < 1):
            raise ValueError(f"sparsity must be in (0, 1), got {sparsity!r}")
        n_keep = keep_count(n, sparsity)
    if n_keep < 1:
        raise ValueError(
            f"the budget keeps no edge of the {n} countable edges; ask for at least one "
            f"(sparsity at most {1 - 0.5 / n:.4g}, or n_edges >= 1)"
        )
    if n_keep > n:
        raise ValueError(
            f"the budget asks for {n_keep} edges, but only {n} of this graph's {graph.n_edges} "
            "edges can matter (countable); ask for at most that many"
        )
    return n_keep, n


def _check_data(data: PruneData, target: Target, ablation: str) -> None:
    if not isinstance(data, PruneData):
        raise ValueError(
            f"data must be PruneData (training and held-out traces), got {type(data).__name__}"
        )
    check_target(target, data.train)
    if ablation == "interchange" and (data.train.corrupted is None or data.test.corrupted is None):
        raise ValueError("ablation 'interchange' needs corrupted traces (Traces.corrupted)")


def circuit_from_scores(
    model: nn.Module,
    data: PruneData,
    target: Target,
    scores: EdgeScores | Tensor,
    sparsity: float | None = 0.95,
    *,
    n_edges: int | None = None,
    ablation: str | None = None,
    absolute: bool = True,
    eligible: Tensor | None = None,
    position_aware: bool | None = None,
    checkpoint_sha256: str | None = None,
    metadata: dict[str, Any] | None = None,
    progress: bool = False,
) -> Circuit:
    """The circuit of whole paths among the best-ranked edges within the budget, scored held out.

    Args:
        model: The model.
        data: Training and held-out traces (the held-out set is scored).
        target: The target.
        scores: :class:`~mechlab.prune.attribution.EdgeScores`, or ``[n_edges]`` scores
            in the graph's edge order (higher: more important).
        sparsity: Fraction of the countable edges to leave out (ignored with ``n_edges``).
        n_edges: Keep at most this many countable edges instead.
        ablation: The ablation (default: the scores', else ``interchange``).
        absolute: Rank by ``|score|`` (default) or by the signed score.
        eligible: ``[n_edges]`` bool, the only edges that may be kept (ACDC's), or None.
        position_aware: The graph of a recurrent model (as :func:`~mechlab.prune.engine.prune`).
        checkpoint_sha256: Recorded in the metadata.
        metadata: More plain values for the metadata.
        progress: Show the held-out evaluation's bar (``evaluation: ...``).

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit` with its held-out ``metrics``.

    Raises:
        ValueError: A budget above the countable edges or below one edge, scores that are
            not one finite number per edge, bad data or target (all before any work).
    """
    started = time.perf_counter()
    ablation = (
        (scores.ablation if isinstance(scores, EdgeScores) else "interchange")
        if ablation is None
        else ablation
    )
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}; choose one of {', '.join(ABLATIONS)}")
    _check_data(data, target, ablation)
    graph = (
        scores.graph
        if isinstance(scores, EdgeScores)
        else pruning_graph(model, data.train.windows, position_aware)
    )
    values = check_scores(scores.scores if isinstance(scores, EdgeScores) else scores, graph)
    scored = target_positions(target, data.train) if graph.windows else None
    n_keep, n_countable = edge_budget(graph, ablation, sparsity, n_edges, scored)
    countable = countable_edges(graph, ablation, scored)
    allowed = countable if eligible is None else countable & eligible.cpu().bool()
    ranking = values.abs() if absolute else values
    edges, _ = select_on_paths(graph, ranking, allowed, n_keep, ablation)
    device = next(model.parameters()).device
    reference = data.train.inputs.to(device) if ablation == "mean" else None
    with frozen_eval(model):
        metrics = evaluate_masks(model, graph, data.test.to(device), target, ablation, edges,
                                 mean_reference=reference, progress=progress)  # fmt: skip

    warning = faithfulness_warning(metrics)
    kept = edges.nonzero().flatten().tolist()
    top = float(values[kept].abs().max()) if kept else 0.0
    circuit_edges = {
        graph.edges[i]: (abs(float(values[i])) / top if top > 0 else 1.0) for i in kept
    }
    extra = dict(metadata or {})
    seconds_scoring = float(extra.pop("seconds_scoring", 0.0))
    meta: dict[str, Any] = {
        "checkpoint_sha256": checkpoint_sha256,
        "target": target_name(target),
        "ablation": ablation,
        "method": extra.pop(
            "method", scores.method if isinstance(scores, EdgeScores) else "scores"
        ),
        "ranking": "abs" if absolute else "signed",
        "sparsity_asked": 1.0 - n_keep / n_countable if n_edges is not None else sparsity,
        "sparsity_reached": 1.0 - len(kept) / n_countable,
        "n_edges_kept": len(kept),
        "n_edges_asked": n_keep,
        "n_edges_countable": n_countable,
        # fewer than asked: the next edges by rank would not complete a path within the quota
        "sparsity_limited_by_paths": len(kept) < min(n_keep, int(allowed.sum())),
        "graph": graph.summary(),
        "data": dict(data.info),
        "data_seed": data.info.get("data_seed"),
        "metrics": metrics,
        "warnings": [warning] if warning else [],
        **extra,
    }
    if isinstance(scores, EdgeScores):
        meta["attribution"] = scores.summary()
    else:
        meta["attribution"] = {
            "scores": [
                [w, r, float(s)] for (w, r), s in zip(graph.edges, values.tolist(), strict=True)
            ]
        }
    meta["seconds_scoring"] = seconds_scoring
    meta["seconds"] = seconds_scoring + time.perf_counter() - started
    return Circuit.from_edges(circuit_edges, metadata=meta)


def circuit_scores_of(circuit: Circuit, graph: EdgeGraph) -> Tensor:
    """``[n_edges]`` the signed scores a circuit was chosen from, in ``graph``'s edge order."""
    rows = circuit.metadata.get("attribution", {}).get("scores")
    if rows is None:
        raise ValueError(
            "the circuit records no attribution scores (it was not found by find_circuit from scores)"
        )
    by_edge = {(w, r): s for w, r, s in rows}
    missing = [e for e in graph.edges if e not in by_edge]
    if missing:
        raise ValueError(
            f"the circuit's scores miss {len(missing)} edges of the model's graph, e.g. {missing[0]}"
        )
    return torch.tensor([by_edge[e] for e in graph.edges], dtype=torch.float64)


def find_circuit(
    model: nn.Module,
    data: PruneData,
    target: Target,
    method: str = "eap-ig",
    sparsity: float | None = 0.95,
    *,
    n_edges: int | None = None,
    ablation: str = "interchange",
    metric: str = "loss",
    steps: int | None = None,
    at: str = "corrupted",
    absolute: bool = True,
    tau: float | None = None,
    max_edges: int | None = None,
    passes: int = ACDC_PASSES,
    batch_size: int = DEFAULT_BATCH_SIZE,
    position_aware: bool | None = None,
    progress: bool = False,
    checkpoint_sha256: str | None = None,
    **prune_kwargs: Any,
) -> Circuit:
    """Find a circuit with any method, on the same graph, budget and evaluation (module docstring).

    Args:
        model: A mechlab model.
        data: Training traces (scored or pruned on) and held-out traces (evaluated on).
        target: ``"k-after"``, ``"all"`` or a callable.
        method: ``prune``, ``eap``, ``eap-ig`` (default), ``eap-ig-inputs``, ``exact`` or ``acdc``.
        sparsity: Fraction of the countable edges to leave out (ignored with ``n_edges``).
        n_edges: Keep at most this many countable edges instead.
        ablation: ``interchange``, ``mean`` or ``zero``.
        metric: ``loss`` (edge pruning's task loss) or ``projection``
            (:mod:`mechlab.prune.attribution`); ``prune`` takes ``loss`` only.
        steps: EAP-IG's integration points (default 10); for ``prune``, its optimiser steps.
        at: EAP's run, ``corrupted`` or ``clean``.
        absolute: Rank attribution scores by ``|score|`` (default) or signed.
        tau: ACDC's threshold (None: the one that fits the budget).
        max_edges: ACDC's limit on countable edges (default :data:`~mechlab.prune.acdc.ACDC_MAX_EDGES`).
        passes: Most ACDC passes when searching ``tau``.
        batch_size: Traces per pass of the scoring methods.
        position_aware: The graph of a recurrent model (as :func:`~mechlab.prune.engine.prune`).
        progress: Show progress bars: the references, the scoring (or the search) and
            the held-out evaluation, each naming its stage.
        checkpoint_sha256: Recorded in the metadata.
        **prune_kwargs: More settings of :func:`~mechlab.prune.engine.prune` (``prune`` only).

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`; its metadata records the method, its
        settings, every edge's score (not for ``prune``, which records ``log_alpha``) and
        the seconds taken.

    Raises:
        ValueError: Unknown method or setting, a method that does not support the
            ablation, metric or graph size, ``steps < 1``, a budget above the countable
            edges or below one edge, NaN scores; all but the last before any work.
    """
    spec = get_method(method)
    if prune_kwargs and not spec.prunes:
        raise ValueError(
            f"unknown setting(s) {', '.join(sorted(prune_kwargs))} for method {method!r}"
        )
    _check_data(data, target, ablation)
    graph = pruning_graph(model, data.train.windows, position_aware)
    scored = target_positions(target, data.train) if graph.windows else None
    if spec.prunes:
        if metric != "loss":
            raise ValueError(
                f"edge pruning minimises the task loss; metric {metric!r} is for attribution methods"
            )
        n_keep, n_countable = edge_budget(graph, ablation, sparsity, n_edges, scored)

        if steps is not None:
            prune_kwargs["steps"] = steps
        return prune(model, data, target, 1.0 - n_keep / n_countable if n_edges is not None else sparsity,
                     ablation=ablation, progress=progress, checkpoint_sha256=checkpoint_sha256,
                     position_aware=position_aware, **prune_kwargs)  # fmt: skip
    steps = DEFAULT_STEPS if steps is None else steps
    scoring = spec.checks_as or method  # acdc: exact's argument checks
    check_attribution_args(
        scoring, ablation=ablation, metric=metric, steps=steps, at=at, batch_size=batch_size
    )
    n_keep, n_countable = edge_budget(graph, ablation, sparsity, n_edges, scored)
    if spec.edge_limit:
        check_acdc_size(n_countable, max_edges)
        if tau is not None and not (
            isinstance(tau, (int, float)) and math.isfinite(tau) and tau >= 0
        ):
            raise ValueError(f"tau must be a finite number >= 0, got {tau!r}")
    started = time.perf_counter()
    with frozen_eval(model):
        obj, total = _references(model, data, target, ablation, metric, graph, batch_size, progress)
        extra: dict[str, Any] = {"metric": metric}
        eligible = None
        if spec.kind == "search":
            found = acdc_search(
                obj, n_keep, tau, passes=passes, batch_size=batch_size, progress=progress
            )
            values, eligible, settings = found.scores, found.kept, acdc_settings(found)
            absolute = not spec.signed  # an ACDC score is signed: the loss change of removing the edge in context
        else:
            values = score_edges(
                obj, method, steps=steps, at=at, batch_size=batch_size, progress=progress
            )
            settings = scoring_settings(method, batch_size=batch_size, n_traces=len(data.train), steps=steps, at=at)
    seconds = time.perf_counter() - started
    scores = EdgeScores(method, graph, values, obj.countable.cpu(), target_name(target), ablation, metric,
                        total, settings, seconds)  # fmt: skip
    extra.update(method=method, settings=settings, seconds_scoring=seconds)
    return circuit_from_scores(
        model, data, target, scores, sparsity, n_edges=n_edges, ablation=ablation, absolute=absolute,
        eligible=eligible, checkpoint_sha256=checkpoint_sha256, metadata=extra, progress=progress,
    )  # fmt: skip


def _references(
    model: nn.Module, data: PruneData, target: Target, ablation: str, metric: str, graph: EdgeGraph,
    batch_size: int, progress: bool,
) -> tuple[Objective, float]:  # fmt: skip
    """The objective on the training traces and the metric's total effect (all edges
    ablated minus none), under a bar of three passes when ``progress`` (the model frozen)."""
    bar = tqdm(total=3, disable=not progress, unit="pass",
               desc=f"references: {ablation} ablation, full outputs, {metric} ablated and full")  # fmt: skip
    with bar:
        obj = build_objective(model, data.train, target, ablation, metric, graph, batch_size=batch_size)
        bar.update()
        ablated = metric_value(obj, torch.zeros(graph.n_edges), batch_size)
        bar.update()
        full = metric_value(obj, torch.ones(graph.n_edges), batch_size)
        bar.update()
    return obj, ablated - full
