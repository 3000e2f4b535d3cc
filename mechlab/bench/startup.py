"""How long the `mechlab` command takes to answer: ``--help`` of the command and each subcommand,
and ``import mechlab``, each in a fresh Python process (medians over repeats)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from mechlab.bench.record import Table

COMMANDS = ("", "report", "train", "eval", "recall", "prune", "view", "overlap", "curve", "info")


@dataclass
class StartupResult:
    """Median and range of wall seconds per measured command line."""

    medians: dict[str, float]
    ranges: dict[str, tuple[float, float]]
    repeats: int

    def format_table(self) -> str:
        rows = [f"{'command':28s} {'median s':>9s} {'min-max s':>12s}"]
        for name, median in self.medians.items():
            lo, hi = self.ranges[name]
            rows.append(f"{name:28s} {median:9.2f} {lo:6.2f}-{hi:5.2f}")
        return "\n".join(rows)

    def table(self) -> Table:
        """The result as a :class:`~mechlab.bench.record.Table`."""
        cells = [[f"`{name}`", f"{m:.2f}", f"{self.ranges[name][0]:.2f}-{self.ranges[name][1]:.2f}"]
                 for name, m in self.medians.items()]  # fmt: skip
        values = [{"command": name, "median_s": m, "min_s": self.ranges[name][0], "max_s": self.ranges[name][1]}
                  for name, m in self.medians.items()]  # fmt: skip
        return Table(["command line", "median s", "min-max s"], cells, values=values)


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def bench_startup(repeats: int = 5, commands: tuple[str, ...] = COMMANDS) -> StartupResult:
    """Time ``mechlab [COMMAND] --help`` and ``import mechlab`` in fresh processes.

    Args:
        repeats: Runs of each (after one warm-up run that fills the file cache).
        commands: Subcommands ("" for the top-level help).

    Returns:
        The :class:`StartupResult`.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats}")
    lines = {"import mechlab": [sys.executable, "-c", "import mechlab"]}
    for command in commands:
        name = f"mechlab {command} --help".replace("  ", " ")
        lines[name] = [sys.executable, "-m", "mechlab.cli", *([command] if command else []), "--help"]
    medians, ranges = {}, {}
    for name, argv in lines.items():
        _wall(argv)  # warm-up
        times = [_wall(argv) for _ in range(repeats)]
        medians[name] = statistics.median(times)
        ranges[name] = (min(times), max(times))
    return StartupResult(medians, ranges, repeats)
