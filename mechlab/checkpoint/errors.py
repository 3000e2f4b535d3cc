"""The one error a checkpoint file can give: :class:`CheckpointError`, with a one-line message."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded. The message is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).splitlines()))


class UncheckedCheckpointWarning(UserWarning):
    """A checkpoint loaded without a checksum (written before checksums existed): damage
    to it could not be detected. Re-save it with ``save_checkpoint`` to add one."""



def _corrupt_field(path: Path, field: str, wanted: str, got: Any) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is corrupt: its {field!r} entry is {type(got).__name__}, not "
        f"{wanted}; re-save it with save_checkpoint"
    )


def _brief(err: BaseException, limit: int = 120) -> str:
    """First sentence of an exception message, on one line and at most ``limit`` characters."""
    if str(err).startswith("Weights only load failed") and err.__context__ is not None:
        err = err.__context__  # torch's wrapper; the cause is the inner unpickling error
    text = " ".join(str(err).split())
    if isinstance(err, KeyError | EOFError) or not text:
        text = f"{type(err).__name__} {text}".strip()
    text = text.split(". ")[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _names(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"[{shown}]{more}"
