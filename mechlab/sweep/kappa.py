"""The sharing coefficient kappa and the out-of-distribution (OOD) summary.

kappa = sum over n = 2..L of N*_n / N*_joint, where N*_n is the N* of training and
validating on length n alone (``lengths="fixed"``, ``L=n``) and N*_joint that of all
lengths together (``lengths="uniform"`` over 2..L, or ``short_to_long``). kappa >> 1:
the lengths share what is learned; about 1: each length is learned on its own; < 1: the
lengths interfere.

A search that did not reach N* makes kappa a bound (:func:`kappa`):

- some N*_n not reached (each failed up to its largest N ``lo``): the numerator is at
  least the sum with ``lo + 1`` in their place, so kappa is a **lower** bound;
- N*_joint not reached: the denominator is at least ``lo_joint + 1``, so kappa is an
  **upper** bound;
- both: kappa is **undefined** (``None``);
- a search that stopped with no success at all for another reason (``exhausted``
  before any success) counts as not reached.

``kappa_range`` gives the interval the brackets allow: each true N* lies in
``(lo, hi]`` (``[1, hi]`` when nothing failed; ``(lo, inf)`` when not reached), so the
smallest kappa is ``sum(lo_n + 1) / hi_joint`` and the largest ``sum(hi_n) / (lo_joint + 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mechlab.sweep.search import SearchResult


@dataclass(frozen=True)
class Kappa:
    """kappa for one (model, format, m, L).

    Attributes:
        value: The point estimate (from the N* values, or the bounds' stand-ins), or
            ``None`` when undefined.
        bound: ``exact``, ``lower``, ``upper`` or ``undefined``.
        low: The smallest kappa the brackets allow (``None``: undefined).
        high: The largest kappa the brackets allow (``math.inf`` when unbounded).
        numerator: The sum over n of N*_n used for ``value``.
        denominator: N*_joint used for ``value``.
    """

    value: float | None
    bound: str
    low: float | None
    high: float | None
    numerator: int | None
    denominator: int | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (an infinite ``high`` becomes ``None``)."""
        out = asdict(self)
        if out["high"] is not None and math.isinf(out["high"]):
            out["high"] = None
        return out


def _reached(r: SearchResult) -> bool:
    return r.n_star is not None


def _interval(r: SearchResult) -> tuple[int, float]:
    """Where the true N* lies, as [smallest, largest] integers (largest may be inf)."""
    lowest = 1 if r.lo is None else r.lo + 1
    highest = math.inf if r.hi is None else r.hi
    return lowest, highest


def kappa(per_length: Mapping[int, SearchResult], joint: SearchResult, L: int) -> Kappa:
    """kappa = sum over n = 2..L of N*_n / N*_joint, with not-reached searches as bounds.

    Args:
        per_length: n -> the N* search on length n alone, for every n in 2..L.
        joint: The N* search on all lengths together.
        L: The longest length.

    Returns:
        The :class:`Kappa` (value, bound kind and the range the brackets allow).

    Raises:
        ValueError: a length in 2..L has no search.
    """
    missing = [n for n in range(2, L + 1) if n not in per_length]
    if missing:
        raise ValueError(f"kappa needs N*_n for every n in 2..{L}; missing n = {missing}")
    results = [per_length[n] for n in range(2, L + 1)]
    num_open = any(not _reached(r) for r in results)
    den_open = not _reached(joint)
    # Stand-ins for not-reached searches: their bound lo + 1 (N* is larger than lo).
    numerator = sum(r.n_star if _reached(r) else (r.lo or 0) + 1 for r in results)
    denominator = joint.n_star if not den_open else (joint.lo or 0) + 1
    intervals = [_interval(r) for r in results]
    j_low, j_high = _interval(joint)
    low = sum(a for a, _ in intervals) / j_high if not math.isinf(j_high) else 0.0
    high = sum(b for _, b in intervals) / j_low
    if num_open and den_open:
        return Kappa(None, "undefined", None, None, None, None)
    bound = "lower" if num_open else "upper" if den_open else "exact"
    return Kappa(numerator / denominator, bound, low, high, numerator, denominator)


@dataclass(frozen=True)
class OodSummary:
    """OOD accuracy (at twice the longest training length, chance-normalised) of one
    model trained at one N: the grid's configuration with the lowest validation loss.

    Attributes:
        n_train: The training-set size.
        token_acc: Chance-normalised per-token accuracy of the chosen configuration.
        seq_acc: Chance-normalised per-sequence accuracy of the chosen configuration.
        best_token_acc: The largest per-token value over the grid.
        lr: Learning rate of the chosen configuration.
        seed: Seed of the chosen configuration.
        val_loss: Its validation loss.
        n_configs: Configurations at this N with an OOD value.
    """

    n_train: int
    token_acc: float
    seq_acc: float
    best_token_acc: float
    lr: float
    seed: int
    val_loss: float
    n_configs: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def _spec_value(trial: Mapping[str, Any], key: str) -> Any:
    spec = trial.get("spec") or {}
    return spec.get(key, trial.get(key))


def ood_summary(trials: Sequence[Mapping[str, Any]]) -> OodSummary | None:
    """Summarise OOD over the trials of one model at its largest N.

    Takes the trials with the largest ``n_train`` among those that report OOD, and the
    configuration with the lowest validation loss there (ties: the smallest lr, then the
    smallest seed).

    Args:
        trials: Trial results (``run_trial``'s dicts, each with its ``spec``).

    Returns:
        The :class:`OodSummary`, or ``None`` when no trial reports OOD accuracy.
    """
    scored = [t for t in trials if t.get("ood_token_acc") is not None]
    if not scored:
        return None
    n = max(int(_spec_value(t, "n_train")) for t in scored)
    at_n = [t for t in scored if int(_spec_value(t, "n_train")) == n]
    at_n.sort(key=lambda t: (_spec_value(t, "lr"), _spec_value(t, "seed")))
    best = min(at_n, key=lambda t: float(t["val_loss"]))
    return OodSummary(
        n_train=n, token_acc=float(best["ood_token_acc"]), seq_acc=float(best["ood_seq_acc"]),
        best_token_acc=max(float(t["ood_token_acc"]) for t in at_n), lr=float(_spec_value(best, "lr")),
        seed=int(_spec_value(best, "seed")), val_loss=float(best["val_loss"]), n_configs=len(at_n),
    )  # fmt: skip
