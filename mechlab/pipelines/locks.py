"""Output-folder locks: one per folder, naming its owner; a dead owner's lock is taken over."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

LOCK_NAME = ".mechlab.lock"
"""The lock file of an output folder (removed when its run ends)."""


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
        try:
            import fcntl
        except ImportError:  # not POSIX: a pid file
            return self._acquire_pid_file()
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                text = os.read(fd, 4096).decode("utf-8", "replace")
                os.close(fd)
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

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None
