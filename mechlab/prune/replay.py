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

Given the positions whose outputs count (``at``: the selection scores the target positions
alone), the last block computes its keys and values at every position but its queries,
its MLP and the read-out at those positions only (:func:`last_block_at`), as exact
ablation does (:mod:`mechlab.prune.exact`): an edge into the last block or the read-out
then costs a few rows instead of the whole block. The outputs are those of the masked
forward at ``at``, to float round-off (``tests/prune/test_replay.py``).

It applies to a transformer on its plain graph whose masked forward takes the fast path
(frozen parameters), without node masks and without gradients; anything else runs the
plain masked forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from mechlab.models.buffers import POOL
from mechlab.models.registry import graph_kind
from mechlab.prune.forward import (
    _edge_block,
    _layer_norm,
    _post,
    _post_heads,
    _qkv_readers,
    _transformer_forward_fast_body,
    _transformer_layers,
    masked_forward,
)
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
        at: ``[batch, pos]`` bool, the positions whose outputs are wanted (None: all). Each
            call then returns ``[n_at, d_output]``, the outputs at ``at`` in row-major order
            (``masked_forward(...)[at]``), the last block computed there alone.

    Attributes:
        layers_run: Layers (and read-outs) computed so far; ``passes * (n_layers + 1)``
            without replay (for measuring what the replay saves).
        passes: Masks scored so far.
    """

    def __init__(
        self, model: nn.Module, graph: EdgeGraph, x: Tensor, ablated, kept_passes: int = KEPT_PASSES,
        at: Tensor | None = None,
    ):  # fmt: skip
        self.model, self.graph, self.x, self.ablated = model, graph, x, ablated
        self.at = at
        self.rows = None if at is None else at.reshape(-1).nonzero().flatten()  # [n_at] flat (trace, pos)
        self.n_layers = graph.n_layers
        self.replays = (
            graph_kind(graph.arch) == "transformer" and not graph.windows and isinstance(ablated, Tensor)
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
            out = masked_forward(self.model, self.graph, self.x, self.ablated, edge_mask)
            return out if self.at is None else out[self.at]
        mask = edge_mask.detach().to("cpu", torch.float32)
        source, first = self._closest(mask)
        z = edge_mask.to(self.ablated.device, self.ablated.dtype)
        if self.rows is not None:  # no stream is kept after the last block: it starts there at most
            first = min(first, self.n_layers - 1)
            if source is not None and first == self.n_layers - 1:  # the kept pass's writers serve as they are
                self.layers_run += self.n_layers + 1 - first
                stream = FastStream.resume(self.ablated, self.x.shape[0], source.buffer, source.states[first])
                with POOL.session():
                    return last_block_at(self.model, self.graph, z, stream, self.rows)
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

        with POOL.session():
            if self.rows is None:
                out = _transformer_forward_fast_body(
                    self.model, self.graph, self.x, self.ablated, z, None, True, stream, first, record
                )
            else:
                last = self.n_layers - 1
                _transformer_layers(self.model, self.graph, self.x, z, stream, first, last, record)
                states[last] = stream.state()
                out = last_block_at(self.model, self.graph, z, stream, self.rows)
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


def _attention_at(
    attn: nn.Module, x_q: Tensor, x_kv: Tensor, rows: Tensor
) -> Float[Tensor, "head n_at d_model"]:  # fmt: skip
    """:func:`~mechlab.prune.forward._attention` for queries at the flat positions ``rows``
    only: ``x_q`` ``[H, n_at, d]`` their normalised q inputs, ``x_kv`` ``[2G, batch, pos, d]``
    the k and v inputs at every position."""
    batch, n_pos = x_kv.shape[1:3]
    n_heads, n_kv = attn.W_Q.shape[0], attn.W_K.shape[0]
    kv = torch.einsum("rbpm,rmd->bprd", x_kv, torch.cat([attn.W_K, attn.W_V]))  # [batch, pos, 2G, d_head]
    q_at = torch.einsum("rnm,rmd->nrd", x_q, attn.W_Q)  # [n_at, H, d_head]
    if attn.b_Q is not None:
        kv = kv + torch.cat([attn.b_K, attn.b_V])
        q_at = q_at + attn.b_Q
    q = q_at.new_zeros(batch * n_pos, n_heads, q_at.shape[-1])  # the other queries are never read
    q[rows] = q_at
    q = attn.clip(q.view(batch, n_pos, n_heads, -1))
    k, v = attn.clip(kv).split((n_kv, n_kv), dim=2)
    q, k = attn.position(q, k)
    pattern = F.softmax(attn.scores(q, k), dim=-1)  # [batch, head, q, k]
    z = attn.mix_values(pattern, v)  # [batch, pos, head, d_head]
    z = z.reshape(-1, *z.shape[2:])[rows]  # [n_at, head, d_head]
    return torch.einsum("nhd,hdm->hnm", z, attn.W_O)  # [head, n_at, d_model]


def last_block_at(
    model: nn.Module, graph: EdgeGraph, z: Tensor, stream: FastStream, rows: Tensor
) -> Float[Tensor, "n_at d_output"]:  # fmt: skip
    """The model's outputs at the flat positions ``rows`` (``trace * pos + position``) from
    the fast path's ``stream`` holding every writer before the last block.

    The last block's key and value readers mix every position (the queries at ``rows``
    attend to them); its query readers, its heads' outputs, its MLP and the read-out are
    computed at ``rows`` alone, on the writers' differences gathered there.
    """
    last = model.cfg.n_layers - 1
    block = model.blocks[last]
    sizes = _qkv_readers(model.cfg)
    n_heads = sizes[0]
    writers = stream.writers
    batch, n_pos, d = writers.row_shape
    n_up = writers.n

    def at_rows(t: Tensor) -> Tensor:  # [k, batch | 1, pos, d] -> [k, n_at, d]
        return t.expand(t.shape[0], batch, n_pos, d).reshape(t.shape[0], batch * n_pos, d)[:, rows]

    diffs = writers.diffs[:n_up].view(n_up, batch * n_pos, d)[:, rows]  # [n_up, n_at, d]
    base = at_rows(stream.base.expand(batch, n_pos, d).unsqueeze(0))[0]  # [n_at, d]

    def mixed(block_z: Tensor, upto: Tensor, base: Tensor) -> Tensor:  # [R, n_at, d]
        n = block_z.shape[1]
        return (block_z @ upto[:n].reshape(n, -1)).view(block_z.shape[0], -1, d) + base

    z_heads = _edge_block(z, graph, f"a{last}.h0.q", sum(sizes))  # [H + 2G, n_up]
    x_kv = stream.read_norm(z_heads[n_heads:], block.ln1)  # [2G, batch, pos, d]: every position
    x_q = _layer_norm(block.ln1, mixed(z_heads[:n_heads], diffs, base))  # [H, n_at, d]
    z_mlp = None if block.mlp is None else _edge_block(z, graph, f"m{last}.in", 1)
    if z_mlp is not None and block.parallel:  # reads what the heads read
        mlp_in = _layer_norm(block.ln2, mixed(z_mlp, diffs, base))
    heads = _post_heads(block.ln1_post, _attention_at(block.attn, x_q, x_kv, rows))  # [H, n_at, d]
    ablated = at_rows(stream.ablated[n_up : n_up + n_heads])
    diffs = torch.cat([diffs, heads - ablated])
    base = base + ablated.sum(0)
    if block.attn.b_O is not None:
        base = base + block.attn.b_O
    if z_mlp is not None:
        if not block.parallel:
            mlp_in = _layer_norm(block.ln2, mixed(z_mlp, diffs, base))
        mlp_out = _post(block.ln2_post, block.mlp(mlp_in))  # [1, n_at, d]
        ablated = at_rows(stream.ablated[n_up + n_heads : n_up + n_heads + 1])
        diffs = torch.cat([diffs, mlp_out - ablated])
        base = base + ablated.sum(0)
    resid = _layer_norm(model.ln_final, mixed(_edge_block(z, graph, "out", 1), diffs, base))
    return model.read_out(resid)[0]


__all__ = ["KEPT_PASSES", "MAX_KEPT_BYTES", "ReplayForward", "last_block_at", "reader_layers"]
