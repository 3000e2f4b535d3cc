"""mechlab.pipelines.through_training: the circuits of every checkpoint of a run, joined."""

from __future__ import annotations

import json

import pytest
import torch

from mechlab.checkpoint import save_checkpoint
from mechlab.models import build_model
from mechlab.pipelines import prune_through_training
from mechlab.pipelines.through_training import across_checkpoints, thin_checkpoints
from mechlab.prune import Circuit
from mechlab.prune.circuit import jaccard
from tests.conftest import TINY_LDS_TASK

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = (0, 5, 12)
BATCH = 4
SMALL = {"n_train": 8, "n_test": 8, "progress": False, "method": "exact", "n_edges": 4}


def tiny_run(folder, steps=STEPS, task="lds"):
    """A run directory of ``len(steps)`` checkpoints of a tiny transformer (each its own
    random weights, so that the circuits differ), as the trainer names them."""
    for i, step in enumerate(steps):
        torch.manual_seed(i)
        model = build_model({"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2,
                             "io": "continuous", "d_in": 2 * 4 + 2 + 3, "d_out": 3, "n_ctx": 24})  # fmt: skip
        meta = {"task": task, "task_cfg": TINY_LDS_TASK if task == "lds" else {}} if task else {}
        save_checkpoint(model, folder / "checkpoints" / f"step_{step:07d}.pt", step=step,
                        train_cfg={"eval_haystack": 2, "eval_seg_len": 4, "batch_size": BATCH}, **meta)  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def pruned(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("through") / "tt"
    return prune_through_training(run_dir, ["1-after", "2-after"], [0], out, **SMALL), out


def _independent(out, target, stem_tag="_exact"):
    """The across numbers computed from the written circuit files alone."""
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    circuits = [Circuit.from_json(f / f"{target}{stem_tag}_seed0.json") for f in folders]
    kept = [set(c.edges) for c in circuits]
    steps = [c.metadata["checkpoint_step"] for c in circuits]
    appears = {}
    for edge in kept[-1]:
        i = len(kept) - 1
        while i > 0 and edge in kept[i - 1]:
            i -= 1
        appears[edge] = steps[i]
    return steps, [len(k) for k in kept], [jaccard(k, kept[-1]) for k in kept], appears, circuits


def test_across_json_matches_the_circuit_files(pruned):
    run, out = pruned
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [f"step_{s:07d}" for s in STEPS]
    data = json.loads((out / "across.json").read_text())
    assert set(data["targets"]) == {"1-after", "2-after"} and data["seed"] == 0
    for target in ("1-after", "2-after"):
        steps, sizes, similarity, appears, circuits = _independent(out, target)
        rows = data["targets"][target]["checkpoints"]
        assert [r["step"] for r in rows] == steps == list(STEPS)
        assert [r["examples"] for r in rows] == [BATCH * s for s in STEPS]
        assert [r["edges"] for r in rows] == sizes
        assert [r["jaccard_with_last"] for r in rows] == pytest.approx(similarity)
        assert rows[-1]["jaccard_with_last"] == 1.0
        assert [r["faithfulness"] for r in rows] == pytest.approx(
            [c.metadata["metrics"]["faithfulness"] for c in circuits])  # fmt: skip
        edges = {(e["writer"], e["reader"]): e for e in data["targets"][target]["edges"]}
        assert set(edges) == set().union(*(c.edges for c in circuits))
        for edge, e in edges.items():
            assert e["kept_at_steps"] == [s for s, c in zip(steps, circuits, strict=True) if edge in c.edges]
            assert e["in_last"] == (edge in appears)
            assert e["appears_at_step"] == appears.get(edge)
            assert e["appears_at_examples"] == (None if edge not in appears else BATCH * appears[edge])
        assert (out / f"across_{target}.html").is_file()
    assert sum(sizes) > 0 and min(similarity) < 1.0  # the checkpoints' circuits differ: a real test


def test_rerun_reads_everything_back_and_rewrites_nothing(pruned, run_dir):
    _, out = pruned
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != ".mechlab.lock")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    again = prune_through_training(run_dir, ["1-after", "2-after"], [0], out, **SMALL)
    assert all(len(r.reused) == 2 for r in again.runs.values())
    after = sorted(p for p in out.rglob("*") if p.is_file() and p.name != ".mechlab.lock")
    assert after == files
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == before


def test_every_thins_the_checkpoints_and_keeps_the_last(tmp_path):
    from mechlab.pipelines.checkpoints import run_checkpoints

    ckpts = run_checkpoints(tiny_run(tmp_path / "r", steps=(0, 1, 2, 3, 4, 5, 6)))
    assert [c.step for c in thin_checkpoints(ckpts, 1)] == [0, 1, 2, 3, 4, 5, 6]
    assert [c.step for c in thin_checkpoints(ckpts, 3)] == [0, 3, 6]
    assert [c.step for c in thin_checkpoints(ckpts, 4)] == [0, 4, 6]
    assert [c.step for c in thin_checkpoints(ckpts, 10)] == [0, 6]
    assert [c.step for c in thin_checkpoints(list(reversed(ckpts)), 2)] == [0, 2, 4, 6]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="every"):
            thin_checkpoints(ckpts, bad)


def test_every_prunes_only_the_chosen_checkpoints(run_dir, tmp_path):
    out = tmp_path / "tt"
    run = prune_through_training(run_dir, ["1-after"], [0], out, every=2, **SMALL)
    assert [c.step for c in run.checkpoints] == [0, 12]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["step_0000000", "step_0000012"]
    rows = json.loads((out / "across.json").read_text())["targets"]["1-after"]["checkpoints"]
    assert [r["step"] for r in rows] == [0, 12]


def test_out_inside_the_run_reruns(tmp_path):
    # OUT under the run folder: its own files are outputs, read back on a rerun, not inputs.
    run = tiny_run(tmp_path / "r", steps=(0, 5))
    out = run / "through-training"
    prune_through_training(run, ["1-after"], [0], out, **SMALL)
    first = (out / "across.json").read_bytes()
    again = prune_through_training(run, ["1-after"], [0], out, **SMALL)
    assert all(len(r.reused) == 1 for r in again.runs.values())
    assert (out / "across.json").read_bytes() == first


def test_across_checkpoints_appearance_needs_every_later_checkpoint():
    def circuit(*edges):
        return Circuit(edges={e: 1.0 for e in edges}, nodes=set(), metadata={"metrics": {"faithfulness": 0.5}})

    a, b, c = ("x", "y"), ("y", "z"), ("x", "z")
    across = across_checkpoints([circuit(a, b), circuit(b), circuit(a, b, c)], [1, 2, 3], [10, 20, 30])
    edges = {(e["writer"], e["reader"]): e for e in across["edges"]}
    assert edges[a]["appears_at_step"] == 3 and edges[a]["kept_at_steps"] == [1, 3]  # dropped at 2
    assert edges[b]["appears_at_step"] == 1 and edges[b]["appears_at_examples"] == 10
    assert edges[c]["appears_at_step"] == 3
    assert [r["jaccard_with_last"] for r in across["checkpoints"]] == pytest.approx([2 / 3, 1 / 3, 1.0])


def test_bad_input_is_refused_before_any_write(tmp_path, run_dir):
    out = tmp_path / "tt"
    with pytest.raises(ValueError, match="no checkpoints/step_"):
        prune_through_training(tmp_path, ["1-after"], [0], out, **SMALL)
    with pytest.raises(ValueError, match="not found"):
        prune_through_training(tmp_path / "nothing", ["1-after"], [0], out, **SMALL)
    with pytest.raises(ValueError, match="target"):
        prune_through_training(run_dir, ["1-after", "9-after"], [0], out, **SMALL)
    with pytest.raises(ValueError, match="every"):
        prune_through_training(run_dir, ["1-after"], [0], out, every=0, **SMALL)
    with pytest.raises(ValueError):
        prune_through_training(run_dir, ["1-after"], [0], out, **{**SMALL, "n_edges": 0})
    mixed = tiny_run(tmp_path / "mixed", steps=(0, 3))
    tiny_run(mixed, steps=(9,), task="state_tracking")  # a checkpoint of another task, last
    with pytest.raises(ValueError, match="not trained on the lds task"):
        prune_through_training(mixed, ["1-after"], [0], out, **SMALL)
    tiny_run(mixed, steps=(10,), task=None)  # no task metadata
    with pytest.raises(ValueError, match="no task metadata"):
        prune_through_training(mixed, ["1-after"], [0], out, **SMALL)
    assert not out.exists()


def test_other_settings_are_refused_before_any_work(pruned, run_dir):
    _, out = pruned
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".mechlab.lock"}
    with pytest.raises(ValueError, match="other settings"):
        prune_through_training(run_dir, ["1-after", "2-after"], [0], out, **{**SMALL, "n_edges": 3})
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".mechlab.lock"} == files


def test_two_seeds_record_their_consensus_and_join_the_first(run_dir, tmp_path):
    out = tmp_path / "tt"
    run = prune_through_training(run_dir, ["1-after"], [1, 0], out, **SMALL)
    data = json.loads((out / "across.json").read_text())
    assert data["seed"] == 1
    for folder, step_run in run.runs.items():
        first = Circuit.from_json(out / folder / "1-after_exact_seed1.json")
        assert "consensus" in first.metadata and step_run.circuits["1-after"][0].edges == first.edges
    last = Circuit.from_json(out / "step_0000012" / "1-after_exact_seed1.json")
    final = {(e["writer"], e["reader"]) for e in data["targets"]["1-after"]["edges"] if e["in_last"]}
    assert final == set(last.edges)
