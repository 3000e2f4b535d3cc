"""The circuit file format, checked against a schema before a circuit is built.

A circuit file (written by :meth:`mechlab.prune.Circuit.to_json`) is a JSON
object::

    {"format": "mechlab-circuit", "version": 1,
     "nodes": ["embed", "a0.h1", ...],
     "edges": [["embed", "a0.h1.q", 0.93], ...],          # writer, reader, score
     "metadata": {"checkpoint_sha256": "...", "target": "1-after", ...,
                  "consensus": {"scores": [["embed", "a0.h1.q", 0.8], ...], "n_runs": 9, ...}},
     "log_alpha": [["embed", "a0.h1.q", 2.1], ...]}       # optional

:func:`validate_circuit_dict` checks that shape with a pydantic model and turns
the first violation into one line that names the field (``edges[3][2]``), so a
hand-edited or truncated file fails with what is wrong and where.
:func:`checkpoint_groups` tells which circuits come from which checkpoint, so
``mechlab overlap`` can refuse to compare circuits of different checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

FORMAT = "mechlab-circuit"
VERSION = 1

# writer, reader, score (or log_alpha): a JSON number, NaN and infinities allowed as
# to_json writes them (StrictFloat takes ints, refuses strings and booleans).
_Edge = tuple[StrictStr, StrictStr, StrictFloat]


class _Graph(BaseModel):
    model_config = ConfigDict(extra="allow")

    arch: StrictStr | None = None
    n_layers: StrictInt | None = None
    n_heads: StrictInt | None = None


class _Consensus(BaseModel):
    """``metadata.consensus`` (:mod:`mechlab.prune.consensus`): how often runs keep each edge."""

    model_config = ConfigDict(extra="allow")

    scores: list[_Edge]  # writer, reader, fraction of runs keeping the edge
    n_runs: StrictInt


class _Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    checkpoint_sha256: StrictStr | None = None
    target: StrictStr | None = None
    graph: _Graph | None = None
    consensus: _Consensus | None = None


class CircuitFile(BaseModel):
    """The schema of a circuit file (unknown top-level keys are allowed and kept)."""

    model_config = ConfigDict(extra="allow")

    format: StrictStr
    version: StrictInt
    nodes: list[StrictStr]
    edges: list[_Edge]
    metadata: _Metadata = Field(default_factory=_Metadata)
    log_alpha: list[_Edge] | None = None


def _where(loc: Sequence[Any]) -> str:
    """``("edges", 3, 2)`` -> ``edges[3][2]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the top level"


def validate_circuit_dict(values: Any, source: str = "circuit") -> dict[str, Any]:
    """Check a parsed circuit file against :class:`CircuitFile`.

    Args:
        values: What ``json.loads`` returned for the file.
        source: The file's name, for the message.

    Returns:
        ``values`` itself (a dict), unchanged.

    Raises:
        ValueError: One line naming the file, the field and what it should be.
    """
    if not isinstance(values, dict):
        raise ValueError(
            f"{source} is not a mechlab circuit: it holds a JSON {_json_type(values)}, not an "
            "object with format, version, nodes and edges; pass a file written by mechlab prune"
        )
    fmt = values.get("format")
    if fmt != FORMAT:
        raise ValueError(
            f"{source} is not a mechlab circuit (format {fmt!r}, expected {FORMAT!r}); pass a file "
            "written by mechlab prune"
        )
    version = values.get("version")
    if type(version) is not int or version != VERSION:
        raise ValueError(
            f"{source} has an unsupported circuit version {version!r} (this mechlab reads "
            f"{VERSION}); re-create it with this mechlab's prune"
        )
    try:
        CircuitFile.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        more = len(err.errors()) - 1
        got = first.get("input")
        kind = _json_type(got)
        shown = repr(got) if len(repr(got)) <= 40 else f"a{'n' if kind[0] in 'aeiou' else ''} {kind}"
        got_text = "" if first["type"] == "missing" else f" (got {shown})"
        raise ValueError(
            f"{source} is not a valid mechlab circuit: field {_where(first['loc'])}: "
            f"{first['msg'].rstrip('.')}{got_text}"
            + (f", and {more} more problem{'s' if more > 1 else ''}" if more else "")
            + "; fix the file or re-create it with mechlab prune"
        ) from None
    return values


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    if type(value) in names:
        return names[type(value)]
    return "number" if isinstance(value, int | float) else type(value).__name__


def checkpoint_groups(
    metadata: Sequence[Mapping[str, Any]], names: Sequence[str]
) -> dict[str | None, list[str]]:
    """Which circuits come from which checkpoint.

    Args:
        metadata: Each circuit's metadata.
        names: Each circuit's name (its file), in the same order.

    Returns:
        ``checkpoint_sha256`` (None where a circuit records none) -> the names of the
        circuits from that checkpoint, in order of first appearance.
    """
    groups: dict[str | None, list[str]] = {}
    for meta, name in zip(metadata, names, strict=True):
        sha = meta.get("checkpoint_sha256")
        groups.setdefault(sha if isinstance(sha, str) else None, []).append(name)
    return groups


def describe_groups(groups: Mapping[str | None, Sequence[str]]) -> str:
    """One line: ``a.json, b.json from 1234abcd; c.json from 5678ef90``."""
    parts = []
    for sha, names in groups.items():
        where = f"checkpoint {sha[:12]}" if sha else "an unrecorded checkpoint"
        parts.append(f"{', '.join(names)} from {where}")
    return "; ".join(parts)
