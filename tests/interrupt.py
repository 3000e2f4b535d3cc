"""Stopping a command with a signal, as a user does (Ctrl-C, ``kill``): run ``mechlab`` in a
fresh interpreter, send the signal once its work has started (a file appears, or a line on
stderr), and check the one line it ends with (:func:`mechlab.cli.app.stopped`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
STOPPED = "mechlab: stopped by signal"


def interrupt(args: list[str], ready: Path | str | Callable[[], bool], *, signum: int = signal.SIGINT,
              cwd: Path | None = None, wait_s: float = 240) -> subprocess.CompletedProcess:  # fmt: skip
    """Run ``python -m mechlab *args``, send ``signum`` once it is ready, return the finished process.

    Args:
        args: The command's arguments.
        ready: A path (ready once it exists), a text (once a line of stderr holds it) or a
            function (once it returns True).
        signum: The signal.
        cwd: Where the command runs.
        wait_s: The longest wait for ``ready``.
    """
    proc = subprocess.Popen([sys.executable, "-m", "mechlab", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd)  # fmt: skip
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    if isinstance(ready, Path):
        check = ready.exists
    elif isinstance(ready, str):
        check = lambda: any(ready in line for line in list(err))  # noqa: E731
    else:
        check = ready
    deadline = time.monotonic() + wait_s
    while not check() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"finished before the signal: {proc.stdout.read()} {''.join(err)}"
    proc.send_signal(signum)
    out = proc.stdout.read()
    proc.wait(timeout=120)
    reader.join(timeout=10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(err))


def stopped_line(done: subprocess.CompletedProcess, signum: int = signal.SIGINT) -> str:
    """The one line a stopped command ends with, after checking the exit status (128 + the
    signal), that no traceback was printed and that stderr holds that line once, last."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 128 + signum, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert [line for line in lines if line.startswith(STOPPED)] == lines[-1:], done.stderr
    return lines[-1]


def leftovers(folder: Path) -> list[str]:
    """Temporary files and locks under ``folder`` (none may stay after a stop)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*") if p.is_file())
