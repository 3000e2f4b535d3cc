"""Complete paths: which edges of a set can carry anything from the input to the read-out.

An edge off every path from a source writer through kept edges to a read-out cannot
change the output (:func:`live_edges`); :func:`select_on_paths` turns any ranking of edges
(pruning masks, attribution scores) into a circuit of whole paths within an edge quota.
Used by the pruning search (:mod:`mechlab.prune.engine`), the joint search's refinement
and every scoring method, so all of them build their circuits the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mechlab.prune.graph import EdgeGraph


@dataclass(frozen=True)
class _Arrays:
    """A graph's edges as index arrays.

    Attributes:
        edge_writer: ``[n_edges]`` the index of each edge's writer.
        pair_edge: ``[n_pairs]`` an edge, once per writer its reader feeds (a shared
            key/value reader feeds every head of its group; a read-out feeds none).
        pair_feed: ``[n_pairs]`` that fed writer's index.
        to_out: ``[n_edges]`` bool, the edge's reader is a read-out.
        source: ``[n_writers]`` bool: under interchange ablation the writers no reader
            feeds (the embeddings), under mean and zero ablation every writer (a
            component whose inputs are all ablated still differs from its own ablated
            output there).
    """

    edge_writer: Tensor
    pair_edge: Tensor
    pair_feed: Tensor
    to_out: Tensor
    source: Tensor

    def onward(self, useful: Tensor) -> Tensor:
        """``[n_edges]`` bool: the edge's reader is a read-out or feeds a ``useful`` writer."""
        hits = torch.zeros(self.edge_writer.shape[0], dtype=torch.long)
        hits.index_add_(0, self.pair_edge, useful[self.pair_feed].long())
        return self.to_out | (hits > 0)


def _graph_arrays(graph: EdgeGraph, ablation: str) -> _Arrays:
    edge_writer = torch.tensor([graph.writer_index[w] for w, _ in graph.edges], dtype=torch.long)
    pairs = [
        (i, graph.writer_index[fed])
        for i, (_, r) in enumerate(graph.edges)
        for fed in graph.feeds(r)
    ]
    pair_edge = torch.tensor([i for i, _ in pairs], dtype=torch.long)
    pair_feed = torch.tensor([f for _, f in pairs], dtype=torch.long)
    to_out = torch.tensor([not graph.feeds(r) for _, r in graph.edges], dtype=torch.bool)
    source = torch.ones(graph.n_writers, dtype=torch.bool)
    if ablation == "interchange":
        source[pair_feed] = False
    return _Arrays(edge_writer, pair_edge, pair_feed, to_out, source)


def _reach(edges: Tensor, arrays: _Arrays) -> tuple[Tensor, Tensor]:
    """Writers reached from a source through ``edges`` (``fed``) and writers with a path
    through ``edges`` to a read-out (``useful``), both ``[n_writers]`` bool."""
    a = arrays
    fed = a.source.clone()
    while True:
        new = a.source.clone()
        carried = edges[a.pair_edge] & fed[a.edge_writer[a.pair_edge]]
        new[a.pair_feed[carried]] = True
        if torch.equal(new, fed):
            break
        fed = new
    useful = torch.zeros_like(a.source)
    while True:
        new = torch.zeros_like(useful)
        new[a.edge_writer[edges & a.onward(useful)]] = True
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
    arrays = _graph_arrays(graph, ablation)
    edges = edges.cpu().bool()
    fed, useful = _reach(edges, arrays)
    return edges & fed[arrays.edge_writer] & arrays.onward(useful)


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
    arrays = _graph_arrays(graph, ablation)
    candidates = (eligible & ~best).nonzero().flatten()
    candidates = candidates[torch.argsort(s[candidates], descending=True, stable=True)]
    fed, useful = _reach(best, arrays)
    onward = arrays.onward(useful)
    for i in candidates.tolist():
        if int(best.sum()) >= n_keep:
            break
        if fed[arrays.edge_writer[i]] and onward[i]:
            best[i] = True
            fed, useful = _reach(best, arrays)
            onward = arrays.onward(useful)
    return best, float(s[best].min()) if best.any() else math.inf
