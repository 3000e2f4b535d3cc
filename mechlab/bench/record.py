"""How a benchmark was measured, recorded beside what it measured.

Every ``mechlab bench`` run is wrapped in a :class:`Recorder`: it notes the load average
before and after, samples how many *other* threads wanted a core while the run went on
(``/proc/stat``'s running count less the running threads of this process and its
children, twice a second: well under 1% of a core), and the machine: CPU model and
cores, torch and its BLAS/LAPACK build (``torch.__config__.show()``), torch's intra- and
inter-op threads, the device; and the code: the commit it ran from and the files of its
benchmark that differed from it (:func:`code_state`), so that :mod:`mechlab.bench.stale`
can tell when the code has changed since.

A run is **provisional** (its figures say so wherever they are printed or rendered,
:mod:`mechlab.bench.tables`) when any of these exceeds :data:`LOAD_PER_CORE` (0.5) per
core, 1.0 on a 2-core machine:

- the 1-minute load average before the run;
- the 1-minute load average after it, less the run's own threads (a benchmark's own
  threads raise the load average to about their number within a minute);
- the threads of other processes running, sampled through the run (Linux).

A benchmark run right after another starts at the load the first left (the 1-minute
average decays by e in a minute): ``scripts/bench_quiet.sh`` waits between runs until it
is below the limit (:mod:`mechlab.bench.quiet`).

A run's :class:`BenchRecord` prints as a header plus its tables and writes as JSON
(:meth:`BenchRecord.to_json`; ``mechlab bench ... --json PATH`` writes it under the output
policy of :mod:`mechlab.pipelines.outputs`: atomically, never over an existing file unless
``--force``, never over a checkpoint, an input or a device); :mod:`mechlab.bench.tables` renders those files into docs/benchmarks.md.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlab.bench import gitstate
from mechlab.bench.code_paths import code_paths

LOAD_PER_CORE = 0.5  # load per core (before, after less the run's threads, others' threads): above it, provisional
SCHEMA = "mechlab-bench/1"
SAMPLE_SECONDS = 0.5
TREE_SECONDS = 5.0  # how often the sampler looks for new child processes (a /proc scan)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch_build() -> dict[str, str]:
    """torch's version and the BLAS, LAPACK, oneDNN and OpenMP it was built with."""
    # lazy: mechlab.cli imports this module, and mechlab --help runs without torch
    import torch

    show = torch.__config__.show()
    out = {"torch": torch.__version__}
    for key, pattern in (("blas", r"BLAS_INFO=([^,\s]+)"), ("lapack", r"LAPACK_INFO=([^,\s]+)"),
                         ("cpu_capability", r"CPU capability usage: (\S+)")):  # fmt: skip
        m = re.search(pattern, show)
        out[key] = m.group(1) if m else "unknown"
    for line in show.splitlines():
        line = line.strip().lstrip("- ")
        if "Math Kernel Library" in line or "OpenBLAS" in line:
            out["blas_build"] = line
        elif line.startswith(("Intel(R) MKL-DNN", "oneDNN")):
            out["onednn"] = line
        elif line.startswith("OpenMP"):
            out["openmp"] = line
    return out


def code_state(bench: str | None = None) -> dict[str, Any]:
    """The commit the benchmark measured: ``mechlab_commit`` (``git rev-parse HEAD``, with
    ``+changes`` when files that matter differ from it) and ``mechlab_changes`` (those files
    with their contents' git hashes), both None when mechlab does not run from a git
    checkout (an installed copy): then its records say "no commit recorded".

    The files that matter are ``bench``'s code paths (:mod:`mechlab.bench.code_paths`);
    with none declared, every tracked file under ``mechlab/``.
    """
    here = Path(__file__).resolve()
    root = gitstate.checkout_root(here.parent)
    if root is None or (root / "mechlab" / "bench" / "record.py").resolve() != here:
        return {"mechlab_commit": None, "mechlab_changes": None}
    commit = gitstate.head(root)
    changes = gitstate.uncommitted(root, (code_paths(bench) if bench else None) or ["mechlab"])
    if commit is None or changes is None:
        return {"mechlab_commit": None, "mechlab_changes": None}
    return {"mechlab_commit": commit + ("+changes" if changes else ""), "mechlab_changes": changes}


def machine_info(device: str = "cpu", bench: str | None = None) -> dict[str, Any]:
    """What a figure depends on: CPU, cores, torch's build, threads, device, and the code
    (:func:`code_state` of ``bench``)."""
    # lazy: mechlab.cli imports this module, and mechlab --help runs without torch
    import torch

    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        **_torch_build(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        **code_state(bench),
    }
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name(torch.device(device))
    return info


def _stat_fields(path: Path) -> list[str] | None:
    """The fields of a ``/proc/.../stat`` file after the command name (state first)."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _own_tree() -> list[int]:
    """This process and its descendants (a startup benchmark's subprocesses are its own work)."""
    me = os.getpid()
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry / "stat")
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [me]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _running_threads_elsewhere(tree: Sequence[int] | None = None) -> int | None:
    """Threads of other processes running or runnable now (Linux), or None: ``/proc/stat``'s
    running count less the running threads of this process and its descendants (``tree``,
    default :func:`_own_tree`)."""
    try:
        stat = Path("/proc/stat").read_text()
    except OSError:
        return None
    m = re.search(r"^procs_running (\d+)", stat, re.M)
    if m is None:
        return None
    ours = 0
    for pid in _own_tree() if tree is None else tree:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            fields = _stat_fields(task / "stat")
            ours += fields is not None and fields[0] == "R"
    return max(int(m.group(1)) - ours, 0)


class LoadMonitor:
    """Samples the other processes' running threads in a daemon thread while it is open."""

    def __init__(self, interval: float = SAMPLE_SECONDS):
        self.interval = interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        tree, scanned = _own_tree(), time.monotonic()
        while not self._stop.wait(self.interval):
            if time.monotonic() - scanned > TREE_SECONDS:
                tree, scanned = _own_tree(), time.monotonic()
            n = _running_threads_elsewhere(tree)
            if n is not None:
                self.samples.append(n)

    def __enter__(self) -> LoadMonitor:
        n = _running_threads_elsewhere()
        if n is not None:
            self.samples.append(n)
        self._thread = threading.Thread(target=self._run, daemon=True, name="mechlab-load")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def load_limit(cores: int | None = None) -> float:
    """The load above which a run is provisional: :data:`LOAD_PER_CORE` x the cores."""
    return LOAD_PER_CORE * (cores or os.cpu_count() or 1)


def load_verdict(before: Sequence[float] | None, after: Sequence[float] | None, others_mean: float | None,
                 own_threads: int, cores: int | None = None) -> list[str]:  # fmt: skip
    """Why a run is provisional (empty: it is not): each measure of other work above
    :func:`load_limit`, said with its value.

    Args:
        before: The load averages (1, 5, 15 minutes) before the run, or None.
        after: The load averages after it, or None.
        others_mean: Other processes' running threads, mean over the run, or None.
        own_threads: The threads the run itself kept busy (its torch threads).
        cores: The machine's cores (default: ``os.cpu_count()``).
    """
    cores = cores or os.cpu_count() or 1
    limit = load_limit(cores)
    reasons = []
    if before is not None and before[0] > limit:
        reasons.append(f"load average {before[0]:.2f} before the run")
    if after is not None and after[0] - own_threads > limit:
        reasons.append(f"load average {after[0]:.2f} after it, {after[0] - own_threads:.2f} beyond its own "
                       f"{own_threads} thread(s)")  # fmt: skip
    if others_mean is not None and others_mean > limit:
        reasons.append(f"other processes kept {others_mean:.1f} threads running on average")
    if reasons:
        reasons[-1] += f" (limit {limit:.2f}: {LOAD_PER_CORE:g} per core x {cores} cores)"
    return reasons


@dataclass
class Table:
    """One printed (and rendered) table: column names, formatted cells, and the numbers.

    ``values`` holds one dict of raw numbers per row (seconds, ratios, bytes), for
    anything that reads the JSON rather than the text.
    """

    columns: list[str]
    rows: list[list[str]]
    title: str = ""
    values: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """Left-aligned columns, two spaces apart (what the command prints)."""
        cells = [self.columns, *self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        lines = [self.title] if self.title else []
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
        return "\n".join(lines + self.notes)

    def markdown(self) -> str:
        """A Markdown table (what docs/benchmarks.md shows)."""
        def row(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        lines = [row(self.columns), "|" + "---|" * len(self.columns)] + [row(r) for r in self.rows]
        return "\n".join(lines)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Table:
        return cls(list(data["columns"]), [list(r) for r in data["rows"]], data.get("title", ""),
                   list(data.get("values", [])), list(data.get("notes", [])))  # fmt: skip


@dataclass
class BenchRecord:
    """One benchmark run: what ran, where, under what load, and its tables."""

    bench: str
    command: str
    settings: dict[str, Any]
    machine: dict[str, Any]
    load: dict[str, Any]
    started: str
    seconds: float
    tables: list[Table]
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def provisional(self) -> bool:
        return bool(self.load.get("provisional"))

    def load_line(self) -> str:
        """``load average 0.12 -> 1.05, other threads running 0.1 on average (max 2)``."""
        ld = self.load
        before = "?" if ld.get("before") is None else f"{ld['before'][0]:.2f}"
        after = "?" if ld.get("after") is None else f"{ld['after'][0]:.2f}"
        others = ld.get("others_mean")
        busy = "" if others is None else f", other threads running {others:.1f} on average (max {ld['others_max']})"
        return f"load average {before} -> {after}{busy}"

    def header(self) -> list[str]:
        """The lines printed above the tables."""
        m = self.machine
        lines = [
            f"{self.command}  ({self.started}, {self.seconds:.0f} s)",
            f"{m['cpu_model']}, {m['cores']} cores; torch {m['torch']} ({m['blas']} BLAS, {m['lapack']} LAPACK); "
            f"{m['threads']} intra-op / {m['interop_threads']} inter-op thread(s); device {m['device']}",
            self.load_line(),
            f"mechlab {m['mechlab_commit']}" if m.get("mechlab_commit")
            else "mechlab: no commit recorded (not run from a git checkout)",
        ]
        if self.provisional:
            why = "; ".join(self.load.get("reasons") or ["other work kept the machine busy"])
            lines.append(f"PROVISIONAL: {why}; rerun on a quiet machine for figures that count")
        return lines

    def text(self) -> str:
        return "\n".join(self.header() + [""] + [t.text() + "\n" for t in self.tables]).rstrip()

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "bench": self.bench, "command": self.command, "settings": self.settings,
                "machine": self.machine, "load": self.load, "provisional": self.provisional,
                "started": self.started, "seconds": self.seconds,
                "tables": [vars(t) for t in self.tables], "data": self.data}  # fmt: skip

    def to_json(self) -> str:
        """The record as the JSON text ``--json`` writes (indented, one final newline)."""
        return json.dumps(self.to_dict(), indent=1, default=str) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchRecord:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a mechlab benchmark record (schema {data.get('schema')!r}, expected {SCHEMA!r})")
        return cls(data["bench"], data["command"], data["settings"], data["machine"], data["load"],
                   data["started"], data["seconds"], [Table.from_dict(t) for t in data["tables"]],
                   data.get("data", {}))  # fmt: skip

    @classmethod
    def read(cls, path: str | Path) -> BenchRecord:
        return cls.from_dict(json.loads(Path(path).read_text()))


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed: ``mechlab bench hooks --threads 1`` (from ``sys.argv``)."""
    argv = list(sys.argv if argv is None else argv)
    prog = Path(argv[0]).name if argv else "mechlab"
    if prog in ("__main__.py", "-m", "-c") or prog.startswith("python"):
        prog = "mechlab"
    return " ".join([prog, *argv[1:]])


class Recorder:
    """Wraps one benchmark run: ``with Recorder("hooks", settings) as rec: ... rec.record(tables)``.

    Args:
        bench: The benchmark's name (``hooks``, ``prune``, ...).
        settings: Its options, as given.
        device: The device it runs on.
        command: The command line (default: this process's).
    """

    def __init__(self, bench: str, settings: dict[str, Any], device: str = "cpu", command: str | None = None):
        self.bench = bench
        self.settings = settings
        self.device = device
        self.command = command_line() if command is None else command
        self._monitor = LoadMonitor()
        self._start = 0.0
        self.before: list[float] | None = None
        self.started = ""

    def __enter__(self) -> Recorder:
        self.before = _loadavg()
        self.started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        self._start = time.perf_counter()
        self._monitor.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._monitor.__exit__(*exc)

    def load(self) -> dict[str, Any]:
        """The load so far: averages before and now, other threads' mean and max, the verdict."""
        # lazy: mechlab.cli imports this module, and mechlab --help runs without torch
        import torch

        samples = self._monitor.samples
        others = self._monitor.mean
        after = _loadavg()
        own, cores = torch.get_num_threads(), os.cpu_count() or 1
        reasons = load_verdict(self.before, after, others, own, cores)
        return {"before": self.before, "after": after, "others_mean": None if others is None else round(others, 2),
                "others_max": max(samples) if samples else None, "samples": len(samples),
                "own_threads": own, "cores": cores, "per_core_limit": LOAD_PER_CORE, "limit": load_limit(cores),
                "provisional": bool(reasons), "reasons": reasons}  # fmt: skip

    def record(self, tables: list[Table], data: dict[str, Any] | None = None) -> BenchRecord:
        """The record of the run so far (call at its end, inside the ``with``)."""
        return BenchRecord(self.bench, self.command, self.settings, machine_info(self.device, self.bench), self.load(),
                           self.started, time.perf_counter() - self._start, tables, data or {})  # fmt: skip


def run_recorded(bench: str, settings: dict[str, Any], measure: Callable[[], tuple[list[Table], dict[str, Any]]],
                 device: str = "cpu") -> BenchRecord:  # fmt: skip
    """Run ``measure`` (which returns its tables and raw data) under a :class:`Recorder`."""
    with Recorder(bench, settings, device) as rec:
        tables, data = measure()
        return rec.record(tables, data)
