"""docs/benchmarks.md's tables, rendered from the JSON records of ``mechlab bench ... --json``.

A page names each record it shows between two comment lines; everything between them is
rendered from the file (the command, when, threads, load, the machine and torch's build,
a provisional mark when the run was under load, then its tables)::

    <!-- bench: docs/bench/hooks-1.json -->
    ...
    <!-- /bench -->

Regenerate every block of a page after new runs (paths are relative to the folder the
command runs in, the repository root)::

    python -m mechlab.bench.tables docs/benchmarks.md          # rewrite the blocks
    python -m mechlab.bench.tables docs/benchmarks.md --check  # exit 1 when one is stale
    python -m mechlab.bench.tables docs/benchmarks.md --strict # exit 2 when a record is missing

A block whose record does not exist yet shows a placeholder (``--strict`` refuses instead).
A block whose record is older than the code it measured, or cannot be told to be current
(:mod:`mechlab.bench.stale`: no commit recorded, a commit this clone does not hold), says
so in a line of its own, ``**Staleness:** ...``, naming the files and the rerun; that line
follows the git checkout the command runs in, so ``--check`` compares everything else.

The prose around the blocks is written by hand; ``scripts/bench_quiet.sh`` runs the
benchmarks on a quiet machine and then this.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from mechlab.bench import gitstate
from mechlab.bench.goals import row_goals
from mechlab.bench.record import BenchRecord, Table
from mechlab.bench.stale import CURRENT, UNKNOWN, Staleness, record_staleness
from mechlab.io import atomic_write_text

BLOCK = re.compile(r"(<!-- bench: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /bench -->)", re.S)
STALENESS = "**Staleness:**"
STALENESS_LINE = re.compile(r"\n\n" + re.escape(STALENESS) + r" [^\n]*")  # and the blank line above it


def describe(record: BenchRecord) -> str:
    """The line above a record's tables: command, date, threads, load, machine, build."""
    m, ld = record.machine, record.load
    date = record.started[:10]
    busy = "" if ld.get("others_mean") is None else f", other threads running {ld['others_mean']:.1f} on average"
    before = "?" if ld.get("before") is None else f"{ld['before'][0]:.2f}"
    after = "?" if ld.get("after") is None else f"{ld['after'][0]:.2f}"
    commit = m.get("mechlab_commit")
    code = "no commit recorded" if not commit else f"mechlab {commit[:12]}{'+changes' if commit.endswith('+changes') else ''}"
    lines = [
        f"`{record.command}`",
        "",
        f"{date}; {m['threads']} intra-op / {m['interop_threads']} inter-op thread(s), device {m['device']}; "
        f"load average {before} before, {after} after{busy}; {m['cpu_model']}, {m['cores']} cores; torch "
        f"{m['torch']} with {m['blas']} BLAS and {m['lapack']} LAPACK ({m.get('cpu_capability', '?')}); "
        f"{code}; {record.seconds:.0f} s.",
    ]
    if record.provisional:
        why = "; ".join(ld.get("reasons") or [f"other threads running {ld.get('others_mean', '?')} on average"])
        lines += ["", f"**Provisional: measured under load** ({why}); rerun with `bash scripts/bench_quiet.sh` "
                      "on a quiet machine."]  # fmt: skip
    return "\n".join(lines)


def staleness_line(staleness: Staleness, step: str) -> str:
    """``**Staleness:** older than the code: FILES changed since COMMIT; rerun `ONLY=STEP ...`.``"""
    rerun = "" if staleness.state == UNKNOWN else "; rerun"
    return f"{STALENESS} {staleness.summary()}{rerun} `ONLY={step} bash scripts/bench_quiet.sh`."


def render(record: BenchRecord, staleness: Staleness | None = None, step: str = "") -> str:
    """A record as Markdown: its description, whether it is older than the code (a
    ``staleness`` that is not current, with the rerun of ``step``), then each table (titles
    and notes as text), with a last column of goals (:mod:`mechlab.bench.goals`) where the
    benchmark has them."""
    parts = [describe(record)]
    if staleness is not None and staleness.state != CURRENT:
        parts.append(staleness_line(staleness, step or record.bench))
    for table in record.tables:
        if table.title:
            parts.append(table.title)
        goals = row_goals(record.bench, table.values, record.settings)
        if goals is not None and len(goals) == len(table.rows):
            if record.provisional:
                goals = [g if g == "-" else f"(provisional) {g}" for g in goals]
            table = Table([*table.columns, "goal"], [[*r, g] for r, g in zip(table.rows, goals, strict=True)],
                          table.title, table.values, table.notes)  # fmt: skip
        parts.append(table.markdown())
        if table.notes:
            parts.append("\n".join(f"- {n.strip()}" for n in table.notes))
    return "\n\n".join(parts) + "\n"


def placeholder(path: str) -> str:
    """What a block shows before its record exists."""
    return (f"*No record yet: `bash scripts/bench_quiet.sh` writes `{path}` (see the top of this page); "
            "until then the figures in the text are the earlier hand-recorded ones.*\n")


def regenerate(text: str, root: Path, strict: bool = False, repo: Path | None = None) -> tuple[str, list[str], list[str]]:
    """``text`` with every block re-rendered from its record, each said to be older than
    the code of the git checkout at ``repo`` when it is (None: not a checkout, so it
    cannot tell); also the paths it read and the paths that have no record yet (rendered
    as :func:`placeholder`).

    Raises:
        ValueError: A block names a file that is not a record, or (``strict``) no file.
    """
    paths: list[str] = []
    missing: list[str] = []

    def block(m: re.Match[str]) -> str:
        name = m.group("path")
        path = root / name
        if not path.is_file():
            if strict:
                raise ValueError(f"{name}: no such record (run its benchmark with --json first)")
            missing.append(name)
            return m.group(1) + placeholder(name) + m.group(4)
        paths.append(name)
        record = BenchRecord.read(path)
        return m.group(1) + render(record, record_staleness(record, repo), path.stem) + m.group(4)

    return BLOCK.sub(block, text), paths, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render docs/benchmarks.md's tables from benchmark records.")
    parser.add_argument("page", type=Path, help="the Markdown page (docs/benchmarks.md)")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="where the records' paths start (.)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a block is not its record's rendering")
    parser.add_argument("--strict", action="store_true", help="fail (exit 2) when a block's record does not exist")
    args = parser.parse_args(argv)
    try:
        text = args.page.read_text()
        new, paths, missing = regenerate(text, args.root, strict=args.strict, repo=gitstate.checkout_root(Path.cwd()))
    except (OSError, ValueError) as exc:
        print(f"mechlab.bench.tables: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if STALENESS_LINE.sub("", new) != STALENESS_LINE.sub("", text):
            print(f"{args.page}: tables differ from their records; run python -m mechlab.bench.tables {args.page}")
            return 1
        print(f"{args.page}: {len(paths)} table block(s) current")
        return 0
    if new != text:
        atomic_write_text(args.page, new)
    print(f"{args.page}: {len(paths)} table block(s) rendered from {', '.join(paths) or 'no records'}")
    if missing:
        print(f"{args.page}: no record yet for {', '.join(missing)} (placeholders)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
