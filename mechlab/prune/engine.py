"""The search for a circuit: optimising hard-concrete masks, then choosing the edges.

Optimisation (:func:`prune`): hard-concrete masks on every edge (and optionally every
writer node), the task loss at the target positions plus, per mask kind, the
Lagrangian ``lambda1 (s - t) + lambda2 (s - t)^2`` (``s`` the expected sparsity in
closed form, ``t`` the target ramped linearly from 0 during the warm-up), minimised in
the masks with Adam and maximised in the lambdas with a separate Adam. The lambdas are
created at zero by every call, and the model is put in eval mode with its parameters
frozen for the duration (both restored afterwards). The final circuit keeps the edges
whose deterministic mask passes a threshold found by bisection so that the requested
sparsity is met.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from mechlab.models.base import predict_in_chunks
from mechlab.prune import masks as hc
from mechlab.prune.circuit import Circuit
from mechlab.prune.data import PruneData, Target, Traces, check_target, target_mask, target_name
from mechlab.prune.evaluate import evaluate_masks
from mechlab.prune.forward import (
    ABLATIONS,
    divergence,
    frozen_eval,
    make_ablation,
    masked_forward,
    truth_error,
)
from mechlab.prune.graph import EdgeGraph, build_graph

LOSSES = ("model", "truth")


# ---------------------------------------------------------------------------------------
# Optimisation
# ---------------------------------------------------------------------------------------


@dataclass
class MaskResult:
    """What the optimisation leaves: location parameters and a history.

    Attributes:
        edge_log_alpha: ``[n_edges]``.
        node_log_alpha: ``[n_writers]`` or None.
        history: Per logged step: ``step``, ``loss``, ``sparsity``, ``target``, ``lambda1``, ``lambda2``.
    """

    edge_log_alpha: Tensor
    node_log_alpha: Tensor | None
    history: list[dict[str, float]]


class _Lagrangian(nn.Module):
    """``lambda1 (s - t) + lambda2 (s - t)^2``, both lambdas starting at zero."""

    def __init__(self) -> None:
        super().__init__()
        self.lambda1 = nn.Parameter(torch.zeros(()))
        self.lambda2 = nn.Parameter(torch.zeros(()))

    def forward(self, s: Tensor, t: float) -> Tensor:
        gap = s - t
        return self.lambda1 * gap + self.lambda2 * gap * gap


def _check_unit(name: str, value: float, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value < 1):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return float(value)


def optimise_masks(
    model: nn.Module,
    graph: EdgeGraph,
    traces: Traces,
    positions: Tensor,
    reference: Tensor,
    ablated: Tensor,
    sparsity: float,
    node_sparsity: float | None = None,
    steps: int = 500,
    warmup: int | None = None,
    lr: float = 0.1,
    lambda_lr: float = 1.0,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
    init_mean: float = hc.INIT_MEAN,
) -> MaskResult:
    """Optimise hard-concrete edge (and node) masks; the model must be frozen and in eval mode.

    Args:
        model: The model.
        graph: Its edge graph.
        traces: Training traces (``inputs`` used).
        positions: ``[batch, pos]`` bool target positions.
        reference: ``[batch, pos, d_output]`` what the circuit should output there (the
            full model's predictions or the truth; token ids for a truth loss on tokens).
        ablated: ``[n_writers, batch | 1, pos, d]`` ablated writer outputs.
        sparsity: Target edge sparsity in (0, 1).
        node_sparsity: Target writer-node sparsity, or None for no node masks.
        steps: Optimiser steps.
        warmup: Steps over which the target rises linearly from 0 (default ``steps // 2``).
        lr: Adam learning rate of the masks.
        lambda_lr: Adam learning rate of the lambdas.
        batch_size: Traces per step (all of them if fewer).
        seed: Seeds the initial masks, the noise and the batches.
        progress: Show a tqdm bar.
        init_mean: Mean of the initial ``log_alpha`` (see :mod:`mechlab.prune.masks`).

    Returns:
        The :class:`MaskResult`.
    """
    device = ablated.device
    io = model.cfg.io
    warmup = steps // 2 if warmup is None else warmup
    gen = torch.Generator().manual_seed(seed)
    edge_la = nn.Parameter(hc.init_log_alpha(graph.n_edges, gen, init_mean).to(device))
    node_la = None
    params = [edge_la]
    if node_sparsity is not None:
        node_la = nn.Parameter(hc.init_log_alpha(graph.n_writers, gen, init_mean).to(device))
        params.append(node_la)
    edge_writer = torch.tensor([graph.writer_index[w] for w, _ in graph.edges], device=device)
    lag_edge, lag_node = _Lagrangian().to(device), _Lagrangian().to(device)  # fresh lambdas
    opt = torch.optim.Adam(params, lr=lr)
    lambdas = [*lag_edge.parameters(), *lag_node.parameters()]
    opt_lambda = torch.optim.Adam(lambdas, lr=lambda_lr, maximize=True)
    n = len(traces)
    per_trace_ablation = ablated.shape[1] != 1
    order, cursor = torch.randperm(n, generator=gen), 0
    history = []
    bar = tqdm(
        range(1, steps + 1), disable=not progress, desc="pruning", unit="step", dynamic_ncols=True
    )
    for step in bar:
        if batch_size >= n:
            index = torch.arange(n)
        else:
            if cursor + batch_size > n:
                order, cursor = torch.randperm(n, generator=gen), 0
            index = order[cursor : cursor + batch_size]
            cursor += batch_size
        index_d = index.to(device)
        x = traces.inputs[index_d]
        abl = ablated[:, index_d] if per_trace_ablation else ablated
        mask = positions[index_d]

        z_edge = hc.sample_mask(edge_la, hc.uniform_noise(graph.n_edges, gen).to(device))
        z_node = None
        if node_la is not None:
            z_node = hc.sample_mask(node_la, hc.uniform_noise(graph.n_writers, gen).to(device))
        pred = masked_forward(model, graph, x, abl, z_edge, z_node)
        ref = reference[index_d][mask]
        if io == "tokens" and ref.dtype == torch.long:
            task = truth_error(pred[mask], ref, io).mean()
        else:
            task = divergence(pred[mask], ref, io).mean()

        target = hc.target_schedule(step, sparsity, warmup)
        weight = hc.prob_nonzero(node_la)[edge_writer] if node_la is not None else None
        s_edge = hc.expected_sparsity(edge_la, weight)
        total = task + lag_edge(s_edge, target)
        if node_la is not None:
            node_target = hc.target_schedule(step, node_sparsity, warmup)
            total = total + lag_node(hc.expected_sparsity(node_la), node_target)

        opt.zero_grad(set_to_none=True)
        opt_lambda.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        opt_lambda.step()

        if step == 1 or step % 10 == 0 or step == steps:
            record = {
                "step": step, "loss": task.item(), "sparsity": s_edge.item(), "target": target,
                "lambda1": lag_edge.lambda1.item(), "lambda2": lag_edge.lambda2.item(),
            }  # fmt: skip
            history.append(record)
            bar.set_postfix(loss=f"{record['loss']:.4g}", sparsity=f"{record['sparsity']:.3f}")
    bar.close()
    return MaskResult(
        edge_log_alpha=edge_la.detach().clone(),
        node_log_alpha=None if node_la is None else node_la.detach().clone(),
        history=history,
    )


@dataclass
class BinaryMasks:
    """The circuit as masks: kept edges and nodes, and the thresholds that chose them."""

    edges: Tensor  # [n_edges] bool
    nodes: Tensor  # [n_writers] bool
    edge_threshold: float  # on log_alpha
    node_threshold: float | None


def binarize(
    graph: EdgeGraph, result: MaskResult, sparsity: float, node_sparsity: float | None
) -> BinaryMasks:
    """Choose the circuit: thresholds found by bisection so the requested sparsities are met.

    Nodes first (when node masks were trained): keep the ``round((1 - node_sparsity) n)``
    writers of highest deterministic mask. Then edges: among the edges whose writer is
    kept, keep the ``round((1 - sparsity) n_edges)`` of highest deterministic mask (ties
    of the clamped mask broken by ``log_alpha``, which orders them the same way).
    """
    nodes = torch.ones(graph.n_writers, dtype=torch.bool)
    node_threshold = None
    if result.node_log_alpha is not None and node_sparsity is not None:
        node_la = result.node_log_alpha.cpu()
        node_threshold = hc.bisect_threshold(node_la, hc.keep_count(graph.n_writers, node_sparsity))
        nodes = node_la.double() >= node_threshold
    edge_writer = torch.tensor([graph.writer_index[w] for w, _ in graph.edges])
    eligible = nodes[edge_writer]
    edge_la = result.edge_log_alpha.cpu()
    edge_threshold = hc.bisect_threshold(edge_la, hc.keep_count(graph.n_edges, sparsity), eligible)
    edges = (edge_la.double() >= edge_threshold) & eligible
    return BinaryMasks(edges, nodes, edge_threshold, node_threshold)


def prune(
    model: nn.Module,
    data: PruneData,
    target: Target,
    sparsity: float = 0.95,
    *,
    ablation: str = "interchange",
    steps: int = 500,
    seed: int = 0,
    lr: float = 0.1,
    lambda_lr: float = 1.0,
    warmup: int | None = None,
    batch_size: int = 64,
    loss: str = "model",
    node_sparsity: float | None = None,
    init_mean: float = hc.INIT_MEAN,
    progress: bool = True,
    checkpoint_sha256: str | None = None,
) -> Circuit:
    """Find the circuit of ``model`` for a target by edge pruning.

    Args:
        model: A mechlab model (transformer, LSTM, dense SSM, Mamba).
        data: Training and held-out traces (:func:`mechlab.prune.data.nih_prune_data`).
        target: ``"k-after"``, ``"all"`` or a callable (:func:`mechlab.prune.data.target_mask`).
        sparsity: Fraction of edges to remove, in (0, 1).
        ablation: ``"interchange"`` (corrupted traces), ``"mean"`` or ``"zero"``.
        steps: Optimiser steps.
        seed: Seed of the masks' initialisation, noise and batches.
        lr: Adam learning rate of the masks.
        lambda_lr: Adam learning rate of the Lagrange multipliers (maximised).
        warmup: Steps of the linear sparsity ramp (default ``steps // 2``).
        batch_size: Traces per step.
        loss: ``"model"`` (match the full model's predictions: MSE, or KL for token
            models) or ``"truth"`` (match the ground truth).
        node_sparsity: Also mask writer nodes, at this target sparsity (None: no node masks).
        init_mean: Mean of the initial ``log_alpha`` (5 by default; the paper's 10
            is ``init_mean=10``; see :mod:`mechlab.prune.masks`).
        progress: Show a progress bar.
        checkpoint_sha256: Recorded in the circuit's metadata.

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`, with its metrics on the held-out traces.

    Raises:
        ValueError: Bad target, sparsity, ablation, loss or data.
    """
    sparsity = _check_unit("sparsity", sparsity)
    if node_sparsity is not None:
        node_sparsity = _check_unit("node_sparsity", node_sparsity, allow_zero=True)
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}; choose one of {ABLATIONS}")
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be positive, got {lr!r}")
    check_target(target, data.train)
    if loss == "truth" and (data.train.truth is None or data.test.truth is None):
        raise ValueError("loss 'truth' needs traces with ground truth (Traces.truth)")
    if ablation == "interchange" and (data.train.corrupted is None or data.test.corrupted is None):
        raise ValueError("ablation 'interchange' needs corrupted traces (Traces.corrupted)")

    graph = build_graph(model)
    device = next(model.parameters()).device
    train = data.train.to(device)
    started = time.perf_counter()
    with frozen_eval(model), torch.no_grad():
        positions = target_mask(target, train)
        ablated = make_ablation(model, ablation, train)
        reference = train.truth if loss == "truth" else predict_in_chunks(model, train.inputs)
    with frozen_eval(model):
        result = optimise_masks(
            model, graph, train, positions, reference, ablated, sparsity, node_sparsity,
            steps=steps, warmup=warmup, lr=lr, lambda_lr=lambda_lr, batch_size=batch_size,
            seed=seed, progress=progress, init_mean=init_mean,
        )  # fmt: skip
        binary = binarize(graph, result, sparsity, node_sparsity)
        mean_reference = data.train.inputs.to(device) if ablation == "mean" else None
        metrics = evaluate_masks(
            model, graph, data.test.to(device), target, ablation, binary.edges, binary.nodes,
            mean_reference=mean_reference,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    det = hc.deterministic_mask(result.edge_log_alpha.cpu())
    kept = binary.edges.nonzero().flatten().tolist()
    n_kept = len(kept)
    metadata = {
        "checkpoint_sha256": checkpoint_sha256,
        "target": target_name(target),
        "ablation": ablation,
        "loss": loss,
        "sparsity_asked": sparsity,
        "sparsity_reached": 1.0 - n_kept / graph.n_edges,
        "n_edges_kept": n_kept,
        "node_sparsity_asked": node_sparsity,
        "node_sparsity_reached": 1.0 - float(binary.nodes.float().mean()),
        "edge_threshold_log_alpha": binary.edge_threshold,
        "edge_threshold_mask": float(hc.stretched_mean(torch.tensor(binary.edge_threshold))),
        "seed": seed,
        "steps": steps,
        "warmup": steps // 2 if warmup is None else warmup,
        "lr": lr,
        "lambda_lr": lambda_lr,
        "init_mean": init_mean,
        "batch_size": batch_size,
        "graph": graph.summary(),
        "data": dict(data.info),
        "metrics": metrics,
        "final_expected_sparsity": result.history[-1]["sparsity"],
        "history": result.history,  # every 10th step: loss, expected sparsity, target, lambdas
        "seconds": seconds,
    }
    edges = {graph.edges[i]: float(det[i]) for i in kept}
    log_alpha = {edge: float(result.edge_log_alpha[i]) for i, edge in enumerate(graph.edges)}
    return Circuit.from_edges(edges, metadata=metadata, log_alpha=log_alpha)


def prune_seeds(
    model: nn.Module,
    data: PruneData,
    targets: Sequence[Target],
    seeds: Sequence[int],
    **prune_kwargs: Any,
) -> dict[str, list[Circuit]]:
    """Prune every target with every seed (the input of :func:`seed_stability`).

    Args:
        model: The model.
        data: Traces.
        targets: Targets.
        seeds: Seeds (at least two for a stability estimate).
        **prune_kwargs: Passed to :func:`prune`.

    Returns:
        Target name -> circuits, in the order of ``seeds``.
    """
    return {
        target_name(t): [prune(model, data, t, seed=s, **prune_kwargs) for s in seeds]
        for t in targets
    }
