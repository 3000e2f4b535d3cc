"""Files from outside: parsed within limits, then checked against a schema.

A YAML or JSON file a user hands mechlab (a train or sweep config, a circuit) may be
hand-edited, truncated or hostile. Before any of it is used:

* its size is checked on disk (:data:`MAX_CONFIG_BYTES` for configs), before it is read;
* its nesting depth is measured without recursion (JSON: a scan of the brackets; YAML:
  the parser's event stream), so 200,000 nested brackets are one line of error instead
  of a ``RecursionError`` in ``json.loads`` or in PyYAML's composer;
* a YAML file is read with the safe loader, and any tag but the plain ones (``!!str``,
  ``!!int``, ``!!map`` ...) is refused by name, so ``!!python/object`` never reaches a
  constructor; aliases are allowed but the document's size with every alias expanded
  is bounded (:data:`MAX_YAML_NODES`), so a billion-laughs file is refused in the parse;
* its values are validated against the config class itself (:func:`validate`: a
  pydantic ``TypeAdapter`` of the dataclass, whose field annotations are the schema),
  and the first violation becomes one line that names the field (``steps``).

Every problem is a ``ValueError`` whose message is one line: what is wrong, where, and
what to do.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

# Config files are a few hundred bytes; a megabyte is generous. Circuit files hold one
# entry per graph edge and set their own limit.
MAX_CONFIG_BYTES = 1 << 20
MAX_DEPTH = 64  # nesting levels of a config or circuit file (the deepest real one has 6)
MAX_YAML_NODES = 1_000_000  # values in a YAML document with every alias expanded

T = TypeVar("T")

_PLAIN_TAGS = {
    f"tag:yaml.org,2002:{name}"
    for name in ("str", "int", "float", "bool", "null", "seq", "map", "timestamp", "binary", "merge")
}


class _Loader(yaml.SafeLoader):
    """The safe loader, reading ``1e-3`` (no dot) as a float as YAML 1.2 does (YAML 1.1
    reads it as a string, which no one writing a learning rate means)."""


_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_Loader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def read_limited(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The text of ``path``, refused before reading when it is larger than ``max_bytes``.

    Args:
        path: The file.
        what: What the file is, for the message (``"config file"``).
        max_bytes: The largest size accepted.

    Raises:
        ValueError: Missing, not a file, too large, or not UTF-8 text.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} not found" if not path.exists() else f"{what} {str(path)!r} is not a file")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(
            f"{what} {str(path)!r} is {size:,} bytes, more than the {max_bytes:,} a {what} may have; "
            "pass the right file"
        )
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {str(path)!r} is not UTF-8 text; pass a text file") from None


# --------------------------------------------------------------------------- YAML


def load_yaml(path: str | os.PathLike[str], what: str = "config file", max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """Read a YAML file safely: size, depth, tags and alias expansion checked first.

    Args:
        path: The file.
        what: What it is, for the messages.
        max_bytes: The largest file accepted.

    Returns:
        The document (None for an empty file).

    Raises:
        ValueError: One line, for a missing or oversized file, invalid YAML (with its
            line and column), a tag other than the plain ones (``!!python/object`` ...),
            nesting deeper than :data:`MAX_DEPTH`, or more than :data:`MAX_YAML_NODES`
            values once the aliases are expanded.
    """
    return parse_yaml(read_limited(path, what, max_bytes), f"{what} {str(Path(path))!r}")


def parse_yaml(text: str, source: str = "YAML text", advice: str = "fix the file") -> Any:
    """:func:`load_yaml` of a string (``source`` names it in messages, ``advice`` ends them)."""
    try:
        _check_yaml_events(text, source)
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as err:
        raise ValueError(f"{source} is not valid YAML ({_yaml_problem(err)}); {advice}") from None


def _check_yaml_events(text: str, source: str) -> None:
    """Depth, tags and expanded size from the event stream (the parser does not recurse)."""
    stack: list[int] = []  # values counted so far in each open collection
    anchors_open: list[str | None] = []
    sizes: dict[str, int] = {}  # anchor -> values of its node, expanded
    total = 0
    for event in yaml.parse(text, Loader=_Loader):
        tag = getattr(event, "tag", None)
        if tag is not None and tag not in _PLAIN_TAGS and tag != "!":
            mark = event.start_mark
            raise ValueError(
                f"{source} holds the tag {tag.replace('tag:yaml.org,2002:', '!!')!r} (line "
                f"{mark.line + 1}), which mechlab does not load: only plain YAML (mappings, lists, "
                "strings, numbers, booleans, null) is read; remove the tag"
            )
        if isinstance(event, yaml.AliasEvent):
            size = sizes.get(event.anchor, 1)
        elif isinstance(event, yaml.ScalarEvent):
            size = 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            stack.append(1)
            anchors_open.append(event.anchor)
            if len(stack) > MAX_DEPTH:
                raise ValueError(
                    f"{source} nests more than {MAX_DEPTH} levels deep (line {event.start_mark.line + 1}); "
                    "a mechlab config is a few levels deep - fix the file"
                )
            continue
        elif isinstance(event, yaml.CollectionEndEvent):
            size = stack.pop()
            anchor = anchors_open.pop()
            if anchor is not None:
                sizes[anchor] = size
        else:
            continue
        if stack:
            stack[-1] += size
            if stack[0] > MAX_YAML_NODES:
                raise _too_many_nodes(source)
        else:
            total += size
            if total > MAX_YAML_NODES:
                raise _too_many_nodes(source)


def _too_many_nodes(source: str) -> ValueError:
    return ValueError(
        f"{source} expands to more than {MAX_YAML_NODES:,} values once its aliases (*name) are "
        "resolved; write the values out, or fix the file"
    )


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or type(err).__name__
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return " ".join(f"{where}{problem}".split())


# --------------------------------------------------------------------------- JSON


def json_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """The bracket nesting depth of a JSON text, found without parsing (strings skipped);
    the scan stops as soon as ``limit`` is passed and returns that depth."""
    depth = deepest = 0
    for match in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif token in "]}":
            depth -= 1
    return deepest


def load_json(path: str | os.PathLike[str], what: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Read a JSON file within limits: its size before reading, its depth before parsing.

    ``NaN`` and ``Infinity`` are read as floats (as Python writes them); a schema decides
    whether they are allowed.

    Raises:
        ValueError: One line, for a missing, oversized, too deep or invalid file.
    """
    text = read_limited(path, what, max_bytes)
    source = f"{what} {str(Path(path))!r}"
    if json_depth(text, max_depth) > max_depth:
        raise ValueError(f"{source} nests more than {max_depth} levels deep; fix the file or re-create it")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{source} is not valid JSON ({err}); fix the file or re-create it") from None
    except RecursionError:  # only reachable with a limit above the interpreter's
        raise ValueError(f"{source} nests too deeply to read; fix the file") from None


# --------------------------------------------------------------------------- validation


@functools.cache
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def validate(kind: type[T], values: Any, source: str, advice: str = "fix the file") -> T:
    """Build ``kind`` (a dataclass or pydantic model) from ``values``, checking every field's
    type against its annotation first.

    The dataclass's annotations are the schema (``steps: StrictInt``); its
    ``__post_init__`` then checks ranges and relations, and a ``ValueError`` it raises
    comes out unchanged.

    Args:
        kind: The class.
        values: A mapping of its fields (unknown keys are the caller's to refuse).
        source: What the values came from, for the message (``"config file 'c.yaml'"``).
        advice: What to do, the message's last part.

    Returns:
        The instance.

    Raises:
        ValueError: One line naming ``source``, the field and what it should be.
    """
    try:
        return _adapter(kind).validate_python(values)
    except ValidationError as err:
        raise ValueError(describe_error(err, source, advice)) from None


def describe_error(err: ValidationError, source: str, advice: str) -> str:
    """One line for a pydantic error: the first problem, its field, and how many more."""
    errors = err.errors()
    first = errors[0]
    original = (first.get("ctx") or {}).get("error")
    if first["type"] == "value_error" and isinstance(original, ValueError) and not first["loc"]:
        return f"{source}: {original}"  # the class's own check, already one line
    # A union (``ms: 5`` or ``ms: [5, 7]``) reports one error per member: only other
    # fields count as further problems.
    more = len({e["loc"][:1] for e in errors} - {first["loc"][:1]})  # other fields with problems
    got = first.get("input")
    kind = json_type(got)
    shown = repr(got) if len(repr(got)) <= 40 else f"a{'n' if kind[0] in 'aeiou' else ''} {kind}"
    field = where(first["loc"])
    if first["type"] in _MUST_BE:
        problem = f"{field} must be {_MUST_BE[first['type']]}, got {shown}"
    elif first["type"] == "missing":
        problem = f"field {field} is missing"
    elif first["type"] == "value_error" and isinstance(original, ValueError):
        problem = f"field {field}: {original}"
    else:
        problem = f"field {field}: {first['msg'].rstrip('.')} (got {shown})"
    return (
        f"{source}: {problem}"
        + (f", and {more} more problem{'s' if more > 1 else ''}" if more else "")
        + f"; {advice}"
    )


# pydantic's error types, in the words mechlab's own checks use.
_MUST_BE = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "string_type": "a string", "bool_type": "true or false", "bool_parsing": "true or false",
    "dict_type": "a mapping", "list_type": "a list", "tuple_type": "a list",
    "dataclass_type": "a mapping", "model_type": "a mapping", "none_required": "null",
}  # fmt: skip


_MEMBER_NAMES = {"str", "int", "float", "bool", "dict", "list", "tuple", "none"}


def _is_member_name(part: Any) -> bool:
    """Whether a part of a pydantic error location names a union member, not a field."""
    return isinstance(part, str) and ("[" in part or part.startswith("function-") or part in _MEMBER_NAMES)


def where(loc: Sequence[Any]) -> str:
    """``("edges", 3, 2)`` -> ``edges[3][2]``; pydantic's union branch names are dropped."""
    out = ""
    for part in loc:
        if _is_member_name(part):
            continue  # a union member's name, not a field
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return " ".join(out.split()) or "the top level"


def json_type(value: Any) -> str:
    """The JSON name of a value's type (``object``, ``list``, ``number`` ...)."""
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    if type(value) in names:
        return names[type(value)]
    return "number" if isinstance(value, int | float) else type(value).__name__
