"""Resuming: each planned result read back when its file records the run's settings, else
computed and written; the one loop every command that resumes runs.

A command that resumes (``eval``, ``recall``, ``prune``, ``prune --pairs``, ``curve``,
``report``) plans its folder first (:meth:`mechlab.pipelines.outputs.OutputFolder.plan`:
each result's JSON is ``"new"``, ``"same"`` or ``"redo"``), then walks its results with
:func:`resume_each`:

* ``"same"``: the JSON is read back (``read``), counted as kept, and its figure drawn when
  an interrupted run wrote the JSON only;
* otherwise: the result is computed (``compute``), its JSON written with its settings
  record (``write``), counted as kept (a rerun reads it back from then on), then its figure
  drawn.

Each result is ``<stem>.json`` and, when the command draws one, ``<stem>.html`` beside it.
The loop is a generator: the caller's own work on a result (a line printed, a callback)
runs before the next result is computed, as it did when each command wrote the loop out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from mechlab.pipelines.outputs import OutputFolder, read_json

K = TypeVar("K")
T = TypeVar("T")

SETTINGS_KEYS = ("settings", "settings_sha256")
"""The keys of a result's settings record (:func:`mechlab.pipelines.records.settings_record`)."""


@dataclass(frozen=True)
class Resumed(Generic[K, T]):
    """One result of a resuming command, computed now or read back.

    Attributes:
        key: The caller's key of the result (a target, a suite, a stem).
        value: The result.
        json_path: Its JSON.
        html_path: Its figure (None: the command draws none).
        status: What the plan said: ``"same"`` (read back), ``"new"`` or ``"redo"``
            (computed; ``"redo"`` replaced a file of other settings, with ``--force``).
    """

    key: K
    value: T
    json_path: Path
    html_path: Path | None
    status: str

    @property
    def reused(self) -> bool:
        """Read back from a file of the same settings."""
        return self.status == "same"


def read_result(path: Path) -> dict[str, Any]:
    """A result's JSON without its settings record (what the command computed)."""
    return {k: v for k, v in read_json(path).items() if k not in SETTINGS_KEYS}


def resume_each(
    folder: OutputFolder,
    status: Mapping[str, str],
    stems: Mapping[K, str],
    *,
    read: Callable[[K, Path], T],
    compute: Callable[[K], T],
    write: Callable[[K, T, str], Any],
    draw: Callable[[K, T, str], Any] | None = None,
    kept: Callable[[K, str], None] | None = None,
) -> Iterator[Resumed[K, T]]:
    """Each planned result, read back when the plan says ``"same"``, else computed and written.

    Args:
        folder: The claimed output folder.
        status: :meth:`~mechlab.pipelines.outputs.OutputFolder.plan`'s answer, by JSON name
            (a name it lacks is computed: a result the plan did not compare).
        stems: Key -> the result's stem in the folder (``<stem>.json``, ``<stem>.html``),
            in the order to walk.
        read: ``read(key, json_path)``: the result, read back.
        compute: ``compute(key)``: the result, computed.
        write: ``write(key, value, json_name)``: write the result's JSON, with its settings
            record.
        draw: ``draw(key, value, html_name)``: write its figure (None: no figure).
        kept: ``kept(key, status)``, once the result's JSON is on disk (read back or just
            written), before its figure: what an interrupted run names as kept.

    Yields:
        One :class:`Resumed` per stem, in order, each before the next is computed.
    """
    for key, stem in stems.items():
        json_name, html_name = f"{stem}.json", f"{stem}.html"
        json_path = folder.file(json_name)
        html_path = folder.file(html_name) if draw is not None else None
        state = status.get(json_name, "new")
        if state == "same":
            value = read(key, json_path)
            if kept is not None:
                kept(key, state)
            if draw is not None and not html_path.is_file():  # an interrupted run wrote the JSON only
                draw(key, value, html_name)
        else:
            value = compute(key)
            write(key, value, json_name)
            if kept is not None:
                kept(key, state)  # its JSON: a rerun reads it back (and draws a missing figure)
            if draw is not None:
                draw(key, value, html_name)
        yield Resumed(key, value, json_path, html_path, state)


def keeper(
    kept: list[str], *, reused: list[str] | None = None, replaced: list[str] | None = None
) -> Callable[[str, str], None]:
    """A ``kept`` callback for results keyed by their stem (:func:`resume_each`).

    Args:
        kept: Where each stem goes once its JSON is on disk (a :class:`~mechlab.pipelines.stops.Tally`'s
            ``kept``).
        reused: Where a stem read back goes too (None: nowhere).
        replaced: Where a stem that replaced a file of other settings goes too (None: nowhere).
    """

    def keep(stem: str, status: str) -> None:
        if status == "same" and reused is not None:
            reused.append(stem)
        elif status == "redo" and replaced is not None:
            replaced.append(stem)
        kept.append(stem)

    return keep
