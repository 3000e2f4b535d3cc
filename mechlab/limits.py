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

Some counts are bounded on their own, because what they cost is time or Python objects
rather than one tensor (each bound names itself in its message, and says what to lower):

* :data:`MAX_PROMPT_PAIRS` lines of a prompt-pair file (each a Python dict before any
  tensor), and :data:`MAX_PAIR_FILE_BYTES` bytes of it;
* :data:`MAX_IG_STEPS` integration points of EAP-IG (each a forward and backward pass);
* :data:`MAX_STATES` elements of a state-tracking group (one token each: the model's
  embedding, read-out and every logit tensor grow with it) and
  :data:`MAX_SEQUENCE_LENGTH` elements per state-tracking sequence (checking a task
  counts its sequences at every length up to ``L``, a sweep with kappa runs a search at
  each, and the models read ``ood_factor * L`` elements);
* :func:`max_threads` CPU threads (:data:`THREADS_PER_CPU` per core the machine has).

This module imports nothing of mechlab: every layer may call it.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Mapping
from pathlib import Path

# 2**31 float32 elements are 8 GiB; the study's largest preset has about 1.1e7
# parameters and its largest evaluation batch about 1e8 elements.
MAX_ELEMENTS = 2**31
MAX_ELEMENTS_ENV = "MECHLAB_MAX_ELEMENTS"

# A pair file of the study holds a few hundred pairs of tens of tokens; IOI studies use a
# few thousand. 10**5 pairs are about 100 MB of Python objects before any tensor.
MAX_PROMPT_PAIRS = 100_000
MAX_PAIR_FILE_BYTES = 256 << 20
# EAP-IG uses 5 to 100 points in the literature (mechlab's default is 10).
MAX_IG_STEPS = 10_000
# The study's groups have 2 to 120 elements; 2**14 keeps a model's embedding and read-out
# (and a default batch's logits) to tens of millions of elements.
MAX_STATES = 2**14
# The study's lengths are 2 to 64; checking a sweep at L = 4096 takes about a second
# (the check grows as L**2.6: a day at L = 10**6).
MAX_SEQUENCE_LENGTH = 4096
# More threads than cores only queue; torch segfaults creating 10**5 of them.
THREADS_PER_CPU = 4


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


def available_memory(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Bytes of memory this process can still be given, or None where that cannot be read.

    ``MemAvailable`` plus ``SwapFree`` of ``/proc/meminfo`` (Linux), and no more than a
    cgroup v2 limit leaves (``memory.max`` less ``memory.current``, where set): what the
    kernel can hand out before its out-of-memory killer ends the process, which on Linux
    happens when the memory is first written, not when it is asked for.

    Args:
        meminfo: The meminfo file (a test's own).
        cgroup: The cgroup v2 folder (a test's own).
    """
    try:
        fields = dict(line.split(":", 1) for line in Path(meminfo).read_text().splitlines() if ":" in line)
        free = (int(fields["MemAvailable"].split()[0]) + int(fields.get("SwapFree", "0 kB").split()[0])) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None
    try:
        limit = (Path(cgroup) / "memory.max").read_text().strip()
        if limit != "max":
            used = int((Path(cgroup) / "memory.current").read_text().strip())
            free = min(free, max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return free


def check_memory(what: str, n_bytes: int, *, lower: str, available: int | None = None) -> None:
    """Refuse a planned allocation on the CPU of more bytes than the machine has free.

    A lower bound of what the work needs (the one tensor it cannot do without) is checked,
    so that a refusal is certain to be right: what passes may still need more.

    Args:
        what: What would be allocated (``"the corrupted traces' writer outputs"``).
        n_bytes: Its size in bytes.
        lower: What the message tells the user to lower.
        available: Free bytes (default :func:`available_memory`; None there: not checked).

    Raises:
        ValueError: One line: the size, what is free, what to lower.
    """
    free = available_memory() if available is None else available
    if free is not None and n_bytes > free:
        raise ValueError(
            f"{what} would need {_size(n_bytes)}, more than the {_size(free)} this machine has "
            f"free; lower {lower}, or run on a device with more memory (--device cuda)"
        )


def _size(n_bytes: int) -> str:
    """Bytes for a message: ``4.1 GB``, ``369 MB``, ``12 kB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:,.1f} {unit}" if unit == "GB" else f"{n_bytes / scale:,.0f} {unit}"
    return f"{n_bytes / 1e3:,.0f} kB"


def check_at_most(name: str, value: object, limit: int, why: str, *, minimum: int = 0) -> int:
    """``value`` as a count (:func:`count`), refused above ``limit`` with one line.

    Args:
        name: What the count is, as the user gave it (``"--ig-steps"``, ``"m"``).
        value: The count.
        limit: The largest value allowed.
        why: What the count costs, ending the message (``"each point is a forward and
            backward pass"``).
        minimum: The smallest value allowed.

    Returns:
        The count.

    Raises:
        ValueError: Not a count, below ``minimum`` or above ``limit``.
    """
    number = count(name, value, minimum=minimum)
    if number > limit:
        raise ValueError(
            f"{name} {_short(number)} is more than mechlab's limit of {limit:,} ({why}); lower {name}"
        )
    return number


def max_threads() -> int:
    """The most CPU threads a command may ask for: :data:`THREADS_PER_CPU` per core of
    ``os.cpu_count()`` (1 core when unknown)."""
    return THREADS_PER_CPU * (os.cpu_count() or 1)


def check_threads(threads: object, name: str = "--threads") -> int:
    """A thread count, refused (one line) below 1 or above :func:`max_threads`, before
    torch is asked for it."""
    number = count(name, threads, minimum=1)
    cores = os.cpu_count() or 1
    if number > max_threads():
        raise ValueError(
            f"{name} {_short(number)} is more than {max_threads()} ({THREADS_PER_CPU} per CPU core; this "
            f"machine has {cores}); give at most {max_threads()}, or leave {name} out for torch's default"
        )
    return number


def _short(value: int) -> str:
    return str(value) if value < 10**6 else f"{value:.3g}"
