"""Finished trials on disk: one JSON file per trial, written atomically.

A trial is named by its key, a hash of its spec (every field except ``device``, which
does not change what is computed). The file ``<dir>/<key>.json`` holds
``{"key", "spec", "result"}`` and is written with :func:`mechlab.io.atomic_write_text`
(temporary file, fsync, rename), so a sweep killed at any moment leaves each trial
either finished and complete on disk or absent. A re-run reads the directory and skips
every trial already there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mechlab.io import atomic_write_text, remove_orphan_temps

_NOT_IDENTITY = ("device",)


def _canonical(spec: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in spec.items() if k not in _NOT_IDENTITY}, sort_keys=True,
                      separators=(",", ":"), default=str)  # fmt: skip


def trial_key(spec: Mapping[str, Any]) -> str:
    """The name of a trial: 20 hex digits of the SHA-256 of its spec (without ``device``).

    Args:
        spec: The trial spec as a dict (``TrialSpec`` fields).

    Returns:
        The key.
    """
    return hashlib.sha256(_canonical(spec).encode("utf-8")).hexdigest()[:20]


class TrialStore:
    """Finished trials of a sweep, one file each under ``directory``.

    Args:
        directory: Where the trial files live (created if missing). Temporary files a
            killed write left behind are removed on opening.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_orphan_temps(self.directory)
        self._results: dict[str, dict[str, Any]] = {}
        for path in sorted(self.directory.glob("*.json")):
            record = json.loads(path.read_text(encoding="utf-8"))
            self._results[record["key"]] = record["result"]

    def __contains__(self, spec: Mapping[str, Any]) -> bool:
        return trial_key(spec) in self._results

    def __len__(self) -> int:
        return len(self._results)

    def get(self, spec: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored result of ``spec``, or ``None`` if it has not finished."""
        return self._results.get(trial_key(spec))

    def get_key(self, key: str) -> dict[str, Any] | None:
        """The stored result of the trial named ``key`` (see :func:`trial_key`)."""
        return self._results.get(key)

    def put(self, spec: Mapping[str, Any], result: Mapping[str, Any]) -> Path:
        """Persist one finished trial (atomically) and remember it.

        Args:
            spec: The trial spec as a dict.
            result: Its result dict (JSON-serialisable).

        Returns:
            The file written.
        """
        key = trial_key(spec)
        result = {**result, "spec": dict(spec)}
        text = json.dumps({"key": key, "spec": dict(spec), "result": result}, indent=1, default=str)
        path = atomic_write_text(self.directory / f"{key}.json", text + "\n")
        self._results[key] = json.loads(text)["result"]
        return path

    def results(self) -> Iterator[dict[str, Any]]:
        """Every stored result (each with its ``spec``)."""
        return iter(list(self._results.values()))
