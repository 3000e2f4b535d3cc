"""Sizes checked before anything is allocated.

Every count a user or a file can set (traces, trials, batch sizes, moduli, graph
sizes read from a circuit file, task sizes read from a checkpoint) ends up as the
shape of a tensor or an array. :func:`check_elements` multiplies the planned shape
out in Python integers (so ``10**12`` traces cost nothing) and refuses it above
the limit with one line naming the counts and what to lower, before any memory is
asked for: a count of ``10**12`` is refused in microseconds, not after a 32 TB
allocation attempt.

The limit is :data:`MAX_ELEMENTS` = 2**31 elements (8 GiB of float32), or the
environment variable ``MECHLAB_MAX_ELEMENTS``; the model registry applies the same
limit to the parameters a model config describes
(:func:`mechlab.models.registry.check_size`).

This module imports nothing of mechlab: every layer may call it.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Mapping

# 2**31 float32 elements are 8 GiB; the study's largest preset has about 1.1e7
# parameters and its largest evaluation batch about 1e8 elements.
MAX_ELEMENTS = 2**31
MAX_ELEMENTS_ENV = "MECHLAB_MAX_ELEMENTS"


def max_elements() -> int:
    """The size limit in force: ``MECHLAB_MAX_ELEMENTS`` if set, else :data:`MAX_ELEMENTS`.

    Raises:
        ValueError: The environment variable is set but not a positive number.
    """
    raw = os.environ.get(MAX_ELEMENTS_ENV)
    if raw is None or not raw.strip():
        return MAX_ELEMENTS
    try:
        number = float(raw)
        value = int(number) if math.isfinite(number) else 0
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(
            f"{MAX_ELEMENTS_ENV}={raw!r} is not a positive number of elements; unset it or give "
            "e.g. 4e9"
        )
    return value


def count(name: str, value: object, *, minimum: int = 0) -> int:
    """``value`` as an int, refusing booleans, floats and anything below ``minimum``.

    Args:
        name: What the count is, for the message (``"n_traces"``).
        value: The count.
        minimum: The smallest value allowed.

    Returns:
        The count.

    Raises:
        ValueError: Not an integer, or below ``minimum``.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = operator.index(value)  # ints and numpy integers; never a float
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def check_elements(
    what: str,
    sizes: Mapping[str, int],
    *,
    lower: str | None = None,
    limit: int | None = None,
) -> int:
    """Refuse a planned allocation of ``prod(sizes)`` elements above the size limit.

    Args:
        what: What would be allocated (``"needle-in-a-haystack traces"``).
        sizes: The factors of its shape, by name, in the order they are shown
            (``{"traces": n, "positions": T, "width": d_in}``); each a count >= 0.
        lower: What the message tells the user to lower (default: the largest
            factor's name).
        limit: Most elements allowed (default :func:`max_elements`).

    Returns:
        The number of elements.

    Raises:
        ValueError: One line: the allocation, its factors, the limit and what to lower
            (or how to raise the limit); also a factor that is not a count.
    """
    factors = {name: count(name, value) for name, value in sizes.items()}
    n = math.prod(factors.values())
    limit = max_elements() if limit is None else int(limit)
    if n > limit:
        shown = " x ".join(f"{name} {_short(value)}" for name, value in factors.items())
        if lower is None:
            lower = max(factors, key=factors.__getitem__)
        raise ValueError(
            f"{what} would hold {shown} = {n:.3g} elements ({n * 4 / 2**30:,.1f} GiB in float32), "
            f"more than the limit {limit:.3g}; lower {lower}, or if you mean it raise the limit "
            f"with {MAX_ELEMENTS_ENV}={n}"
        )
    return n


def _short(value: int) -> str:
    return str(value) if value < 10**6 else f"{value:.3g}"
