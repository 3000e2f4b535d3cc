"""Settings records: the canonical JSON and SHA-256 of what shaped a result, read and compared."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mechlab.schema import load_json

_NOT_SETTINGS = ("device", "progress", "threads")


def canonical(settings: Mapping[str, Any]) -> str:
    """Settings as canonical JSON (sorted keys, no spaces, tuples as lists; device,
    threads and progress left out); a non-finite number is written as a string."""

    def plain(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)  # inf (a tied share) -> "inf": JSON has no infinity
        if isinstance(value, Path):
            return str(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {"type": type(value).__name__, **plain(dataclasses.asdict(value))}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"setting of type {type(value).__name__} cannot be recorded: {value!r}")

    kept = {k: v for k, v in settings.items() if k not in _NOT_SETTINGS}
    return json.dumps(plain(kept), sort_keys=True, separators=(",", ":"), allow_nan=False)


def with_defaults(fn: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` with ``fn``'s defaults for every keyword-only argument it does not set (so
    a setting left to its default and the same value given explicitly record alike);
    device, threads, progress and the checkpoint's own digest are left out."""
    skip = (*_NOT_SETTINGS, "checkpoint_sha256")
    filled = {name: p.default for name, p in inspect.signature(fn).parameters.items()
              if p.kind is p.KEYWORD_ONLY and name not in skip and p.default is not p.empty}  # fmt: skip
    return {**filled, **{k: v for k, v in given.items() if k not in skip}}


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (read in chunks)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def settings_record(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``{"settings": ..., "settings_sha256": ...}`` of a result: what it records so that a
    later run reuses it only when every setting matches."""
    text = canonical(settings)
    return {"settings": json.loads(text), "settings_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The settings record a JSON output holds (top level, or a circuit's ``metadata``),
    or None (no record, or not a readable JSON object)."""
    try:
        data = read_json(path)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    for holder in (data, data.get("metadata")):
        if isinstance(holder, dict) and isinstance(holder.get("settings_sha256"), str):
            settings = holder.get("settings")
            return {"settings": settings if isinstance(settings, dict) else {},
                    "settings_sha256": holder["settings_sha256"]}  # fmt: skip
    return None


def read_json(path: str | Path) -> Any:
    """A JSON output read back within limits (:func:`mechlab.schema.load_json`)."""
    return load_json(path, "output", max_bytes=256 << 20, max_depth=64)


def differences(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 4) -> str:
    """The settings that differ, as ``name old (now new)``, at most ``limit`` of them."""
    old, new = json.loads(canonical(old)), json.loads(canonical(new))  # device etc. are no settings
    keys = sorted(set(old) | set(new), key=lambda k: (k != "checkpoint_sha256", k))
    changed = []
    for key in keys:
        if old.get(key, "<unset>") != new.get(key, "<unset>"):
            a, b = old.get(key, "unset"), new.get(key, "unset")
            if key == "checkpoint_sha256":
                a, b = str(a)[:12], str(b)[:12]
            changed.append(f"{key} {_show(a)} (now {_show(b)})")
    more = f", and {len(changed) - limit} more" if len(changed) > limit else ""
    return ", ".join(changed[:limit]) + more if changed else "the same settings, another record"


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."
