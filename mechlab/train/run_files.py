"""A run folder's files beside its checkpoints: the JSONL metrics log and the trainer's lock."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

from mechlab.io import atomic_write_text
from mechlab.schema import MAX_DEPTH, json_depth


class MetricsFile:
    """Append-only JSONL metrics file; on resume, lines after the resumed step are dropped.

    A torn last line (a write cut short by ``kill -9`` or a full disk) is dropped with
    a warning naming the file; any other line that is not a JSON object stops the
    resume with the file and line number.
    """

    def __init__(
        self, path: Path, resume_step: int | None, lines: list[tuple[str, dict[str, Any]]] | None = None
    ):
        self.path = path
        if resume_step is not None and path.exists():
            lines = read_metrics_lines(path) if lines is None else lines
            kept = [line for line, record in lines if record.get("step", 0) <= resume_step]
            atomic_write_text(path, "".join(f"{line}\n" for line in kept))
        elif resume_step is None and path.exists():
            path.unlink()

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


def read_metrics_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The lines of a ``metrics.jsonl`` with their records, a torn last line dropped.

    Args:
        path: The metrics file.

    Returns:
        ``(line, record)`` for every non-empty line.

    Raises:
        ValueError: The file cannot be read, or a line other than the last is not a
            JSON object with a numeric ``step`` (the message names the file and line).
    """
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except OSError as err:
        raise ValueError(f"cannot read the metrics file {str(path)!r}: {err.strerror or err}") from None
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    out = []
    for index, (number, line) in enumerate(numbered):
        try:
            if json_depth(line) > MAX_DEPTH:  # json.loads would recurse past the interpreter's limit
                raise ValueError(f"nests more than {MAX_DEPTH} levels deep")
            record = json.loads(line)
            step = record.get("step", 0) if isinstance(record, dict) else None
            if not isinstance(step, int | float) or isinstance(step, bool):
                raise ValueError("not a JSON object with a numeric 'step'")
        except ValueError as err:  # JSONDecodeError is a ValueError
            reason = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
            if index == len(numbered) - 1:
                warnings.warn(
                    f"dropped the torn last line {number} of {str(path)!r} ({reason}); it is the "
                    "record of a write that was cut short",
                    UserWarning,
                    stacklevel=2,
                )
                break
            raise ValueError(
                f"line {number} of the metrics file {str(path)!r} is damaged ({reason}); delete or "
                "fix that line, then resume"
            ) from None
        out.append((line, record))
    return out


@contextlib.contextmanager
def exclusive_run_dir(out_dir: Path):
    """Hold an exclusive lock on ``out_dir/.lock`` while a trainer writes to the directory.

    The lock dies with the process (also on ``kill -9``); on systems without
    ``fcntl`` nothing is locked.
    """
    try:
        # lazy: POSIX only; the ImportError below is the other systems' path
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    fd = os.open(out_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ValueError(
                f"another mechlab train is writing to {str(out_dir)!r}; wait for it to finish or "
                "choose another --out"
            ) from None
        yield
    finally:
        os.close(fd)
