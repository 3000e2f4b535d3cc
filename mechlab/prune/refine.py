"""Greedy refinement: when the optimised masks leave more edges open than the quota allows,
remove edges one at a time, each time the one whose removal raises the loss least; and
the default search's final selection (:func:`select_edges`), which adds the fill.

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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.progress import tqdm
from mechlab.prune.forward import select_traces
from mechlab.prune.graph import EdgeGraph
from mechlab.prune.masks import LIMIT_LEFT, LIMIT_RIGHT, deterministic_mask
from mechlab.prune.paths import _graph_arrays, _reach, live_edges, select_on_paths
from mechlab.prune.replay import ReplayForward
from mechlab.prune.search import row_losses, task_loss

REFINE_TRACES = 128  # traces the selection scores each candidate set on
REFINE_EXTRA = 16  # the elimination starts from at most the quota plus this many edges
VALIDATION_Z = 2.0  # standard errors by which the selection must beat the reference circuit
# the smallest log_alpha whose deterministic mask is above 0 (plus a margin)
OPEN_LOG_ALPHA = math.log(-LIMIT_LEFT / LIMIT_RIGHT) + 1e-2


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


def removal_costs(
    graph: EdgeGraph, kept: Tensor, loss: float, loss_of: Callable[[Tensor], float], ablation: str
) -> dict[int, float]:
    """Kept edge index -> ``loss(live(kept - {e})) - loss``: each edge's removal cost, with
    the routes its removal leaves incomplete."""
    costs = {}
    for e in kept.nonzero().flatten().tolist():
        trial = kept.clone()
        trial[e] = False
        costs[e] = loss_of(live_edges(graph, trial, ablation)) - loss
    return costs


def verified_eliminate(
    graph: EdgeGraph,
    open_edges: Tensor,
    n_keep: int,
    loss_of: Callable[[Tensor], float],
    ablation: str = "interchange",
    tolerance: float = 1e-3,
    final_costs: bool = True,
) -> tuple[Tensor, float, dict[int, float]]:
    """Backward elimination that drops the whole excess at once when that is safe.

    Each round scores every kept edge's removal (``loss(live(kept - {e})) - loss(kept)``),
    then tries dropping the ``k`` cheapest together (``k`` = the whole excess first) and
    accepts when the loss rises by at most the sum of their single costs plus
    ``tolerance``; otherwise it halves ``k`` and tries again (one evaluation per try).
    Edges that matter only together, two redundant paths into a saturated component, each
    cost nothing alone, so dropping both fails the check and only one is dropped before
    the next round re-scores the other (now the only way through). About ``|pool|`` plus a
    few evaluations per round, usually one or two rounds (dropping half the excess per
    round, the earlier rule, took ``log2(extra)`` rounds and cut both redundant paths); the
    last round's scores are the kept edges' effects.

    Args:
        final_costs: Score the kept edges once more when the set fits (their effects);
            False returns ``{}`` instead (the caller measures them after changing the set:
            one masked forward per kept edge saved).

    Returns:
        ``(kept [n_edges] bool, its loss, kept edge index -> removal cost)``.
    """
    kept = live_edges(graph, open_edges.cpu().bool(), ablation)
    loss = loss_of(kept)
    while True:
        excess = int(kept.sum()) - n_keep
        if excess <= 0 and not final_costs:
            return kept, loss, {}
        costs = removal_costs(graph, kept, loss, loss_of, ablation)
        if excess <= 0:
            return kept, loss, costs
        order = sorted(costs, key=lambda i: (costs[i], i))
        k = excess
        while True:
            trial = kept.clone()
            trial[order[:k]] = False
            trial = live_edges(graph, trial, ablation)
            value = loss_of(trial)
            if k == 1 or value - loss <= sum(max(costs[i], 0.0) for i in order[:k]) + tolerance:
                break
            k = max(1, k // 2)
        kept, loss = trial, value


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


# ---------------------------------------------------------------------------------------
# The default search's selection: eliminate from a pool, fill while it helps
# ---------------------------------------------------------------------------------------


def loss_function(
    model: nn.Module,
    graph: EdgeGraph,
    traces,
    positions: Sequence[Tensor],
    reference: Tensor,
    ablated,
    norms: Sequence[float],
    n_traces: int = REFINE_TRACES,
    first: int = 0,
    per_trace: bool = False,
) -> Callable[[Sequence[int]], Callable[[Tensor], float]]:
    """``loss_of(targets)(kept)``: the summed normalised task losses of a binary edge set.

    Scored on ``n_traces`` training traces from the ``first``, deterministic masks (0 or 1), the
    search's own :func:`~mechlab.prune.search.task_loss`, each target's loss divided by
    its ``norms`` entry (so with normalising, ``1 - faithfulness`` on those traces). Each
    set's masked forward replays only the layers where it differs from a set scored before
    (:class:`~mechlab.prune.replay.ReplayForward`; the same numbers as a whole pass, to
    float round-off: its last block is computed at the target positions only).

    ``per_trace``: ``kept`` -> ``[n]`` each trace's share of that loss instead (the sum over
    traces of its positions' terms over the target's position count; the shares add up to
    the loss), for a paired comparison of two sets over traces (:func:`paired_difference`).
    """
    io = model.cfg.io
    n = max(0, min(len(traces) - first, n_traces))
    index = torch.arange(first, first + n, device=reference.device)
    x = traces.inputs[index]
    at = torch.stack([p[index] for p in positions]).any(0)  # [n, pos]: every target's positions
    # replays what a change reaches; the last block at the target positions only
    forward = ReplayForward(model, graph, x, select_traces(ablated, index), at=at)
    dtype = next(model.parameters()).dtype
    masks = [positions[t][index] for t in range(len(positions))]
    refs = [reference[index][m] for m in masks]
    owners = [m.nonzero()[:, 0] for m in masks]  # each target position's trace

    def shares(kept: Tensor, targets: Sequence[int]) -> Tensor:  # [n] per trace
        with torch.no_grad():
            pred = forward(kept.to(x.device, dtype))  # [n_at, d_output]
            out = torch.zeros(n, dtype=torch.float64, device=x.device)
            for t in targets:
                terms = row_losses(pred[masks[t][at]], refs[t], io).double()
                out.index_add_(0, owners[t], terms / (max(len(terms), 1) * norms[t]))
        return out

    def loss_of(targets: Sequence[int]) -> Callable[[Tensor], float]:
        def loss(kept: Tensor) -> float:
            with torch.no_grad():
                pred = forward(kept.to(x.device, dtype))  # [n_at, d_output]
                total = 0.0
                for t in targets:
                    total += float(task_loss(pred[masks[t][at]], refs[t], io)) / norms[t]
            return total if math.isfinite(total) else math.inf

        def per(kept: Tensor) -> Tensor:
            out = shares(kept, targets)
            return out if bool(torch.isfinite(out).all()) else torch.full_like(out, math.inf)

        return per if per_trace else loss

    return loss_of


def paired_difference(a: Tensor, b: Tensor) -> tuple[float, float]:
    """``(sum(a - b), its standard error)`` of two sets' per-trace loss shares on the same
    traces (:func:`loss_function` with ``per_trace``): the traces as independent draws,
    ``SE = sqrt(n / (n - 1) * sum((d_i - mean d)^2))``."""
    d = (a - b).double()
    n = d.numel()
    if n < 2:
        return float(d.sum()), math.inf
    return float(d.sum()), float((n / (n - 1) * (d - d.mean()).pow(2).sum()).sqrt())


@dataclass
class Selection:
    """The edges chosen on the true objective, and what was measured on the way.

    Attributes:
        edges: ``[n_edges]`` bool, the circuit (live, at most the quota).
        loss: Its loss.
        n_pool: Edges the elimination started from (live ones).
        added: Edges the fill added (in order).
        effects: Kept edge -> loss increase when it alone is removed (with the route it
            completes), the circuit's own single-edge ablation.
        fill_stopped: Why the fill stopped: ``"budget"`` (the quota is met), ``"no effect"``
            (no candidate lowered the loss by ``min_effect``) or ``"no candidate"``.
        rejected: When the fill stopped for want of effect: each candidate it tried last
            -> the loss decrease its addition gave (below ``min_effect``).
        validation: The check on traces the selection did not score (None: none made):
            ``traces``, the losses there of the selection's circuit (``selected_loss``)
            and of the reference ranking's own circuit (``reference_loss``), their
            difference's standard error (``se``), and which was ``chosen``
            (``"selection"`` or ``"reference"``).
    """

    edges: Tensor
    loss: float
    n_pool: int
    added: list[int] = field(default_factory=list)
    effects: dict[int, float] = field(default_factory=dict)
    fill_stopped: str = "budget"
    rejected: dict[int, float] = field(default_factory=dict)
    validation: dict[str, Any] | None = None


def ranked_pool(log_alpha: Tensor, countable: Tensor, size: int) -> Tensor:
    """``[n_edges]`` bool: the ``size`` countable edges of highest ``log_alpha`` (ties: graph order)."""
    la = log_alpha.detach().cpu()
    index = countable.cpu().bool().nonzero().flatten()
    top = index[torch.argsort(la[index], descending=True, stable=True)[:size]]
    pool = torch.zeros(la.numel(), dtype=torch.bool)
    pool[top] = True
    return pool


def select_edges(
    graph: EdgeGraph,
    log_alpha: Tensor,
    countable: Tensor,
    n_keep: int,
    loss_of: Callable[[Tensor], float],
    ablation: str = "interchange",
    extra: int = REFINE_EXTRA,
    min_effect: float = 1e-4,
    rankings: Sequence[Tensor] = (),
    progress: bool = False,
    validate: Callable[[Tensor], Tensor] | None = None,
) -> Selection:
    """Choose ``n_keep`` edges on the true objective, starting from the search's ranking.

    1. *Eliminate*: from the ``n_keep + extra`` countable edges of highest
       ``log_alpha``, drop edges by :func:`verified_eliminate` until the live set fits;
       keep the ranking's own complete paths (:func:`~mechlab.prune.paths.select_on_paths`)
       instead when their loss is lower (one greedy step can go astray where only a
       group of edges together helps, a query and a key of one head).
    2. *Fill*: while fewer than ``n_keep`` are kept (removing an edge can take a whole
       route with it), add the countable edge, among the ``extra`` best-ranked ones that
       would be live with the kept set, whose addition lowers the loss most, as long as
       that lowers it by at least ``min_effect``.
    3. *Validate* (with ``validate``): on traces the steps above did not score, the chosen
       circuit must beat the last ranking's own complete-path circuit (the reference: the
       most stable ranking, exact ablation's where it is one) by :data:`VALIDATION_Z`
       standard errors of their paired difference; otherwise that circuit is taken (and
       filled as in 2). The elimination picks among near-equivalent edges by their loss on
       its own traces, so its circuit's loss there is optimistic; a difference it cannot
       show on fresh traces is not taken as one.
    4. *Measure*: each kept edge's effect, the loss increase when it is removed.

    Args:
        graph: The edge graph.
        log_alpha: ``[n_edges]`` the search's logits (the ranking).
        countable: ``[n_edges]`` bool.
        n_keep: The quota.
        loss_of: Binary edge set -> loss (:func:`loss_function`).
        ablation: The ablation (where complete paths start).
        extra: Size of the pool beyond the quota, and of the fill's candidate list.
        min_effect: The smallest loss change that counts as an effect.
        rankings: Other ``[n_edges]`` rankings (a warm start's ``|score|``): their best
            ``n_keep`` countable edges of positive score join the elimination's pool, and
            their own complete paths among those are a candidate as the search's are.
        progress: Show a bar of the masked forwards (each scores one edge set), its
            description the step (``selection: eliminating from a pool of N edges``, the
            rankings' paths, the fill, ``selection: scoring N removals``).
        validate: Binary edge set -> ``[n]`` per-trace loss shares on other traces
            (:func:`loss_function` with ``per_trace``), or None (no check).

    Returns:
        The :class:`Selection`.
    """
    bar = tqdm(disable=not progress, desc="selection", unit=" forward")
    scored = loss_of

    def loss_of(kept: Tensor) -> float:
        value = scored(kept)
        bar.update()
        return value

    with bar:
        return _select_edges(graph, log_alpha, countable, n_keep, loss_of, ablation, extra, min_effect,
                             rankings, bar.set_description_str, validate)  # fmt: skip


def _select_edges(
    graph: EdgeGraph,
    log_alpha: Tensor,
    countable: Tensor,
    n_keep: int,
    loss_of: Callable[[Tensor], float],
    ablation: str,
    extra: int,
    min_effect: float,
    rankings: Sequence[Tensor],
    say: Callable[[str], Any],
    validate: Callable[[Tensor], Tensor] | None = None,
) -> Selection:
    """:func:`select_edges`, ``say`` called with each step's description."""
    countable = countable.cpu().bool()
    la = log_alpha.detach().cpu()
    pool = ranked_pool(la, countable, n_keep + extra)
    rankings = [r.detach().cpu() for r in rankings]
    for other in rankings:  # only edges the other ranking gives some effect
        pool |= ranked_pool(other, countable & (other > 0), n_keep)
    # the effects are measured once, on the final set (the fill may still change it)
    n_pool = int(live_edges(graph, pool, ablation).sum())
    say(f"selection: eliminating from a pool of {n_pool} edges to {n_keep}")
    kept, loss, _ = verified_eliminate(graph, pool, n_keep, loss_of, ablation, final_costs=False)
    say(f"selection: the {1 + len(rankings)} rankings' own paths")
    reference = None
    for ranking, eligible in ((la, countable), *((r, countable & (r > 0)) for r in rankings)):
        ranked, _ = select_on_paths(graph, ranking, eligible, n_keep, ablation)
        ranked_loss = loss_of(ranked)
        reference = (ranked, ranked_loss) if rankings else None  # the last ranking's
        if ranked_loss < loss:  # greedy steps can go astray where only whole groups help
            kept, loss = ranked, ranked_loss
    arrays = _graph_arrays(graph, ablation)
    order = torch.argsort(la, descending=True, stable=True)
    kept, loss, added, stopped, rejected = _fill(kept, loss, n_keep, countable, order, arrays, loss_of,
                                                 extra, min_effect, say)  # fmt: skip
    validation = None
    if validate is not None and reference is not None and not torch.equal(reference[0], kept):
        say("selection: validating on other traces")
        chosen, ref_shares = validate(kept), validate(reference[0])
        difference, se = paired_difference(chosen, ref_shares)
        validation = {"traces": chosen.numel(), "selected_loss": float(chosen.sum()),
                      "reference_loss": float(ref_shares.sum()), "se": se, "chosen": "selection"}  # fmt: skip
        if not difference < -VALIDATION_Z * se:  # no better than the reference on fresh traces
            validation["chosen"] = "reference"
            kept, loss, added, stopped, rejected = _fill(reference[0].clone(), reference[1], n_keep, countable,
                                                         order, arrays, loss_of, extra, min_effect, say)  # fmt: skip
    say(f"selection: scoring {int(kept.sum())} removals")
    effects = removal_costs(graph, kept, loss, loss_of, ablation)
    return Selection(kept, loss, n_pool, added, effects, stopped, rejected, validation)


def _fill(
    kept: Tensor, loss: float, n_keep: int, countable: Tensor, order: Tensor, arrays, loss_of, extra: int,
    min_effect: float, say: Callable[[str], Any],
) -> tuple[Tensor, float, list[int], str, dict[int, float]]:  # fmt: skip
    """The fill of :func:`select_edges` (step 2): ``(kept, loss, added, why it stopped, rejected)``."""
    added: list[int] = []
    stopped, rejected = "budget", {}
    while int(kept.sum()) < n_keep:
        say(f"selection: filling, {int(kept.sum())} of {n_keep} edges kept")
        fed, useful = _reach(kept, arrays)
        onward = arrays.onward(useful)
        candidates = [
            i for i in order.tolist()
            if countable[i] and not kept[i] and fed[arrays.edge_writer[i]] and onward[i]
        ][:extra]  # fmt: skip
        if not candidates:
            stopped = "no candidate"
            break
        best, tried = None, {}
        for i in candidates:
            trial = kept.clone()
            trial[i] = True
            value = loss_of(trial)
            tried[i] = loss - value
            if best is None or value < best[0]:
                best = (value, i)
        if loss - best[0] < min_effect:
            stopped, rejected = "no effect", tried
            break
        kept[best[1]] = True
        loss = best[0]
        added.append(best[1])
    return kept, loss, added, stopped, rejected


def kept_log_alpha(log_alpha: Tensor, kept: Tensor, countable: Tensor) -> Tensor:
    """:func:`refined_log_alpha`, with every kept edge raised to at least an open mask
    (an edge the fill added may have been closed by the search; it keeps a small score)."""
    out = refined_log_alpha(log_alpha, kept, countable)
    k = kept.to(out.device).bool()
    out[k] = out[k].clamp(min=OPEN_LOG_ALPHA)
    return out


__all__ = [
    "OPEN_LOG_ALPHA",
    "REFINE_EXTRA",
    "REFINE_TRACES",
    "VALIDATION_Z",
    "Selection",
    "greedy_eliminate",
    "greedy_eliminate_joint",
    "verified_eliminate",
    "kept_log_alpha",
    "loss_function",
    "paired_difference",
    "open_countable",
    "pair_disagreement",
    "ranked_pool",
    "refined_log_alpha",
    "removal_costs",
    "select_edges",
]
