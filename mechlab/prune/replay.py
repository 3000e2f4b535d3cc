"""Masked forwards of many edge sets, each replaying only the layers its changes reach.

The default search's selection (:mod:`mechlab.prune.refine`) scores about a hundred
binary edge sets on the same traces, and each differs from one scored just before by an
edge or a few: an elimination round removes each kept edge in turn, the fill adds each
candidate in turn. A masked forward's writers before the first layer whose readers see a
changed mask are the same in both passes (a writer's output depends only on the edges into
readers at its layer and below), so :class:`ReplayForward` keeps the writer buffers of the
last few passes and starts a new pass at that layer, from the closest pass kept: an edge
into the read-out replays nothing but the read-out, an edge into the last layer only that
layer. The arithmetic is :func:`~mechlab.prune.forward.masked_forward`'s fast path, on the
same rows, so the outputs are the same numbers (``tests/prune/test_replay.py``).

It applies to a transformer on its plain graph whose masked forward takes the fast path
(frozen parameters), without node masks and without gradients; anything else runs the
plain masked forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn

from mechlab.models.buffers import POOL
from mechlab.prune.forward import _transformer_forward_fast_body, masked_forward
from mechlab.prune.graph import EdgeGraph
from mechlab.prune.mixing import FastStream, usable

KEPT_PASSES = 3  # passes whose writer buffers are kept (at most MAX_KEPT_BYTES of them)
MAX_KEPT_BYTES = 1 << 30  # memory the kept buffers may take


def reader_layers(graph: EdgeGraph) -> Tensor:
    """``[n_edges]`` long: the layer of each edge's reader (``n_layers`` for the read-out)."""
    out = torch.empty(graph.n_edges, dtype=torch.long)
    for r in graph.readers:
        start = graph.edge_offset[r.name]
        out[start : start + r.n_upstream] = r.layer
    return out


@dataclass(eq=False)
class _Pass:
    """A pass kept: its edge mask, its writer buffer, the stream's state before each layer."""

    mask: Tensor  # [n_edges] on the CPU
    buffer: Tensor  # [n_writers, batch * pos * d]
    states: list  # per layer 0..n_layers: FastStream.state() before it


class ReplayForward:
    """``masked_forward(model, graph, x, ablated, mask)`` for many masks, without gradients,
    replaying from the first layer a mask changes (module docstring).

    Args:
        model: A mechlab model.
        graph: Its edge graph.
        x: ``[batch, pos, ...]`` inputs.
        ablated: Their ablated writer outputs (:func:`~mechlab.prune.forward.make_ablation`).
        kept_passes: Passes whose buffers are kept to start from (fewer when they would
            take more than :data:`MAX_KEPT_BYTES`; none: every pass runs in full).

    Attributes:
        layers_run: Layers (and read-outs) computed so far; ``passes * (n_layers + 1)``
            without replay (for measuring what the replay saves).
        passes: Masks scored so far.
    """

    def __init__(self, model: nn.Module, graph: EdgeGraph, x: Tensor, ablated, kept_passes: int = KEPT_PASSES):
        self.model, self.graph, self.x, self.ablated = model, graph, x, ablated
        self.n_layers = graph.n_layers
        self.replays = (
            graph.arch == "transformer" and not graph.windows and isinstance(ablated, Tensor)
            and usable(model, ablated)
        )  # fmt: skip
        if self.replays:
            n_writers, _, n_pos, d = ablated.shape
            self.shape = (n_writers, x.shape[0] * n_pos * d)
            row_bytes = self.shape[0] * self.shape[1] * ablated.element_size()
            self.capacity = min(kept_passes, MAX_KEPT_BYTES // max(row_bytes, 1))
            self.replays = self.capacity >= 1
            self.layer_of = reader_layers(graph)
        self.kept: list[_Pass] = []  # most recently used first
        self.spare: list[Tensor] = []  # buffers of passes dropped
        self.layers_run = 0
        self.passes = 0

    @torch.no_grad()
    def __call__(self, edge_mask: Tensor) -> Float[Tensor, "batch pos d_output"]:
        """The masked forward's output for ``edge_mask`` (``[n_edges]``)."""
        self.passes += 1
        if not self.replays:
            self.layers_run += self.n_layers + 1
            return masked_forward(self.model, self.graph, self.x, self.ablated, edge_mask)
        mask = edge_mask.detach().to("cpu", torch.float32)
        source, first = self._closest(mask)
        self.layers_run += self.n_layers + 1 - first
        buffer = self._buffer()
        batch = self.x.shape[0]
        states: list = [None] * (self.n_layers + 1)  # the stream's state before each layer
        if source is None:  # an empty stream: the pass starts at the embeddings
            stream = FastStream(self.ablated, None, batch, recompute=True, buffer=buffer)
        else:
            rows = source.states[first][0]
            buffer[:rows].copy_(source.buffer[:rows])
            stream = FastStream.resume(self.ablated, batch, buffer, source.states[first])
            states[:first] = source.states[:first]

        def record(layer: int, s: FastStream) -> None:
            states[layer] = s.state()

        z = edge_mask.to(self.ablated.device, self.ablated.dtype)
        with POOL.session():
            out = _transformer_forward_fast_body(
                self.model, self.graph, self.x, self.ablated, z, None, True, stream, first, record
            )
        self._keep(_Pass(mask, buffer, states))
        return out

    def _closest(self, mask: Tensor) -> tuple[_Pass | None, int]:
        """The kept pass whose mask agrees with ``mask`` on the most layers' readers, and
        the first layer where they differ (``n_layers + 1``: the same mask)."""
        best, first = None, 0
        for kept in self.kept:
            changed = (kept.mask != mask).nonzero()
            layer = int(self.layer_of[changed].min()) if len(changed) else self.n_layers + 1
            if layer > first:
                best, first = kept, layer
        if best is not None:  # most recently used first
            self.kept = [best, *(k for k in self.kept if k is not best)]
        return best, min(first, self.n_layers)

    def _buffer(self) -> Tensor:
        """A writer buffer no kept pass uses."""
        return self.spare.pop() if self.spare else self.ablated.new_empty(self.shape)

    def _keep(self, done: _Pass) -> None:
        """Keep ``done`` as the most recent pass; a pass beyond the capacity gives its buffer back."""
        self.kept.insert(0, done)
        while len(self.kept) > self.capacity:
            self.spare.append(self.kept.pop().buffer)


__all__ = ["KEPT_PASSES", "MAX_KEPT_BYTES", "ReplayForward", "reader_layers"]
