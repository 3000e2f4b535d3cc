"""The search for a circuit: optimising hard-concrete masks, then choosing the edges.

Optimisation (:func:`prune`): hard-concrete masks on every edge (and optionally every
writer node), the task loss at the target positions (times ``loss_scale``) plus, per
mask kind, the Lagrangian ``lambda1 (s - t) + lambda2 (s - t)^2`` (``s`` the expected
sparsity in closed form over the countable edges, ``t`` the target ramped linearly from
0 during the first half of the steps). One Adam optimiser minimises in the masks (lr 0.1,
constant) and maximises in the lambdas (lr 1.0, rising linearly over the first tenth of
the steps, then decaying linearly towards 0, so they cannot wind up late in the run and
push the expected sparsity past its target). ``normalize_loss=True`` divides the task
loss by the fully ablated model's (:func:`ablated_loss`). Measurements behind these
choices: docs/pruning.md, "Optimisation". The lambdas are
created at zero by every call, and the model is put in eval mode with its parameters
frozen for the duration (both restored afterwards).

The circuit (:func:`binarize`) keeps only open edges (deterministic mask > 0), the
``round((1 - sparsity) n)`` of highest mask among the ``n`` countable edges (those not
from a writer that cannot matter under the ablation, :func:`~mechlab.prune.graph.countable_edges`),
fewer when fewer are open; a sparsity that keeps no edge is refused before any work.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.models.base import predict_in_chunks
from mechlab.progress import tqdm
from mechlab.prune import masks as hc
from mechlab.prune.circuit import Circuit
from mechlab.prune.evaluate import evaluate_masks
from mechlab.prune.forward import (
    ABLATIONS,
    divergence,
    frozen_eval,
    make_ablation,
    masked_forward,
    select_traces,
    truth_error,
)
from mechlab.prune.graph import (
    EdgeGraph,
    countable_edges,
    inert_writers,
    pruning_graph,
    target_windows,
    unreachable_edges,
)
from mechlab.prune.paths import live_edges, select_on_paths
from mechlab.traces import (
    PruneData,
    Target,
    Traces,
    check_target,
    target_mask,
    target_name,
    target_positions,
)

LOSSES = ("model", "truth")
LR = 0.1  # learning rate of the masks (constant)
LAMBDA_LR = 1.0  # peak learning rate of the Lagrange multipliers
NORMALIZED_LOSS_SCALE = 10.0  # the default loss: 10 x (task loss / fully ablated loss)
WARN_FAITHFULNESS = 0.1  # warn below this faithfulness ...
WARN_COMPLEMENT = 0.9  # ... or above this complement faithfulness


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


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return float(value)


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _lr_factor(step: int, steps: int, warmup: int) -> float:
    """Multiplier of the multipliers' learning rate at (0-based) ``step``: linear warm-up
    over ``warmup`` steps, then linear decay to ``1 / (steps - warmup)`` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    return (steps - step) / max(1, steps - warmup)


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
    lr: float = LR,
    lambda_lr: float = LAMBDA_LR,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
    init_mean: float = hc.INIT_MEAN,
    countable: Tensor | None = None,
    loss_scale: float = 1.0,
    lambda_warmup: int | None = None,
    loss_norm: float = 1.0,
    desc: str = "pruning",
) -> MaskResult:
    """Optimise hard-concrete edge (and node) masks; the model must be frozen and in eval mode.

    One Adam optimiser holds the masks (minimised, constant learning rate) and the
    Lagrange multipliers (maximised, their own learning rate, which warms up linearly
    over ``lambda_warmup`` steps and then decays linearly; see the module docstring).

    Args:
        model: The model.
        graph: Its edge graph.
        traces: Training traces (``inputs`` used).
        positions: ``[batch, pos]`` bool target positions.
        reference: ``[batch, pos, d_output]`` what the circuit should output there (the
            full model's predictions or the truth; token ids for a truth loss on tokens).
        ablated: ``[n_writers, batch | 1, pos, d]`` ablated writer outputs (a
            :class:`~mechlab.prune.forward.WindowedAblation` for a windowed graph).
        sparsity: Target edge sparsity in (0, 1), over the ``countable`` edges.
        node_sparsity: Target writer-node sparsity, or None for no node masks.
        steps: Optimiser steps.
        warmup: Steps over which the target rises linearly from 0 (default ``steps // 2``).
        lr: Adam learning rate of the masks.
        lambda_lr: Peak Adam learning rate of the multipliers.
        batch_size: Traces per step (all of them if fewer).
        seed: Seeds the initial masks, the noise and the batches.
        progress: Show a tqdm bar.
        init_mean: Mean of the initial ``log_alpha`` (see :mod:`mechlab.prune.masks`).
        countable: ``[n_edges]`` bool, the edges the sparsity counts (default: all).
        loss_scale: Multiplies the task loss.
        lambda_warmup: Warm-up steps of the multipliers' learning rate (default ``steps // 10``).
        loss_norm: The task loss is divided by it (see :func:`ablated_loss`).
        desc: What the progress bar says it runs.

    Returns:
        The :class:`MaskResult`.
    """
    device = ablated.device
    io = model.cfg.io
    warmup = steps // 2 if warmup is None else warmup
    lambda_warmup = max(1, steps // 10) if lambda_warmup is None else lambda_warmup
    gen = torch.Generator().manual_seed(seed)
    edge_la = nn.Parameter(hc.init_log_alpha(graph.n_edges, gen, init_mean).to(device))
    node_la = None
    params = [edge_la]
    if node_sparsity is not None:
        node_la = nn.Parameter(hc.init_log_alpha(graph.n_writers, gen, init_mean).to(device))
        params.append(node_la)
    counted = (
        torch.ones(graph.n_edges, dtype=torch.bool) if countable is None else countable
    ).to(device)
    edge_writer = torch.tensor([graph.writer_index[w] for w, _ in graph.edges], device=device)
    lag_edge, lag_node = _Lagrangian().to(device), _Lagrangian().to(device)  # fresh lambdas
    lambdas = [*lag_edge.parameters(), *lag_node.parameters()]
    opt = torch.optim.Adam(
        [{"params": params, "lr": lr}, {"params": lambdas, "lr": lambda_lr, "maximize": True}]
    )
    # masks: constant rate; multipliers: warm-up, then linear decay (no late wind-up)
    factors = [lambda i: 1.0, lambda i: _lr_factor(i, steps, lambda_warmup)]
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, factors)
    n = len(traces)
    order, cursor = torch.randperm(n, generator=gen), 0
    history = []
    bar = tqdm(
        range(1, steps + 1), disable=not progress, desc=desc, unit="step", dynamic_ncols=True
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
        abl = select_traces(ablated, index_d)
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
        if weight is not None:
            weight = weight[counted]
        s_edge = hc.expected_sparsity(edge_la[counted], weight)
        total = loss_scale * task / loss_norm + lag_edge(s_edge, target)
        if node_la is not None:
            node_target = hc.target_schedule(step, node_sparsity, warmup)
            total = total + lag_node(hc.expected_sparsity(node_la), node_target)

        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        schedule.step()

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
    io = model.cfg.io
    zeros = torch.zeros(graph.n_edges, device=ablated.device)
    losses = []
    for start in range(0, len(traces), batch_size):
        index = torch.arange(start, min(start + batch_size, len(traces)), device=ablated.device)
        abl = select_traces(ablated, index)
        pred = masked_forward(model, graph, traces.inputs[index], abl, zeros)
        mask, ref = positions[index], reference[index][positions[index]]
        if io == "tokens" and ref.dtype == torch.long:
            losses.append(truth_error(pred[mask], ref, io))
        else:
            losses.append(divergence(pred[mask], ref, io))
    value = float(torch.cat(losses).double().mean())
    return value if value > 0 else 1.0


@dataclass
class BinaryMasks:
    """The circuit as masks: kept edges and nodes, and how they were chosen.

    Attributes:
        edges: ``[n_edges]`` bool, the kept edges (all open and on a complete path).
        nodes: ``[n_writers]`` bool, the kept writers.
        edge_threshold: On ``log_alpha`` (``inf`` when no edge is kept).
        node_threshold: On the nodes' ``log_alpha``, or None without node masks.
        n_countable: Edges the sparsity counts (those not from an inert writer).
        n_open: Countable edges that are open (and whose writer is kept).
        n_wanted: Edges the asked sparsity keeps; more than ``n_open`` when limited.
        n_open_on_paths: Open edges on a complete path through open edges
            (:func:`live_edges`); the others could not change the output.
    """

    edges: Tensor
    nodes: Tensor
    edge_threshold: float
    node_threshold: float | None
    n_countable: int
    n_open: int
    n_wanted: int
    n_open_on_paths: int = -1

    @property
    def limited_by_open_edges(self) -> bool:
        """Whether fewer edges than asked are kept because too few are open."""
        return self.n_open < self.n_wanted

    @property
    def limited_by_paths(self) -> bool:
        """Whether fewer edges than asked (and open) are kept because the next ones by
        ``log_alpha`` would not all lie on complete paths within the quota."""
        return int(self.edges.sum()) < min(self.n_wanted, self.n_open)


def binarize(
    graph: EdgeGraph,
    result: MaskResult,
    sparsity: float,
    node_sparsity: float | None,
    countable: Tensor | None = None,
    ablation: str = "interchange",
) -> BinaryMasks:
    """Choose the circuit: whole paths of open edges of highest mask, within the quota.

    Nodes first (when node masks were trained): keep the ``round((1 - node_sparsity) n)``
    writers of highest ``log_alpha`` among the open ones. Then edges: among the
    countable, open edges (deterministic mask > 0) whose writer is kept, at most
    ``round((1 - sparsity) n_countable)``, ranked by ``log_alpha`` (which orders them
    as the deterministic mask does, without the ties of its clamp) and kept only where
    they complete a path from the input to the read-out (:func:`select_on_paths`);
    fewer when fewer are open (:attr:`BinaryMasks.limited_by_open_edges`) or when the
    next path does not fit (:attr:`BinaryMasks.limited_by_paths`).

    Args:
        graph: The edge graph.
        result: The optimised masks.
        sparsity: Edge sparsity over the countable edges.
        node_sparsity: Writer sparsity, or None.
        countable: ``[n_edges]`` bool, the edges the sparsity counts (default: all).
        ablation: The ablation the masks were trained under (where paths may start).

    Returns:
        The :class:`BinaryMasks`.
    """
    nodes = torch.ones(graph.n_writers, dtype=torch.bool)
    node_threshold = None
    if result.node_log_alpha is not None and node_sparsity is not None:
        node_la = result.node_log_alpha.cpu()
        open_nodes = hc.deterministic_mask(node_la) > 0
        n_nodes = min(hc.keep_count(graph.n_writers, node_sparsity), int(open_nodes.sum()))
        node_threshold = hc.bisect_threshold(node_la, n_nodes, open_nodes)
        nodes = (node_la.double() >= node_threshold) & open_nodes
    countable = torch.ones(graph.n_edges, dtype=torch.bool) if countable is None else countable
    edge_writer = torch.tensor([graph.writer_index[w] for w, _ in graph.edges])
    edge_la = result.edge_log_alpha.cpu()
    eligible = nodes[edge_writer] & countable.cpu() & (hc.deterministic_mask(edge_la) > 0)
    n_countable, n_open = int(countable.sum()), int(eligible.sum())
    n_wanted = hc.keep_count(n_countable, sparsity)
    edges, edge_threshold = select_on_paths(
        graph, edge_la, eligible, min(n_wanted, n_open), ablation
    )
    n_on_paths = int(live_edges(graph, eligible, ablation).sum())
    return BinaryMasks(
        edges, nodes, edge_threshold, node_threshold, n_countable, n_open, n_wanted, n_on_paths
    )


def check_sparsity(
    graph: EdgeGraph, ablation: str, sparsity: float, positions: list[int] | None = None
) -> int:
    """Raise ValueError unless ``sparsity`` keeps at least one countable edge; returns how many.

    Args:
        graph: The edge graph.
        ablation: The ablation (it decides which edges count, see
            :func:`mechlab.prune.graph.countable_edges`).
        sparsity: Edge sparsity in (0, 1).
        positions: The scored positions (in a windowed graph they decide which edges
            can matter), or None.

    Returns:
        The number of edges the sparsity keeps.
    """
    n = int(countable_edges(graph, ablation, positions).sum())
    n_keep = hc.keep_count(n, sparsity)
    if n_keep < 1:
        possible = ", ".join(f"{1 - k / n:.4g}" for k in range(1, min(n, 3) + 1))
        raise ValueError(
            f"sparsity {sparsity} keeps no edge of this {graph.arch} graph's {n} countable edges "
            f"(of {graph.n_edges}); use at most {1 - 0.5 / n:.4g} (1 - k/{n} keeps k: {possible}, ...)"
        )
    return n_keep


def faithfulness_warning(metrics: dict[str, Any]) -> str | None:
    """A one-line warning when a circuit explains nothing or its complement explains all.

    Args:
        metrics: The metrics of :func:`mechlab.prune.evaluate.evaluate_masks`.

    Returns:
        The warning, or None when faithfulness >= 0.1 and complement faithfulness <= 0.9.
    """
    faith = metrics.get("faithfulness", float("nan"))
    complement = metrics.get("complement_faithfulness", float("nan"))
    problems = []
    if faith < WARN_FAITHFULNESS:
        problems.append(f"faithfulness {faith:.3f} < {WARN_FAITHFULNESS}")
    if complement > WARN_COMPLEMENT:
        problems.append(f"complement faithfulness {complement:.3f} > {WARN_COMPLEMENT}")
    if not problems:
        return None
    return (
        f"circuit for {metrics.get('target')!r}: {' and '.join(problems)}; the search likely "
        "failed (try more steps, a lower sparsity or another seed)"
    )


def check_prune_args(
    sparsity: float,
    *,
    ablation: str = "interchange",
    loss: str = "model",
    steps: int = 500,
    lr: float = LR,
    lambda_lr: float = LAMBDA_LR,
    batch_size: int = 64,
    node_sparsity: float | None = None,
    loss_scale: float | None = None,
    normalize_loss: bool | None = None,
    **_: Any,
) -> None:
    """Validate :func:`prune`'s scalar arguments (one-line ValueError), before any work.

    Other keyword arguments are accepted and ignored, so a caller can pass on all of
    :func:`prune`'s.
    """
    _check_unit("sparsity", sparsity)
    if node_sparsity is not None:
        _check_unit("node_sparsity", node_sparsity, allow_zero=True)
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}; choose one of {ABLATIONS}")
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
    _check_count("steps", steps)
    _check_count("batch_size", batch_size)
    _check_positive("lr", lr)
    _check_positive("lambda_lr", lambda_lr)
    if loss_scale is not None:
        _check_positive("loss_scale", loss_scale)
    if normalize_loss is not None and not isinstance(normalize_loss, bool):
        raise ValueError(f"normalize_loss must be True, False or None, got {normalize_loss!r}")


def loss_settings(loss_scale: float | None, normalize_loss: bool | None) -> tuple[float, bool]:
    """The effective ``(loss_scale, normalize_loss)`` of :func:`prune`'s arguments.

    Default (both None): the raw task loss. ``normalize_loss=True``: the task loss divided
    by the fully ablated model's, times :data:`NORMALIZED_LOSS_SCALE` (10) unless a
    ``loss_scale`` is given, i.e. ``10 (1 - faithfulness)`` of the batch: it recovers
    circuits whose outputs are tiny (the planted x0.03 cases), but on the bundled
    checkpoint's 2-after target (study NiH, seed 0) it closed every edge where the raw
    loss found 12 edges at faithfulness 0.80 (docs/pruning.md, "Optimisation"). A
    ``loss_scale`` given alone means the raw loss times it (the study's 1000 x MSE).
    """
    normalize = bool(normalize_loss)
    if loss_scale is None:
        loss_scale = NORMALIZED_LOSS_SCALE if normalize else 1.0
    return float(loss_scale), normalize


def prune(
    model: nn.Module,
    data: PruneData,
    target: Target,
    sparsity: float = 0.95,
    *,
    ablation: str = "interchange",
    steps: int = 500,
    seed: int = 0,
    lr: float = LR,
    lambda_lr: float = LAMBDA_LR,
    warmup: int | None = None,
    lambda_warmup: int | None = None,
    batch_size: int = 64,
    loss: str = "model",
    loss_scale: float | None = None,
    normalize_loss: bool | None = None,
    node_sparsity: float | None = None,
    init_mean: float = hc.INIT_MEAN,
    progress: bool = True,
    checkpoint_sha256: str | None = None,
    position_aware: bool | None = None,
) -> Circuit:
    """Find the circuit of ``model`` for a target by edge pruning.

    Edges from writers that cannot matter under the ablation (the position table under
    interchange or mean ablation, :func:`mechlab.prune.graph.inert_writers`) are left
    out of the sparsity count and out of the circuit; the circuit holds only open edges
    (deterministic mask > 0), fewer than asked when fewer are open (recorded in the
    metadata as ``sparsity_limited_by_open_edges``). A ``UserWarning`` is issued when
    the held-out faithfulness is below 0.1 or the complement's above 0.9.

    Args:
        model: A mechlab model (transformer, LSTM, dense SSM, Mamba).
        data: Training and held-out traces (:func:`mechlab.tasks.lds_prune.nih_prune_data`).
        target: ``"k-after"``, ``"all"`` or a callable (:func:`mechlab.traces.target_mask`).
        sparsity: Fraction of the countable edges to remove, in (0, 1); it must keep
            at least one edge.
        ablation: ``"interchange"`` (corrupted traces), ``"mean"`` or ``"zero"``.
        steps: Optimiser steps.
        seed: Seed of the masks' initialisation, noise and batches.
        lr: Adam learning rate of the masks (constant).
        lambda_lr: Peak Adam learning rate of the Lagrange multipliers (maximised).
        warmup: Steps of the linear sparsity ramp (default ``steps // 2``).
        lambda_warmup: Steps of the multipliers' learning-rate warm-up before its
            linear decay (default ``steps // 10``).
        batch_size: Traces per step.
        loss: ``"model"`` (match the full model's predictions: MSE, or KL for token
            models) or ``"truth"`` (match the ground truth).
        loss_scale: Multiplies the task loss. None (default): 10 when the loss is
            normalized, else 1 (the study: 1000 x MSE). See :func:`loss_settings`.
        normalize_loss: Divide the task loss by that of the fully ablated model on the
            training traces (:func:`ablated_loss`), so the search does not depend on
            the scale of the outputs (for circuits with tiny outputs). None or False
            (default): the raw loss.
        node_sparsity: Also mask writer nodes, at this target sparsity (None: no node masks).
        init_mean: Mean of the initial ``log_alpha`` (see :mod:`mechlab.prune.masks`).
        progress: Show a progress bar.
        checkpoint_sha256: Recorded in the circuit's metadata.
        position_aware: Graph of a recurrent model (:func:`~mechlab.prune.graph.pruning_graph`):
            None (default) prunes the windowed graph when the traces have windows
            (``Traces.windows``; edges from which no target window's read-out can be
            reached are then left out of the count and recorded as
            ``n_edges_excluded_unreachable``), False the plain graph, True insists on
            the windowed one.

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`, with its metrics on the held-out traces.

    Raises:
        ValueError: Bad target, sparsity (or one that keeps no edge), ablation, loss,
            learning rate, batch size or data.
    """
    check_prune_args(
        sparsity, ablation=ablation, loss=loss, steps=steps, lr=lr, lambda_lr=lambda_lr,
        batch_size=batch_size, node_sparsity=node_sparsity, loss_scale=loss_scale,
        normalize_loss=normalize_loss,
    )  # fmt: skip
    loss_scale, normalize_loss = loss_settings(loss_scale, normalize_loss)
    check_target(target, data.train)
    if loss == "truth" and (data.train.truth is None or data.test.truth is None):
        raise ValueError("loss 'truth' needs traces with ground truth (Traces.truth)")
    if ablation == "interchange" and (data.train.corrupted is None or data.test.corrupted is None):
        raise ValueError("ablation 'interchange' needs corrupted traces (Traces.corrupted)")
    graph = pruning_graph(model, data.train.windows, position_aware)
    scored = target_positions(target, data.train) if graph.windows else None
    check_sparsity(graph, ablation, sparsity, scored)
    countable = countable_edges(graph, ablation, scored)

    device = next(model.parameters()).device
    train = data.train.to(device)
    started = time.perf_counter()
    with frozen_eval(model), torch.no_grad():
        positions = target_mask(target, train)
        ablated = make_ablation(model, ablation, train, graph=graph)
        reference = train.truth if loss == "truth" else predict_in_chunks(model, train.inputs)
        loss_norm = (
            ablated_loss(model, graph, train, positions, reference, ablated)
            if normalize_loss else 1.0
        )  # fmt: skip
    with frozen_eval(model):
        result = optimise_masks(
            model, graph, train, positions, reference, ablated, sparsity, node_sparsity,
            steps=steps, warmup=warmup, lr=lr, lambda_lr=lambda_lr, batch_size=batch_size,
            seed=seed, progress=progress, init_mean=init_mean, countable=countable,
            loss_scale=loss_scale, lambda_warmup=lambda_warmup, loss_norm=loss_norm,
            desc=f"pruning {target if isinstance(target, str) else 'custom target'} (seed {seed})",
        )  # fmt: skip
        settings = {
            "checkpoint_sha256": checkpoint_sha256, "loss": loss, "loss_scale": loss_scale,
            "loss_normalized": normalize_loss,
            "loss_normalized_by": loss_norm,  # the fully ablated model's training loss (or 1)
            "seed": seed, "steps": steps, "warmup": steps // 2 if warmup is None else warmup,
            "lambda_warmup": max(1, steps // 10) if lambda_warmup is None else lambda_warmup,
            "lr": lr, "lambda_lr": lambda_lr, "init_mean": init_mean, "batch_size": batch_size,
        }  # fmt: skip
        circuit = finish_circuit(
            model, graph, data, target, ablation, result, sparsity, node_sparsity, countable,
            scored, settings, started,
        )  # fmt: skip
    warning = circuit.metadata["warnings"]
    if warning:
        warnings.warn(warning[0], UserWarning, stacklevel=2)
    return circuit


def finish_circuit(
    model: nn.Module,
    graph: EdgeGraph,
    data: PruneData,
    target: Target,
    ablation: str,
    result: MaskResult,
    sparsity: float,
    node_sparsity: float | None,
    countable: Tensor,
    scored: list[int] | None,
    settings: dict[str, Any],
    started: float,
) -> Circuit:
    """Choose the circuit from optimised masks, score it on the held-out traces, record how.

    The model must be frozen and in eval mode (:func:`~mechlab.prune.forward.frozen_eval`).

    Args:
        model: The model.
        graph: The graph pruned.
        data: The traces (the held-out set is scored).
        target: The target.
        ablation: The ablation.
        result: The optimised masks.
        sparsity: Edge sparsity asked.
        node_sparsity: Node sparsity asked, or None.
        countable: ``[n_edges]`` bool, the edges the sparsity counts.
        scored: The scored positions of a windowed graph, else None.
        settings: Search settings recorded in the metadata as they are (seed, lr, ...).
        started: ``time.perf_counter()`` when the search started.

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`; ``metadata["warnings"]`` holds the
        :func:`faithfulness_warning`, if any (not issued here).
    """
    device = next(model.parameters()).device
    binary = binarize(graph, result, sparsity, node_sparsity, countable, ablation)
    mean_reference = data.train.inputs.to(device) if ablation == "mean" else None
    metrics = evaluate_masks(
        model, graph, data.test.to(device), target, ablation, binary.edges, binary.nodes,
        mean_reference=mean_reference,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    det = hc.deterministic_mask(result.edge_log_alpha.cpu())
    kept = binary.edges.nonzero().flatten().tolist()
    n_kept = len(kept)
    node_det = (
        None if result.node_log_alpha is None else hc.deterministic_mask(result.node_log_alpha.cpu())
    )
    warning = faithfulness_warning(metrics)
    metadata = {
        "checkpoint_sha256": settings.get("checkpoint_sha256"),
        "target": target_name(target),
        "ablation": ablation,
        **{k: v for k, v in settings.items() if k != "checkpoint_sha256"},
        "sparsity_asked": sparsity,
        "sparsity_reached": 1.0 - n_kept / binary.n_countable,
        "n_edges_kept": n_kept,
        "n_edges_asked": binary.n_wanted,
        "n_open_edges": binary.n_open,
        "sparsity_limited_by_open_edges": binary.limited_by_open_edges,
        # open edges on a complete input -> read-out path; kept fewer when the next path
        # by log_alpha would not fit in the quota
        "n_open_edges_on_paths": binary.n_open_on_paths,
        "sparsity_limited_by_paths": binary.limited_by_paths,
        "n_edges_countable": binary.n_countable,
        "n_edges_excluded_inert": graph.n_edges - int(countable_edges(graph, ablation).sum()),
        "inert_writers": inert_writers(graph, ablation),
        "node_sparsity_asked": node_sparsity,
        "node_sparsity_reached": 1.0 - float(binary.nodes.float().mean()),
        "edge_threshold_log_alpha": binary.edge_threshold,
        # the smallest kept deterministic mask, in (0, 1]; None when nothing is kept
        "edge_threshold_mask": float(det[kept].min()) if kept else None,
        "node_threshold_mask": (
            float(node_det[binary.nodes].min()) if node_det is not None and binary.nodes.any()
            else None
        ),
        "data_seed": data.info.get("data_seed"),
        "graph": graph.summary(),
        "data": dict(data.info),
        "metrics": metrics,
        "warnings": [warning] if warning else [],
        "final_expected_sparsity": result.history[-1]["sparsity"],
        "history": result.history,  # every 10th step: loss, expected sparsity, target, lambdas
        "seconds": seconds,
    }
    if graph.windows:  # edges no scored read-out can be reached from: out of the count
        metadata["n_edges_excluded_unreachable"] = int(unreachable_edges(graph, scored).sum())
        metadata["target_windows"] = target_windows(graph, scored)
    edges = {graph.edges[i]: float(det[i]) for i in kept}
    log_alpha = {edge: float(result.edge_log_alpha[i]) for i, edge in enumerate(graph.edges)}
    return Circuit.from_edges(edges, metadata=metadata, log_alpha=log_alpha)


def prune_seeds(
    model: nn.Module,
    data: PruneData | Callable[[int], PruneData],
    targets: Sequence[Target],
    seeds: Sequence[int],
    **prune_kwargs: Any,
) -> dict[str, list[Circuit]]:
    """Prune every target with every seed (the input of :func:`seed_stability`).

    A seed baseline should vary the data as well as the optimiser: pass ``data`` as a
    function of the seed (e.g. ``lambda s: nih_prune_data(cfg, seed=s)``) and seed ``s``
    draws its own traces; its circuits record both seeds (``seed``, ``data_seed``).

    Args:
        model: The model.
        data: Traces, the same for every seed, or a function seed -> traces.
        targets: Targets.
        seeds: Seeds (at least two for a stability estimate).
        **prune_kwargs: Passed to :func:`prune`.

    Returns:
        Target name -> circuits, in the order of ``seeds``.
    """
    check_prune_args(**{"sparsity": 0.95, **prune_kwargs})
    found: dict[str, list[Circuit]] = {target_name(t): [] for t in targets}
    for s in seeds:
        seed_data = data(s) if callable(data) else data
        for t in targets:
            check_target(t, seed_data.train)
        for t in targets:
            circuit = prune(model, seed_data, t, seed=s, **prune_kwargs)
            if callable(data):
                circuit.metadata["data_seed"] = s
            found[target_name(t)].append(circuit)
    return found
