"""Hard-concrete masks (Louizos, Welling & Kingma 2018), as edge pruning uses them.

Each mask has a location parameter ``log_alpha``. With temperature ``beta = 2/3`` and
stretch interval ``(l, r) = (-0.1, 1.1)``:

* training sample (reparameterised, ``u ~ U(0, 1)``)::

      s = sigmoid((log u - log(1 - u) + log_alpha) / beta)
      z = clamp(s (r - l) + l, 0, 1)

* deterministic mask (evaluation)::

      z_det = clamp(sigmoid(log_alpha) (r - l) + l, 0, 1)

  the test-time estimator of Louizos et al.; it is monotone in ``log_alpha``, which
  breaks its ties (many masks sit at exactly 0 or 1) when a threshold is chosen;

* probability that a sample is non-zero (the expected L0 norm, closed form)::

      P(z > 0) = sigmoid(log_alpha - beta log(-l / r))

Initialisation ``log_alpha ~ N(INIT_MEAN, 0.01^2)`` with ``INIT_MEAN = 5`` (our choice;
the paper uses 10, available as ``init_mean=10``). At 5 every mask still starts open
(deterministic mask 1, ``P(z > 0) = 0.9986``; about 3% of training samples start below 1),
but Adam at lr 0.1 needs half as many steps to bring a mask down to where it can close,
so the expected sparsity can follow its warm-up ramp instead of lagging it while the
Lagrange multipliers wind up. On the planted circuits of ``tests/prune/test_planted.py``
the paper's settings (lr 0.8 for masks and multipliers, init 10) recovered 6 of 8 at 200
steps, init 5 with lr 0.1 8 of 8 (docs/pruning.md, "Optimisation").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

BETA = 2.0 / 3.0
LIMIT_LEFT = -0.1
LIMIT_RIGHT = 1.1
INIT_MEAN = 5.0
INIT_STD = 0.01
_EPS = 1e-6


def init_log_alpha(
    n: int, generator: torch.Generator | None = None, mean: float | None = None
) -> Tensor:
    """``n`` location parameters drawn from ``N(mean, INIT_STD^2)`` (float32).

    Args:
        n: How many.
        generator: Source of randomness.
        mean: Default :data:`INIT_MEAN` (5).
    """
    mean = INIT_MEAN if mean is None else mean
    return mean + INIT_STD * torch.randn(n, generator=generator)


def uniform_noise(n: int, generator: torch.Generator | None = None, dtype=torch.float32) -> Tensor:
    """``u ~ U(eps, 1 - eps)`` for :func:`sample_mask` (kept away from 0 and 1)."""
    return torch.rand(n, generator=generator, dtype=dtype).clamp_(_EPS, 1 - _EPS)


def sample_mask(log_alpha: Tensor, u: Tensor) -> Tensor:
    """A hard-concrete training sample, differentiable in ``log_alpha``.

    Args:
        log_alpha: Location parameters, any shape.
        u: Uniform noise in ``(0, 1)``, same shape.

    Returns:
        ``z = clamp(sigmoid((log u - log(1-u) + log_alpha) / beta) (r - l) + l, 0, 1)``.
    """
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return (s * (LIMIT_RIGHT - LIMIT_LEFT) + LIMIT_LEFT).clamp(0.0, 1.0)


def stretched_mean(log_alpha: Tensor) -> Tensor:
    """``sigmoid(log_alpha) (r - l) + l``: the deterministic mask before clamping."""
    return torch.sigmoid(log_alpha) * (LIMIT_RIGHT - LIMIT_LEFT) + LIMIT_LEFT


def deterministic_mask(log_alpha: Tensor) -> Tensor:
    """The evaluation mask ``clamp(sigmoid(log_alpha) (r - l) + l, 0, 1)``."""
    return stretched_mean(log_alpha).clamp(0.0, 1.0)


def prob_nonzero(log_alpha: Tensor) -> Tensor:
    """``P(z > 0) = sigmoid(log_alpha - beta log(-l / r))``, the expected L0 of each mask."""
    return torch.sigmoid(log_alpha - BETA * math.log(-LIMIT_LEFT / LIMIT_RIGHT))


def expected_sparsity(log_alpha: Tensor, weight: Tensor | None = None) -> Tensor:
    """``1 - mean P(z > 0)``, differentiable.

    Args:
        log_alpha: ``[n]`` location parameters.
        weight: Optional ``[n]`` factors multiplying each ``P(z > 0)`` (e.g. the
            probability that the edge's writer node is kept).

    Returns:
        Scalar expected sparsity in ``[0, 1]``.
    """
    p = prob_nonzero(log_alpha)
    if weight is not None:
        p = p * weight
    return 1.0 - p.mean()


def target_schedule(step: int, target: float, warmup: int) -> float:
    """The sparsity target at ``step``: linear from 0 to ``target`` over ``warmup`` steps."""
    if warmup <= 0:
        return target
    return target * min(1.0, step / warmup)


def keep_count(n: int, sparsity: float) -> int:
    """How many of ``n`` items a sparsity of ``sparsity`` keeps (rounded to nearest)."""
    return int(round(n * (1.0 - sparsity)))


def bisect_threshold(
    scores: Tensor, n_keep: int, eligible: Tensor | None = None, iters: int = 200
) -> float:
    """Find ``tau`` such that ``(scores >= tau) & eligible`` keeps ``n_keep`` items, by bisection.

    ``scores`` are ranked as given (pass ``log_alpha``: it orders masks the same way as
    the deterministic mask, without the ties the clamp creates). When ties make
    ``n_keep`` unreachable, the threshold keeping the closest count from below
    (never more than asked) is returned.

    Args:
        scores: ``[n]`` ranking scores.
        n_keep: Number of items wanted.
        eligible: ``[n]`` bool, items that may be kept at all (default: all).
        iters: Bisection steps (float64).

    Returns:
        The threshold ``tau`` (a float; ``+inf`` when nothing is to be kept). Compare
        ``scores.double() >= tau``: ``tau`` may sit one float64 ulp above a tied score.
    """
    s = scores.detach().double().flatten()
    ok = torch.ones_like(s, dtype=torch.bool) if eligible is None else eligible.flatten()
    s = s[ok]
    if n_keep <= 0 or s.numel() == 0:
        return math.inf
    if n_keep >= s.numel():
        return float(s.min())
    lo, hi = float(s.min()), float(s.max()) + 1.0  # count(lo) = all >= n_keep > count(hi) = 0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if int((s >= mid).sum()) >= n_keep:
            lo = mid
        else:
            hi = mid
    # lo keeps >= n_keep, hi keeps < n_keep; lo keeps exactly n_keep unless tied scores
    return lo if int((s >= lo).sum()) == n_keep else hi
