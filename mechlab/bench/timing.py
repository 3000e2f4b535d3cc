"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch


def quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    """``(q1, median, q3)`` of ``xs`` (all three equal for a single value)."""
    if not xs:
        raise ValueError("quartiles of no values")
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    qs = statistics.quantiles(xs, n=4)
    return qs[0], statistics.median(xs), qs[2]


@dataclass
class Timing:
    """Median and spread of repeated runs of one thing, in seconds.

    ``median``, ``q1`` and ``q3`` are wall-clock times; ``cpu`` holds the process CPU
    time (user + system, every thread) of each run, which a busy machine inflates far
    less than the wall clock (it leaves out the time spent waiting for a core).
    """

    name: str
    median: float
    q1: float
    q3: float
    runs: int
    samples: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def cpu_median(self) -> float | None:
        """Median process CPU time of a run, or None when not recorded."""
        return statistics.median(self.cpu) if self.cpu else None

    def scaled(self, factor: float) -> Timing:
        """The same timing with every time multiplied by ``factor`` (per step, per item)."""
        return Timing(self.name, self.median * factor, self.q1 * factor, self.q3 * factor, self.runs,
                      [s * factor for s in self.samples], [c * factor for c in self.cpu])  # fmt: skip

    def to_dict(self) -> dict[str, object]:
        """Plain-Python form (seconds), for a benchmark's JSON record."""
        return {"median_s": self.median, "q1_s": self.q1, "q3_s": self.q3, "runs": self.runs,
                "samples_s": self.samples, "cpu_median_s": self.cpu_median, "cpu_s": self.cpu}  # fmt: skip


def timing_of(name: str, wall: Sequence[float], cpu: Sequence[float] = ()) -> Timing:
    """A :class:`Timing` from the wall-clock (and CPU) seconds of each run."""
    q1, med, q3 = quartiles(wall)
    return Timing(name, med, q1, q3, len(wall), list(wall), list(cpu))


def time_interleaved(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    device: str | torch.device | None = None,
) -> dict[str, Timing]:
    """Time several callables side by side, interleaving them run by run.

    Interleaving (a, b, c, a, b, c, ...) spreads drifts of the machine's speed
    over all contenders instead of favouring whichever ran first.

    Args:
        fns: Name -> zero-argument callable.
        repeats: Timed runs of each callable.
        warmup: Untimed runs of each callable first.
        device: The device the callables run on. On a CUDA device every timed run is
            bracketed by ``torch.cuda.synchronize``, so the time is that of the kernels
            it launched, not of their launch (CUDA runs asynchronously).

    Returns:
        Name -> Timing (median and quartiles of the timed runs, wall clock and the
        process CPU time of each run).
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    cuda = device is not None and torch.device(device).type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            sync()
            samples[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {name: timing_of(name, samples[name], cpu[name]) for name in fns}


def paired_ratio(a: Timing, b: Timing, cpu: bool = False) -> tuple[float, float, float]:
    """``(q1, median, q3)`` of ``a / b`` run by run (the i-th timed run of each, which
    :func:`time_interleaved` took side by side); the medians' ratio when no samples were kept."""
    xs, ys = (a.cpu, b.cpu) if cpu else (a.samples, b.samples)
    if not xs or len(xs) != len(ys):
        if cpu:
            ratio = a.cpu_median / b.cpu_median if a.cpu_median and b.cpu_median else float("nan")
        else:
            ratio = a.median / b.median
        return ratio, ratio, ratio
    return quartiles([x / y for x, y in zip(xs, ys, strict=True)])


def fmt_ms(t: Timing) -> str:
    """``"211.3 [205.0-220.1]"``: the median wall time and its quartiles, in milliseconds."""
    return f"{t.median * 1e3:.1f} [{t.q1 * 1e3:.1f}-{t.q3 * 1e3:.1f}]"


def fmt_ratio(spread: tuple[float, float, float], bold: bool = False) -> str:
    """``"1.23x [1.20-1.26]"``: a ratio's median and quartiles (``**1.23x**`` with ``bold``)."""
    q1, med, q3 = spread
    head = f"**{med:.2f}x**" if bold else f"{med:.2f}x"
    return f"{head} [{q1:.2f}-{q3:.2f}]"
