"""The recall harness on checkpoints and runs (mechlab.pipelines.recall) and `mechlab recall`."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

import mechlab
from mechlab.cli import main
from mechlab.pipelines import recall_dynamics
from mechlab.tasks.lds import LDSConfig
from mechlab.viz import recall_dynamics_figure, recall_figure
from tests.test_label_vs_observation import TASK, build

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg() -> LDSConfig:
    return LDSConfig(**TASK)


BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "checkpoints" / "recall-cpu" / "last.pt"


@pytest.fixture(scope="module")
def runs(cfg, tmp_path_factory):
    root = tmp_path_factory.mktemp("recall")
    meta = {"task": "lds", "task_cfg": cfg.to_dict(),
            "train_cfg": {"batch_size": 8, "eval_haystack": 2, "eval_seg_len": 4}}  # fmt: skip
    torch.manual_seed(0)
    lstm = build(cfg, {"arch": "lstm", "d_model": 16, "n_layers": 2})
    mamba = build(cfg, {"arch": "mamba", "d_model": 16, "n_layers": 1})
    paths = {
        "lstm": mechlab.save_checkpoint(lstm, root / "lstm.pt", step=0, **meta),
        "bare": mechlab.save_checkpoint(lstm, root / "bare.pt", step=0),
        "other_task": mechlab.save_checkpoint(lstm, root / "other.pt", step=0, task="chess", task_cfg={}),
    }
    for step in (0, 5, 40):
        mechlab.save_checkpoint(mamba, root / "run" / "checkpoints" / f"step_{step:07d}.pt", step=step, **meta)
    paths["run"] = root / "run"
    for step, meta_ in ((0, meta), (9, {})):  # a run whose later checkpoint has no task metadata
        mechlab.save_checkpoint(lstm, root / "badrun" / "checkpoints" / f"step_{step:07d}.pt", step=step, **meta_)
    paths["badrun"] = root / "badrun"
    return paths


def test_recurrent_checkpoints_get_mixer_components(runs):
    from mechlab.pipelines import recall_checkpoint

    report = recall_checkpoint(runs["lstm"], n_traces=16, progress=False)
    r = report["result"]
    assert r["n_haystack"] == 2 and r["seg_len"] == 4 and r["offsets"] == [1, 2, 3, 4]
    assert {c["component"] for c in r["components"]} == {"l0", "l1"}
    assert set(r["per_offset"]["1"]) >= {"score", "verdict", "follows_label", "e_label", "e_obs"}
    assert isinstance(recall_figure(report), go.Figure)


def test_dynamics_over_checkpoints(runs):
    d = recall_dynamics(runs["run"], n_traces=16, offsets=(1, 2), progress=False)
    assert d["steps"] == [0, 5, 40] and d["examples"] == [0, 40, 320]
    assert list(d["per_offset"]) == ["1", "2"]
    assert all(len(v["verdict"]) == 3 for v in d["per_offset"].values())
    # the same weights at every step: the same scores
    assert len(set(d["per_offset"]["2"]["e_label"])) == 1
    assert isinstance(recall_dynamics_figure(d), go.Figure)
    with pytest.raises(ValueError, match="no checkpoints"):
        recall_dynamics(runs["run"] / "checkpoints")


def test_cli_writes_json_and_html_on_the_bundled_checkpoint(tmp_path, capsys):
    out = tmp_path / "rc"
    assert main(["recall", "--ckpt", str(BUNDLED), "--traces", "24", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    report = json.loads((out / "recall.json").read_text())
    html = (out / "recall.html").read_text()
    assert "<html>" in html and "plotly" in html
    r = report["result"]
    assert r["offsets"] == [1, 2, 3, 4, 5, 6] and report["step"] == 20000
    # the trained model: 1-after follows the label, 2-after the observations
    assert r["per_offset"]["1"]["verdict"] == "label" and r["per_offset"]["1"]["follows_label"] > 0.8
    assert r["per_offset"]["2"]["verdict"] == "observation"
    assert len(r["components"]) == 3 * 3 * (6 + 2) * 6  # label noise, label denoise, observation
    assert "1-after" in text and "heads carrying the label" in text


def test_cli_dynamics_writes_under_mechlab_out(runs, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["recall", "--checkpoints", str(runs["run"]), "--traces", "8", "--offset", "1",
                 "--no-progress"]) == 0  # fmt: skip
    folder = tmp_path / "mechlab-out" / runs["run"].name / "recall"  # not beside the run
    d = json.loads((folder / "recall_dynamics.json").read_text())
    assert d["steps"] == [0, 5, 40] and (folder / "recall_dynamics.html").exists()
    assert not (runs["run"] / "recall").exists()
    assert "score verdict (follows_label)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("which", "extra", "message"),
    [("bare", [], "no task"), ("other_task", [], "task 'chess'"), ("missing", [], "not found"),
     ("lstm", ["--offset", "5"], "offset 5 is beyond seg_len=4"), (None, [], "give --ckpt")],
)  # fmt: skip
def test_cli_bad_input_exits_2_and_writes_nothing(runs, tmp_path, capsys, which, extra, message):
    out = tmp_path / "out"
    ckpt = [] if which is None else ["--ckpt", str(runs.get(which, tmp_path / "missing.pt"))]
    assert main(["recall", *ckpt, *extra, "--traces", "8", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mechlab: error:") and message in err and "\n" not in err
    assert not out.exists()


def test_cli_dynamics_checks_every_checkpoint_before_writing(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["recall", "--checkpoints", str(runs["badrun"]), "--out", str(out), "--no-progress"]) == 2
    assert "step_0000009.pt" in capsys.readouterr().err and not out.exists()
    assert main(["recall", "--checkpoints", str(tmp_path / "nowhere"), "--no-progress"]) == 2


def test_cli_dynamics_beside_the_run_reruns_and_replaces(runs, tmp_path, capsys):
    # `--out RUN/recall` (the documented place): a rerun reads the scores back, other
    # settings are refused until --force; the run's checkpoints stay untouched.
    import shutil

    run = tmp_path / "run"
    shutil.copytree(runs["run"], run)
    out = run / "recall"

    def recall(traces: int, *extra: str) -> int:
        return main(["recall", "--checkpoints", str(run), "--traces", str(traces), "--offset", "1",
                     "--out", str(out), "--no-progress", *extra])  # fmt: skip

    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    assert recall(8) == 0
    first = (out / "recall_dynamics.json").read_bytes()
    assert recall(8) == 0 and (out / "recall_dynamics.json").read_bytes() == first
    capsys.readouterr()
    assert recall(12) == 2
    err = capsys.readouterr().err.strip()
    assert "other settings" in err and "--force" in err and "\n" not in err
    assert (out / "recall_dynamics.json").read_bytes() == first  # nothing written
    assert recall(12, "--force") == 0
    assert json.loads((out / "recall_dynamics.json").read_text())["n_traces"] == 12
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before


def test_sigterm_during_recall_keeps_the_report_written_and_the_rerun_reads_it_back(tmp_path, capsys):
    from tests.interrupt import interrupt, leftovers, stopped_line

    out = tmp_path / "recall"
    args = ["recall", "--ckpt", str(BUNDLED), "--checkpoints", str(BUNDLED.parent), "--traces", "32",
            "--no-components", "--threads", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    done = interrupt(args, out / "recall.json", signum=signal.SIGTERM)  # the run's 13 checkpoints follow
    line = stopped_line(done, signal.SIGTERM)
    assert line.startswith(f"mechlab: stopped by signal 15 (SIGTERM) after 1 of 2 report(s); kept recall in '{out}'; "
                           "resume with the same command"), line  # fmt: skip
    assert not (out / "recall_dynamics.json").exists() and not leftovers(out)
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"recall: read back {out / 'recall.json'} (same settings)" in printed
    assert (out / "recall_dynamics.json").is_file()
