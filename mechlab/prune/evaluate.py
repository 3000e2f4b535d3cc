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

from typing import Any

import torch
from torch import Tensor, nn

from mechlab.models.base import predict_in_chunks
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

    Returns:
        A dict of floats (see the module docstring), plus ``n_traces``, ``n_positions``
        and ``divergence`` (``"mse"`` or ``"kl"``).
    """
    io = model.cfg.io
    device = next(model.parameters()).device
    traces = traces.to(device)
    positions = target_mask(target, traces)
    edge_on = edges.to(device=device, dtype=torch.float32)
    node_on = None if nodes is None else nodes.to(device=device, dtype=torch.float32)
    variants = {
        "circuit": (edge_on, node_on),
        "ablated": (torch.zeros_like(edge_on), None),
        "complement": (1.0 - edge_on, None),
    }
    mean_ablation = None
    if ablation == "mean":
        reference = traces.inputs if mean_reference is None else mean_reference.to(device)
        mean_ablation = make_ablation(model, "mean", traces, reference=reference, graph=graph)
    dist: dict[str, list[Tensor]] = {name: [] for name in variants}
    err: dict[str, list[Tensor]] = {name: [] for name in (*variants, "full")}
    with frozen_eval(model):
        for start in range(0, len(traces), batch_size):
            chunk = traces.subset(torch.arange(start, min(start + batch_size, len(traces))))
            mask = positions[start : start + len(chunk)]
            ablated = (
                mean_ablation
                if mean_ablation is not None
                else make_ablation(model, ablation, chunk, graph=graph)
            )
            full = predict_in_chunks(model, chunk.inputs)
            if chunk.truth is not None:
                err["full"].append(truth_error(full[mask], chunk.truth[mask], io))
            for name, (edge_mask, node_mask) in variants.items():
                out = masked_forward(model, graph, chunk.inputs, ablated, edge_mask, node_mask)
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
        for name, values in err.items():
            e = torch.cat(values).double()
            metrics[f"error_{name}"] = float(e.mean())
            metrics[f"error_{name}_median"] = float(e.median())
    return metrics


def evaluate_circuit(
    model: nn.Module,
    data: PruneData,
    circuit: Circuit,
    target: Target | None = None,
    ablation: str | None = None,
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

    The graph is the circuit's: the windowed graph of a recurrent model (on
    ``data``'s windows) when the circuit was pruned on one, else the plain graph.

    Returns:
        The metrics of :func:`evaluate_masks`.
    """
    target = circuit.metadata.get("target") if target is None else target
    ablation = circuit.metadata.get("ablation", "interchange") if ablation is None else ablation
    if target is None:
        raise ValueError("the circuit records no target; pass target=")
    windowed = "windows" in circuit.metadata.get("graph", {})
    graph = pruning_graph(model, data.test.windows, position_aware=windowed)
    edges = circuit_edge_mask(circuit, graph)
    reference = data.train.inputs if ablation == "mean" else None
    return evaluate_masks(
        model, graph, data.test, target, ablation, edges, mean_reference=reference
    )
