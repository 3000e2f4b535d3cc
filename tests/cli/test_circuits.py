"""`mechlab prune --share`: joint pruning of a checkpoint's targets from the command line."""

from __future__ import annotations

import json

import pytest

from mechlab.cli import main
from mechlab.prune import Circuit

pytestmark = pytest.mark.usefixtures("one_thread")


def test_joint_prune_writes_the_sweep_and_its_circuits(tiny_lds_checkpoint, tmp_path, capsys):
    out = tmp_path / "c"
    code = main(["prune", "--ckpt", str(tiny_lds_checkpoint), "--target", "1-after", "--target",
                 "2-after", "--share", "0", "--share", "tied", "--steps", "5", "--traces", "8",
                 "--test-traces", "8", "--no-progress", "--out", str(out), "--threads", "1"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "cost = faithfulness at share 0 minus at this share" in printed
    table = json.loads((out / "joint" / "joint.json").read_text())
    assert table["targets"] == ["1-after", "2-after"]
    assert [r["share"] for r in table["rows"]] == [0.0, "tied"]
    tied = {t: Circuit.from_json(out / "joint" / "share-tied" / f"{t}_seed0.json")
            for t in ("1-after", "2-after")}  # fmt: skip
    assert set(tied["1-after"].edges) == set(tied["2-after"].edges)  # one circuit for both
    for t, circuit in tied.items():
        meta = circuit.metadata
        assert meta["joint"] and meta["share"] == "tied" and meta["checkpoint"] == str(tiny_lds_checkpoint)
        row = table["rows"][1][t]
        assert row["faithfulness"] == pytest.approx(meta["metrics"]["faithfulness"])
    assert (out / "joint" / "share-0" / "1-after_seed0.html").is_file()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--share", "1"], "give two or more --target"),
        (["--target", "2-after", "--share", "much"], "--share must be a number >= 0 or tied"),
        (["--target", "2-after", "--share", "-1"], "share must be >= 0"),
        (["--target", "2-after", "--share", "1", "--recipe", "study"], "joint pruning masks edges only"),
        (["--target", "1-after", "--share", "1"], "distinct"),
    ],
)
def test_bad_joint_input_is_one_line_exit_2(tiny_lds_checkpoint, tmp_path, capsys, extra, message):
    code = main(["prune", "--ckpt", str(tiny_lds_checkpoint), "--target", "1-after", *extra,
                 "--steps", "1", "--out", str(tmp_path / "c")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()  # refused before any work


def test_an_interrupted_joint_sweep_resumes_from_the_circuits_written(tiny_lds_checkpoint, tmp_path,
                                                                       monkeypatch, capsys):  # fmt: skip
    import mechlab.prune.joint as joint

    args = ["prune", "--ckpt", str(tiny_lds_checkpoint), "--target", "1-after", "--target", "2-after",
            "--share", "0", "--share", "tied", "--steps", "5", "--traces", "8", "--test-traces", "8",
            "--no-progress", "--out", str(tmp_path / "c"), "--threads", "1"]  # fmt: skip
    real = joint.joint_prune
    calls = []

    def interrupted(*a, **k):  # the second (share, seed) never finishes
        if calls:
            raise KeyboardInterrupt
        calls.append(k["share"])
        return real(*a, **k)

    monkeypatch.setattr(joint, "joint_prune", interrupted)
    assert main(args) != 0
    assert (tmp_path / "c" / "joint" / "share-0" / "1-after_seed0.json").is_file()  # kept
    assert not (tmp_path / "c" / "joint" / "joint.json").exists()

    def counted(*a, **k):
        calls.append(k["share"])
        return real(*a, **k)

    monkeypatch.setattr(joint, "joint_prune", counted)
    assert main(args) == 0
    assert calls == [0.0, float("inf")]  # only the unfinished share ran again
    first = json.loads((tmp_path / "c" / "joint" / "joint.json").read_text())
    assert main(args) == 0 and calls == [0.0, float("inf")]  # all done: nothing runs
    assert json.loads((tmp_path / "c" / "joint" / "joint.json").read_text()) == first
    other = [*args[:-4], "--steps", "6", *args[-4:]]
    capsys.readouterr()
    assert main(other) == 2  # other settings: refused, naming them, before any work
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "steps 5 (now 6)" in err and "--force" in err
    assert calls[2:] == []
    assert main([*other, "--force"]) == 0  # asked: pruned again, the files replaced
    assert calls[2:] == [0.0, float("inf")]
    assert Circuit.from_json(tmp_path / "c" / "joint" / "share-0" / "1-after_seed0.json").metadata["steps"] == 6
    capsys.readouterr()


def test_the_budget_note_says_what_happened_and_what_to_do():
    from mechlab.cli.circuits import budget_note

    # the metadata of the bundled 1-after circuit under the previous default (500 steps, no
    # warm start), which kept 16 of the 25 edges asked; the new default keeps all 25
    meta = {"method": "prune", "sparsity_asked": 0.95, "sparsity_reached": 0.967741935483871,
            "sparsity_limited_by_open_edges": True, "sparsity_limited_by_paths": True, "n_edges_kept": 16,
            "n_edges_asked": 25, "n_open_edges": 17, "n_open_edges_on_paths": 16, "n_edges_countable": 496,
            "steps": 500, "seconds": 40.0}  # fmt: skip
    note = budget_note(meta, meta["n_edges_kept"])
    assert note.startswith("kept 16 edges where sparsity 0.95 allows 25: the search closed every other edge")
    assert "17 stayed open, 16 of them on complete paths" in note and "Not an error" in note
    assert "--steps" in note


def test_overlap_says_each_stage_as_it_starts(capsys):
    files = [f"circuits/recall-cpu/{t}_seed{s}.json" for t in ("1-after", "2-after") for s in (0, 1)]
    assert main(["overlap", *files, "--boot", "20", "--null", "20"]) == 0
    err = capsys.readouterr().err
    assert "bootstrap (20 resamples of each target's circuits) and null models (20 samples each)" in err
    assert "degree null" in err  # its progress bar
    assert main(["overlap", *files, "--boot", "20", "--null", "20", "--no-progress"]) == 0
    assert "bootstrap" not in capsys.readouterr().err


def test_ctrl_c_during_overlap_says_nothing_was_written(tmp_path):
    """overlap writes --json only at its end: stopped in its null models, it says so in one
    line, and no file (or temporary file) is left."""
    from tests.interrupt import ROOT, interrupt, stopped_line

    files = [str(ROOT / f"circuits/recall-cpu/{t}_seed{s}.json") for t in ("1-after", "2-after") for s in (0, 1)]
    args = ["overlap", *files, "--null", "10000000", "--json", str(tmp_path / "o.json")]
    line = stopped_line(interrupt(args, "bootstrap ("))  # its stage line: the null models start
    assert line == (f"mechlab: stopped by signal 2 (SIGINT, Ctrl-C) before the end; nothing was written "
                    f"('{tmp_path / 'o.json'}' is written only at the end) and no partial file is left; run the same "
                    f"command again to start over: python -m mechlab {' '.join(args)}")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_prune_without_steps_or_rates_runs_the_library_defaults(tiny_lds_checkpoint, monkeypatch):
    """`mechlab prune` leaves --steps, --lr and --lambda-lr to the recipe and PruneConfig
    (200 steps at the default), instead of hard-coding its own values."""
    import types

    import mechlab.pipelines as pipelines
    from mechlab.prune.config import PruneConfig, prune_config

    seen = {}

    def captured(ckpt, targets, seeds, out, **settings):
        seen.update(settings)
        return types.SimpleNamespace(overlaps=[], stability=None, reused=[], replaced=[], updated=[])

    monkeypatch.setattr(pipelines, "prune_targets", captured)
    assert main(["prune", "--ckpt", str(tiny_lds_checkpoint), "--no-progress"]) == 0
    search = seen["request"].search  # the one request the command resolved
    assert not {"steps", "lr", "lambda_lr"} & set(search)
    assert prune_config(None, **{k: v for k, v in search.items() if k != "progress"}) == PruneConfig()
    assert main(["prune", "--ckpt", str(tiny_lds_checkpoint), "--no-progress", "--steps", "7",
                 "--lr", "0.2"]) == 0  # fmt: skip
    search = seen["request"].search
    assert (search["steps"], search["lr"], search.get("lambda_lr")) == (7, 0.2, None)
