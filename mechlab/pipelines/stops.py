"""A command stopped by a signal: what it kept, so that the rerun resumes.

``mechlab prune`` writes each circuit as soon as it is found, and a rerun of the same
command reads back the circuits of the same settings (:meth:`OutputFolder.plan
<mechlab.pipelines.outputs.OutputFolder.plan>`). A Ctrl-C (SIGINT) or a ``kill``
(SIGTERM) while it runs raises :class:`Interrupted` out of the pipeline: the folder's lock
is released, no temporary file is left (every write is atomic, its temporary file
removed on the way out), and the exception names the circuits kept, for the command to
print in one line with how to resume (exit status 128 + the signal: 130 for Ctrl-C).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

SIGNAL_NAMES = {signal.SIGINT: "SIGINT, Ctrl-C", signal.SIGTERM: "SIGTERM"}


class Signalled(KeyboardInterrupt):
    """Raised by :func:`stop_on_signals`' handler: a KeyboardInterrupt that records its signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Interrupted(KeyboardInterrupt):
    """A pipeline stopped by a signal, after writing what it names.

    A KeyboardInterrupt, so that code catching Ctrl-C catches it as before.

    Attributes:
        signum: The signal (2: SIGINT, Ctrl-C; 15: SIGTERM).
        out: The output folder.
        kept: The results written (or read back) before the signal, as their file stems.
        total: How many results the run was to make.
        note: More about what was kept (e.g. written before the seeds' consensus), or None.
    """

    def __init__(self, signum: int, out: Path, kept: Sequence[str], total: int, note: str | None = None) -> None:
        self.signum, self.out, self.kept, self.total = signum, Path(out), list(kept), total
        self.note = note or ""
        super().__init__(self.message())

    @property
    def exit_code(self) -> int:
        """The shell's status of a process a signal ended: 128 + the signal."""
        return 128 + self.signum

    def message(self) -> str:
        """One line: the signal, and what was kept where."""
        name = SIGNAL_NAMES.get(self.signum, f"signal {self.signum}")
        head = f"stopped by signal {self.signum} ({name}) after {len(self.kept)} of {self.total} circuit(s)"
        if not self.kept:
            return f"{head}; none was finished, nothing kept in {str(self.out)!r}"
        note = f" ({self.note})" if self.note else ""
        return f"{head}; kept {', '.join(self.kept)} in {str(self.out)!r}{note}"

    def __str__(self) -> str:
        return self.message()


def signal_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt (SIGINT unless :func:`stop_on_signals` said otherwise)."""
    return exc.signum if isinstance(exc, Signalled) else int(signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Signalled` (a KeyboardInterrupt),
    so that a ``kill`` stops a run as cleanly as a Ctrl-C. Only in the main thread (signal
    handlers cannot be set elsewhere), and a signal ignored when the block starts (a job
    started with ``nohup``, or in the background of a shell) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Signalled(signum)

    old = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(signum)
        if current is not signal.SIG_IGN:
            old[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
