"""The typer application and what every command shares: bad-input errors, tables, threads."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import NoReturn

import typer

from mechlab.limits import check_threads
from mechlab.pipelines.stops import Stopped, signal_of

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: wraps to the terminal's width, readable at 80 columns
    help="mechlab: train small sequence models, look inside them, find their circuits.",
)
bench_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Speed and memory benchmarks (ratios, medians).")  # fmt: skip
app.add_typer(bench_app, name="bench")

THREADED = ("eval", "prune", "recall", "curve", "report")  # commands that say their thread count


class UsageProblem(ValueError):
    """Bad input from the command line: reported as one line, exit status 2."""


def interactive() -> bool:
    """Whether stderr is a terminal (a person watching), not a log or a pipe."""
    return sys.stderr.isatty()


def say_loading(progress: bool, what: str = "torch, the model and its traces") -> None:
    """Say ``loading <what>`` on stderr before the seconds torch and the pipelines take to
    load (half a minute on a fresh clone), at a terminal only and with ``progress``: in a log
    or a pipe refused input stays one line. Call it after the command's input checks."""
    if progress and interactive():
        typer.echo(f"loading {what}", err=True)


def use_threads(threads: int | None) -> int:
    """Set torch's CPU threads when given; returns how many run (torch loads here). The
    count is printed when the command ends (:func:`mechlab.cli.main`)."""
    # lazy: mechlab --help and the CLI's checks run without torch
    import torch

    if threads is not None:
        torch.set_num_threads(check_threads(threads))
    return torch.get_num_threads()


def echo_table(rows: list[tuple[str, ...]]) -> None:
    """Print rows as left-aligned columns, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def fmt(x: float | None) -> str:
    """A number with three decimals, ``-`` for None."""
    return "-" if x is None else f"{x:.3f}"


def warn(line: str) -> None:
    """One warning line on stderr."""
    typer.echo(f"mechlab: warning: {line}", err=True)


def renamed_option(old_value: str | None, new_value: str, old: str, new: str) -> str:
    """The value of option ``new``, or of its deprecated spelling ``old`` when that was given
    (with a one-line warning)."""
    if old_value is None:
        return new_value
    warn(f"{old} is deprecated and goes in mechlab 0.2.0; use {new}")
    return old_value


DEPRECATED_PROTOCOL = typer.Option(None, "--protocol", hidden=True, help="Deprecated spelling.")


def force_option(what: str) -> bool:
    """The ``--force`` option of a command that writes (``what``: what it replaces)."""
    return typer.Option(False, "--force", help=f"{what} Never an input or a checkpoint.")


def command_line(ctx: typer.Context) -> str:
    """The command as it was typed (``mechlab prune --ckpt ...``; ``python -m mechlab ...``
    when run so), for a message that says how to run it again."""
    root = ctx.find_root()
    args = (root.obj or {}).get("args") if isinstance(root.obj, dict) else None
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    prog = "python -m mechlab" if started.parts[-2:] == ("mechlab", "__main__.py") else "mechlab"
    if args is None:
        return f"{prog} {ctx.command_path.split(' ', 1)[-1]} ..."
    return f"{prog} {shlex.join(args)}"


def stopped(ctx: typer.Context, exc: KeyboardInterrupt) -> NoReturn:
    """One line for a command a signal stopped (Ctrl-C, SIGTERM): what it kept
    (:class:`mechlab.pipelines.stops.Interrupted`) and how to resume, the same command, or
    that nothing was written or kept (:class:`mechlab.pipelines.stops.Unwritten`) and the
    same command starts over; exit status 128 + the signal (130 for Ctrl-C)."""
    if isinstance(exc, Stopped):
        what, code, resumes = str(exc), exc.exit_code, exc.resumes
    else:
        what, code, resumes = f"stopped by signal {signal_of(exc)}; what was written is kept", 128 + signal_of(exc), True
    if resumes:
        how = "resume with the same command, which reads back what is kept and computes the rest"
    else:
        how = "run the same command again to start over"
    typer.echo(f"mechlab: {what}; {how}: {command_line(ctx)}", err=True)
    raise typer.Exit(code)
