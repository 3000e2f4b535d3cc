"""A command stopped by a signal: what it kept, so that the rerun resumes.

``mechlab prune`` writes each circuit as soon as it is found, and a rerun of the same
command reads back the circuits of the same settings (:meth:`OutputFolder.plan
<mechlab.pipelines.outputs.OutputFolder.plan>`). A Ctrl-C (SIGINT) or a ``kill``
(SIGTERM) while it runs raises :class:`Interrupted` out of the pipeline: the folder's lock
is released, no temporary file is left (every write is atomic, its temporary file
removed on the way out), and the exception names the circuits kept, for the command to
print in one line with how to resume (exit status 128 + the signal: 130 for Ctrl-C).

Every long command does the same: a pipeline that writes its results one by one and reads
them back on a rerun (``eval`` per suite, ``recall`` per report, ``curve`` per target,
``prune --share`` per share and seed, ``prune --pairs`` per seed, ``sweep`` per trial)
runs within :func:`resumable`, which turns the signal into :class:`Interrupted` naming what
its :class:`Tally` kept; one that writes only at the end (``overlap``, ``bench methods``)
runs within :func:`written_at_end`, whose :class:`Unwritten` says that nothing was written
and no partial file is left. The command prints either as one line
(:func:`mechlab.cli.app.stopped`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SIGNAL_NAMES = {signal.SIGINT: "SIGINT, Ctrl-C", signal.SIGTERM: "SIGTERM"}
SHOWN = 8
"""The most results a stop's line names (then how many more)."""


def signal_words(signum: int) -> str:
    """``stopped by signal 2 (SIGINT, Ctrl-C)``: the start of a stopped command's line."""
    return f"stopped by signal {signum} ({SIGNAL_NAMES.get(signum, f'signal {signum}')})"


class Signalled(KeyboardInterrupt):
    """Raised by :func:`stop_on_signals`' handler: a KeyboardInterrupt that records its signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Stopped(KeyboardInterrupt):
    """A command stopped by a signal: the line it ends with (:meth:`message`) and its exit
    status. A KeyboardInterrupt, so that code catching Ctrl-C catches it as before.

    Attributes:
        signum: The signal (2: SIGINT, Ctrl-C; 15: SIGTERM).
    """

    signum: int

    @property
    def exit_code(self) -> int:
        """The shell's status of a process a signal ended: 128 + the signal."""
        return 128 + self.signum

    @property
    def resumes(self) -> bool:
        """Whether a rerun of the same command reads back something that was kept."""
        return False

    def message(self) -> str:
        """One line: the signal (the subclasses add what was kept)."""
        return signal_words(self.signum)

    def __str__(self) -> str:
        return self.message()


class Interrupted(Stopped):
    """A pipeline stopped by a signal, after writing what it names; a rerun reads it back.

    Attributes:
        signum: The signal (2: SIGINT, Ctrl-C; 15: SIGTERM).
        out: The output folder.
        kept: The results written (or read back) before the signal, as their file stems.
        total: How many results the run was to make (None: not known ahead, as a sweep's
            trials).
        note: More about what was kept (e.g. written before the seeds' consensus), or None.
        unit: What a result is, for the line (``circuit``, ``suite``, ``trial``).
    """

    def __init__(self, signum: int, out: Path, kept: Sequence[str], total: int | None, note: str | None = None,
                 *, unit: str = "circuit") -> None:  # fmt: skip
        self.signum, self.out, self.kept, self.total = signum, Path(out), list(kept), total
        self.note, self.unit = note or "", unit
        super().__init__(self.message())

    @property
    def resumes(self) -> bool:
        """Whether something was kept, for the rerun to read back."""
        return bool(self.kept)

    def message(self) -> str:
        """One line: the signal, and what was kept where."""
        of = "" if self.total is None else f" of {self.total}"
        head = f"{signal_words(self.signum)} after {len(self.kept)}{of} {self.unit}(s)"
        if not self.kept:
            return f"{head}; none was finished, nothing kept in {str(self.out)!r}"
        note = f" ({self.note})" if self.note else ""
        return f"{head}; kept {named(self.kept)} in {str(self.out)!r}{note}"


class Unwritten(Stopped):
    """A command that writes only at its end, stopped by a signal before it: nothing was
    written (and no partial file is left), so a rerun starts over.

    Attributes:
        signum: The signal.
        out: The file the command writes at its end, or None (it only prints).
    """

    def __init__(self, signum: int, out: str | Path | None = None) -> None:
        self.signum, self.out = signum, None if out is None else Path(out)
        super().__init__(self.message())

    def message(self) -> str:
        """One line: the signal, and that nothing was written."""
        if self.out is None:
            return f"{signal_words(self.signum)} before the end; nothing was written (the results are printed at the end)"
        return (f"{signal_words(self.signum)} before the end; nothing was written ({str(self.out)!r} is written "
                "only at the end) and no partial file is left")  # fmt: skip


def named(stems: Sequence[str]) -> str:
    """The stems, comma-separated; past :data:`SHOWN`, the first ones and how many more."""
    if len(stems) <= SHOWN:
        return ", ".join(stems)
    return f"{', '.join(stems[:SHOWN])} and {len(stems) - SHOWN} more"


@dataclass
class Tally:
    """What a resumable pipeline has kept so far (:func:`resumable`): its output folder,
    how many results it is to make, and the stems of those on disk (appended as each is
    written or read back).

    Attributes:
        out: The output folder.
        total: How many results the run is to make (None: not known ahead).
        unit: What a result is, for the line.
        kept: Stems of the results written or read back.
        note: More about what was kept, or empty.
    """

    out: Path
    total: int | None
    unit: str = "circuit"
    kept: list[str] = field(default_factory=list)
    note: str = ""


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


@contextlib.contextmanager
def _stopping_as(stop: Callable[[int], Stopped]) -> Iterator[None]:
    """Within the block SIGINT and SIGTERM stop the work (:func:`stop_on_signals`); a stop
    leaves as ``stop(signum)``, a :class:`Stopped` from within passes as it is."""
    with stop_on_signals():
        try:
            yield
        except Stopped:
            raise
        except KeyboardInterrupt as exc:
            raise stop(signal_of(exc)) from None


@contextlib.contextmanager
def resumable(tally: Tally) -> Iterator[Tally]:
    """Run a pipeline that keeps its results one by one: within the block SIGINT and SIGTERM
    stop it (:func:`stop_on_signals`), and a stop leaves as :class:`Interrupted` naming what
    ``tally`` kept at that moment (an :class:`Interrupted` from a pipeline within passes as
    it is). Claim the output folder inside the block, so that its lock is released first."""
    with _stopping_as(lambda signum: Interrupted(signum, tally.out, tally.kept, tally.total, tally.note,
                                                 unit=tally.unit)):  # fmt: skip
        yield tally


@contextlib.contextmanager
def written_at_end(out: str | Path | None = None) -> Iterator[None]:
    """Run a command that writes only at its end (``out``, or nothing: it prints): within
    the block SIGINT and SIGTERM stop it (:func:`stop_on_signals`), and a stop leaves as
    :class:`Unwritten`. Every write is atomic, so a stop while ``out`` is written leaves
    no partial file."""
    with _stopping_as(lambda signum: Unwritten(signum, out)):
        yield
