"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Timing:
    """Median and spread of repeated runs of one thing, in seconds."""

    name: str
    median: float
    q1: float
    q3: float
    runs: int


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
        Name -> Timing (median and quartiles of the timed runs).
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
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            samples[name].append(time.perf_counter() - start)
    out = {}
    for name, xs in samples.items():
        qs = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
        out[name] = Timing(name, statistics.median(xs), qs[0], qs[2], len(xs))
    return out
