"""mechlab.schema: YAML and JSON from outside read within limits (size, depth, tags,
alias expansion) and validated against the config classes, with one-line errors."""

from __future__ import annotations

import dataclasses
import time

import pytest
from pydantic import StrictInt

from mechlab import schema

LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


def load(tmp_path, text: str, **kwargs):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return schema.load_yaml(path, **kwargs)


def refused(tmp_path, text: str) -> str:
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        load(tmp_path, text)
    assert time.perf_counter() - start < 1.0
    assert "\n" not in str(err.value) and "c.yaml" in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    "text",
    ["steps: !!python/object/apply:os.system ['echo pwned']\n", "x: !!python/name:os.system\n",
     "x: !!python/object:collections.OrderedDict {}\n", "x: !custom 3\n", "--- !!python/tuple [1, 2]\n"],
)  # fmt: skip
def test_tags_beyond_plain_yaml_are_refused_by_name(tmp_path, text):
    message = refused(tmp_path, text)
    assert "holds the tag" in message and "which mechlab does not load" in message


def test_a_billion_laughs_is_refused_while_parsing(tmp_path):
    assert "expands to more than 1,000,000 values" in refused(tmp_path, LAUGHS)
    assert load(tmp_path, "base: &b {x: 1, y: 2}\nother: *b\n") == {"base": {"x": 1, "y": 2}, "other": {"x": 1, "y": 2}}


@pytest.mark.parametrize("text", ["a: " + "[" * 3000 + "]" * 3000 + "\n", "".join(" " * i + "k:\n" for i in range(1000))])
def test_deep_nesting_is_refused_without_recursion(tmp_path, text):
    assert "nests more than 64 levels deep" in refused(tmp_path, text)


def test_oversized_missing_and_invalid_files(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("x: 1\n" * 300_000)
    with pytest.raises(ValueError, match=r"is 1,500,000 bytes, more than the 1,048,576"):
        schema.load_yaml(big)
    with pytest.raises(ValueError, match="not found"):
        schema.load_yaml(tmp_path / "none.yaml")
    assert "is not valid YAML (line 2, column 1: expected ',' or ']'" in refused(tmp_path, "a: [1, 2\n")


def test_numbers_read_as_yaml_1_2_does(tmp_path):
    values = load(tmp_path, "lr: 1e-3\nsteps: 10\nb: 2.5\nc: .inf\nd: '1e-3'\ne: 1_000\nf: 0x10\ng: yes\n")
    assert values == {"lr": 1e-3, "steps": 10, "b": 2.5, "c": float("inf"), "d": "1e-3", "e": 1000, "f": 16, "g": True}


def test_json_depth_skips_strings_and_stops_at_the_limit():
    assert schema.json_depth('{"a": [1, {"b": "[[[[["}]}') == 3
    assert schema.json_depth('"\\"[[["') == 0
    start = time.perf_counter()
    assert schema.json_depth("[" * 10**6, limit=10) == 11
    assert time.perf_counter() - start < 0.5


@dataclasses.dataclass
class Config:
    steps: StrictInt = 1

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be positive, got {self.steps}")


@pytest.mark.parametrize(
    "values, phrase",
    [({"steps": "abc"}, "src: steps must be an integer, got 'abc'; fix it"),
     ({"steps": True}, "steps must be an integer, got True"),
     ({"steps": 2.0}, "steps must be an integer, got 2.0"),
     ({"steps": 0}, "src: steps must be positive, got 0")],
)  # fmt: skip
def test_validate_names_the_field_in_one_line(values, phrase):
    with pytest.raises(ValueError) as err:
        schema.validate(Config, values, "src", "fix it")
    assert str(err.value) == phrase or phrase in str(err.value)
    assert schema.validate(Config, {"steps": 3}, "src") == Config(3)
