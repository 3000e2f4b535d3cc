"""Tests of mechlab.pipelines.resume: the plan / read back / compute / write loop of the
commands that resume, on a real output folder."""

from __future__ import annotations

import json

import pytest

from mechlab.pipelines import outputs
from mechlab.pipelines.resume import keeper, read_result, resume_each


class Loop:
    """A resuming command in miniature: each key's result is its square, drawn as text."""

    def __init__(self, folder: outputs.OutputFolder, settings: dict[str, int]):
        self.folder, self.settings = folder, settings
        self.log: list[tuple[str, str]] = []

    def records(self, keys):
        return {f"r{k}.json": {"x": k, **self.settings} for k in keys}

    def read(self, key, path):
        self.log.append(("read", key))
        return read_result(path)

    def compute(self, key):
        self.log.append(("compute", key))
        return {"square": key * key}

    def write(self, key, value, name):
        assert name == f"r{key}.json"
        self.log.append(("write", key))
        self.folder.write_json(name, {**value, **outputs.settings_record(self.records([key])[name])})

    def draw(self, key, value, name):
        self.log.append(("draw", key))
        self.folder.write_text(name, f"<p>{value['square']}</p>")

    def kept(self, key, status):
        assert self.folder.file(f"r{key}.json").is_file()  # the JSON is on disk when it counts as kept
        self.log.append((status, key))

    def run(self, keys):
        status = self.folder.plan(self.records(keys))
        return list(resume_each(self.folder, status, {k: f"r{k}" for k in keys}, read=self.read,
                                compute=self.compute, write=self.write, draw=self.draw, kept=self.kept))  # fmt: skip


def test_a_fresh_folder_computes_writes_counts_then_draws(tmp_path):
    with outputs.OutputFolder(tmp_path / "out", "test") as folder:
        loop = Loop(folder, {"n": 1})
        done = loop.run([2, 3])
    assert [d.value for d in done] == [{"square": 4}, {"square": 9}]
    assert [(d.key, d.status, d.reused) for d in done] == [(2, "new", False), (3, "new", False)]
    assert loop.log == [("compute", 2), ("write", 2), ("new", 2), ("draw", 2),
                        ("compute", 3), ("write", 3), ("new", 3), ("draw", 3)]  # fmt: skip
    written = json.loads((tmp_path / "out" / "r3.json").read_text())
    assert written["square"] == 9 and written["settings"] == {"x": 3, "n": 1} and "settings_sha256" in written
    assert (tmp_path / "out" / "r3.html").read_text() == "<p>9</p>"
    assert done[1].json_path == tmp_path / "out" / "r3.json" and done[1].html_path == tmp_path / "out" / "r3.html"


def test_a_rerun_reads_back_and_draws_only_a_missing_figure(tmp_path):
    with outputs.OutputFolder(tmp_path / "out", "test") as folder:
        Loop(folder, {"n": 1}).run([2, 3])
    (tmp_path / "out" / "r3.html").unlink()  # an interrupted run wrote the JSON only
    with outputs.OutputFolder(tmp_path / "out", "test") as folder:
        loop = Loop(folder, {"n": 1})
        done = loop.run([2, 3, 4])
    assert loop.log == [("read", 2), ("same", 2), ("read", 3), ("same", 3), ("draw", 3),
                        ("compute", 4), ("write", 4), ("new", 4), ("draw", 4)]  # fmt: skip
    assert [d.value for d in done] == [{"square": 4}, {"square": 9}, {"square": 16}]  # no settings record
    assert [d.reused for d in done] == [True, True, False]


def test_other_settings_are_refused_then_replaced_with_force(tmp_path):
    with outputs.OutputFolder(tmp_path / "out", "test") as folder:
        Loop(folder, {"n": 1}).run([2])
    with outputs.OutputFolder(tmp_path / "out", "test") as folder, pytest.raises(ValueError, match="other settings"):
        Loop(folder, {"n": 2}).run([2])
    with outputs.OutputFolder(tmp_path / "out", "test", force=True) as folder:
        loop = Loop(folder, {"n": 2})
        done = loop.run([2])
    assert done[0].status == "redo" and ("redo", 2) in loop.log
    assert json.loads((tmp_path / "out" / "r2.json").read_text())["settings"]["n"] == 2


def test_the_loop_yields_each_result_before_computing_the_next(tmp_path):
    with outputs.OutputFolder(tmp_path / "out", "test") as folder:
        loop = Loop(folder, {"n": 1})
        status = folder.plan(loop.records([1, 2]))
        walk = resume_each(folder, status, {1: "r1", 2: "r2"}, read=loop.read, compute=loop.compute,
                           write=loop.write)  # fmt: skip
        first = next(walk)
        assert first.key == 1 and first.html_path is None and loop.log == [("compute", 1), ("write", 1)]
        assert [d.key for d in walk] == [2]
    assert not (tmp_path / "out" / "r1.html").exists()  # no draw: no figure


def test_a_result_the_plan_did_not_compare_is_computed(tmp_path):
    with outputs.OutputFolder(tmp_path / "out", "test") as folder:
        loop = Loop(folder, {"n": 1})
        done = list(resume_each(folder, {}, {5: "r5"}, read=loop.read, compute=loop.compute, write=loop.write))
    assert done[0].status == "new" and done[0].value == {"square": 25}


def test_the_keeper_names_what_was_read_back_and_replaced():
    kept, reused, replaced = [], [], []
    keep = keeper(kept, reused=reused, replaced=replaced)
    for stem, status in (("a", "same"), ("b", "new"), ("c", "redo")):
        keep(stem, status)
    assert (kept, reused, replaced) == (["a", "b", "c"], ["a"], ["c"])
    only = []
    keeper(only)("a", "same")
    assert only == ["a"]
