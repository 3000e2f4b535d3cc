"""Wait for a quiet machine before a benchmark, or refuse saying the load.

``scripts/bench_quiet.sh`` calls this before its first benchmark and between two (a
benchmark's own threads keep the 1-minute load average up for a minute after it ends)::

    python -m mechlab.bench.quiet --wait 600   # exit 0 once quiet, 2 if still busy after 600 s
    python -m mechlab.bench.quiet              # check once

Quiet is what :func:`mechlab.bench.record.load_verdict` asks of a run's start: the
1-minute load average and the other processes' running threads (sampled over a few
seconds) both at most :data:`~mechlab.bench.record.LOAD_PER_CORE` per core.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from mechlab.bench.record import _loadavg, _running_threads_elsewhere, load_limit, load_verdict


@dataclass(frozen=True)
class Load:
    """The machine's load now: 1-minute load average, other processes' running threads."""

    average: float | None
    others: float | None
    limit: float

    @property
    def reasons(self) -> list[str]:
        """Why the machine is busy (empty: it is quiet)."""
        avg = None if self.average is None else [self.average] * 3
        return [r.replace(" before the run", " now") for r in load_verdict(avg, None, self.others, 0)]

    def line(self) -> str:
        avg = "?" if self.average is None else f"{self.average:.2f}"
        others = "?" if self.others is None else f"{self.others:.1f}"
        return f"load average {avg}, other threads running {others} on average (limit {self.limit:.2f})"


def measure_load(sample_seconds: float = 5.0, interval: float = 0.5) -> Load:
    """The 1-minute load average, and other processes' running threads averaged over
    ``sample_seconds`` (this process's own are not counted)."""
    samples = []
    end = time.monotonic() + sample_seconds
    while True:
        n = _running_threads_elsewhere()
        if n is not None:
            samples.append(n)
        if time.monotonic() >= end:
            break
        time.sleep(interval)
    avg = _loadavg()
    return Load(None if avg is None else avg[0], sum(samples) / len(samples) if samples else None,
                load_limit(os.cpu_count()))  # fmt: skip


def wait_for_quiet(timeout: float, sample_seconds: float = 5.0, say: Callable[[str], None] = print,
                   every: float = 30.0) -> tuple[bool, Load]:  # fmt: skip
    """Measure the load until it is quiet or ``timeout`` seconds have passed.

    Returns:
        Whether the machine is quiet, and the last load measured.
    """
    start = time.monotonic()
    said = -every
    while True:
        load = measure_load(sample_seconds)
        waited = time.monotonic() - start
        if not load.reasons or waited >= timeout:
            return not load.reasons, load
        if waited - said >= every:
            say(f"waiting for a quiet machine ({waited:.0f} of {timeout:.0f} s): {load.line()}")
            said = waited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Wait for a quiet machine (load <= 0.5 per core), or refuse.")
    parser.add_argument("--wait", type=float, default=0.0, help="seconds to wait for quiet (0: check once)")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds over which other threads are sampled")
    args = parser.parse_args(argv)
    if args.wait < 0 or args.sample < 0:
        print("mechlab.bench.quiet: --wait and --sample take seconds >= 0", file=sys.stderr)
        return 2
    quiet, load = wait_for_quiet(args.wait, args.sample, say=lambda s: print(s, flush=True))
    if quiet:
        print(f"quiet: {load.line()}")
        return 0
    print(f"busy after waiting {args.wait:.0f} s: {'; '.join(load.reasons)}; stop the other jobs, or run "
          "with ALLOW_LOAD=1 to record provisional figures", file=sys.stderr)  # fmt: skip
    return 2


if __name__ == "__main__":
    sys.exit(main())
