"""Complete paths: which edges of a set can carry anything from the input to the read-out.

An edge off every path from a source writer through kept edges to a read-out cannot
change the output (:func:`live_edges`); :func:`select_on_paths` turns any ranking of edges
(pruning masks, attribution scores) into a circuit of whole paths within an edge quota.
Used by the pruning search (:mod:`mechlab.prune.engine`), the joint search's refinement
and every scoring method, so all of them build their circuits the same way.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mechlab.prune.graph import EdgeGraph


def _graph_arrays(graph: EdgeGraph, ablation: str) -> tuple[Tensor, Tensor, Tensor]:
    """Edge endpoints as writer indices, and which writers can start a path.

    Returns:
        ``edge_writer`` ``[n_edges]`` (the writer's index), ``edge_feeds`` ``[n_edges]``
        (the index of the writer the edge's reader feeds, -1 for a read-out) and
        ``source`` ``[n_writers]`` bool: under interchange ablation the writers no reader
        feeds (the embeddings), under mean and zero ablation every writer (a component
        whose inputs are all ablated still differs from its own ablated output there).
    """
    edge_writer = torch.tensor([graph.writer_index[w] for w, _ in graph.edges], dtype=torch.long)
    feeds = [graph.writer_index.get(graph.reader_by_name[r].component, -1) for _, r in graph.edges]
    edge_feeds = torch.tensor(feeds, dtype=torch.long)
    if ablation == "interchange":
        source = torch.ones(graph.n_writers, dtype=torch.bool)
        source[edge_feeds[edge_feeds >= 0]] = False
    else:
        source = torch.ones(graph.n_writers, dtype=torch.bool)
    return edge_writer, edge_feeds, source


def _reach(
    edges: Tensor, edge_writer: Tensor, edge_feeds: Tensor, source: Tensor
) -> tuple[Tensor, Tensor]:
    """Writers reached from a source through ``edges`` (``fed``) and writers with a path
    through ``edges`` to a read-out (``useful``), both ``[n_writers]`` bool."""
    feeds_writer = edge_feeds >= 0
    fed = source.clone()
    while True:
        new = source.clone()
        new[edge_feeds[edges & fed[edge_writer] & feeds_writer]] = True
        if torch.equal(new, fed):
            break
        fed = new
    useful = torch.zeros_like(source)
    while True:
        new = torch.zeros_like(useful)
        new[edge_writer[edges & (~feeds_writer | useful[edge_feeds.clamp(min=0)])]] = True
        if torch.equal(new, useful):
            break
        useful = new
    return fed, useful


def live_edges(graph: EdgeGraph, edges: Tensor, ablation: str = "interchange") -> Tensor:
    """``[n_edges]`` bool: the edges of ``edges`` that lie on a complete path of ``edges``.

    A complete path runs from a source writer (see :func:`_graph_arrays`) through kept
    edges and components to a read-out. An edge off every such path cannot change the
    output: if its reader's component has no kept path onward, what it reads is
    discarded; under interchange ablation, if its writer has no kept path from the
    input, every input of the writer is the corrupted run's, so its output equals its
    ablated output and the edge carries no difference. Keeping such edges spends the
    sparsity budget on nothing.

    Args:
        graph: The edge graph.
        edges: ``[n_edges]`` bool, a set of edges.
        ablation: ``"interchange"``, ``"mean"`` or ``"zero"``.

    Returns:
        ``[n_edges]`` bool, a subset of ``edges``.
    """
    edge_writer, edge_feeds, source = _graph_arrays(graph, ablation)
    edges = edges.cpu().bool()
    fed, useful = _reach(edges, edge_writer, edge_feeds, source)
    onward = (edge_feeds < 0) | useful[edge_feeds.clamp(min=0)]
    return edges & fed[edge_writer] & onward


def select_on_paths(
    graph: EdgeGraph, scores: Tensor, eligible: Tensor, n_keep: int, ablation: str = "interchange"
) -> tuple[Tensor, float]:
    """The largest set of live edges among the best-scored ones that fits in ``n_keep``.

    Rank the eligible edges by score (equal scores in graph order) and let ``L(k)`` be
    the live edges (:func:`live_edges`) among the first ``k``; ``|L(k)|`` only grows with
    ``k``. The largest ``k`` with ``|L(k)| <= n_keep`` is chosen and ``L(k)`` kept.
    Plain top-k breaks a tie between two equally good paths by taking one edge of each
    (no complete path, nothing carried); this keeps a whole path. Ranking edge by edge
    rather than score level by level matters when many edges share the top score (masks
    saturated open): a level too big for the quota would otherwise leave nothing. The rest
    of the quota is filled, in order of rank, with single edges that are live together
    with the kept ones (from a reached writer into a component with a kept way to the
    read-out).

    Args:
        graph: The edge graph.
        scores: ``[n_edges]`` ranking scores (``log_alpha``).
        eligible: ``[n_edges]`` bool, the edges that may be kept.
        n_keep: At most this many edges.
        ablation: The ablation (it decides where paths may start).

    Returns:
        ``(edges [n_edges] bool, the smallest kept score)`` (``inf`` when nothing is kept).
    """
    s = scores.detach().double().cpu()
    eligible = eligible.cpu().bool()
    ranked = eligible.nonzero().flatten()
    ranked = ranked[torch.argsort(s[ranked], descending=True, stable=True)]  # ties: graph order
    best = torch.zeros_like(eligible)
    if n_keep <= 0 or ranked.numel() == 0:
        return best, math.inf
    lo, hi = 1, ranked.numel()  # find the longest prefix of the ranking whose live set fits
    while lo <= hi:
        mid = (lo + hi) // 2
        prefix = torch.zeros_like(eligible)
        prefix[ranked[:mid]] = True
        live = live_edges(graph, prefix, ablation)
        if int(live.sum()) <= n_keep:
            best, lo = live, mid + 1
        else:
            hi = mid - 1
    edge_writer, edge_feeds, source = _graph_arrays(graph, ablation)
    candidates = (eligible & ~best).nonzero().flatten()
    candidates = candidates[torch.argsort(s[candidates], descending=True, stable=True)]
    fed, useful = _reach(best, edge_writer, edge_feeds, source)
    for i in candidates.tolist():
        if int(best.sum()) >= n_keep:
            break
        feeds = int(edge_feeds[i])
        if fed[edge_writer[i]] and (feeds < 0 or useful[feeds]):
            best[i] = True
            fed, useful = _reach(best, edge_writer, edge_feeds, source)
    return best, float(s[best].min()) if best.any() else math.inf
