"""The masked forward pass of edge pruning: mixing, divergences (the writer outputs and
ablations it mixes: :mod:`mechlab.prune.ablation`).

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
whole sequence, as its own forward does. The transformer's options follow its forward
too: RMSNorms, weightless LayerNorms, ``clip_qkv``, query/key norms and rotary
embeddings (either pair layout, scaled or not) of each head's queries and keys, grouped key/value
heads (one k and one v reader per group, whose keys and values serve the group's query
heads), gated MLPs, a parallel residual (an MLP reads its input before its layer's heads
are added), attention-only blocks, biases that are off, sliding windows, soft-capping and
scaled embeddings (the model's own ``attn.scores``, ``read_in`` and ``read_out``).

Norms after the sublayers (``post_norms``: Gemma 2/3, OLMo 2; RMSNorms). The MLP writes
``ln2_post(mlp(...))``, as in the model. A head writes its share of the normed attention
output, ``w * result_h / s``, where ``w`` is ``ln1_post``'s weight and ``s`` the RMS of the
layer's whole attention output ``sum_h result_h`` *in the pass the value comes from*: this
masked pass for ``X_w``, the ablation run for ``X~_w`` (:func:`~mechlab.prune.ablation.writer_outputs`). The heads'
shares sum to ``ln1_post``'s output, so every mask open gives the plain forward and every
mask closed the ablation run; in between, the scale is shared by a layer's heads, as in
the model, so what head ``h`` writes depends on the other heads of its layer in the same
pass (an edge into one head of a layer changes ``s``, and with it every head's output).

Windowed recurrent graphs (:func:`~mechlab.prune.graph.windowed_recurrent_graph`).
The sequence is run window by window; in window ``w`` each reader mixes, as above, the
writers of ``w`` at ``w``'s positions only, and layer ``l`` starts ``w`` from the state

    s_lw = s~_lw + z_s n_w (s_lw(this pass) - s~_lw)

where ``s_lw(this pass)`` is the state it ended the previous window with in this masked
pass, ``z_s`` the mask of the state edge ``l{l}@w_prev -> l{l}.state@w``, ``n_w`` the
node mask of ``l{l}@w_prev`` (1 without node masks), and ``s~_lw`` the *ablated state*
(:class:`WindowedAblation`): the state layer ``l`` had at that position on the corrupted
input (interchange), its mean over the reference inputs (mean), or zeros (zero). States
are one tensor per trace (the mixers' ``initial_state`` / ``return_state``: LSTM
``h, c``; dense SSM ``h``; Mamba its conv inputs and SSM state).

Memory. The differences are stored once, as they are produced, one tensor per writer
group (the embeddings, then each layer's heads, then its MLP; ``n_writers x [B, T, d]``
in all); a reader group's ``R`` inputs are the ablated residual plus, per upstream
group, the product ``z[R, k] @ D[k, B*T*d]`` accumulated in place (``addmm_``). Nothing
is ever concatenated or stacked, so memory grows with the number of writers, not with
``layers x writers`` as when every layer stacks all upstream writers (the reference
implementation's scheme, which :func:`bench_prune` measures against ours with
:func:`peak_memory`). Each reader's norm uses PyTorch's fused LayerNorm kernel.

Fast path. On a transformer whose parameters are all frozen (as pruning has them),
:func:`masked_forward` runs the same arithmetic through :mod:`mechlab.prune.mixing`
instead: the differences go into one ``[n_writers, batch * pos * d]`` buffer, each reader
group is one product ``base + z @ D[:n_up]`` plus its readers' LayerNorms in one autograd
node with a hand-written backward, and with ``recompute=True`` no reader inputs are kept
for the backward pass. ``fast=False`` selects the path described above (the two agree to
float rounding in values and mask gradients; ``tests/prune/test_forward_perf_paths.py``).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from mechlab.models.buffers import POOL
from mechlab.models.registry import get_family, graph_kind
from mechlab.prune.ablation import (  # noqa: F401 -- re-exported: callers import them from here too
    ABLATIONS,
    Ablation,
    WindowedAblation,
    make_ablation,
    mixer_of,
    select_traces,
    window_states,
    writer_outputs,
)
from mechlab.prune.graph import EdgeGraph, check_windows
from mechlab.prune.mixing import FastStream, usable

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
    attn: nn.Module,
    x_qkv: Float[Tensor, "reader batch pos d_model"],
    sizes: tuple[int, int, int],
) -> Float[Tensor, "head batch pos d_model"]:
    """Each head's output ``z_h W_O[h]`` from its own normalised q input and its key/value
    group's normalised k and v inputs (one per head without grouping).

    The q, k and v inputs come stacked, as the reader group's mixing makes them, and are
    projected in one product with the stacked weights: their gradient then comes back as
    one tensor (splitting first would make the backward pass concatenate the three).

    Args:
        attn: The block's :class:`~mechlab.models.transformer.Attention` (its weights,
            ``clip_qkv``, query/key norms, rotary embedding, grouping and causal mask are
            used).
        x_qkv: ``[H + 2G, batch, pos, d]``: the q input of every query head, then the k and
            the v input of every key/value head (already normalised).
        sizes: ``(H, G, G)``, the three blocks' sizes.
    """
    W = torch.cat([attn.W_Q, attn.W_K, attn.W_V])  # [H + 2G, d_model, d_head]
    qkv = torch.einsum("rbpm,rmd->bprd", x_qkv, W)  # [batch, pos, H + 2G, d_head]
    if attn.b_Q is not None:
        qkv = qkv + torch.cat([attn.b_Q, attn.b_K, attn.b_V])
    q, k, v = attn.clip(qkv).split(sizes, dim=2)  # [batch, pos, head | kv_head, d_head]
    q, k = attn.position(q, k)  # query/key norms, rotary embedding
    pattern = F.softmax(attn.scores(q, k), dim=-1)  # [batch, head, q, k]
    z = attn.mix_values(pattern, v)  # [batch, pos, head, d_head]
    return torch.einsum("bqhd,hdm->hbqm", z, attn.W_O)  # [head, batch, pos, d_model]


def _layer_norm(ln: nn.Module, x: Tensor) -> Tensor:
    """The transformer's norm ``ln`` on any number of leading axes, as PyTorch's fused
    kernel: a LayerNorm (biased variance, eps inside the root, affine ``w, b``), an
    RMSNorm (``x / sqrt(mean(x^2) + eps) * w``), or ``x`` itself for a ``NoNorm``
    (``normalization="none"``, no weights)."""
    if not hasattr(ln, "w"):
        return x
    w = ln.w.to(x.dtype)  # (Gemma's float32 norm weights in a bfloat16 model)
    if not hasattr(ln, "b"):
        return F.rms_norm(x, (x.shape[-1],), w, ln.eps)
    return F.layer_norm(x, (x.shape[-1],), w, ln.b.to(x.dtype), ln.eps)


def _post_heads(norm: nn.Module | None, heads: Float[Tensor, "head batch pos d"]) -> Tensor:
    """Each head's share ``w * result_h / s`` of a post-norm's output, ``s`` the RMS of the
    heads' sum (the module docstring); the heads themselves without a post-norm."""
    if norm is None:
        return heads
    scale = (heads.sum(0).pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()  # [batch, pos, 1]
    return heads / scale * norm.w.to(heads.dtype)


def _post(norm: nn.Module | None, out: Tensor) -> Tensor:
    return out if norm is None else norm(out)


def _embeddings(model: nn.Module, x: Tensor) -> Float[Tensor, "embed batch pos d"]:
    """The embedding writers' outputs: the read-in and, with a learned table, the positions."""
    embed = model.read_in(x)  # [batch, pos, d]
    if model.W_pos is None:
        return embed.unsqueeze(0)
    batch, n_pos = x.shape[:2]
    return torch.stack([embed, model.W_pos[:n_pos].expand(batch, n_pos, -1)])


def _qkv_readers(cfg) -> tuple[int, int, int]:
    """Sizes of a layer's q, k and v reader blocks (query heads, key/value heads twice)."""
    return cfg.n_heads, cfg.n_key_value_heads, cfg.n_key_value_heads


def _transformer_forward_fast(model, graph, x, ablated, z, node_mask, recompute) -> Tensor:
    """:func:`_transformer_forward`'s arithmetic through :mod:`mechlab.prune.mixing`: one
    contraction per reader group, each reader's norm inside the same autograd node."""
    with POOL.session():  # the writer buffers come from reused memory (mechlab.models.buffers)
        return _transformer_forward_fast_body(model, graph, x, ablated, z, node_mask, recompute)


def _transformer_forward_fast_body(
    model, graph, x, ablated, z, node_mask, recompute, stream=None, first_layer=0, on_layer=None
) -> Tensor:
    """The fast path's pass; ``stream`` (a :class:`FastStream`, empty or holding the writers
    of the layers before ``first_layer``) resumes it there, and ``on_layer(layer, stream)``
    is called before each layer from ``first_layer`` on and before the read-out
    (:mod:`mechlab.prune.replay`)."""
    if stream is None:
        stream = FastStream(ablated, node_mask, x.shape[0], recompute)
    _transformer_layers(model, graph, x, z, stream, first_layer, len(model.blocks), on_layer)
    if on_layer is not None:
        on_layer(len(model.blocks), stream)
    resid = stream.read_norm(_edge_block(z, graph, "out", 1), model.ln_final).squeeze(0)
    return model.read_out(resid)


def _transformer_layers(model, graph, x, z, stream, first_layer: int, stop: int, on_layer=None) -> None:
    """Blocks ``first_layer .. stop - 1`` of the fast path's pass, their writers added to
    ``stream`` (the embeddings first when it is empty); ``on_layer(layer, stream)`` before each."""
    sizes = _qkv_readers(model.cfg)
    if stream.writers.n == 0:
        stream.add(_embeddings(model, x))
    for layer in range(first_layer, stop):
        block = model.blocks[layer]
        if on_layer is not None:
            on_layer(layer, stream)
        z_heads = _edge_block(z, graph, f"a{layer}.h0.q", sum(sizes))  # [H + 2G, n_up]
        x_in = stream.read_norm(z_heads, block.ln1)  # [H + 2G, batch, pos, d]
        mlp_block = None if block.mlp is None else _edge_block(z, graph, f"m{layer}.in", 1)
        if mlp_block is not None and block.parallel:  # reads what the heads read
            mlp_in = stream.read_norm(mlp_block, block.ln2)
        stream.add(_post_heads(block.ln1_post, _attention(block.attn, x_in, sizes)))  # [H, batch, pos, d]
        if block.attn.b_O is not None:
            stream.add_constant(block.attn.b_O)
        if mlp_block is not None:
            if not block.parallel:
                mlp_in = stream.read_norm(mlp_block, block.ln2)
            stream.add(_post(block.ln2_post, block.mlp(mlp_in.squeeze(0))).unsqueeze(0))  # [1, batch, pos, d]


def _transformer_forward(model, graph, x, ablated, z, node_mask) -> Tensor:
    sizes = _qkv_readers(model.cfg)
    stream = _Stream(ablated, node_mask)
    stream.add(_embeddings(model, x))
    for layer, block in enumerate(model.blocks):
        z_heads = _edge_block(z, graph, f"a{layer}.h0.q", sum(sizes))  # [H + 2G, n_up]
        x_in = _layer_norm(block.ln1, stream.read(z_heads))  # [H + 2G, batch, pos, d]
        z_mlp = None if block.mlp is None else _edge_block(z, graph, f"m{layer}.in", 1)  # [1, n_up]
        if z_mlp is not None and block.parallel:  # reads what the heads read
            mlp_in = _layer_norm(block.ln2, stream.read(z_mlp).squeeze(0))
        stream.add(_post_heads(block.ln1_post, _attention(block.attn, x_in, sizes)))  # [H, batch, pos, d]
        if block.attn.b_O is not None:
            stream.add_constant(block.attn.b_O)
        if z_mlp is not None:
            if not block.parallel:
                mlp_in = _layer_norm(block.ln2, stream.read(z_mlp).squeeze(0))
            stream.add(_post(block.ln2_post, block.mlp(mlp_in)).unsqueeze(0))  # [1, batch, pos, d]
    resid = stream.read(_edge_block(z, graph, "out", 1)).squeeze(0)
    return model.read_out(_layer_norm(model.ln_final, resid))


def _recurrent_forward(model, graph, x, ablated, z, node_mask) -> Tensor:
    stream = _Stream(ablated, node_mask)
    stream.add(model.read_in(x).unsqueeze(0))
    mixer_attr = get_family(model.cfg.arch).mixer  # the family's registry entry
    for layer, block in enumerate(model.blocks):
        x_in = stream.read(_edge_block(z, graph, f"l{layer}.in", 1)).squeeze(0)  # [batch, pos, d]
        mixer_out = getattr(block, mixer_attr)(block.norm(x_in)).to(x_in.dtype)
        stream.add(mixer_out.unsqueeze(0))
    resid = stream.read(_edge_block(z, graph, "out", 1)).squeeze(0)
    return model.read_out(model.ln_final(resid))


def _windowed_recurrent_forward(model, graph, x, ablated: WindowedAblation, z, node_mask) -> Tensor:
    n_layers = model.cfg.n_layers
    embed = model.read_in(x)  # [batch, pos, d]
    states: list[Tensor | None] = [None] * n_layers  # carried into the current window, per layer
    outs = []
    for k, (name, start, end) in enumerate(graph.windows):
        first = k * (n_layers + 1)  # writer index of embed@name
        window_nodes = None if node_mask is None else node_mask[first : first + n_layers + 1]
        stream = _Stream(ablated.writers[:, :, start:end], window_nodes)  # [1 + L, batch | 1, w, d]
        stream.add(embed[:, start:end].unsqueeze(0))
        for layer, block in enumerate(model.blocks):
            if k > 0:  # s~ + z_s n_w (s - s~): the state edge from the previous window
                gate = z[graph.edge_offset[f"l{layer}.state@{name}"]]
                if node_mask is not None:
                    gate = gate * node_mask[first - n_layers + layer]  # l{layer}@previous
                s_abl = ablated.states[layer][k - 1]  # [batch | 1, *state]
                states[layer] = s_abl + gate * (states[layer] - s_abl)
            x_in = stream.read(_edge_block(z, graph, f"l{layer}.in@{name}", 1)).squeeze(0)
            mixer_out, states[layer] = mixer_of(model, layer)(
                block.norm(x_in), states[layer], return_state=True
            )  # [batch, w, d], [batch, *state]
            stream.add(mixer_out.unsqueeze(0))
        resid = stream.read(_edge_block(z, graph, f"out@{name}", 1)).squeeze(0)
        outs.append(model.read_out(model.ln_final(resid)))  # [batch, w, d_output]
    return torch.cat(outs, dim=1)


def masked_forward(
    model: nn.Module,
    graph: EdgeGraph,
    x: Tensor,
    ablated: Ablation,
    edge_mask: Tensor,
    node_mask: Tensor | None = None,
    fast: bool = True,
    recompute: bool = False,
) -> Float[Tensor, "batch pos d_output"]:
    """Run ``model`` with every edge interpolated between its clean and ablated value.

    Args:
        model: A mechlab model (transformer, LSTM, dense SSM or Mamba).
        graph: Its :func:`~mechlab.prune.graph.build_graph` (windowed or not).
        x: ``[batch, pos, d_in]`` floats or ``[batch, pos]`` token ids.
        ablated: ``[n_writers, batch | 1, pos, d_model]`` ablated writer outputs, or a
            :class:`WindowedAblation` for a windowed graph (:func:`make_ablation` with
            ``graph=``).
        edge_mask: ``[n_edges]`` masks in ``[0, 1]`` in graph edge order (1 = clean).
        node_mask: ``[n_writers]`` writer masks, or None (all 1).
        fast: On a transformer whose parameters are all frozen (``requires_grad=False``,
            as pruning has them), mix each reader group in one contraction with a
            hand-written backward (:mod:`mechlab.prune.mixing`); False, or a model with
            a trainable parameter, runs the straightforward autograd path. Both compute
            the same function (to float rounding) and the same mask gradients.
        recompute: With the fast path, keep no reader inputs for the backward pass and
            recompute them from the stored writer differences instead (less memory,
            one more product per reader group).

    Returns:
        ``[batch, pos, d_output]``: with all masks 1 the model's normal output on ``x``;
        with all edge masks 0 its output on the ablation input.
    """
    if edge_mask.shape != (graph.n_edges,):
        raise ValueError(f"edge_mask must be [{graph.n_edges}], got {list(edge_mask.shape)}")
    if node_mask is not None and node_mask.shape != (graph.n_writers,):
        raise ValueError(f"node_mask must be [{graph.n_writers}], got {list(node_mask.shape)}")
    if graph.windows:
        if not isinstance(ablated, WindowedAblation):
            raise ValueError(
                "a windowed graph needs a WindowedAblation (make_ablation(..., graph=graph))"
            )
        check_windows(graph.windows, x.shape[1])
        n_rows = graph.n_layers + 1
        if ablated.writers.shape[0] != n_rows or ablated.writers.shape[2] != x.shape[1]:
            raise ValueError(
                f"ablated writer outputs must be [{n_rows}, batch|1, {x.shape[1]}, d_model], "
                f"got {list(ablated.writers.shape)}"
            )
        model.check_length(x.shape[1])
        edge_mask = edge_mask.to(ablated.dtype)
        node_mask = None if node_mask is None else node_mask.to(ablated.dtype)
        return _windowed_recurrent_forward(model, graph, x, ablated, edge_mask, node_mask)
    if isinstance(ablated, WindowedAblation):
        raise ValueError("a WindowedAblation is for a windowed graph; this graph has no windows")
    if ablated.shape[0] != graph.n_writers or ablated.shape[2] != x.shape[1]:
        raise ValueError(
            f"ablated writer outputs must be [{graph.n_writers}, batch|1, {x.shape[1]}, d_model], "
            f"got {list(ablated.shape)}"
        )
    model.check_length(x.shape[1])
    edge_mask = edge_mask.to(ablated.dtype)  # (the masks in the model's dtype: bf16, fp16, ...)
    node_mask = None if node_mask is None else node_mask.to(ablated.dtype)
    if graph_kind(graph.arch) == "transformer":
        if fast and usable(model, ablated):
            return _transformer_forward_fast(
                model, graph, x, ablated, edge_mask, node_mask, recompute
            )
        return _transformer_forward(model, graph, x, ablated, edge_mask, node_mask)
    if graph_kind(graph.arch) == "recurrent":
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
