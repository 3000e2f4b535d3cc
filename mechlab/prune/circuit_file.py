"""The circuit file format, checked against a schema before a circuit is built.

A circuit file (written by :meth:`mechlab.prune.Circuit.to_json`) is a JSON
object::

    {"format": "mechlab-circuit", "version": 1,
     "nodes": ["embed", "a0.h1", ...],
     "edges": [["embed", "a0.h1.q", 0.93], ...],          # writer, reader, score
     "metadata": {"checkpoint_sha256": "...", "target": "1-after", ...,
                  "consensus": {"scores": [["embed", "a0.h1.q", 0.8], ...], "n_runs": 9, ...}},
     "log_alpha": [["embed", "a0.h1.q", 2.1], ...]}       # optional

:func:`read_circuit_file` reads a file within limits (its size before reading, its
nesting depth before ``json.loads`` can recurse) and :func:`validate_circuit_dict`
checks it with a pydantic model: scores finite, component names well formed and
within the graph the file records (``a0.h1000000000`` is refused), graph sizes
bounded (``n_layers = 1e8`` is refused before any figure or graph is built),
the metadata mechlab reads of the right types (``metadata.data = 5`` is refused).
The first violation becomes one line that names the field (``edges[3][2]``), so a
hand-edited, truncated or hostile file fails with what is wrong and where.
:func:`checkpoint_groups` tells which circuits come from which checkpoint, so
``mechlab overlap`` can refuse to compare circuits of different checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationError,
    model_validator,
)

from mechlab.limits import check_elements
from mechlab.prune.graph import component_of, parse_component
from mechlab.schema import describe_error, json_type, load_json

FORMAT = "mechlab-circuit"
VERSION = 1

# Bounds of what a circuit file may describe. The largest model mechlab prunes has a
# few dozen layers and heads; a file asking for more is damaged or hostile.
MAX_LAYERS = 4096
MAX_HEADS = 4096
MAX_NAME_LENGTH = 128
# One entry per graph edge, about 60 bytes each: 256 MiB holds 4 million edges.
MAX_CIRCUIT_BYTES = 256 << 20
MAX_CIRCUIT_DEPTH = 32  # the deepest file mechlab writes nests 5 levels


@lru_cache(maxsize=65536)
def _check_name(name: str) -> str:
    """A component or reader name (``a0.h1``, ``a1.h0.q``, ``l0.state@label``) whose layer
    and head numbers are within the absolute bounds."""
    try:
        _, layer, head = parse_component(component_of(name))
    except ValueError:
        raise ValueError(f"{name!r} is not a component name (such as embed, a0.h1, a1.h0.q, m0, l0, out)") from None
    if layer >= MAX_LAYERS or head >= MAX_HEADS:
        raise ValueError(f"{name!r} names layer {layer}, head {head}: more than a circuit file may hold "
                         f"({MAX_LAYERS} layers, {MAX_HEADS} heads)")  # fmt: skip
    return name


_Name = Annotated[
    StrictStr,
    StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[A-Za-z0-9_.@:-]+$"),
    AfterValidator(_check_name),
]
_Label = Annotated[StrictStr, StringConstraints(max_length=MAX_NAME_LENGTH)]
# writer, reader, score (or log_alpha): a finite JSON number (ints allowed; strings,
# booleans, NaN and infinities refused).
_Score = Annotated[float, Strict(), AllowInfNan(False)]
_Edge = tuple[_Name, _Name, _Score]
_Count = Annotated[StrictInt, Field(ge=0)]
_Window = tuple[_Label, StrictInt, StrictInt]


class _Graph(BaseModel):
    model_config = ConfigDict(extra="allow")

    arch: _Label | None = None
    n_layers: Annotated[StrictInt, Field(ge=0, le=MAX_LAYERS)] | None = None
    n_heads: Annotated[StrictInt, Field(ge=0, le=MAX_HEADS)] | None = None
    n_writers: _Count | None = None
    n_readers: _Count | None = None
    n_edges: _Count | None = None
    windows: list[_Window] | None = None

    @model_validator(mode="after")
    def _fits(self) -> _Graph:
        # Writers x readers is what an edge table of this graph would hold.
        layers, heads = self.n_layers or 0, max(self.n_heads or 0, 1)
        writers = self.n_writers if self.n_writers is not None else layers * (heads + 1) + 2
        readers = self.n_readers if self.n_readers is not None else layers * (3 * heads + 1) + 1
        check_elements("the circuit's graph", {"writers": writers, "readers": readers}, lower="the graph's sizes")
        if self.n_edges is not None:
            check_elements("the circuit's graph", {"edges": self.n_edges}, lower="n_edges")
        return self


class _Data(BaseModel):
    """What the pruning data recorded (``metadata.data``), as far as mechlab reads it."""

    model_config = ConfigDict(extra="allow")

    task: StrictStr | None = None
    corruption: StrictStr | None = None
    nih_protocol: StrictStr | None = None
    group: StrictStr | None = None
    format: StrictStr | None = None
    n_haystack: _Count | None = None
    seg_len: _Count | None = None
    n_train: _Count | None = None
    n_test: _Count | None = None
    n_pos: _Count | None = None
    query_position: _Count | None = None
    length: _Count | None = None
    m: _Count | None = None
    L: _Count | None = None
    data_seed: StrictInt | None = None
    in_training_lengths: StrictBool | None = None
    windows: list[_Window] | None = None
    changed_positions: list[StrictInt] | None = None


_Number = Annotated[float, Strict()]  # ints allowed; NaN and infinities too (a failed metric)


class _Metrics(BaseModel):
    """The metrics mechlab reads back and formats as numbers; others are kept as they are."""

    model_config = ConfigDict(extra="allow")

    target: StrictStr | None = None
    n_traces: _Count | None = None
    faithfulness: _Number | None = None
    complement_faithfulness: _Number | None = None
    error_circuit: _Number | None = None
    error_full: _Number | None = None
    error_ablated: _Number | None = None
    error_complement: _Number | None = None


class _Consensus(BaseModel):
    """``metadata.consensus`` (:mod:`mechlab.prune.consensus`): how often runs keep each edge."""

    model_config = ConfigDict(extra="allow")

    scores: list[_Edge]  # writer, reader, fraction of runs keeping the edge
    n_runs: StrictInt


class _Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    checkpoint_sha256: StrictStr | None = None
    checkpoint: StrictStr | None = None
    checkpoint_step: StrictInt | None = None
    target: _Label | None = None
    ablation: StrictStr | None = None
    seed: StrictInt | None = None
    data_seed: StrictInt | None = None
    graph: _Graph | None = None
    consensus: _Consensus | None = None
    data: _Data | None = None
    metrics: _Metrics | None = None
    warnings: list[StrictStr] | None = None
    inert_writers: list[_Name] | None = None
    partners: list[_Label] | None = None
    jaccard_with: dict[StrictStr, _Number | None] | None = None


class CircuitFile(BaseModel):
    """The schema of a circuit file (unknown top-level keys are allowed and kept)."""

    model_config = ConfigDict(extra="allow")

    format: StrictStr
    version: StrictInt
    nodes: list[_Name]
    edges: list[_Edge]
    metadata: _Metadata = Field(default_factory=_Metadata)
    log_alpha: list[_Edge] | None = None

    @model_validator(mode="after")
    def _within_graph(self) -> CircuitFile:
        """Every name's layer and head within the graph the file records, if it records one."""
        graph = self.metadata.graph
        if graph is None or graph.n_layers is None:
            return self
        names = {n for n in self.nodes}
        for rows in (self.edges, self.log_alpha or []):
            names.update(name for row in rows for name in row[:2])
        for name in names:
            _, layer, head = parse_component(component_of(name))
            if layer >= graph.n_layers or (graph.n_heads is not None and head >= graph.n_heads):
                raise ValueError(
                    f"{name!r} is outside the recorded graph ({graph.n_layers} layers, "
                    f"{graph.n_heads} heads); fix the file or re-create it with mechlab prune"
                )
        return self


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
            f"{source} is not a mechlab circuit: it holds a JSON {json_type(values)}, not an "
            "object with format, version, nodes and edges; pass a file written by mechlab prune"
        )
    fmt = values.get("format")
    if fmt != FORMAT:
        raise ValueError(
            f"{source} is not a mechlab circuit (format {_short(fmt)}, expected {FORMAT!r}); pass a "
            "file written by mechlab prune"
        )
    version = values.get("version")
    if type(version) is not int or version != VERSION:
        raise ValueError(
            f"{source} has an unsupported circuit version {_short(version)} (this mechlab reads "
            f"{VERSION}); re-create it with this mechlab's prune"
        )
    try:
        CircuitFile.model_validate(values)
    except ValidationError as err:
        raise ValueError(
            describe_error(err, f"{source} is not a valid mechlab circuit", "fix the file or re-create it with mechlab prune")
        ) from None
    return values


def read_circuit_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a circuit file: its size before reading (:data:`MAX_CIRCUIT_BYTES`),
    its depth before parsing (:data:`MAX_CIRCUIT_DEPTH`), then the schema.

    Returns:
        The parsed, validated dict.

    Raises:
        ValueError: One line naming the file (and the field).
    """
    values = load_json(path, "circuit file", MAX_CIRCUIT_BYTES, MAX_CIRCUIT_DEPTH)
    return validate_circuit_dict(values, repr(str(path)))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"a {json_type(value)}"


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
