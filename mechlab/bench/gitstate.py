"""What git says about the code a benchmark ran: the commit, the files changed since.

Every function takes the checkout's root and returns None (or nothing) where git cannot
answer: no git, not a checkout, a commit the repository does not hold (a shallow clone).
Paths are git pathspecs relative to the root (``mechlab/prune/forward.py``,
``mechlab/models/*.py``); a file's content is named by its git blob hash
(``git hash-object``), so an uncommitted change can be recognised later.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

GIT_SECONDS = 10.0


def git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS``'s output, or None when git is missing or fails."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=GIT_SECONDS, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def checkout_root(where: Path) -> Path | None:
    """The root of the git checkout holding ``where``, or None outside one."""
    out = git(where, "rev-parse", "--show-toplevel")
    return Path(out.strip()) if out and out.strip() else None


def head(root: Path) -> str | None:
    """The commit checked out at ``root`` (``git rev-parse HEAD``), or None."""
    out = git(root, "rev-parse", "--verify", "HEAD")
    return out.strip() if out and out.strip() else None


def has_commit(root: Path, commit: str) -> bool:
    """Whether the repository holds ``commit`` (a shallow clone may not)."""
    return git(root, "cat-file", "-e", f"{commit}^{{commit}}") is not None


def changed_files(root: Path, since: str, paths: Sequence[str]) -> list[str] | None:
    """The files under ``paths`` whose content differs from commit ``since``: changed in a
    later commit, changed and not committed (``git diff --name-only SINCE -- PATHS``
    compares with the working tree), or new and untracked; None when git cannot tell."""
    diff = git(root, "diff", "--name-only", since, "--", *paths)
    new = git(root, "ls-files", "--others", "--exclude-standard", "--", *paths)
    if diff is None or new is None:
        return None
    return sorted({line for line in (diff + new).splitlines() if line})


def file_hashes(root: Path, files: Iterable[str]) -> dict[str, str | None]:
    """Each file's content as its git blob hash, None where the file does not exist."""
    hashes: dict[str, str | None] = {}
    for name in files:
        out = git(root, "hash-object", "--", name) if (root / name).is_file() else None
        hashes[name] = out.strip() if out else None
    return hashes


def uncommitted(root: Path, paths: Sequence[str]) -> dict[str, str | None] | None:
    """The files under ``paths`` that differ from HEAD, with their content's hash (None:
    deleted), or None when git cannot tell."""
    files = changed_files(root, "HEAD", paths)
    return None if files is None else file_hashes(root, files)
