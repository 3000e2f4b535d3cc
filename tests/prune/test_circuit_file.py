"""The circuit file schema (mechlab.prune.circuit_file): hostile and damaged files are
refused with one line naming the field, before any graph, figure or comparison is built
(issue 19: an infinite score, n_layers = 1e8, a writer a0.h1000000000, 200,000 nested
brackets and metadata.data = 5 each ended in a traceback)."""

from __future__ import annotations

import copy
import gc
import json
import time
from pathlib import Path

import pytest

from mechlab.prune import Circuit
from mechlab.prune.circuit_file import MAX_CIRCUIT_BYTES, read_circuit_file, validate_circuit_dict

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "circuits" / "recall-cpu" / "1-after_seed0.json"


@pytest.fixture(scope="module")
def good() -> dict:
    return json.loads(COMMITTED.read_text())


def refused(tmp_path, content: dict | str) -> str:
    path = tmp_path / "c.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content, allow_nan=True))
    gc.collect()  # a full collection of an earlier test's garbage is not this refusal's work
    # CPU time of this thread: the work the refusal did, not the machine's load nor the other
    # threads an earlier test left running (process_time counted 0.55 s of them on CI)
    start = time.thread_time()
    with pytest.raises(ValueError) as err:
        Circuit.from_json(path)
    assert time.thread_time() - start < 0.5  # refused from the file, before any work
    message = str(err.value)
    assert "\n" not in message and "c.json" in message
    return message


def changed(values: dict, change) -> dict:
    values = copy.deepcopy(values)
    change(values)
    return values


def test_every_committed_circuit_is_valid():
    paths = [p for p in ROOT.glob("circuits/**/*.json") if json.loads(p.read_text()).get("format") == "mechlab-circuit"]
    assert len(paths) >= 70
    for path in paths:
        read_circuit_file(path)


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda v: v["edges"][0].__setitem__(2, float("inf")), "edges[0][2] must be a finite number, got inf"),
        (lambda v: v["edges"][1].__setitem__(2, float("nan")), "edges[1][2] must be a finite number, got nan"),
        (lambda v: v["log_alpha"][0].__setitem__(2, float("-inf")), "log_alpha[0][2] must be a finite number"),
        (lambda v: v["edges"][0].__setitem__(2, "0.5"), "edges[0][2] must be a number, got '0.5'"),
        (lambda v: v["metadata"]["graph"].__setitem__("n_layers", 10**8),
         "metadata.graph.n_layers: Input should be less than or equal to 4096 (got 100000000)"),
        (lambda v: v["metadata"]["graph"].__setitem__("n_layers", 1e8), "metadata.graph.n_layers must be an integer"),
        (lambda v: v["metadata"]["graph"].__setitem__("n_writers", 10**8),
         "the circuit's graph would hold writers 1e+08 x readers 58"),
        (lambda v: v["edges"][0].__setitem__(0, "a0.h1000000000"),
         "edges[0][0]: 'a0.h1000000000' names layer 0, head 1000000000"),
        (lambda v: v["edges"][0].__setitem__(0, "a0.h7"), "'a0.h7' is outside the recorded graph (3 layers, 6 heads)"),
        (lambda v: v["edges"][0].__setitem__(1, "a9.h0.q"), "'a9.h0.q' is outside the recorded graph"),
        (lambda v: v["nodes"].append("x" * 1000), "field nodes[" ),
        (lambda v: v["nodes"].append("<script>"), "field nodes["),
        (lambda v: v["edges"][0].__setitem__(0, "bogus"), "'bogus' is not a component name"),
        (lambda v: v["metadata"].__setitem__("data", 5), "metadata.data must be a mapping, got 5"),
        (lambda v: v["metadata"].__setitem__("metrics", []), "metadata.metrics must be a mapping"),
        (lambda v: v["metadata"]["metrics"].__setitem__("faithfulness", [1]), "metadata.metrics.faithfulness"),
        (lambda v: v["metadata"].__setitem__("warnings", "oops"), "metadata.warnings must be a list"),
        (lambda v: v["metadata"].__setitem__("seed", "0"), "metadata.seed must be an integer"),
        (lambda v: v["metadata"].__setitem__("graph", []), "metadata.graph must be a mapping"),
        (lambda v: v["metadata"]["data"].__setitem__("windows", [["a", 0]]), "metadata.data.windows[0]"),
    ],
    ids=["inf-score", "nan-score", "inf-log-alpha", "string-score", "n_layers-1e8", "n_layers-float",
         "writers-1e8", "head-1e9", "head-outside-graph", "layer-outside-graph", "long-name", "markup-name",
         "not-a-component", "data-5", "metrics-list", "metric-list", "warnings-string", "seed-string",
         "graph-list", "window-short"],
)  # fmt: skip
def test_a_hostile_field_is_refused_naming_it(tmp_path, good, change, phrase):
    assert phrase in refused(tmp_path, changed(good, change))


def test_deep_nesting_is_refused_before_json_recursion(tmp_path):
    # 200,000 nested brackets: a RecursionError in json.loads before.
    assert "nests more than 32 levels deep" in refused(tmp_path, "[" * 200_000 + "]" * 200_000)
    deep_metadata = '{"format": "mechlab-circuit", "version": 1, "nodes": [], "edges": [], "metadata": {"x": ' + "[" * 40 + "]" * 40 + "}}"
    assert "nests more than" in refused(tmp_path, deep_metadata)
    brackets_in_strings = json.dumps({"format": "mechlab-circuit", "version": 1, "nodes": [], "edges": [],
                                      "metadata": {"note": "[" * 1000}})  # fmt: skip
    (tmp_path / "s.json").write_text(brackets_in_strings)
    assert Circuit.from_json(tmp_path / "s.json").metadata["note"] == "[" * 1000  # strings are skipped


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import mechlab.prune.circuit_file as circuit_file

    monkeypatch.setattr(circuit_file, "MAX_CIRCUIT_BYTES", 1000)
    path = tmp_path / "c.json"
    path.write_text(" " * 2000)
    with pytest.raises(ValueError, match="is 2,000 bytes, more than the 1,000"):
        Circuit.from_json(path)
    assert MAX_CIRCUIT_BYTES >= 64 << 20


def test_not_json_and_not_text_are_one_line(tmp_path):
    assert "is not valid JSON" in refused(tmp_path, '{"format": ')
    (tmp_path / "c.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        Circuit.from_json(tmp_path / "c.json")


def test_from_dict_validates_the_same_way(good):
    with pytest.raises(ValueError, match="edges.0..2. must be a finite number"):
        Circuit.from_dict(changed(good, lambda v: v["edges"][0].__setitem__(2, float("inf"))))
    assert validate_circuit_dict(good) is good
