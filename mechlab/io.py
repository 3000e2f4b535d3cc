"""Atomic file writes: a temporary file in the target's directory, fsync, then rename.

A reader (or a run interrupted mid-write) sees the old file or the new one, never
half of one. Every file mechlab writes goes through here.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def atomic_write(path: str | Path, write: Callable[[BinaryIO], Any]) -> Path:
    """Write ``path`` by calling ``write(file)`` on a temporary file, then renaming it.

    Args:
        path: Destination; its directory is created if missing.
        write: Writes the content into the binary file object it is given.

    Returns:
        The destination path. On any error the temporary file is removed and the
        previous content of ``path`` (if any) is left intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _mode_for(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, mode)  # mkstemp makes 0600; give what a plain open() would
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    # Make the rename itself durable (POSIX); not every platform can open a directory.
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


# The names atomic_write's temporary files have: ".<name>.<8 random characters>.tmp".
_TEMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


def remove_orphan_temps(directory: str | Path) -> list[Path]:
    """Remove the temporary files an interrupted :func:`atomic_write` left in ``directory``.

    A save killed between creating its temporary file and renaming it (``kill -9``,
    a power cut) leaves ``.<name>.<random>.tmp`` behind; nothing else ever removes
    it. Call this only where no other process is writing (the trainer holds a lock
    on its run directory while it does).

    Args:
        directory: The folder to clean (not its subfolders); a missing one is fine.

    Returns:
        The files removed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for entry in sorted(directory.iterdir()):
        if _TEMP_NAME.match(entry.name) and entry.is_file() and not entry.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed.append(entry)
    return removed


def _mode_for(path: Path) -> int:
    """The permission bits a plain ``open(path, "w")`` would leave: the existing file's,
    else ``0o666`` less the process umask."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`atomic_write`."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))
