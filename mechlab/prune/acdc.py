"""A greedy ACDC-style search (Conmy et al. 2023) on the pruning graph, within an edge budget.

One *pass* at threshold ``tau``: start from the full graph ``H`` (every mask 1) and visit
the countable edges from the read-out backwards (readers in reverse forward order, each
reader's writers latest first); remove edge ``k`` when

    m(H without k) - m(H) < tau

(``m`` the metric of :class:`~mechlab.prune.attribution.Objective`: edge pruning's task
loss by default), and keep it otherwise. The edge's *score* is that difference, the
effect of removing it given the edges removed before it. Each pass costs one masked
forward of the traces per countable edge, so the search is refused above
:data:`ACDC_MAX_EDGES` countable edges (pass ``max_edges`` to lift the limit knowingly).

To meet a budget of ``n`` edges (:func:`acdc_search` without ``tau``), ``tau`` is found by
geometric bisection between ``1e-6`` and ``1`` times the total effect ``m(0) - m(1)``
(raised tenfold while even that keeps too many): the pass that keeps the most edges
without exceeding ``n`` is returned, after at most ``passes`` passes (the number kept is
not strictly monotone in ``tau``, so the budget may be missed by a few edges; the
circuit is then smaller and its metadata says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mechlab.progress import tqdm
from mechlab.prune.objective import DEFAULT_BATCH_SIZE, Objective, metric_value

ACDC_MAX_EDGES = 400
ACDC_PASSES = 12


@dataclass
class AcdcResult:
    """What the search keeps.

    Attributes:
        kept: ``[n_edges]`` bool, the edges left after the pass chosen.
        scores: ``[n_edges]`` float64, each countable edge's removal effect in that pass.
        tau: Its threshold.
        passes: Every pass run: ``tau`` and ``n_kept``.
    """

    kept: Tensor
    scores: Tensor
    tau: float
    passes: list[dict[str, float]] = field(default_factory=list)


def check_acdc_size(n_countable: int, max_edges: int | None = None) -> None:
    """One-line ValueError when the graph is too large for ACDC."""
    limit = ACDC_MAX_EDGES if max_edges is None else max_edges
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_edges must be a positive integer, got {max_edges!r}")
    if n_countable > limit:
        raise ValueError(
            f"ACDC runs one forward pass per edge and pass; this graph has {n_countable} countable "
            f"edges, above its limit of {limit}: use method 'exact' or 'eap-ig', or pass "
            "max_edges to lift the limit"
        )


@torch.no_grad()
def acdc_pass(
    obj: Objective, tau: float, batch_size: int = DEFAULT_BATCH_SIZE, progress: bool = False
) -> tuple[Tensor, Tensor]:
    """One greedy pass at threshold ``tau`` (module docstring).

    Returns:
        ``(kept [n_edges] bool, scores [n_edges] float64)``; edges that cannot matter are
        never visited (kept False, score 0).
    """
    n = obj.graph.n_edges
    z = torch.ones(n)
    scores = torch.zeros(n, dtype=torch.float64)
    current = metric_value(obj, z, batch_size)
    order = obj.countable.nonzero().flatten().flip(0).tolist()  # from the read-out backwards
    for k in tqdm(order, disable=not progress, desc=f"acdc tau={tau:.3g}", unit="edge"):
        z[k] = 0.0
        value = metric_value(obj, z, batch_size)
        scores[k] = value - current
        if value - current < tau:
            current = value
        else:
            z[k] = 1.0
    return z.bool() & obj.countable.cpu(), scores


def acdc_search(
    obj: Objective,
    n_keep: int,
    tau: float | None = None,
    *,
    passes: int = ACDC_PASSES,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
) -> AcdcResult:
    """ACDC at threshold ``tau``, or at the threshold that keeps at most ``n_keep`` edges.

    Args:
        obj: The objective (model frozen, eval mode).
        n_keep: The edge budget (used to choose ``tau`` when it is None).
        tau: A fixed threshold (in metric units), or None to search for one.
        passes: Most passes of the search.
        batch_size: Traces per pass.
        progress: Show progress bars.

    Returns:
        The :class:`AcdcResult`.
    """
    if tau is not None:
        kept, scores = acdc_pass(obj, tau, batch_size, progress)
        return AcdcResult(kept, scores, tau, [{"tau": tau, "n_kept": int(kept.sum())}])
    n = obj.graph.n_edges
    total = metric_value(obj, torch.zeros(n), batch_size) - metric_value(
        obj, torch.ones(n), batch_size
    )
    if not total > 0:
        raise ValueError(
            f"ablating every edge changes the metric by {total:.3g}: ACDC has nothing to keep; "
            "use another ablation or target"
        )
    history: list[dict[str, float]] = []
    best: AcdcResult | None = None

    def run(t: float) -> int:
        nonlocal best
        kept, scores = acdc_pass(obj, t, batch_size, progress)
        count = int(kept.sum())
        history.append({"tau": t, "n_kept": count})
        if count <= n_keep and (best is None or count > int(best.kept.sum())):
            best = AcdcResult(kept, scores, t)
        return count

    lo, hi = 1e-6 * total, total
    if run(lo) > n_keep:
        for _ in range(3):  # raise hi until a pass fits the budget
            if run(hi) <= n_keep or len(history) >= passes:
                break
            lo, hi = hi, 10 * hi
        while len(history) < passes and best is not None and int(best.kept.sum()) < n_keep:
            mid = math.sqrt(lo * hi)
            if run(mid) <= n_keep:
                hi = mid
            else:
                lo = mid
    if best is None:  # nothing fitted: the last pass's edges, the highest-scored first
        kept, scores = acdc_pass(obj, hi, batch_size, progress)
        best = AcdcResult(kept, scores, hi)
        history.append({"tau": hi, "n_kept": int(kept.sum())})
    best.passes = history
    return best


def acdc_settings(result: AcdcResult) -> dict[str, Any]:
    """Plain values for a circuit's metadata."""
    return {
        "tau": result.tau,
        "passes": list(result.passes),
        "n_kept_by_acdc": int(result.kept.sum()),
    }
