"""The objective every attribution method scores: a metric of the masked forward at the target.

:class:`Objective` bundles a frozen model, its edge graph, the training traces, their
ablation and the target positions; :func:`metric_value` is the metric ``m(z)`` at one set
of edge masks (the module docstring of :mod:`mechlab.prune.attribution` defines it), and
:func:`exact_loop_scores` the exact single-edge effects by one masked forward per edge.
The score methods (:mod:`~mechlab.prune.attribution`), the batched replay
(:mod:`~mechlab.prune.exact`) and ACDC (:mod:`~mechlab.prune.acdc`) build on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from mechlab import limits
from mechlab.circuit_methods import scoring_names
from mechlab.models.base import predict_in_chunks
from mechlab.progress import tqdm
from mechlab.prune.forward import (
    Ablation,
    divergence,
    make_ablation,
    masked_forward,
    select_traces,
)
from mechlab.prune.graph import EdgeGraph, countable_edges, pruning_graph
from mechlab.traces import Target, Traces, target_mask
from mechlab.traces import target_positions as scored_positions

METRICS = ("loss", "projection")
EAP_POINTS = ("corrupted", "clean")
ATTRIBUTION_METHODS = scoring_names()  # the built-in ones (mechlab.circuit_methods: the registry)
DEFAULT_STEPS = 10
DEFAULT_BATCH_SIZE = 128
# Vectors of d_model a masked forward and backward keeps per reader and position of a trace:
# its reader inputs, their norms and the autograd graph's saved tensors. Measured: EAP at the
# GPT-2-small shape (445 readers, 33 positions, d_model 768, float32) holds about 0.2 GB per
# trace, 4.4 vectors per reader and position; 6 leaves a third to spare.
GRADIENT_VECTORS_PER_READER = 6
MEMORY_SHARE = 0.8  # of the memory free, what one chunk's gradient pass may take


# ---------------------------------------------------------------------------------------
# The objective every method scores against
# ---------------------------------------------------------------------------------------


@dataclass
class Objective:
    """What the methods score: the metric ``m(z)`` of a model's masked forward on traces.

    Attributes:
        model: The model (frozen and in eval mode while scores are computed).
        graph: Its edge graph.
        traces: The traces scored on (``inputs``; ``corrupted`` for interchange).
        positions: ``[batch, pos]`` bool target positions.
        reference: ``[batch, pos, d_output]`` the full model's output ``f(1)``.
        ablated: The ablated values (:func:`~mechlab.prune.forward.make_ablation`).
        ablation: ``interchange``, ``mean`` or ``zero``.
        metric: ``loss`` or ``projection`` (module docstring).
        countable: ``[n_edges]`` bool, the edges that can matter.
        fully_ablated: ``[batch, pos, d_output]`` the output with every edge ablated ``f(0)``.
    """

    model: nn.Module
    graph: EdgeGraph
    traces: Traces
    positions: Tensor
    reference: Tensor
    ablated: Ablation
    ablation: str
    metric: str
    countable: Tensor
    fully_ablated: Tensor

    @property
    def n_positions(self) -> int:
        """Target positions summed over traces (the metric's denominator)."""
        return int(self.positions.sum())

    @property
    def device(self) -> torch.device:
        return self.reference.device

    def gradient_chunk(self, batch_size: int) -> int:
        """Traces per masked forward and backward: ``batch_size``, or fewer on a CPU whose free
        memory would not hold that many (:data:`GRADIENT_VECTORS_PER_READER` vectors of
        ``d_model`` per reader and position of a trace, measured at the GPT-2-small shape). Where it shrinks the
        chunk, the gradient is the same sum in smaller parts (equal to float rounding), where
        before the kernel's out-of-memory killer ended the process."""
        if self.device.type != "cpu" or (free := limits.available_memory()) is None:
            return batch_size
        vector = self.model.cfg.d_model * self.reference.element_size()
        per_trace = GRADIENT_VECTORS_PER_READER * self.graph.n_readers * self.traces.n_pos * vector
        return max(1, min(batch_size, int(MEMORY_SHARE * free) // max(per_trace, 1)))

    def chunks(self, batch_size: int) -> Iterator[Tensor]:
        """Index tensors of consecutive traces, ``batch_size`` at a time."""
        n = len(self.traces)
        for start in range(0, n, batch_size):
            yield torch.arange(start, min(start + batch_size, n), device=self.device)

    def metric_sum(self, out: Tensor, index: Tensor, at: Tensor | None = None) -> Tensor:
        """The metric summed over the target positions of the traces at ``index``.

        Args:
            out: ``[len(index), pos, d_output]`` outputs of a masked forward (or
                ``[len(index), len(at), d_output]``: the outputs at positions ``at`` only,
                which must hold every target position of these traces).
            index: The traces ``out`` is of.
            at: The positions ``out`` holds (None: every position).
        """
        def of(t: Tensor) -> Tensor:
            return t[index] if at is None else t[index][:, at]

        mask = of(self.positions)
        # summed in float32 at least (a bfloat16 / float16 model's outputs, upcast here)
        pred, ref = (t.to(torch.promote_types(t.dtype, torch.float32)) for t in (out[mask], of(self.reference)[mask]))
        io = self.model.cfg.io
        if self.metric == "loss":
            return divergence(pred, ref, io).sum()
        base = of(self.fully_ablated)[mask].to(pred.dtype)
        if io == "tokens":  # logits are defined up to a constant: centre them
            pred, ref, base = (t - t.mean(-1, keepdim=True) for t in (pred, ref, base))
        return ((ref - pred) * (ref - base)).sum()

    def truncated(self) -> Objective:
        """The same objective on the positions up to the last target one, where that is exact.

        A causal model's outputs up to position ``p`` do not depend on later inputs, so
        they can be dropped (not in a windowed graph, whose windows cover the whole trace).
        """
        last = kept_positions(self.model, self.graph, [self.positions])
        if last is None:
            return self

        def cut(t: Tensor) -> Tensor:
            return t[:, :last]

        return replace(
            self, traces=self.traces.upto(last), positions=cut(self.positions), reference=cut(self.reference),
            ablated=self.ablated[:, :, :last], fully_ablated=cut(self.fully_ablated),
        )  # fmt: skip


def kept_positions(model: nn.Module, graph: EdgeGraph, positions: list[Tensor]) -> int | None:
    """How many leading positions a causal model's outputs at the target positions
    (``[batch, pos]`` masks, one per target) depend on: up to the last target position; None
    when nothing can be cut (a model that is not causal, a windowed graph whose windows cover
    the whole trace, or a target at the last position)."""
    last = max(int(p.any(0).nonzero().max()) + 1 for p in positions)
    if graph.windows or not getattr(model.cfg, "causal", True) or last == positions[0].shape[1]:
        return None
    return last


def writer_kind_mask(graph: EdgeGraph, kind: str) -> Tensor:
    """``[n_edges]`` bool: edges whose writer is of ``kind`` (``embed``, ...)."""
    kinds = {w.name: w.kind for w in graph.writers}
    return torch.tensor([kinds[w] == kind for w, _ in graph.edges], dtype=torch.bool)


@torch.no_grad()
def build_objective(
    model: nn.Module,
    traces: Traces,
    target: Target,
    ablation: str = "interchange",
    metric: str = "loss",
    graph: EdgeGraph | None = None,
    mean_reference: Tensor | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> Objective:
    """The :class:`Objective` of ``model`` on ``traces`` (the model must be frozen, in eval mode).

    Args:
        model: A mechlab model.
        traces: Traces to score on (on any device; moved to the model's).
        target: ``"k-after"``, ``"all"`` or a callable.
        ablation: ``interchange``, ``mean`` or ``zero``.
        metric: ``loss`` or ``projection``.
        graph: The edge graph (default: :func:`~mechlab.prune.graph.pruning_graph`).
        mean_reference: Inputs of a ``mean`` ablation (default ``traces.inputs``).
        batch_size: Traces per pass.
    """
    device = next(model.parameters()).device
    traces = traces.to(device)
    graph = pruning_graph(model, traces.windows) if graph is None else graph
    positions = target_mask(target, traces)
    reference = mean_reference.to(device) if mean_reference is not None else None
    ablated = make_ablation(model, ablation, traces, reference=reference, graph=graph)
    full = predict_in_chunks(model, traces.inputs, batch_size)
    zeros = torch.zeros(graph.n_edges, device=device)
    empty = torch.cat([
        masked_forward(model, graph, traces.inputs[i], select_traces(ablated, i), zeros)
        for i in (torch.arange(s, min(s + batch_size, len(traces)), device=device)
                  for s in range(0, len(traces), batch_size))
    ])  # fmt: skip
    scored = scored_positions(target, traces) if graph.windows else None
    countable = countable_edges(graph, ablation, scored)
    return Objective(model, graph, traces, positions, full, ablated, ablation, metric,
                     countable, empty)  # fmt: skip


# ---------------------------------------------------------------------------------------
# Metric values and gradients
# ---------------------------------------------------------------------------------------


@torch.no_grad()
def metric_value(obj: Objective, z: Tensor, batch_size: int = DEFAULT_BATCH_SIZE) -> float:
    """``m(z)``: the metric of the masked forward with edge masks ``z`` (mean over targets)."""
    z = z.to(obj.device, obj.reference.dtype)
    total = 0.0
    for index in obj.chunks(batch_size):
        out = masked_forward(obj.model, obj.graph, obj.traces.inputs[index],
                             select_traces(obj.ablated, index), z)  # fmt: skip
        total += float(obj.metric_sum(out, index).double())
    return total / obj.n_positions


def exact_loop_scores(
    obj: Objective, batch_size: int = DEFAULT_BATCH_SIZE, progress: bool = False,
    desc: str = "exact",
) -> Tensor:  # fmt: skip
    """Exact single-edge effects, one masked forward per countable edge (any family)."""
    base = metric_value(obj, torch.ones(obj.graph.n_edges), batch_size)
    scores = torch.zeros(obj.graph.n_edges, dtype=torch.float64)
    for k in tqdm(obj.countable.nonzero().flatten().tolist(), disable=not progress,
                  desc=desc, unit="edge"):  # fmt: skip
        z = torch.ones(obj.graph.n_edges)
        z[k] = 0.0
        scores[k] = metric_value(obj, z, batch_size) - base
    return scores
