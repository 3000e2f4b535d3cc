"""Greedy refinement: when the optimised masks leave more edges open than the quota allows,
remove edges one at a time, each time the one whose removal raises the loss least.

The hard-concrete search often ends with several equally useful routes still open
(masks saturated at 1, the sparsity constraint not yet met). Ranking those edges by
``log_alpha`` then breaks the tie by optimiser noise. That is harmless for one target
(any of the routes is as faithful), but not for a joint search, where a route that
serves every target is worth more than one that serves a single target. Backward
elimination on the actual objective decides such ties by what they cost:

    kept = live(open edges)
    while |kept| > n_keep:
        e* = argmin_e loss(live(kept - {e}))
        kept = live(kept - {e*})

``live`` drops the edges left off every complete input-to-read-out path (they cannot
change the output), so removing one edge of a route also removes the rest of it at no
cost. Each round costs ``|kept|`` masked forwards on the refinement traces, so the
elimination starts from at most the quota plus :data:`REFINE_EXTRA` open edges, those of
highest ``log_alpha``: it decides among the routes the search left open, it does not
search the whole graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from mechlab.prune.graph import EdgeGraph
from mechlab.prune.masks import deterministic_mask
from mechlab.prune.paths import live_edges

REFINE_TRACES = 256  # traces the elimination scores each candidate set on
REFINE_EXTRA = 16  # the elimination starts from at most the quota plus this many open edges


def greedy_eliminate(
    graph: EdgeGraph,
    open_edges: Tensor,
    n_keep: int,
    loss_of: Callable[[Tensor], float],
    ablation: str = "interchange",
) -> Tensor:
    """Backward elimination of edges down to ``n_keep`` (module docstring).

    Args:
        graph: The edge graph.
        open_edges: ``[n_edges]`` bool, the edges to start from.
        n_keep: At most this many edges are kept.
        loss_of: Binary edge set ``[n_edges]`` bool -> the loss to keep low.
        ablation: The ablation (it decides where complete paths may start).

    Returns:
        ``[n_edges]`` bool: at most ``n_keep`` live edges, a subset of ``open_edges``.
        Ties go to the candidate removed first in graph order.
    """
    return greedy_eliminate_joint(graph, [open_edges], [n_keep], [loss_of], 0.0, ablation)[0]


def pair_disagreement(sets: list[Tensor], n_keep: list[int]) -> float:
    """``mean over pairs (a, b) of |A xor B| / ((k_a + k_b) / 2)``: 0 when all sets agree."""
    pairs = [(a, b) for a in range(len(sets)) for b in range(a + 1, len(sets))]
    if not pairs:
        return 0.0
    return sum(
        int((sets[a] ^ sets[b]).sum()) / max(0.5 * (n_keep[a] + n_keep[b]), 1.0) for a, b in pairs
    ) / len(pairs)


def greedy_eliminate_joint(
    graph: EdgeGraph,
    open_edges: list[Tensor],
    n_keep: list[int],
    loss_of: list[Callable[[Tensor], float]],
    share: float,
    ablation: str = "interchange",
) -> list[Tensor]:
    """Backward elimination for several targets at once, rewarding shared edges.

    The objective is ``sum_t loss_t(kept_t) + share * pair_disagreement(kept)``. Each
    round removes, from one target still over its quota, the edge whose removal raises
    the objective least (its writer-to-reader route falling away with it, as in
    :func:`greedy_eliminate`), until every target fits its quota.

    Args:
        graph: The edge graph.
        open_edges: Per target, ``[n_edges]`` bool, the edges to start from.
        n_keep: Per target, at most this many edges.
        loss_of: Per target, binary edge set -> its loss.
        share: Weight of the disagreement term (0: independent targets).
        ablation: The ablation.

    Returns:
        Per target, ``[n_edges]`` bool: at most ``n_keep[t]`` live edges.
    """
    kept = [live_edges(graph, e.cpu().bool(), ablation) for e in open_edges]
    losses = [f(k) for f, k in zip(loss_of, kept, strict=True)]
    quota = [max(k, 0) for k in n_keep]
    while True:
        over = [t for t in range(len(kept)) if int(kept[t].sum()) > quota[t]]
        if not over:
            return kept
        base = share * pair_disagreement(kept, quota) if share else 0.0
        best = None  # (objective change, t, trial set, its loss)
        for t in over:
            for e in kept[t].nonzero().flatten().tolist():
                trial = kept[t].clone()
                trial[e] = False
                trial = live_edges(graph, trial, ablation)
                loss = loss_of[t](trial)
                change = loss - losses[t]
                if share:
                    sets = kept[:t] + [trial] + kept[t + 1 :]
                    change += share * pair_disagreement(sets, quota) - base
                if best is None or change < best[0]:
                    best = (change, t, trial, loss)
        _, t, trial, loss = best
        kept[t], losses[t] = trial, loss


def refined_log_alpha(log_alpha: Tensor, kept: Tensor, countable: Tensor) -> Tensor:
    """``log_alpha`` with the countable edges outside ``kept`` closed (deterministic mask 0).

    The circuit chosen from the result by :func:`~mechlab.prune.engine.binarize` is then
    ``kept`` (when it fits the quota), and the kept edges keep their scores.

    Args:
        log_alpha: ``[n_edges]`` optimised location parameters.
        kept: ``[n_edges]`` bool, the edges to keep.
        countable: ``[n_edges]`` bool, the edges the sparsity counts (the others stay as they are).

    Returns:
        ``[n_edges]`` location parameters.
    """
    out = log_alpha.detach().clone()
    drop = countable.to(out.device).bool() & ~kept.to(out.device).bool()
    out[drop] = -20.0  # far below the clamp: deterministic mask 0, P(z > 0) ~ 0
    return out


def open_countable(
    log_alpha: Tensor, countable: Tensor, n_keep: int | None = None, extra: int = REFINE_EXTRA
) -> Tensor:
    """``[n_edges]`` bool: the elimination's starting set.

    The countable edges whose deterministic mask is above 0; with ``n_keep``, at most
    ``n_keep + extra`` of them, those of highest ``log_alpha`` (the elimination costs
    about ``(n_keep + extra) * extra`` masked forwards, whatever the graph's size).

    Args:
        log_alpha: ``[n_edges]`` location parameters.
        countable: ``[n_edges]`` bool, the edges the sparsity counts.
        n_keep: The quota; None: no limit.
        extra: How many more than the quota the elimination may start from.

    Returns:
        ``[n_edges]`` bool.
    """
    la = log_alpha.detach().cpu()
    candidates = (deterministic_mask(la) > 0) & countable.cpu().bool()
    if n_keep is None or int(candidates.sum()) <= n_keep + extra:
        return candidates
    index = candidates.nonzero().flatten()
    top = index[torch.argsort(la[index], descending=True, stable=True)[: n_keep + extra]]
    pool = torch.zeros_like(candidates)
    pool[top] = True
    return pool


__all__ = [
    "REFINE_EXTRA",
    "REFINE_TRACES",
    "greedy_eliminate",
    "greedy_eliminate_joint",
    "open_countable",
    "pair_disagreement",
    "refined_log_alpha",
]
