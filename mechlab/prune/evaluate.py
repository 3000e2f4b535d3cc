"""Scoring a circuit: faithfulness and errors of binary edge masks on held-out traces.

Metrics (:func:`evaluate_masks`), on held-out traces at the target positions, with
``d`` the squared error summed over output dims (KL(full || other) for token models):

* ``circuit_vs_full``: ``d(circuit, full model)``, and ``faithfulness`` =
  ``1 - d(circuit, full) / d(all edges ablated, full)`` (1: the circuit does all the
  full model does there; 0: no better than ablating everything);
* ``error_circuit``, ``error_full``, ``error_ablated``: errors against the ground truth;
* ``error_complement`` / ``complement_vs_full`` / ``complement_faithfulness``: the
  model with the circuit's edges ablated and every other edge kept, which should lose
  the target ability (error near ``error_ablated``, faithfulness near 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.models.base import predict_in_chunks
from mechlab.progress import tqdm
from mechlab.prune.circuit import Circuit
from mechlab.prune.forward import (
    divergence,
    frozen_eval,
    make_ablation,
    masked_forward,
    truth_error,
)
from mechlab.prune.graph import EdgeGraph, pruning_graph
from mechlab.traces import PruneData, Target, Traces, target_mask, target_name


def circuit_edge_mask(circuit: Circuit, graph: EdgeGraph) -> Tensor:
    """``[n_edges]`` bool: the circuit's edges in ``graph``'s edge order."""
    mask = torch.zeros(graph.n_edges, dtype=torch.bool)
    for edge in circuit.edges:
        if edge not in graph.edge_index:
            raise ValueError(f"edge {edge} of the circuit is not in the model's graph")
        mask[graph.edge_index[edge]] = True
    return mask


def _mean(values: Tensor) -> float:
    return float(values.double().mean())


def _variants(edges: Tensor, nodes: Tensor | None, device: torch.device) -> dict[str, tuple]:
    """The masks of the circuit, the fully ablated model and the complement."""
    edge_on = edges.to(device=device, dtype=torch.float32)
    node_on = None if nodes is None else nodes.to(device=device, dtype=torch.float32)
    return {
        "circuit": (edge_on, node_on),
        "ablated": (torch.zeros_like(edge_on), None),
        "complement": (1.0 - edge_on, None),
    }


def _variant_runs(
    model: nn.Module,
    graph: EdgeGraph,
    traces: Traces,
    positions: Tensor,
    ablation: str,
    edges: Tensor,
    nodes: Tensor | None,
    mean_reference: Tensor | None,
    batch_size: int,
    progress: bool = False,
    desc: str = "evaluation",
) -> Iterator[tuple[Traces, Tensor, dict[str, Tensor]]]:
    """Per chunk of traces: the chunk, its target mask, and the outputs of the full model
    and of each variant (:func:`_variants`), ``[chunk, pos, d_output]`` each."""
    device = next(model.parameters()).device
    variants = _variants(edges, nodes, device)
    mean_ablation = None
    if ablation == "mean":
        reference = traces.inputs if mean_reference is None else mean_reference.to(device)
        mean_ablation = make_ablation(model, "mean", traces, reference=reference, graph=graph)
    starts = range(0, len(traces), batch_size)
    with frozen_eval(model):
        for start in tqdm(starts, disable=not progress, desc=desc, unit="batch"):
            chunk = traces.subset(torch.arange(start, min(start + batch_size, len(traces))))
            mask = positions[start : start + len(chunk)]
            ablated = (
                mean_ablation
                if mean_ablation is not None
                else make_ablation(model, ablation, chunk, graph=graph)
            )
            outs = {"full": predict_in_chunks(model, chunk.inputs)}
            for name, (edge_mask, node_mask) in variants.items():
                outs[name] = masked_forward(model, graph, chunk.inputs, ablated, edge_mask, node_mask)
            yield chunk, mask, outs


@torch.no_grad()
def evaluate_masks(
    model: nn.Module,
    graph: EdgeGraph,
    traces: Traces,
    target: Target,
    ablation: str,
    edges: Tensor,
    nodes: Tensor | None = None,
    mean_reference: Tensor | None = None,
    batch_size: int = 128,
    progress: bool = False,
    stage: str = "evaluation",
    on_batch: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Faithfulness and errors of a binary circuit at the target positions (see the module docstring).

    Args:
        model: The model.
        graph: Its edge graph.
        traces: Held-out traces.
        target: Which positions to score.
        ablation: ``interchange``, ``mean`` or ``zero``.
        edges: ``[n_edges]`` bool, the circuit.
        nodes: ``[n_writers]`` bool kept writers, or None.
        mean_reference: Inputs whose mean writer outputs a ``mean`` ablation uses
            (default: ``traces.inputs``).
        batch_size: Traces per pass.
        progress: Show a progress bar (one step per batch of traces: the full model, the
            circuit, the fully ablated model and the complement).
        stage: What the bar says first (``<stage>: circuit, complement, ablated on N
            held-out traces``).
        on_batch: Called after each batch of traces (e.g. an outer bar's ``update`` over
            several circuits' batches).

    Returns:
        A dict of floats (see the module docstring), plus ``n_traces``, ``n_positions``
        and ``divergence`` (``"mse"`` or ``"kl"``).
    """
    io = model.cfg.io
    device = next(model.parameters()).device
    traces = traces.to(device)
    positions = target_mask(target, traces)
    variants = ("circuit", "ablated", "complement")
    dist: dict[str, list[Tensor]] = {name: [] for name in variants}
    err: dict[str, list[Tensor]] = {name: [] for name in (*variants, "full")}
    runs = _variant_runs(model, graph, traces, positions, ablation, edges, nodes, mean_reference,
                         batch_size, progress,
                         f"{stage}: circuit, complement, ablated on {len(traces)} held-out traces")  # fmt: skip
    for chunk, mask, outs in runs:
        if on_batch is not None:
            on_batch()
        full = outs["full"]
        for name, out in outs.items():
            if name != "full":
                dist[name].append(divergence(out[mask], full[mask], io))
            if chunk.truth is not None:
                err[name].append(truth_error(out[mask], chunk.truth[mask], io))
    d = {name: torch.cat(v) for name, v in dist.items()}
    gap = _mean(d["ablated"])
    metrics: dict[str, Any] = {
        "target": target_name(target),
        "n_traces": len(traces),
        "n_positions": int(positions.sum()),
        "divergence": "mse" if io == "continuous" else "kl",
        "circuit_vs_full": _mean(d["circuit"]),
        "ablated_vs_full": gap,
        "complement_vs_full": _mean(d["complement"]),
        "faithfulness": 1.0 - _mean(d["circuit"]) / gap if gap > 0 else float("nan"),
        "complement_faithfulness": 1.0 - _mean(d["complement"]) / gap if gap > 0 else float("nan"),
    }
    if traces.truth is not None:
        for name in (*variants, "full"):
            e = torch.cat(err[name]).double()
            metrics[f"error_{name}"] = float(e.mean())
            metrics[f"error_{name}_median"] = float(e.median())
    return metrics


@torch.no_grad()
def target_outputs(
    model: nn.Module,
    data: PruneData,
    circuit: Circuit,
    target: Target | None = None,
    ablation: str | None = None,
    batch_size: int = 128,
) -> dict[str, Tensor]:
    """The outputs at the target positions of ``data``'s held-out traces, for a metric of
    your own: the full model's, the circuit's, the fully ablated model's and the complement's.

    The traces, target, ablation and graph are those :func:`evaluate_circuit` scores; a
    metric such as a logit difference of answer tokens is then a function of these
    outputs (e.g. :func:`mechlab.tasks.prompts.logit_diff_metrics`).

    Args:
        model: The model the circuit was pruned from.
        data: Traces (the held-out set is run; the training set is a ``mean`` ablation's
            reference).
        circuit: The circuit.
        target: Target positions (default: the circuit's own).
        ablation: Ablation (default: the circuit's own).
        batch_size: Traces per pass.

    Returns:
        ``full``, ``circuit``, ``ablated``, ``complement``: ``[n_positions, d_output]`` each,
        the target positions in order, trace by trace (one row per trace for a target of
        one position per trace), on the CPU.
    """
    graph, edges, target, ablation = _circuit_setting(model, data, circuit, target, ablation)
    device = next(model.parameters()).device
    traces = data.test.to(device)
    positions = target_mask(target, traces)
    reference = data.train.inputs if ablation == "mean" else None
    outs: dict[str, list[Tensor]] = {}
    for _, mask, chunk_outs in _variant_runs(model, graph, traces, positions, ablation, edges,
                                             None, reference, batch_size):  # fmt: skip
        for name, out in chunk_outs.items():
            outs.setdefault(name, []).append(out[mask].cpu())
    return {name: torch.cat(values) for name, values in outs.items()}


def _circuit_setting(
    model: nn.Module, data: PruneData, circuit: Circuit, target: Target | None, ablation: str | None
) -> tuple[EdgeGraph, Tensor, Target, str]:
    """The graph, edge mask, target and ablation a circuit is scored with on ``data``."""
    target = circuit.metadata.get("target") if target is None else target
    ablation = circuit.metadata.get("ablation", "interchange") if ablation is None else ablation
    if target is None:
        raise ValueError("the circuit records no target; pass target=")
    windowed = "windows" in circuit.metadata.get("graph", {})
    graph = pruning_graph(model, data.test.windows, position_aware=windowed)
    return graph, circuit_edge_mask(circuit, graph), target, ablation


def evaluate_circuit(
    model: nn.Module,
    data: PruneData,
    circuit: Circuit,
    target: Target | None = None,
    ablation: str | None = None,
    progress: bool = False,
    stage: str = "evaluation",
) -> dict[str, Any]:
    """Score a circuit on ``data``'s held-out traces, for its own target or another one.

    Cross-evaluation: ``evaluate_circuit(model, data, circuit_a, target="2-after")``
    scores the 1-after circuit ``circuit_a`` on the 2-after positions.

    Args:
        model: The model the circuit was pruned from.
        data: Traces (the held-out set is used; the training set is the reference of a
            ``mean`` ablation).
        circuit: The circuit.
        target: Target to score (default: the circuit's own).
        ablation: Ablation (default: the circuit's own).
        progress: Show a bar over the batches of traces (:func:`evaluate_masks`).
        stage: What the bar says first.

    The graph is the circuit's: the windowed graph of a recurrent model (on
    ``data``'s windows) when the circuit was pruned on one, else the plain graph.

    Returns:
        The metrics of :func:`evaluate_masks`.
    """
    graph, edges, target, ablation = _circuit_setting(model, data, circuit, target, ablation)
    reference = data.train.inputs if ablation == "mean" else None
    return evaluate_masks(model, graph, data.test, target, ablation, edges, mean_reference=reference,
                          progress=progress, stage=stage)  # fmt: skip
