"""The N* search: the smallest training-set size at which a grid of runs converges.

N* is the smallest training-set size N for which at least one configuration of a grid
(the study's: lr in {1e-3, 1e-4, 1e-5} x seeds {10, 20, 30, 40, 50}) reaches validation
loss < epsilon. Success is assumed monotone in N (more data never hurts); the search
looks for the boundary between failing and succeeding N.

The study names a "hybrid binary-geometric" procedure (multiplier 1000, at most 20
steps, success moves to a smaller N, N_max 16M) without spelling it out. This one:

1. **Geometric phase.** Start at ``start`` (default ``n_min``). A failure multiplies N
   by ``multiplier`` (capped at the largest N available), a success divides it (floored
   at ``n_min``), until one failing and one succeeding N bracket N*.
2. **Binary phase.** Bisect the bracket ``(lo, hi]`` in log space: try the integer
   geometric mean of ``lo`` and ``hi``; a success makes it the new ``hi``, a failure the
   new ``lo``; stop when ``hi / lo <= resolution`` or ``hi == lo + 1`` (exact).

Every try is one step; at most ``max_steps`` steps. N* is the smallest succeeding N
tried (``hi``); the true boundary lies in ``(lo, hi]``. The outcomes:

- ``found``: a bracket was closed to the resolution (or to adjacent integers);
- ``bracketed``: the steps ran out while bisecting: N* lies in ``(lo, hi]``, and
  ``ratio = hi / lo`` says how close (N* is reported as ``hi``);
- ``at_min``: ``n_min`` itself succeeds, so N* <= ``n_min`` (reported as ``n_min``);
- ``not_reached``: the largest N available fails (no N* up to ``min(n_max, cap)``);
- ``exhausted``: the steps ran out before a bracket: N* is ``hi`` if some N succeeded
  (an upper bound) and ``None`` otherwise.

The search is a small state machine (:class:`NStarSearch`: :meth:`~NStarSearch.next_n`,
:meth:`~NStarSearch.record`), so a runner can drive many searches at once and replay a
finished one from stored trials.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import StrictFloat, StrictInt


@dataclass(frozen=True)
class SearchConfig:
    """Knobs of the N* search (the study's values are the defaults).

    Args:
        epsilon: A run succeeds when its validation loss is below this.
        multiplier: Factor of the geometric phase (> 1).
        n_min: Smallest N tried (>= 1).
        n_max: Largest N tried; also capped by the unique samples that exist.
        max_steps: Most grid evaluations (N values tried) per search.
        resolution: Stop bisecting once ``hi / lo <= resolution``; 1.0 bisects until
            ``hi == lo + 1`` or the steps run out.
        start: First N tried (default ``n_min``).
    """

    epsilon: StrictFloat = 1e-4
    multiplier: StrictFloat = 1000.0
    n_min: StrictInt = 1
    n_max: StrictInt = 16_000_000
    max_steps: StrictInt = 20
    resolution: StrictFloat = 1.0
    start: StrictInt | None = None

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be a positive number, got {self.epsilon}")
        if not (self.multiplier > 1 and math.isfinite(self.multiplier)):
            raise ValueError(f"multiplier must be > 1, got {self.multiplier}")
        if self.n_min < 1:
            raise ValueError(f"n_min must be >= 1, got {self.n_min}")
        if self.n_max < self.n_min:
            raise ValueError(f"n_max ({self.n_max}) must be >= n_min ({self.n_min})")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not (self.resolution >= 1 and math.isfinite(self.resolution)):
            raise ValueError(f"resolution must be >= 1 (a ratio hi/lo), got {self.resolution}")
        if self.start is not None and not (self.n_min <= self.start <= self.n_max):
            raise ValueError(f"start ({self.start}) must lie in [n_min, n_max] = [{self.n_min}, {self.n_max}]")


@dataclass
class SearchResult:
    """What one N* search found.

    Attributes:
        n_star: The smallest succeeding N tried, or ``None`` if none succeeded.
        status: ``found``, ``bracketed``, ``at_min``, ``not_reached`` or ``exhausted``
            (module docs).
        lo: Largest failing N tried (``None`` if none failed).
        hi: Smallest succeeding N tried (``None`` if none succeeded); equals ``n_star``.
        cap: The largest N available: ``min(n_max, unique samples)``.
        steps: Grid evaluations made.
        ratio: ``hi / lo`` when both exist: the resolution reached.
        history: ``[(N, success), ...]`` in the order tried.
    """

    n_star: int | None
    status: str
    lo: int | None
    hi: int | None
    cap: int
    steps: int
    ratio: float | None
    history: list[tuple[int, bool]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = asdict(self)
        out["history"] = [[n, ok] for n, ok in self.history]
        return out


class NStarSearch:
    """The search as a state machine: ask :meth:`next_n`, run the grid there, :meth:`record`.

    Args:
        config: The search's knobs.
        cap: Unique training samples that exist (``None``: unlimited); N never exceeds
            ``min(config.n_max, cap)``.

    Raises:
        ValueError: ``cap`` smaller than ``config.n_min`` (no N can be tried).
    """

    def __init__(self, config: SearchConfig, cap: int | None = None) -> None:
        self.config = config
        limit = config.n_max if cap is None else min(config.n_max, int(cap))
        if limit < config.n_min:
            raise ValueError(
                f"N_min {config.n_min} is larger than the {limit} unique training samples that exist"
            )
        self.cap = limit
        self.lo: int | None = None
        self.hi: int | None = None
        self.history: list[tuple[int, bool]] = []
        self._status: str | None = None
        start = config.n_min if config.start is None else config.start
        self._next: int | None = min(start, self.cap)

    @property
    def done(self) -> bool:
        """Whether the search has finished."""
        return self._status is not None

    def next_n(self) -> int | None:
        """The N to evaluate next, or ``None`` when the search has finished."""
        return None if self.done else self._next

    def record(self, n: int, success: bool) -> None:
        """Record the grid's outcome at ``n`` (which must be :meth:`next_n`) and move on.

        Args:
            n: The N just evaluated.
            success: Whether at least one configuration reached loss < epsilon.
        """
        if self.done or n != self._next:
            raise ValueError(f"record({n}) out of turn: the search expects {self.next_n()}")
        cfg = self.config
        self.history.append((n, bool(success)))
        if success:
            self.hi = n if self.hi is None else min(self.hi, n)
        else:
            self.lo = n if self.lo is None else max(self.lo, n)
        if success and self.hi == cfg.n_min:
            return self._finish("at_min")
        if not success and self.lo == self.cap:
            return self._finish("not_reached")
        if self.lo is not None and self.hi is not None:  # bracketed: bisect in log space
            if self.hi - self.lo <= 1 or self.hi / self.lo <= cfg.resolution:
                return self._finish("found")
            mid = int(round(math.sqrt(self.lo * self.hi)))
            self._next = min(max(mid, self.lo + 1), self.hi - 1)
        elif success:  # geometric phase, moving down
            self._next = max(cfg.n_min, int(math.floor(n / cfg.multiplier)))
        else:  # geometric phase, moving up
            self._next = min(self.cap, int(math.ceil(n * cfg.multiplier)))
        if len(self.history) >= cfg.max_steps:
            self._finish("bracketed" if self.lo is not None and self.hi is not None else "exhausted")

    def _finish(self, status: str) -> None:
        self._status = status
        self._next = None

    def result(self) -> SearchResult:
        """The outcome (call when :attr:`done`)."""
        if not self.done:
            raise ValueError("the search has not finished; keep calling next_n() and record()")
        ratio = self.hi / self.lo if self.hi is not None and self.lo is not None else None
        return SearchResult(
            n_star=self.hi, status=self._status, lo=self.lo, hi=self.hi, cap=self.cap,
            steps=len(self.history), ratio=ratio, history=list(self.history),
        )  # fmt: skip


def search_n_star(
    succeeds: Callable[[int], bool], config: SearchConfig | None = None, cap: int | None = None
) -> SearchResult:
    """Run one N* search with a callable that evaluates the whole grid at N.

    Args:
        succeeds: ``succeeds(N)`` -> whether any configuration reaches loss < epsilon.
        config: The search's knobs (default: the study's).
        cap: Unique training samples that exist (``None``: unlimited).

    Returns:
        The :class:`SearchResult`.
    """
    search = NStarSearch(config or SearchConfig(), cap=cap)
    while (n := search.next_n()) is not None:
        search.record(n, succeeds(n))
    return search.result()
