"""Exact single-edge ablation, batched: every edge's true effect on the metric.

Ablating one edge ``w -> r`` and keeping every other edge clean changes exactly one
thing: reader ``r`` receives ``x_r - D_w`` (``D_w = X_w - X~_w``) instead of ``x_r``.
Everything upstream of ``r``'s component is the clean run, and everything downstream is
the model's own forward pass from the changed residual stream. On a transformer
(:func:`transformer_single_edge_outputs`) the effect of every edge is therefore computed
from one clean pass by replaying only what follows its reader:

* ``a{l}.h{h}.q|k|v``: head ``h`` of layer ``l`` is recomputed with that one input
  changed, its output change is added to ``resid_mid`` of layer ``l``, and the MLP of
  layer ``l`` and the blocks after it run as usual;
* ``m{l}.in``: the MLP of layer ``l`` on ``ln2(resid_mid - D_w)``, then the later blocks;
* ``out``: the read-out of ``resid_final - D_w``.

Only the outputs at target positions count, so the last block computes its keys and values
at every position but its queries, its MLP and the read-out at the target positions alone
(:func:`_last_block`; an edge into the last block or the read-out costs a few rows).

The edges of one reader are stacked along the batch axis (at most ``max_rows`` traces
per pass). Other families (residual stacks, windowed graphs: tens of edges) use one
masked forward per edge (:func:`~mechlab.prune.attribution.exact_loop_scores`); the two
agree on transformers to float round-off (``tests/prune/test_exact.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mechlab.models.registry import graph_kind
from mechlab.models.transformer import causal_mask
from mechlab.progress import tqdm
from mechlab.prune.forward import select_traces
from mechlab.prune.graph import EdgeGraph
from mechlab.prune.objective import DEFAULT_BATCH_SIZE, Objective, exact_loop_scores, metric_value

MAX_ROWS = 512  # traces (edges x traces) per replay pass


def _head_output(
    attn: nn.Module, h: int, x_q: Tensor, x_k: Tensor, x_v: Tensor, at: Tensor | None = None
) -> Tensor:  # fmt: skip
    """Head ``h``'s output ``z W_O[h]`` ``[batch, query, d_model]`` from its normalised q, k, v
    inputs; ``at``: the positions of ``x_q``'s queries (None: every position)."""
    q = x_q @ attn.W_Q[h] + attn.b_Q[h]  # [batch, query, d_head]
    k = x_k @ attn.W_K[h] + attn.b_K[h]  # [batch, pos, d_head]
    v = x_v @ attn.W_V[h] + attn.b_V[h]
    scores = (q / attn.scale) @ k.transpose(-1, -2)  # [batch, query, pos]
    if attn.causal:
        n = k.shape[-2]
        later = causal_mask(n, k.device) if at is None else torch.arange(n, device=k.device) > at[:, None]
        scores = scores.masked_fill(later, float("-inf"))
    return (F.softmax(scores, dim=-1) @ v) @ attn.W_O[h]


def _last_block(block: nn.Module, resid: Tensor, at: Tensor) -> Tensor:
    """The last block's ``resid_post`` at positions ``at`` ``[batch, len(at), d]`` from its
    whole ``resid_pre`` ``[batch, pos, d]``: the keys and values of every position, the
    queries and the MLP of ``at`` only (what the read-out there depends on)."""
    attn = block.attn
    x = block.ln1(resid)
    x_q = x[:, at]
    mid = resid[:, at] + sum(_head_output(attn, h, x_q, x, x, at) for h in range(attn.W_Q.shape[0]))
    if attn.b_O is not None:
        mid = mid + attn.b_O
    return mid + block.mlp(block.ln2(mid))


def _finish(model: nn.Module, resid: Tensor, first_block: int, at: Tensor) -> Tensor:
    """The model's output at positions ``at`` ``[batch, len(at), d_output]`` from the
    residual stream entering block ``first_block`` (``[batch, pos, d]``; the last block
    computes only what those positions read, :func:`_last_block`)."""
    last = model.cfg.n_layers - 1
    for block in model.blocks[first_block:last]:
        resid = block(resid)
    resid = _last_block(model.blocks[last], resid, at) if first_block <= last else resid[:, at]
    return model.read_out(model.ln_final(resid))


@torch.no_grad()
def clean_run(model: nn.Module, x: Tensor) -> tuple[dict[str, Tensor], list[Tensor]]:
    """The clean pass every single-edge replay starts from: the activations it reads
    (``resid_pre/mid/post``, head results, MLP outputs per block) and the writer outputs
    in graph order. One pass per batch of traces, shared by every reader's replays."""
    names = [f"blocks.{i}.{h}" for i in range(model.cfg.n_layers)
             for h in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_result",
                       "hook_mlp_out")]  # fmt: skip
    _, cache = model.run_with_cache(x, names_filter=names + ["hook_embed", "hook_pos_embed"])
    rows = []  # writer outputs in graph order
    rows += [cache["hook_embed"], cache["hook_pos_embed"].expand_as(cache["hook_embed"])]
    for i in range(model.cfg.n_layers):
        rows += list(cache[f"blocks.{i}.attn.hook_result"].unbind(2)) + [
            cache[f"blocks.{i}.hook_mlp_out"]
        ]
    return cache, rows


@torch.no_grad()
def transformer_single_edge_outputs(
    model: nn.Module, graph: EdgeGraph, x: Tensor, ablated: Tensor, reader: str, writers: list[int],
    clean: tuple | None = None, at: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The outputs with each of the edges ``writers[i] -> reader`` ablated alone.

    Args:
        model: A mechlab transformer (frozen, eval mode).
        graph: Its (plain) edge graph.
        x: ``[batch, pos, ...]`` inputs.
        ablated: ``[n_writers, batch | 1, pos, d]`` ablated writer outputs of these traces.
        reader: The reader's name.
        writers: Writer indices of its edges.
        clean: :func:`clean_run` of ``x`` (None: run it here; :func:`exact_scores` runs
            it once per batch of traces for every reader).
        at: The positions whose outputs are wanted, increasing (None: every position).
            The last block computes its queries and MLP there only.

    Returns:
        ``[len(writers), batch, len(at), d_output]``.
    """
    cache, rows = clean_run(model, x) if clean is None else clean
    at = torch.arange(x.shape[1], device=x.device) if at is None else at
    index = torch.tensor(writers, device=x.device)
    diffs = torch.stack([rows[w] for w in writers]) - ablated[index]  # [K, batch, pos, d]
    K, B = diffs.shape[:2]
    r = graph.reader_by_name[reader]
    last = model.cfg.n_layers - 1
    if r.kind == "out":
        final = cache[f"blocks.{last}.hook_resid_post"][:, at]
        return model.read_out(model.ln_final(final - diffs[:, :, at]))
    layer = r.layer
    block = model.blocks[layer]
    keep = at if layer == last else slice(None)  # the positions this layer's outputs are needed at
    resid_mid = cache[f"blocks.{layer}.hook_resid_mid"][:, keep]
    if r.kind == "mlp":
        changed = block.mlp(block.ln2((resid_mid - diffs[:, :, keep]).flatten(0, 1)))
        resid = (
            cache[f"blocks.{layer}.hook_resid_post"][:, keep]
            + changed.view(K, B, *changed.shape[1:])
            - cache[f"blocks.{layer}.hook_mlp_out"][:, keep]
        ).flatten(0, 1)
    else:
        resid_pre = cache[f"blocks.{layer}.hook_resid_pre"]
        normal = block.ln1(resid_pre).expand(K, *resid_pre.shape).flatten(0, 1)  # [K * batch, pos, d]
        if r.kind == "q":  # the keys and values are the clean run's
            x_q, x_k, x_v = block.ln1((resid_pre[:, keep] - diffs[:, :, keep]).flatten(0, 1)), normal, normal
        else:
            changed = block.ln1((resid_pre - diffs).flatten(0, 1))
            x_q = normal[:, keep]
            x_k, x_v = (changed, normal) if r.kind == "k" else (normal, changed)
        head = _head_output(block.attn, r.head, x_q, x_k, x_v, at if layer == last else None)
        old = cache[f"blocks.{layer}.attn.hook_result"][:, keep, r.head]
        resid = (resid_mid + head.view(K, B, *head.shape[1:]) - old).flatten(0, 1)
        resid = resid + block.mlp(block.ln2(resid))
    if layer == last:
        out = model.read_out(model.ln_final(resid))
    else:
        out = _finish(model, resid, layer + 1, at)
    return out.view(K, B, len(at), -1)


def _replayable(obj: Objective) -> bool:
    """Whether the replay applies: a transformer of GPT-2's layout (learned positions, one
    key/value head per query head, sequential attention and MLP, q/k/v biases, norms before
    the sublayers, no soft-capping, window or rescaling), on its plain graph. Other layouts
    (rotary, grouped heads, parallel or attention-only blocks, post-norms, as imported models
    have them) take the loop of masked forwards."""
    cfg = obj.model.cfg
    if graph_kind(cfg.arch) != "transformer" or obj.graph.windows:
        return False
    return (
        getattr(cfg, "positional", "learned") == "learned"
        and getattr(cfg, "n_key_value_heads", cfg.n_heads) == cfg.n_heads
        and not getattr(cfg, "parallel_attn_mlp", False)
        and not getattr(cfg, "attn_only", False)
        and getattr(cfg, "qkv_bias", True)
        and not getattr(cfg, "qk_norm", False)
        and getattr(cfg, "clip_qkv", None) is None
        and not getattr(cfg, "post_norms", False)
        and getattr(cfg, "pre_norms", True)
        and all(getattr(cfg, name, None) is None for name in (
            "attn_softcap", "sliding_window", "attn_scale", "embed_scale", "final_softcap"))
    )  # fmt: skip


@torch.no_grad()
def exact_scores(
    obj: Objective, batch_size: int = DEFAULT_BATCH_SIZE, progress: bool = False,
    max_rows: int = MAX_ROWS, desc: str = "exact",
) -> Tensor:  # fmt: skip
    """``m(1 - e_k) - m(1)`` for every countable edge ``k`` (0 for the others), float64.

    Transformers replay only what follows each edge's reader (module docstring); other
    families run one masked forward per edge. The progress bar (``desc``) counts the edges
    of each batch of traces in turn.
    """
    if not _replayable(obj):
        return exact_loop_scores(obj, batch_size, progress, desc)
    graph = obj.graph
    sums = torch.zeros(graph.n_edges, dtype=torch.float64)
    todo = []  # (reader, edge indices, writer indices), countable edges only
    for r in graph.readers:
        start = graph.edge_offset[r.name]
        ks = [start + i for i in range(r.n_upstream) if obj.countable[start + i]]
        if ks:
            todo.append((r.name, ks, [graph.writer_index[graph.edges[k][0]] for k in ks]))
    # closed on a Ctrl-C too, so that the line of a stopped command starts a line of its own
    with tqdm(total=sum(len(ks) for _, ks, _ in todo), disable=not progress, desc=desc, unit="edge") as bar:
        base = metric_value(obj, torch.ones(graph.n_edges), batch_size)  # the bar is up meanwhile
        n = len(obj.traces)
        for index in obj.chunks(batch_size):
            if len(index) < n:  # several batches: the bar counts each batch's edges in turn
                bar.reset()
                bar.set_description_str(f"{desc}, traces {int(index[0]) + 1}-{int(index[-1]) + 1} of {n}")
            x = obj.traces.inputs[index]
            abl = select_traces(obj.ablated, index)
            per_pass = max(1, max_rows // len(index))
            clean = clean_run(obj.model, x)
            at = obj.positions[index].any(0).nonzero().flatten()  # these traces' target positions
            for reader, ks, ws in todo:
                for i in range(0, len(ks), per_pass):
                    out = transformer_single_edge_outputs(
                        obj.model, graph, x, abl, reader, ws[i : i + per_pass], clean, at
                    )
                    for k, o in zip(ks[i : i + per_pass], out, strict=True):
                        sums[k] += float(obj.metric_sum(o, index, at).double())
                    bar.update(len(ks[i : i + per_pass]))
    scores = sums / obj.n_positions - base
    return scores.masked_fill(~obj.countable, 0.0)
