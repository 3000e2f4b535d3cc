"""Running the CLI: arguments every command shares checked first, errors as one line."""

from __future__ import annotations

import os
import sys
import warnings

import click
import typer

from mechlab.cli.app import THREADED, UsageProblem, app
from mechlab.limits import check_threads

# typer >= 0.2x ships its own copy of click (typer._click) whose exceptions are not
# click's; catch both.
try:
    from typer._click import exceptions as _typer_click
except ImportError:  # older typer uses click itself
    _typer_click = click.exceptions
_EXIT = (click.exceptions.Exit, typer.Exit)
_ABORT = (click.exceptions.Abort, typer.Abort)
_CLICK_ERROR = (click.exceptions.ClickException, _typer_click.ClickException)

# Options naming a file or folder: an empty value would silently mean the current folder.
_PATH_OPTIONS = ("--out", "--json", "--ckpt", "--checkpoints", "--config", "--resume", "--model",
                 "--pairs", "--tokenizer")  # fmt: skip


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


def _option_values(args: list[str], name: str) -> list[str]:
    """The values given to option ``name`` (``--name V`` or ``--name=V``), up to ``--``."""
    values = []
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == name and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(name + "="):
            values.append(arg[len(name) + 1 :])
    return values


def _check_arguments(args: list[str]) -> None:
    """What every command shares, checked before any of them runs: devices, path options,
    seeds (within 64 bits) and thread counts (:func:`mechlab.limits.check_threads`: a count
    torch cannot start would end the process, a folder lock left behind)."""
    for name in _PATH_OPTIONS:
        if any(not value.strip() for value in _option_values(args, name)):
            raise UsageProblem(f"{name} is empty; give a path (use {name} . for the current folder)")
    for value in _option_values(args, "--seed"):  # torch's generators take 64 bits
        try:
            seed = int(value)
        except ValueError:
            continue  # the command's parser names it
        if not -(2**63) <= seed < 2**63:
            raise UsageProblem(f"--seed {value} is outside -2**63..2**63-1; give a smaller seed")
    for value in _option_values(args, "--threads"):
        try:
            threads = int(value)
        except ValueError:
            continue  # not a number: the command's own parser says so

        try:
            check_threads(threads)
        except ValueError as err:
            raise UsageProblem(str(err)) from None
    devices = _option_values(args, "--device")
    if devices:  # (torch is imported only when a device is named)
        # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
        from mechlab.devices import check_device

        for value in devices:
            check_device(value)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    typer.echo(f"mechlab: warning: {_one_line(Exception(str(message)))}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input, 1 a missing extra)."""
    # Idle OpenMP threads sleep instead of spinning. Set before torch loads (the commands
    # import it lazily): on a shared machine spinning threads made a 2-thread step 10x
    # slower than a 1-thread one (docs/benchmarks.md, "Threads").
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        args = list(sys.argv[1:] if argv is None else argv)
        if "--help" not in args:
            _check_arguments(args)
        # Filters a command sets and the one-line display end with the command.
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            # In non-standalone mode a command's `raise typer.Exit(n)` comes back as the result.
            result = app(args=argv, prog_name="mechlab", standalone_mode=False, obj={"args": args})
        command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
        if command in THREADED and "torch" in sys.modules and result in (None, 0):
            # lazy: only after a command that loaded torch (checked above); mechlab --help and the CLI's checks run without torch
            import torch

            policy = os.environ.get("OMP_WAIT_POLICY", "default")
            typer.echo(f"torch threads: {torch.get_num_threads()} (--threads N to change; "
                       f"OMP_WAIT_POLICY={policy})", err=True)  # fmt: skip
    except _EXIT as exc:
        return exc.exit_code
    except _ABORT:
        typer.echo("mechlab: aborted", err=True)
        return 130
    except _CLICK_ERROR as exc:
        typer.echo(f"mechlab: error: {_one_line(Exception(exc.format_message()))}", err=True)
        return 2
    except ImportError as exc:
        # an optional feature run without its extra (nnsight, tracr, ...): one line naming it
        if "pip install 'mechlab[" not in str(exc) or os.environ.get("MECHLAB_DEBUG"):
            raise
        typer.echo(f"mechlab: error: {_one_line(exc)}", err=True)
        return 1
    except (ValueError, OSError, KeyError) as exc:
        if os.environ.get("MECHLAB_DEBUG"):
            raise
        typer.echo(f"mechlab: error: {_one_line(exc)}", err=True)
        return 2
    return result if isinstance(result, int) else 0
