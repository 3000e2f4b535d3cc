"""The masked forward pass of edge pruning: writer outputs, ablations, mixing, divergences.

Masked forward (:func:`masked_forward`). Reader ``r`` receives

    x_r = sum_w [ z_wr X_w + (1 - z_wr) X~_w ] + c_r
        = (sum_w X~_w + c_r) + sum_w z_wr (X_w - X~_w)

over its upstream writers ``w``, where ``X_w`` is writer ``w``'s output in this pass,
``X~_w`` its output on the ablation input, and ``c_r`` the biases upstream of ``r`` that
are no writer's output (attention ``b_O``), which stay as constants. The first term is
the *ablated residual*, the same for every reader of a layer, kept as a running sum;
the second is computed from the writers' differences ``D_w = n_w (X_w - X~_w)``
(``n_w`` the optional node mask). Every reader then applies its own copy of the norm
that precedes its component (``ln1`` for q/k/v, ``ln2`` for an MLP, the block norm of a
recurrent layer, ``ln_final`` for the read-out) to its own mixed input; a transformer
with ``normalization="none"`` has none, and one with ``causal=False`` attends over the
whole sequence, as its own forward does.

Memory. The differences are stored once, as they are produced, one tensor per writer
group (the embeddings, then each layer's heads, then its MLP; ``n_writers x [B, T, d]``
in all); a reader group's ``R`` inputs are the ablated residual plus, per upstream
group, the product ``z[R, k] @ D[k, B*T*d]`` accumulated in place (``addmm_``). Nothing
is ever concatenated or stacked, so memory grows with the number of writers, not with
``layers x writers`` as when every layer stacks all upstream writers (the reference
implementation's scheme, which :func:`bench_prune` measures against ours with
:func:`peak_memory`). Each reader's norm uses PyTorch's fused LayerNorm kernel.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from mechlab.prune.data import Traces
from mechlab.prune.graph import RECURRENT_ARCHS, EdgeGraph, build_graph

ABLATIONS = ("interchange", "mean", "zero")
_MIXER_ATTR = {"lstm": "lstm", "dense_ssm": "ssm", "mamba": "mixer"}


# ---------------------------------------------------------------------------------------
# Writer outputs and ablations
# ---------------------------------------------------------------------------------------


def _writer_hooks(model: nn.Module) -> list[str]:
    cfg = model.cfg
    if cfg.arch == "transformer":
        names = ["hook_embed", "hook_pos_embed"]
        for layer in range(cfg.n_layers):
            names += [f"blocks.{layer}.attn.hook_result", f"blocks.{layer}.hook_mlp_out"]
        return names
    return ["hook_embed"] + [f"blocks.{layer}.hook_mixer_out" for layer in range(cfg.n_layers)]


@torch.no_grad()
def writer_outputs(
    model: nn.Module, x: Tensor, batch_size: int = 256
) -> Float[Tensor, "writer batch pos d_model"]:
    """Every writer's output on input ``x``, read from the model's own hooks.

    Args:
        model: A mechlab model.
        x: ``[batch, pos, d_in]`` floats or ``[batch, pos]`` token ids.
        batch_size: Traces per forward pass.

    Returns:
        ``[n_writers, batch, pos, d_model]`` in the graph's writer order (for a
        transformer: embed, pos, then per layer its heads' ``hook_result`` and its MLP).
    """
    names = _writer_hooks(model)
    chunks = []
    for start in range(0, x.shape[0], batch_size):
        _, cache = model.run_with_cache(x[start : start + batch_size], names_filter=names)
        parts = []
        for name in names:
            act = cache[name]
            if name.endswith("hook_result"):  # [batch, pos, head, d_model] -> [head, batch, pos, d]
                parts.extend(act.permute(2, 0, 1, 3).unbind(0))
            else:
                parts.append(act)
        chunks.append(torch.stack(parts))
    return torch.cat(chunks, dim=1)


@torch.no_grad()
def make_ablation(
    model: nn.Module,
    kind: str,
    traces: Traces,
    reference: Tensor | None = None,
    batch_size: int = 256,
) -> Float[Tensor, "writer batch_or_1 pos d_model"]:
    """The ablated writer outputs ``X~``.

    Args:
        model: The model.
        kind: ``"interchange"`` (writer outputs on ``traces.corrupted``), ``"mean"``
            (writer outputs averaged over the ``reference`` inputs, per position) or
            ``"zero"``.
        traces: The traces being run (for interchange, and the shapes).
        reference: Inputs whose mean writer outputs ``"mean"`` uses; default
            ``traces.inputs``.
        batch_size: Traces per forward pass.

    Returns:
        ``[n_writers, batch, pos, d_model]`` (interchange) or ``[n_writers, 1, pos, d_model]``.
    """
    if kind not in ABLATIONS:
        raise ValueError(f"unknown ablation {kind!r}; choose one of {ABLATIONS}")
    if kind == "interchange":
        if traces.corrupted is None:
            raise ValueError("interchange ablation needs corrupted traces (Traces.corrupted)")
        return writer_outputs(model, traces.corrupted, batch_size)
    if kind == "mean":
        ref = traces.inputs if reference is None else reference
        if ref.shape[1] != traces.n_pos:
            raise ValueError(
                f"mean-ablation reference has {ref.shape[1]} positions, traces have {traces.n_pos}"
            )
        return writer_outputs(model, ref, batch_size).mean(dim=1, keepdim=True)
    n_writers = build_graph(model).n_writers
    device = next(model.parameters()).device
    return torch.zeros(n_writers, 1, traces.n_pos, model.cfg.d_model, device=device)


# ---------------------------------------------------------------------------------------
# The masked forward pass
# ---------------------------------------------------------------------------------------


class _Stream:
    """The disentangled residual stream: writer differences stored once, plus the ablated sum.

    Args:
        ablated: ``[n_writers, batch | 1, pos, d]`` ablated writer outputs ``X~``.
        node_mask: ``[n_writers]`` node masks, or None.
    """

    def __init__(self, ablated: Tensor, node_mask: Tensor | None):
        self.ablated = ablated
        self.node_mask = node_mask
        self.groups: list[tuple[int, Tensor]] = []  # (first writer, D [k, batch, pos, d])
        self.n = 0  # writers stored so far
        self.base: Tensor | float = 0.0  # ablated residual: sum of X~ so far + constants

    def add(self, outputs: Float[Tensor, "k batch pos d"]) -> None:
        """Store the next ``k`` writers' outputs (in graph order)."""
        k = outputs.shape[0]
        ablated = self.ablated[self.n : self.n + k]  # [k, batch | 1, pos, d]
        diff = outputs - ablated
        if self.node_mask is not None:
            diff = diff * self.node_mask[self.n : self.n + k].view(k, 1, 1, 1)
        self.groups.append((self.n, diff.contiguous()))  # [k, batch, pos, d]
        self.base = self.base + ablated.sum(0)
        self.n += k

    def add_constant(self, value: Tensor) -> None:
        """A bias added to the residual stream that is no writer's output (attention ``b_O``)."""
        self.base = self.base + value

    def read(self, z: Float[Tensor, "reader upstream"]) -> Float[Tensor, "reader batch pos d"]:
        """Mixed inputs of ``R`` readers that each read the first ``z.shape[1]`` writers.

        ``base + sum_g z[:, g] @ D_g``, accumulated in place (``addmm_``, one per upstream
        group) on the flattened ``[k, batch * pos * d]`` differences.
        """
        n_up, n_readers = z.shape[1], z.shape[0]
        first = self.groups[0][1]
        shape = (n_readers, *first.shape[1:])  # [R, batch, pos, d]
        # a fresh dense copy of the ablated residual per reader: [R, batch * pos * d]
        # (not a view, so the in-place updates below need no view bookkeeping in autograd)
        out = torch.broadcast_to(self.base, shape).reshape(n_readers, -1).clone()
        for start, diff in self.groups:
            if start >= n_up:
                break
            k = diff.shape[0]
            if start + k > n_up:
                raise AssertionError("reader boundary inside a writer group")
            out = out.addmm_(
                z[:, start : start + k], diff.view(k, -1)
            )  # in place: nothing saves out
        return out.view(shape)


def _edge_block(z: Tensor, graph: EdgeGraph, first_reader: str, n_readers: int) -> Tensor:
    """The ``[n_readers, n_upstream]`` block of edge masks of consecutive readers."""
    start = graph.edge_offset[first_reader]
    n_up = graph.reader_by_name[first_reader].n_upstream
    return z[start : start + n_readers * n_up].view(n_readers, n_up)


def _attention(
    attn: nn.Module, x_qkv: Float[Tensor, "3 head batch pos d_model"]
) -> Float[Tensor, "head batch pos d_model"]:
    """Each head's output ``z_h W_O[h]`` from its own normalised q, k and v inputs.

    Args:
        attn: The block's attention module (its weights are used).
        x_qkv: The q, k and v inputs of every head (already normalised).
    """
    n_pos = x_qkv.shape[3]
    W = torch.stack([attn.W_Q, attn.W_K, attn.W_V])  # [3, head, d_model, d_head]
    b = torch.stack([attn.b_Q, attn.b_K, attn.b_V])  # [3, head, d_head]
    qkv = (
        torch.einsum("khbpm,khmd->kbphd", x_qkv, W) + b[:, None, None]
    )  # [3, batch, pos, head, d_head]
    q, k, v = qkv.unbind(0)
    scores = torch.einsum("bqhd,bkhd->bhqk", q / attn.scale, k)  # [batch, head, q, k]
    if attn.causal:
        scores = scores.masked_fill(~attn.causal_mask[:n_pos, :n_pos], float("-inf"))
    pattern = F.softmax(scores, dim=-1)
    z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)  # [batch, pos, head, d_head]
    return torch.einsum("bqhd,hdm->hbqm", z, attn.W_O)  # [head, batch, pos, d_model]


def _layer_norm(ln: nn.Module, x: Tensor) -> Tensor:
    """The transformer's LayerNorm ``ln`` (same function: biased variance, eps inside the
    root, affine ``w, b``) as PyTorch's fused kernel, on any number of leading axes; ``x``
    itself when the model has no normalisation (``normalization="none"``: ``ln`` is a
    ``NoNorm``, which has no weights)."""
    if not hasattr(ln, "w"):
        return x
    return F.layer_norm(x, (x.shape[-1],), ln.w, ln.b, ln.eps)


def _transformer_forward(model, graph, x, ablated, z, node_mask) -> Tensor:
    cfg = model.cfg
    H = cfg.n_heads
    batch, n_pos = x.shape[:2]
    stream = _Stream(ablated, node_mask)
    embed = model.read_in(x)  # [batch, pos, d]
    pos = model.W_pos[:n_pos].expand(batch, n_pos, -1)
    stream.add(torch.stack([embed, pos]))  # the two embedding writers
    for layer, block in enumerate(model.blocks):
        z_heads = _edge_block(z, graph, f"a{layer}.h0.q", 3 * H)  # [3H, n_up] (q, k, v)
        x_in = _layer_norm(block.ln1, stream.read(z_heads)).view(3, H, batch, n_pos, -1)
        result = _attention(block.attn, x_in)  # [H, batch, pos, d]
        stream.add(result)
        stream.add_constant(block.attn.b_O)
        z_mlp = _edge_block(z, graph, f"m{layer}.in", 1)  # [1, n_up]
        mlp_out = block.mlp(
            _layer_norm(block.ln2, stream.read(z_mlp).squeeze(0))
        )  # [batch, pos, d]
        stream.add(mlp_out.unsqueeze(0))
    resid = stream.read(_edge_block(z, graph, "out", 1)).squeeze(0)
    return model.read_out(_layer_norm(model.ln_final, resid))


def _recurrent_forward(model, graph, x, ablated, z, node_mask) -> Tensor:
    stream = _Stream(ablated, node_mask)
    stream.add(model.read_in(x).unsqueeze(0))
    mixer_attr = _MIXER_ATTR[model.cfg.arch]
    for layer, block in enumerate(model.blocks):
        x_in = stream.read(_edge_block(z, graph, f"l{layer}.in", 1)).squeeze(0)  # [batch, pos, d]
        mixer_out = getattr(block, mixer_attr)(block.norm(x_in))
        stream.add(mixer_out.unsqueeze(0))
    resid = stream.read(_edge_block(z, graph, "out", 1)).squeeze(0)
    return model.read_out(model.ln_final(resid))


def masked_forward(
    model: nn.Module,
    graph: EdgeGraph,
    x: Tensor,
    ablated: Tensor,
    edge_mask: Tensor,
    node_mask: Tensor | None = None,
) -> Float[Tensor, "batch pos d_output"]:
    """Run ``model`` with every edge interpolated between its clean and ablated value.

    Args:
        model: A mechlab model (transformer, LSTM, dense SSM or Mamba).
        graph: Its :func:`~mechlab.prune.graph.build_graph`.
        x: ``[batch, pos, d_in]`` floats or ``[batch, pos]`` token ids.
        ablated: ``[n_writers, batch | 1, pos, d_model]`` ablated writer outputs
            (:func:`make_ablation`).
        edge_mask: ``[n_edges]`` masks in ``[0, 1]`` in graph edge order (1 = clean).
        node_mask: ``[n_writers]`` writer masks, or None (all 1).

    Returns:
        ``[batch, pos, d_output]``: with all masks 1 the model's normal output on ``x``;
        with all edge masks 0 its output on the ablation input.
    """
    if edge_mask.shape != (graph.n_edges,):
        raise ValueError(f"edge_mask must be [{graph.n_edges}], got {list(edge_mask.shape)}")
    if node_mask is not None and node_mask.shape != (graph.n_writers,):
        raise ValueError(f"node_mask must be [{graph.n_writers}], got {list(node_mask.shape)}")
    if ablated.shape[0] != graph.n_writers or ablated.shape[2] != x.shape[1]:
        raise ValueError(
            f"ablated writer outputs must be [{graph.n_writers}, batch|1, {x.shape[1]}, d_model], "
            f"got {list(ablated.shape)}"
        )
    model.check_length(x.shape[1])
    edge_mask = edge_mask.to(ablated.dtype)
    if graph.arch == "transformer":
        return _transformer_forward(model, graph, x, ablated, edge_mask, node_mask)
    if graph.arch in RECURRENT_ARCHS:
        return _recurrent_forward(model, graph, x, ablated, edge_mask, node_mask)
    raise ValueError(f"unsupported architecture {graph.arch!r}")


# ---------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------


def divergence(pred: Tensor, ref: Tensor, io: str) -> Tensor:
    """Per-position distance of predictions from a reference.

    Args:
        pred: ``[n, d_output]`` predictions (or logits).
        ref: ``[n, d_output]`` reference predictions (or logits).
        io: ``"continuous"``: squared error summed over dims; ``"tokens"``: KL(ref || pred).

    Returns:
        ``[n]`` distances.
    """
    if io == "continuous":
        return (pred - ref).pow(2).sum(-1)
    log_p = F.log_softmax(ref.float(), dim=-1)
    log_q = F.log_softmax(pred.float(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def truth_error(pred: Tensor, truth: Tensor, io: str) -> Tensor:
    """Per-position error against the ground truth: squared error summed over dims, or cross-entropy."""
    if io == "continuous":
        return (pred - truth.to(pred.dtype)).pow(2).sum(-1)
    return F.cross_entropy(pred.float(), truth.long(), reduction="none")


@contextmanager
def frozen_eval(model: nn.Module):
    """Eval mode and ``requires_grad=False`` on every parameter, restored on exit."""
    was_training = model.training
    flags = [p.requires_grad for p in model.parameters()]
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)
        model.train(was_training)
