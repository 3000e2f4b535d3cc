"""Which benchmark records are older than the code they measured.

A record names the commit it measured (``machine.mechlab_commit``, with ``+changes`` and
the changed files' hashes in ``machine.mechlab_changes`` when the run had uncommitted
changes; :func:`mechlab.bench.record.code_state`). Its benchmark declares the files it
exercises (:mod:`mechlab.bench.code_paths`). The record is **stale** when one of those
files differs now from what the run measured: changed in a commit since, changed and not
committed, or new (``git diff --name-only COMMIT -- PATHS`` against the working tree, and
the untracked files); a file the run had changed uncommitted counts as unchanged while
its content is still the one measured. When git cannot tell (no commit recorded, a commit
the repository does not hold, as in a shallow clone, no paths declared), the record is
reported as "cannot tell", never as current::

    python -m mechlab.bench.stale [docs/bench]   # one line per stale or unknown record

Exit status: 1 when a record is stale; else 2 when one cannot be told (or, with one line,
when this is not a git checkout); 0 when every record is current.
``scripts/bench_quiet.sh`` runs it before and after the benchmarks; docs/benchmarks.md
says the same above each table (:mod:`mechlab.bench.tables`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mechlab.bench import gitstate
from mechlab.bench.code_paths import code_paths
from mechlab.bench.record import BenchRecord

CURRENT, STALE, UNKNOWN = "current", "stale", "cannot tell"


@dataclass
class Staleness:
    """Whether one record is older than the code: its state, the files, why."""

    state: str  # CURRENT, STALE or UNKNOWN
    commit: str | None = None
    files: list[str] = field(default_factory=list)
    reason: str = ""

    def summary(self) -> str:
        """``older than the code: mechlab/prune/forward.py changed since 0b89bf3d7539``."""
        if self.state == STALE:
            note = f" ({self.reason})" if self.reason else ""
            return f"older than the code: {', '.join(self.files)} changed since {(self.commit or '')[:12]}{note}"
        if self.state == UNKNOWN:
            return f"{self.reason}: cannot tell; rerun"
        return f"current (its code unchanged since {(self.commit or '')[:12]})"


def record_staleness(record: BenchRecord, root: Path | None) -> Staleness:
    """Whether ``record`` is older than the code of the checkout at ``root`` (None: not a
    checkout, so it cannot tell).

    Args:
        record: A benchmark record.
        root: The root of the git checkout whose code it is held against.
    """
    named = record.machine.get("mechlab_commit")
    if not named:
        return Staleness(UNKNOWN, reason="no commit recorded")
    commit = named.removesuffix("+changes")
    if root is None:
        return Staleness(UNKNOWN, commit, reason="not in a git checkout")
    if not gitstate.has_commit(root, commit):
        return Staleness(UNKNOWN, commit, reason=f"unknown commit {commit[:12]} (a shallow clone?)")
    paths = code_paths(record.bench)
    if paths is None:
        return Staleness(UNKNOWN, commit, reason=f"no code paths declared for benchmark {record.bench!r}")
    changed = gitstate.changed_files(root, commit, paths)
    if changed is None:
        return Staleness(UNKNOWN, commit, reason=f"git cannot compare with {commit[:12]}")
    measured = record.machine.get("mechlab_changes") or {}  # uncommitted at the run: path -> hash
    now = gitstate.file_hashes(root, sorted(set(changed) | set(measured)))
    stale = [f for f, h in now.items() if f not in measured or measured[f] != h]
    unlisted = named.endswith("+changes") and record.machine.get("mechlab_changes") is None
    reason = "its run had uncommitted changes it did not list: some may be what it measured" if unlisted else ""
    return Staleness(STALE if stale else CURRENT, commit, stale, reason)


def folder_staleness(folder: Path, root: Path | None) -> dict[Path, Staleness]:
    """Each record (``*.json``) in ``folder``, by path, with its :func:`record_staleness`."""
    return {path: record_staleness(BenchRecord.read(path), root) for path in sorted(folder.glob("*.json"))}


def exit_status(found: dict[Path, Staleness]) -> int:
    """1 when a record is stale, else 2 when one cannot be told, else 0."""
    states = {s.state for s in found.values()}
    return 1 if STALE in states else 2 if UNKNOWN in states else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m mechlab.bench.stale [FOLDER]``: print the stale and unknown records; the
    status of :func:`exit_status` (2 also when this is no checkout or FOLDER no folder)."""
    parser = argparse.ArgumentParser(description="List the benchmark records older than the code they measured.")
    parser.add_argument("folder", type=Path, nargs="?", default=Path("docs/bench"), help="the records (docs/bench)")
    args = parser.parse_args(argv)
    root = gitstate.checkout_root(Path.cwd())
    if root is None:
        print(f"{args.folder}: not in a git checkout: cannot tell which records are older than the code")
        return 2
    if not args.folder.is_dir():
        print(f"{args.folder}: no such folder of records")
        return 2
    try:
        found = folder_staleness(args.folder, root)
    except (OSError, ValueError, KeyError) as exc:
        print(f"mechlab.bench.stale: {exc}", file=sys.stderr)
        return 2
    for path, staleness in found.items():
        if staleness.state != CURRENT:
            print(f"{path}: {staleness.summary()}")
    status = exit_status(found)
    if status == 0:
        print(f"{args.folder}: {len(found)} record(s), none older than the code")
    return status


if __name__ == "__main__":
    sys.exit(main())
