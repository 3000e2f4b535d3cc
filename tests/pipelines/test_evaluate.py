"""Evaluating checkpoints and runs (mechlab.pipelines.evaluate) and the figures of every suite."""

from __future__ import annotations

import json
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

from mechlab.checkpoint import save_checkpoint
from mechlab.evals import SUITES
from mechlab.models import build_model
from mechlab.pipelines import eval_dynamics as dynamics
from mechlab.pipelines import run_suite
from mechlab.tasks.lds import LDSConfig
from mechlab.tasks.lds_evals import PROBES
from mechlab.train import TrainConfig, train
from mechlab.viz import figure_for_suite, write_html

TASK = {
    "d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
    "n_train_systems": 200, "n_test_systems": 50,
}


MODEL = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2}


@pytest.fixture(scope="module")
def cfg() -> LDSConfig:
    return LDSConfig(**TASK)


@pytest.fixture(scope="module")
def model(cfg):
    torch.manual_seed(0)
    return build_model({**MODEL, "io": "continuous", "d_in": cfg.d_in, "d_out": cfg.d_out, "n_ctx": cfg.n_ctx})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 12-step run of the tiny task with checkpoints at steps 0, 1, 2, 5, 12."""
    out = tmp_path_factory.mktemp("run")
    cfg = TrainConfig(
        task_cfg=TASK, model=MODEL, steps=12, batch_size=8, eval_haystack=2, eval_seg_len=4,
        eval_traces=32, eval_every=0, n_checkpoints=4,
    )
    train(cfg, out, progress=False)
    return out


def test_run_suite_reports_and_defaults_to_the_runs_eval_settings(run_dir):
    report = run_suite(run_dir / "last.pt", "nih", n_traces=24, seed=5)
    assert set(report) == {"suite", "checkpoint", "sha256", "step", "seed", "result"}
    assert report["suite"] == "nih" and report["step"] == 12 and report["seed"] == 5
    assert len(report["sha256"]) == 64
    assert report["result"]["n_haystack"] == 2 and report["result"]["seg_len"] == 4  # from train_cfg
    assert report["result"]["n_traces"] == 24
    assert run_suite(run_dir / "last.pt", "nih", n_traces=24, seed=5) == report  # deterministic
    with pytest.raises(ValueError, match="unknown suite 'nope'"):
        run_suite(run_dir / "last.pt", "nope")


def test_run_suite_needs_task_metadata(tmp_path, model):
    bare = save_checkpoint(model, tmp_path / "bare.pt", step=3)
    with pytest.raises(ValueError, match=r"bare\.pt.*has no task metadata"):
        run_suite(bare, "nih", n_traces=4)


def test_dynamics_has_one_entry_per_checkpoint(run_dir):
    result = dynamics(run_dir, n_traces=24, n_haystack=2, seg_len=4, seed=2, progress=False)
    assert result["steps"] == [0, 1, 2, 5, 12]
    assert result["examples"] == [8 * s for s in result["steps"]]
    assert all(a < b for a, b in zip(result["examples"], result["examples"][1:], strict=False))
    for key in ("offsets", "q1", "q3"):
        assert list(result[key]) == ["1", "2", "3"]
        assert all(len(v) == 5 for v in result[key].values())
    # Each entry is the nih suite of that checkpoint.
    last = run_suite(run_dir / "checkpoints" / "step_0000012.pt", "nih", n_traces=24, seed=2)
    assert result["offsets"]["2"][-1] == last["result"]["offsets"]["2"]["median"]
    # run_suite finds the run directory from last.pt or from a checkpoints/ file.
    via_last = run_suite(run_dir / "last.pt", "dynamics", n_traces=24, seed=2)
    via_ckpt = run_suite(run_dir / "checkpoints" / "step_0000001.pt", "dynamics", n_traces=24, seed=2)
    assert via_last["result"] == via_ckpt["result"] == result
    with pytest.raises(ValueError, match="no checkpoints"):
        dynamics(run_dir / "checkpoints", progress=False)


def test_a_figure_for_every_suite_and_self_contained_html(run_dir, tmp_path):
    n_traces = {"nih": 16, "ood": 16, "uninterleaved": 8, "dynamics": 8}
    assert set(n_traces) == set(SUITES)
    n_plots = {"nih": 1, "ood": 1 + len(PROBES), "uninterleaved": 2, "dynamics": 3}
    for suite in SUITES:
        report = run_suite(run_dir / "last.pt", suite, n_traces=n_traces[suite])
        fig = figure_for_suite(report)
        assert isinstance(fig, go.Figure)
        assert len(fig.data) == n_plots[suite], suite
    nih = run_suite(run_dir / "last.pt", "nih", n_traces=16)
    fig = figure_for_suite(nih)
    assert list(fig.data[0].y) == [nih["result"]["offsets"][j]["median"] for j in ("1", "2", "3")]

    path = write_html(fig, tmp_path / "nih.html")
    assert path == tmp_path / "nih.html"
    html = path.read_text()
    assert "plotly" in html.lower() and "<html" in html
    assert not re.search(r"<script[^>]*\bsrc=", html)  # no script fetched from a CDN
    assert 'src="https://cdn.plot.ly' not in html
    assert len(html) > 1_000_000  # plotly.js itself is embedded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nih.html"]  # no temporary file left
    with pytest.raises(ValueError, match="no figure for suite"):
        figure_for_suite({"suite": "nope", "result": {}})


ROOT = Path(__file__).resolve().parents[2]


def test_a_committed_evaluation_reproduces_to_float32_rounding(tmp_path, monkeypatch):
    """`mechlab eval --suite uninterleaved` on the bundled checkpoint, through the pipeline,
    writes the committed examples/checkpoints/recall-cpu/eval/uninterleaved.json: the same
    keys and every number to float32 rounding (another CPU's kernels move the last digits,
    measured 2e-5 relative at most; the bytes matched only on the machine that wrote it)."""
    from mechlab.pipelines import evaluate_checkpoint

    monkeypatch.chdir(ROOT)  # the report records the checkpoint's path as given
    committed = ROOT / "examples" / "checkpoints" / "recall-cpu" / "eval" / "uninterleaved.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        evaluate_checkpoint("examples/checkpoints/recall-cpu/last.pt", ["uninterleaved"], tmp_path)
    finally:
        torch.set_num_threads(threads)
    written = json.loads((tmp_path / "uninterleaved.json").read_text())
    record = {k: written.pop(k) for k in ("settings", "settings_sha256")}  # what a rerun compares
    assert record["settings"]["suite"] == "uninterleaved" and len(record["settings_sha256"]) == 64
    expected = json.loads(committed.read_text())

    def same(a, b, path="") -> None:
        assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, path
        if isinstance(a, dict):
            assert list(a) == list(b), path
            for k in a:
                same(a[k], b[k], f"{path}/{k}")
        elif isinstance(a, list):
            assert len(a) == len(b), path
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                same(x, y, f"{path}[{i}]")
        elif isinstance(a, float):
            assert a == pytest.approx(b, rel=1e-4, abs=1e-9), path
        else:
            assert a == b, path

    same(written, expected)


def test_eval_runs_the_model_on_the_device_asked_for(run_dir, tmp_path, monkeypatch, capsys):
    """`mechlab eval --device` reaches the checkpoint's model (eval had no --device before)."""
    import mechlab.pipelines.evaluate as evaluate
    from mechlab.cli import main

    devices = []
    real_open = evaluate.open_checkpoint

    def spy(source, device=None):
        ckpt = real_open(source, device)
        devices.append((device, str(next(ckpt.model.parameters()).device)))
        return ckpt

    monkeypatch.setattr(evaluate, "open_checkpoint", spy)
    args = ["eval", "--ckpt", str(run_dir / "last.pt"), "--traces", "4", "--out", str(tmp_path)]
    assert main([*args, "--device", "cpu"]) == 0
    assert devices and all(d == ("cpu", "cpu") for d in devices)
    assert main([*args, "--device", "nope"]) == 2  # checked before any work
    assert "nope" in capsys.readouterr().err


def test_eval_prune_and_recall_take_one_haystack_default(tmp_path, model):
    """A run whose evaluation haystack (7 systems of 10) does not fit the model: eval shrinks
    it as pruning and recall do, so all three run on the same haystack (eval refused it before)."""
    from mechlab.label_vs_observation import recall_analysis
    from mechlab.pipelines import checkpoint_prune_data, open_checkpoint

    path = save_checkpoint(model, tmp_path / "wide.pt", task="lds", task_cfg=TASK,
                           train_cfg={"eval_haystack": 7, "eval_seg_len": 4})  # fmt: skip
    evaluated = run_suite(path, "nih", n_traces=4)["result"]
    _, data = checkpoint_prune_data(path, n_train=2, n_test=2)
    recalled = recall_analysis(open_checkpoint(path), n_traces=4, components=False, progress=False)
    assert (evaluated["n_haystack"], evaluated["seg_len"]) == (data.info["n_haystack"], data.info["seg_len"])
    assert (recalled.n_haystack, recalled.seg_len) == (data.info["n_haystack"], data.info["seg_len"]) == (2, 4)


def test_ctrl_c_during_eval_keeps_the_suites_written_and_the_rerun_reads_them_back(tmp_path, capsys):
    from mechlab.cli import main
    from tests.interrupt import interrupt, leftovers, stopped_line

    bundled = Path(__file__).resolve().parents[2] / "examples" / "checkpoints" / "recall-cpu" / "last.pt"
    out = tmp_path / "eval"
    args = ["eval", "--ckpt", str(bundled), "--suite", "nih", "--suite", "ood", "--traces", "200", "--threads", "1",
            "--out", str(out)]  # fmt: skip
    line = stopped_line(interrupt(args, out / "nih.json"))  # ood (eight probes) runs on
    assert line == (f"mechlab: stopped by signal 2 (SIGINT, Ctrl-C) after 1 of 2 suite(s); kept nih in '{out}'; "
                    "resume with the same command, which reads back what is kept and computes the rest: "
                    f"python -m mechlab {' '.join(args)}")  # fmt: skip
    assert not (out / "ood.json").exists() and not leftovers(out)  # no half-written file, no lock
    assert main(args) == 0
    assert f"nih: read back {out / 'nih.json'} (same settings" in capsys.readouterr().out
    assert (out / "ood.json").is_file() and (out / "nih.html").is_file()
