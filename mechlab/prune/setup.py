"""Preparing a search: its settings checked, and what every search of one model and its
traces needs, built once (:class:`SearchSetup`: the graph, the countable edges, the
ablation, the reference outputs, the fully ablated loss, the warm start's scores).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.models.base import predict_in_chunks
from mechlab.progress import tqdm
from mechlab.prune.attribution import build_objective, score_edges
from mechlab.prune.choose import check_sparsity
from mechlab.prune.config import EXACT_WARM_MAX, PruneConfig, prune_config
from mechlab.prune.forward import frozen_eval, make_ablation, masked_forward, select_traces
from mechlab.prune.graph import EdgeGraph, countable_edges, pruning_graph
from mechlab.prune.objective import kept_positions
from mechlab.prune.search import task_loss
from mechlab.traces import PruneData, Target, Traces, target_mask, target_positions


def check_prune_args(sparsity: float | None = None, **settings: Any) -> PruneConfig:
    """Validate :func:`prune`'s settings before any work; returns their :class:`PruneConfig`.

    Args:
        sparsity: Edge sparsity (None: the config's default).
        **settings: :class:`PruneConfig` fields (``config=`` a base config) and
            :func:`prune`'s run arguments (:data:`~mechlab.prune.config.RUN_ARGUMENTS`,
            ignored here).

    Raises:
        ValueError: A bad value or an unknown setting (one line).
    """
    config = settings.pop("config", None)
    return prune_config(sparsity, config, **settings)


@dataclass
class SearchSetup:
    """Everything a search needs besides its settings, built once on the training traces.

    Attributes:
        graph: The graph pruned.
        train: The training traces, on the model's device, cut after the last target
            position where that changes nothing (:func:`cut_after_targets`).
        positions: Per target, ``[batch, pos]`` bool.
        reference: The full model's outputs (or the truth).
        ablated: The ablated writer outputs.
        scored: Per target, its scored positions (a windowed graph) or None.
        countable: Per target, ``[n_edges]`` bool.
        n_keep: Per target, the edges the sparsity keeps.
        ablated_losses: Per target, the fully ablated model's training loss (computed
            when normalising, else 1.0).
        norms: Per target, what its task loss is divided by.
        warm: Per target, the warm start's attribution scores (``[n_edges]``), or None.
        pool: Per target, the ``refine_pool`` method's scores (None for a target whose
            warm start is that method), or None (no pool asked or none used).
    """

    graph: EdgeGraph
    train: Traces
    positions: list[Tensor]
    reference: Tensor
    ablated: Any
    scored: list[list[int] | None]
    countable: list[Tensor]
    n_keep: list[int]
    ablated_losses: list[float]
    norms: list[float]
    warm: list[Tensor] | None = None
    pool: list[Tensor | None] | None = None


def check_prune_data(config: PruneConfig, data: PruneData) -> None:
    """A one-line ValueError when the traces lack what the loss or the ablation needs."""
    if config.loss == "truth" and (data.train.truth is None or data.test.truth is None):
        raise ValueError("loss 'truth' needs traces with ground truth (Traces.truth)")
    if config.ablation == "interchange" and (data.train.corrupted is None or data.test.corrupted is None):
        raise ValueError("ablation 'interchange' needs corrupted traces (Traces.corrupted)")


def prepare_search(
    model: nn.Module,
    data: PruneData,
    targets: Sequence[Target],
    config: PruneConfig,
    position_aware: bool | None = None,
    ablated_losses: bool | None = None,
    pool_scores: bool | None = None,
    progress: bool = False,
) -> SearchSetup:
    """Check the data and the sparsity, then build the search's inputs (no optimisation).

    Args:
        model: The model (frozen and in eval mode for the forward passes inside).
        data: The traces.
        targets: The targets (already checked against the traces).
        config: The settings.
        position_aware: As :func:`prune`.
        ablated_losses: Compute the fully ablated losses (default: when normalising).
        pool_scores: Compute ``config.refine_pool``'s scores (default: when the selection
            is ``"refine"``; a joint search that shares edges does not use them).
        progress: Show a bar for each stage: the references (the ablation, the full
            model's outputs, the fully ablated loss), the warm start, the second ranking.

    Raises:
        ValueError: Missing ground truth or corrupted traces, a sparsity that keeps no edge.
    """
    check_prune_data(config, data)
    graph = pruning_graph(model, data.train.windows, position_aware)
    scored = [target_positions(t, data.train) if graph.windows else None for t in targets]
    n_keep = [check_sparsity(graph, config.ablation, config.sparsity, s) for s in scored]
    countable = [countable_edges(graph, config.ablation, s) for s in scored]
    device = next(model.parameters()).device
    whole = data.train.to(device)  # what the attribution rankings score (they cut it themselves)
    train, positions = cut_after_targets(model, graph, whole, targets)
    compute = config.normalize_loss if ablated_losses is None else ablated_losses
    bar = tqdm(total=2 + (len(targets) if compute else 0), disable=not progress, unit="pass",
               desc=f"references: {config.ablation} ablation, full outputs, ablated loss")  # fmt: skip
    with frozen_eval(model), torch.no_grad(), bar:
        ablated = make_ablation(model, config.ablation, train, graph=graph)
        bar.update()
        reference = train.truth if config.loss == "truth" else predict_in_chunks(model, train.inputs)
        bar.update()
        losses = [1.0] * len(targets)
        for i, pos in enumerate(positions if compute else ()):
            losses[i] = ablated_loss(model, graph, train, pos, reference, ablated)
            bar.update()
    norms = losses if config.normalize_loss else [1.0] * len(targets)
    warm = pool = None
    with frozen_eval(model):
        if config.warm_start != "none":
            warm = [warm_start_scores(model, whole, t, graph, config, progress) for t in targets]
        wanted = config.select == "refine" if pool_scores is None else pool_scores
        if wanted and config.refine_pool != "none":
            n_pool = len(whole) if config.pool_traces is None else min(config.pool_traces, len(whole))
            first = whole if n_pool == len(whole) else whole.subset(torch.arange(n_pool))
            methods = [pool_method(config, int(c.sum())) for c in countable]
            pool = [None if method is None  # the warm start's method: its scores are there
                    else attribution_scores(model, first, t, graph, config, method, progress, "selection pool")
                    for t, method in zip(targets, methods, strict=True)]  # fmt: skip
    return SearchSetup(graph, train, positions, reference, ablated, scored, countable, n_keep,
                       losses, norms, warm, pool)  # fmt: skip


def cut_after_targets(
    model: nn.Module, graph: EdgeGraph, traces: Traces, targets: Sequence[Target]
) -> tuple[Traces, list[Tensor]]:  # fmt: skip
    """The training traces the search runs on, and each target's ``[batch, pos]`` mask on them.

    A causal model's outputs up to the last target position do not depend on the positions
    after it, so the traces are cut there (as the attribution methods' objectives are,
    :meth:`~mechlab.prune.objective.Objective.truncated`): every pass of the search, the
    references and the selection then skip them. The traces of a windowed graph (whose
    windows cover the whole trace) and of a model that is not causal are kept whole.
    """
    positions = [target_mask(t, traces) for t in targets]
    last = kept_positions(model, graph, positions)
    if last is None:
        return traces, positions
    return traces.upto(last), [p[:, :last] for p in positions]


def warm_start_scores(
    model: nn.Module, traces: Traces, target: Target, graph: EdgeGraph, config: PruneConfig,
    progress: bool = False,
) -> Tensor:  # fmt: skip
    """``[n_edges]`` the scores of ``config.warm_start`` (an attribution method,
    :func:`mechlab.prune.attribution.score_edges`; ``"auto"``: exact single-edge ablation up
    to :data:`~mechlab.prune.config.EXACT_WARM_MAX` countable edges, else EAP-IG) on the
    training traces, with the search's ablation and its task loss as the metric. The model
    must be frozen and in eval mode. ``progress``: a bar that says ``warm start: <method>``."""
    return attribution_scores(model, traces, target, graph, config, None, progress, "warm start")


def attribution_scores(
    model: nn.Module, traces: Traces, target: Target, graph: EdgeGraph, config: PruneConfig,
    method: str | None, progress: bool = False, stage: str = "attribution",
) -> Tensor:
    """``[n_edges]`` an attribution method's scores on the training traces with the
    search's ablation and its task loss as the metric (``None``: the warm start's
    method). The model must be frozen and in eval mode. ``progress``: a bar that says
    ``<stage>: <what the method does>``."""
    obj = build_objective(model, traces, target, config.ablation, "loss", graph)
    method = warm_method(config, int(obj.countable.sum())) if method is None else method
    desc = f"{stage}: {METHOD_WORDS.get(method, method)}"
    return score_edges(obj, method, steps=config.warm_steps, progress=progress, desc=desc).float().cpu()


METHOD_WORDS = {
    "exact": "exact single-edge ablation",
    "eap": "edge attribution patching",
    "eap-ig": "EAP-IG (integrated gradients over the edge masks)",
    "eap-ig-inputs": "EAP-IG over the inputs",
}
"""What a progress bar calls each attribution method."""


def warm_method(config: PruneConfig, n_countable: int) -> str | None:
    """The attribution method a search starts from (None: no warm start); ``"auto"``:
    ``"exact"`` up to :data:`~mechlab.prune.config.EXACT_WARM_MAX` countable edges, else ``"eap-ig"``."""
    if config.warm_start == "none":
        return None
    if config.warm_start == "auto":
        return "exact" if n_countable <= EXACT_WARM_MAX else "eap-ig"
    return config.warm_start


def pool_method(config: PruneConfig, n_countable: int) -> str | None:
    """The attribution method of the selection's second ranking (None: none, or the warm
    start's own); ``"auto"``: ``"exact"`` up to :data:`~mechlab.prune.config.EXACT_WARM_MAX`
    countable edges, else ``"eap"``."""
    choice = config.refine_pool  # a setting: a method's name, "auto" or "none"
    if choice == "auto":
        choice = "exact" if n_countable <= EXACT_WARM_MAX else "eap"
    return None if choice in ("none", warm_method(config, n_countable)) else choice


@torch.no_grad()
def ablated_loss(
    model: nn.Module, graph: EdgeGraph, traces: Traces, positions: Tensor, reference: Tensor,
    ablated: Tensor, batch_size: int = 128,
) -> float:
    """The task loss of the model with every edge ablated (the loss an empty circuit has).

    Dividing the task loss by it makes the search indifferent to the scale of the
    model's outputs: the loss becomes ``1 - faithfulness`` of the batch, so a circuit
    whose effect is small in absolute terms is found as readily as a large one.

    Returns:
        The mean loss at the target positions (1.0 when it is 0, so it can divide).
    """
    zeros = torch.zeros(graph.n_edges, device=ablated.device)
    losses = []
    for start in range(0, len(traces), batch_size):
        index = torch.arange(start, min(start + batch_size, len(traces)), device=ablated.device)
        abl = select_traces(ablated, index)
        pred = masked_forward(model, graph, traces.inputs[index], abl, zeros)
        mask = positions[index]
        n = int(mask.sum())
        if n:
            losses.append((task_loss(pred[mask], reference[index][mask], model.cfg.io).double() * n, n))
    total, count = sum(v for v, _ in losses), sum(n for _, n in losses)
    value = float(total / count) if count else 0.0
    return value if value > 0 else 1.0


__all__ = ["SearchSetup", "ablated_loss", "attribution_scores", "check_prune_args", "check_prune_data", "prepare_search",
           "pool_method", "warm_method", "warm_start_scores"]  # fmt: skip
