"""Output-folder locks: one per folder, naming its owner; a dead owner's lock is taken over.

A claimed folder's lock covers the folder and everything under it: a run that claims
``R/circuits`` is refused while another holds ``R``, and a run that claims ``R`` while
another holds a folder anywhere under it (a ``report --out R`` and a ``prune --out
R/circuits`` at the same time would otherwise both write ``R/circuits``). Each run takes
its own folder's lock first and then looks for a held lock above and below it, so of two
runs that overlap at least one sees the other. Folders below are looked at down to
:data:`NESTED_DEPTH` levels (hidden folders and links not followed, at most
:data:`NESTED_FOLDERS` folders). Locks this process holds are its own nesting
(``prune --through-training`` claims its folder and one folder per checkpoint inside it)
and never refuse it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

LOCK_NAME = ".mechlab.lock"
"""The lock file of an output folder (removed when its run ends)."""

NESTED_DEPTH = 8
"""How many levels below a claimed folder are searched for held locks."""
NESTED_FOLDERS = 20_000
"""The most folders below a claimed folder that are searched for held locks."""

_HELD: dict[str, Lock] = {}
"""The folders (real paths) whose locks this process holds."""

_BUSY_TRIES = 3  # a lock found taken is tried again (a nested check may hold it for an instant)
_BUSY_WAIT = 0.02


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # it exists, under another user
    return True


class Lock:
    """An exclusive lock on ``folder/.mechlab.lock`` that records its owner (pid, command,
    start). With ``fcntl`` the lock is the kernel's (released when its process dies, even
    by ``kill -9``, so a dead owner's lock is taken over); without it, the file's pid is
    checked for life."""

    def __init__(self, folder: Path, command: str, option: str) -> None:
        self.path = folder / LOCK_NAME
        self.command, self.option = command, option
        self.fd: int | None = None

    def _owner(self, text: str) -> str:
        try:
            owner = json.loads(text)
            when = time.strftime("%H:%M:%S", time.localtime(float(owner["started"])))
            return f"pid {int(owner['pid'])}, mechlab {owner['command']}, started {when}"
        except (ValueError, KeyError, TypeError):
            return "another process"

    def _busy(self, text: str) -> ValueError:
        folder = str(self.path.parent)
        return ValueError(f"{folder!r} is being written by another mechlab run ({self._owner(text)}); wait "
                          f"for it to finish, or choose another {self.option}")  # fmt: skip

    def _mine(self) -> str:
        return json.dumps({"pid": os.getpid(), "command": self.command, "started": time.time(),
                           "argv": sys.argv[1:][:40]})  # fmt: skip

    def acquire(self) -> None:
        """Take the folder's lock, then refuse (releasing it) when another run holds a lock
        on a folder above it or anywhere under it."""
        self._acquire_own()
        try:
            self._check_nested()
        except BaseException:
            self.release()
            raise
        _HELD[self._real] = self

    @property
    def _real(self) -> str:
        return os.path.realpath(self.path.parent)

    def _acquire_own(self) -> None:
        try:
            # lazy: POSIX only; the ImportError below is the other systems' path
            import fcntl
        except ImportError:  # not POSIX: a pid file
            return self._acquire_pid_file()
        busy = 0
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                text = os.read(fd, 4096).decode("utf-8", "replace")
                os.close(fd)
                busy += 1
                if busy < _BUSY_TRIES:  # another run's nested check holds it for an instant
                    time.sleep(_BUSY_WAIT)
                    continue
                raise self._busy(text) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # its owner removed it as we opened it: lock the file now there
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, self._mine().encode("utf-8"))
            self.fd = fd
            return None
        raise ValueError(f"could not lock {str(self.path.parent)!r}; try again")

    def _acquire_pid_file(self) -> None:
        for _ in range(100):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                text = self.path.read_text(encoding="utf-8", errors="replace")
                try:
                    pid = int(json.loads(text)["pid"])
                except (ValueError, KeyError, TypeError):
                    pid = None
                if pid is not None and pid != os.getpid() and _alive(pid):
                    raise self._busy(text) from None
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()  # a dead owner's lock: taken over
                continue
            os.write(fd, self._mine().encode("utf-8"))
            self.fd = fd
            return
        raise ValueError(f"could not lock {str(self.path.parent)!r}; try again")

    # -- the folders above and below ---------------------------------------------------
    def _check_nested(self) -> None:
        real = Path(self._real)
        for above in real.parents:
            self._probe(above / LOCK_NAME, "lies inside", above)
        for below in _locks_below(real):  # named as under the folder given
            self._probe(below, "holds", self.path.parent / below.parent.relative_to(real))

    def _probe(self, path: Path, relation: str, shown: Path) -> None:
        """Refuse when another process holds the lock file ``path`` (of the folder above or
        below this one that messages call ``shown``)."""
        if os.path.realpath(path.parent) in _HELD:
            return  # this process's own nesting
        text = _held_by_another(path)
        if text is not None:
            mine = str(self.path.parent)
            raise ValueError(f"{self.option} {mine!r} {relation} {str(shown)!r}, which is being written by "
                             f"another mechlab run ({self._owner(text)}); wait for it to finish, or choose "
                             f"another {self.option}")  # fmt: skip

    def release(self) -> None:
        if _HELD.get(self._real) is self:
            del _HELD[self._real]
        if self.fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None


def _held_by_another(path: Path) -> str | None:
    """The owner record of a lock file another live process holds, or None (no file, a
    stale one, or not readable)."""
    try:
        # lazy: POSIX only; the ImportError below is the other systems' path
        import fcntl
    except ImportError:
        fcntl = None  # type: ignore[assignment]
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096).decode("utf-8", "replace")
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return text  # held
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        try:
            pid = int(json.loads(text)["pid"])
        except (ValueError, KeyError, TypeError):
            return None
        return text if pid != os.getpid() and _alive(pid) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _locks_below(folder: Path) -> list[Path]:
    """The lock files in the folders under ``folder`` (not its own), down to
    :data:`NESTED_DEPTH` levels; hidden folders and links are not followed."""
    found: list[Path] = []
    seen = 0
    for directory, dirs, files in os.walk(folder, onerror=lambda _e: None):
        here = Path(directory)
        if here != folder and LOCK_NAME in files:
            found.append(here / LOCK_NAME)
        seen += 1
        if seen >= NESTED_FOLDERS:
            break
        level = len(here.relative_to(folder).parts)
        dirs[:] = [] if level >= NESTED_DEPTH else [d for d in dirs if not d.startswith(".")]
    return found
