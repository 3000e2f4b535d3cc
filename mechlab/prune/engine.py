"""The masked forward pass of edge pruning, and the optimisation of the masks.

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
recurrent layer, ``ln_final`` for the read-out) to its own mixed input.

Memory. The differences are stored once, as they are produced, one tensor per writer
group (the embeddings, then each layer's heads, then its MLP; ``n_writers x [B, T, d]``
in all); a reader group's ``R`` inputs are the ablated residual plus, per upstream
group, the product ``z[R, k] @ D[k, B*T*d]`` accumulated in place (``addmm_``). Nothing
is ever concatenated or stacked, so memory grows with the number of writers, not with
``layers x writers`` as when every layer stacks all upstream writers (the reference
implementation's scheme, which :func:`bench_prune` measures against ours with
:func:`peak_memory`). Each reader's norm uses PyTorch's fused LayerNorm kernel.

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
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from tqdm.auto import tqdm

from mechlab.models.base import predict_in_chunks
from mechlab.prune import masks as hc
from mechlab.prune.data import PruneData, Target, Traces, check_target, target_mask, target_name
from mechlab.prune.graph import RECURRENT_ARCHS, EdgeGraph, build_graph

ABLATIONS = ("interchange", "mean", "zero")
LOSSES = ("model", "truth")
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
    scores = scores.masked_fill(~attn.causal_mask[:n_pos, :n_pos], float("-inf"))
    pattern = F.softmax(scores, dim=-1)
    z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)  # [batch, pos, head, d_head]
    return torch.einsum("bqhd,hdm->hbqm", z, attn.W_O)  # [head, batch, pos, d_model]


def _layer_norm(ln: nn.Module, x: Tensor) -> Tensor:
    """The transformer's LayerNorm ``ln`` (same function: biased variance, eps inside the
    root, affine ``w, b``) as PyTorch's fused kernel, on any number of leading axes."""
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
) -> Any:
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
    from mechlab.prune.circuit import Circuit, evaluate_masks

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


def prune_checkpoint(
    path: str | Path,
    target: Target,
    sparsity: float = 0.95,
    *,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = "misdirect_incorrect",
    data_seed: int = 0,
    device: str | None = None,
    **prune_kwargs: Any,
) -> Any:
    """Prune a checkpoint of the interleaved-systems task on needle-in-a-haystack traces.

    The NiH traces are built from the task config in the checkpoint's metadata, with
    the run's evaluation haystack (``eval_haystack`` / ``eval_seg_len``) unless given.

    Args:
        path: Checkpoint file.
        target: ``"k-after"``, ``"all"`` or a callable.
        sparsity: Edge sparsity in (0, 1).
        n_train: Training traces.
        n_test: Held-out traces for the metrics.
        n_haystack: Haystack systems.
        seg_len: Observations per haystack segment.
        corruption: How interchange-ablation traces are corrupted
            (:data:`mechlab.prune.data.CORRUPTIONS`).
        data_seed: Seed of the traces.
        device: Where to run (default: CPU).
        **prune_kwargs: Passed to :func:`prune` (``ablation``, ``steps``, ``seed``, ...).

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`; its metadata records the
        checkpoint's path and sha256.

    Raises:
        ValueError: Missing task metadata, unknown target, sparsity outside (0, 1), ...
    """
    from mechlab.checkpoint import load_checkpoint
    from mechlab.evals.recall import task_config_of
    from mechlab.prune.data import default_haystack, nih_prune_data

    sparsity = _check_unit("sparsity", sparsity)
    ckpt = load_checkpoint(path, map_location=device or "cpu")
    cfg = task_config_of(ckpt.metadata, path)
    default_n, default_s = default_haystack(cfg, ckpt.metadata.get("train_cfg"))
    data = nih_prune_data(
        cfg, n_train=n_train, n_test=n_test,
        n_haystack=default_n if n_haystack is None else n_haystack,
        seg_len=default_s if seg_len is None else seg_len,
        corruption=corruption, seed=data_seed,
    )  # fmt: skip
    check_target(target, data.train)
    circuit = prune(
        ckpt.model, data, target, sparsity, checkpoint_sha256=ckpt.sha256, **prune_kwargs
    )
    circuit.metadata["checkpoint"] = str(path)
    circuit.metadata["checkpoint_step"] = ckpt.step
    return circuit


# ---------------------------------------------------------------------------------------
# Benchmarks: memory and step time
# ---------------------------------------------------------------------------------------


def _naive_forward(model, graph, x, ablated, z) -> Tensor:
    """The stacking scheme, for comparison only: at every reader group, stack the outputs
    of *all* upstream writers (clean and ablated) into new tensors and mix them.

    Transformer only. Memory grows about as ``layers x writers x batch x pos x d``.
    """
    cfg = model.cfg
    H = cfg.n_heads
    batch, n_pos = x.shape[:2]
    clean: list[Tensor] = []
    const: Tensor | float = 0.0

    def read(z_block: Tensor) -> Tensor:
        n_up = z_block.shape[1]
        X = torch.stack(clean[:n_up])  # [n_up, batch, pos, d], a new stack at every layer
        X_abl = ablated[:n_up].expand_as(X)
        mixed = torch.einsum("rw,wbtd->rbtd", z_block, X) + torch.einsum(
            "rw,wbtd->rbtd", 1 - z_block, X_abl
        )
        return mixed + const

    clean += [model.read_in(x), model.W_pos[:n_pos].expand(batch, n_pos, -1)]
    for layer, block in enumerate(model.blocks):
        x_in = _layer_norm(block.ln1, read(_edge_block(z, graph, f"a{layer}.h0.q", 3 * H)))
        clean += list(_attention(block.attn, x_in.view(3, H, batch, n_pos, -1)).unbind(0))
        const = const + block.attn.b_O
        clean.append(
            block.mlp(_layer_norm(block.ln2, read(_edge_block(z, graph, f"m{layer}.in", 1))[0]))
        )
    return model.read_out(_layer_norm(model.ln_final, read(_edge_block(z, graph, "out", 1))[0]))


def peak_memory(fn: Callable[[], Any], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated while ``fn()`` runs (above what was allocated before).

    CUDA: the caching allocator's peak. CPU: the allocation timeline of
    ``torch.profiler`` (``profile_memory=True``), replayed to find the peak.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    from torch.profiler import ProfilerActivity, profile

    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        fn()
    current = peak = 0
    for _, action, _, size in prof._memory_profile().timeline:
        name = getattr(action, "name", str(action))
        if name == "CREATE":
            current += size
        elif name == "DESTROY":
            current -= size
        peak = max(peak, current)
    return peak


@dataclass
class PruneBench:
    """Memory and time of edge pruning against baselines (one config)."""

    config: dict[str, Any]
    memory_ours: int  # bytes, masked forward + backward
    memory_naive: int  # bytes, stacking scheme, forward + backward
    step_seconds: float  # one pruning step (sample masks, masked forward, backward, updates)
    plain_seconds: float  # plain forward + backward of the model's parameters, same batch

    @property
    def memory_ratio(self) -> float:
        """Ours / naive (below 1 is better)."""
        return self.memory_ours / self.memory_naive

    @property
    def time_ratio(self) -> float:
        """Pruning step / plain forward+backward (goal: <= 3)."""
        return self.step_seconds / self.plain_seconds


def bench_prune(
    model: nn.Module | None = None,
    batch: int = 32,
    n_pos: int = 64,
    repeats: int = 5,
    device: str = "cpu",
    seed: int = 0,
) -> PruneBench:
    """Measure the masked pass against the naive stacking scheme and a plain training step.

    Args:
        model: A transformer (default: the ``tiny`` preset, d=72, 3 layers, 6 heads).
        batch: Traces per batch.
        n_pos: Positions per trace.
        repeats: Timed runs (medians).
        device: ``cpu`` or ``cuda``.
        seed: Seed of the random inputs and masks.

    Returns:
        The :class:`PruneBench`.
    """
    from mechlab.bench.timing import time_interleaved
    from mechlab.models import build_model

    torch.manual_seed(seed)
    model = (model or build_model("tiny")).to(device)
    if model.cfg.arch != "transformer":
        raise ValueError("bench_prune compares against the stacking scheme of transformers only")
    cfg = model.cfg
    graph = build_graph(model)
    gen = torch.Generator().manual_seed(seed)
    if cfg.io == "continuous":
        x = torch.randn(batch, n_pos, cfg.d_in, generator=gen).to(device)
        x_corrupt = torch.randn(batch, n_pos, cfg.d_in, generator=gen).to(device)
    else:
        x = torch.randint(0, cfg.d_vocab, (batch, n_pos), generator=gen).to(device)
        x_corrupt = torch.randint(0, cfg.d_vocab, (batch, n_pos), generator=gen).to(device)
    log_alpha = nn.Parameter(hc.init_log_alpha(graph.n_edges, gen).to(device))
    with frozen_eval(model):
        ablated = writer_outputs(model, x_corrupt)
        reference = model(x)

        def ours() -> None:
            z = hc.sample_mask(log_alpha, hc.uniform_noise(graph.n_edges, gen).to(device))
            out = masked_forward(model, graph, x, ablated, z)
            divergence(out, reference, cfg.io).mean().backward()

        def naive() -> None:
            z = hc.sample_mask(log_alpha, hc.uniform_noise(graph.n_edges, gen).to(device))
            out = _naive_forward(model, graph, x, ablated, z)
            divergence(out, reference, cfg.io).mean().backward()

        memory_ours = peak_memory(ours, device)
        memory_naive = peak_memory(naive, device)
        opt = torch.optim.Adam([log_alpha], lr=0.1)

        def pruning_step() -> None:
            opt.zero_grad(set_to_none=True)
            ours()
            opt.step()

    model.train()
    params = list(model.parameters())

    def plain_step() -> None:
        for p in params:
            p.grad = None
        divergence(model(x), reference, cfg.io).mean().backward()

    def timed_pruning() -> None:
        with frozen_eval(model):
            pruning_step()

    if device != "cpu":
        sync = torch.cuda.synchronize
        timings = time_interleaved(
            {"prune": lambda: (timed_pruning(), sync()), "plain": lambda: (plain_step(), sync())},
            repeats,
        )
    else:
        timings = time_interleaved({"prune": timed_pruning, "plain": plain_step}, repeats)
    for p in params:
        p.grad = None
    model.eval()
    return PruneBench(
        config={"arch": cfg.arch, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
                "n_heads": cfg.n_heads, "batch": batch, "n_pos": n_pos, "n_edges": graph.n_edges,
                "device": str(device)},
        memory_ours=memory_ours,
        memory_naive=memory_naive,
        step_seconds=timings["prune"].median,
        plain_seconds=timings["plain"].median,
    )  # fmt: skip
