"""Tests of the `mechlab` command line (mechlab.cli.main): help, info, train, eval, resume,
and one-line errors with exit status 2 for bad input."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
import yaml

import mechlab.train
from mechlab.checkpoint import load_checkpoint, save_checkpoint
from mechlab.cli import main
from mechlab.models import build_model
from mechlab.train import TrainConfig, TrainingStopped, train

TASK = {
    "d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
    "n_train_systems": 200, "n_test_systems": 50,
}
MODEL = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2}
SMALL = {
    "task_cfg": TASK, "model": MODEL, "batch_size": 8, "eval_haystack": 2, "eval_seg_len": 4,
    "eval_traces": 16, "eval_every": 0, "log_every": 1, "n_checkpoints": 2,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A finished 4-step run, a checkpoint without task metadata and a corrupt file."""
    root = tmp_path_factory.mktemp("cli")
    train(TrainConfig(steps=4, **SMALL), root / "run", progress=False)
    torch.manual_seed(0)
    model = build_model({**MODEL, "io": "continuous", "d_in": 13, "d_out": 3, "n_ctx": 24})
    save_checkpoint(model, root / "bare.pt", step=7)
    (root / "corrupt.pt").write_bytes(b"\x80\x02not really a checkpoint" * 10)
    return {"run": root / "run", "good": root / "run" / "last.pt", "bare": root / "bare.pt",
            "corrupt": root / "corrupt.pt", "missing": root / "missing.pt", "root": root}


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- help, info


def test_help(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("info", "train", "eval", "bench"):
        assert command in out
    code, out, _ = run(capsys, "train", "--help")
    assert code == 0 and "--resume" in out and "--set" in out


def test_info_on_a_fresh_preset(capsys):
    code, out, err = run(capsys, "info", "--model", "tiny")
    assert code == 0 and err == ""
    assert "212,189" in out  # the study's tiny transformer (papers.md)
    assert "transformer" in out and re.search(r"step:\s+0\b", out)
    hooks = build_model("tiny").hook_dict
    assert f"hooks ({len(hooks)})" in out
    for name in hooks:  # every hook point is listed, with its shape
        assert re.search(rf"^\s+{re.escape(name)}\s+\[1, 8, ", out, re.MULTILINE) or \
            re.search(rf"^\s+{re.escape(name)}\s+\[1, 6, 8, 8\]", out, re.MULTILINE), name


def test_info_on_a_checkpoint(capsys, files):
    code, out, err = run(capsys, "info", "--ckpt", files["good"])
    assert code == 0 and err == ""
    assert re.search(r"step:\s+4\b", out)
    n_params = sum(p.numel() for p in load_checkpoint(files["good"]).model.parameters())
    assert f"{n_params:,}" in out
    assert "blocks.0.hook_resid_post" in out


# --------------------------------------------------------------------------- bad input

BAD_INPUTS = {
    "info missing checkpoint": ["info", "--ckpt", "{missing}"],
    "info corrupt checkpoint": ["info", "--ckpt", "{corrupt}"],
    "info neither option": ["info"],
    "info both options": ["info", "--ckpt", "{good}", "--model", "tiny"],
    "info unknown model": ["info", "--model", "nope"],
    "eval missing checkpoint": ["eval", "--ckpt", "{missing}"],
    "eval corrupt checkpoint": ["eval", "--ckpt", "{corrupt}", "--out", "{root}/ev_corrupt"],
    "eval unknown suite": ["eval", "--ckpt", "{good}", "--suite", "nope"],
    "eval without task metadata": ["eval", "--ckpt", "{bare}", "--out", "{root}/ev_bare"],
    "train unknown preset": ["train", "--preset", "nope", "--out", "{root}/t1"],
    "train bad --set": ["train", "--out", "{root}/t2", "--set", "lr"],
    "train unknown --set key": ["train", "--out", "{root}/t3", "--set", "nope=1"],
    "train --set sub-field of a scalar": ["train", "--out", "{root}/t4", "--set", "steps.x=1"],
    "train invalid value": ["train", "--out", "{root}/t5", "--set", "steps=0"],
    "train without --out": ["train", "--steps", "1"],
    "train missing config file": ["train", "--out", "{root}/t6", "--config", "{root}/nope.yaml"],
    "train into an existing run": ["train", "--out", "{run}", "--set", "steps=1", "--no-progress"],
    "train resume nothing": ["train", "--resume", "{root}/no_such_run"],
    "train resume with changed batch": ["train", "--resume", "{run}", "--set", "batch_size=4", "--no-progress"],
    "bench unknown family": ["bench", "hooks", "--families", "nope"],
}


@pytest.mark.parametrize("args", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_status_2(capsys, monkeypatch, files, args):
    monkeypatch.delenv("MECHLAB_DEBUG", raising=False)
    code, out, err = run(capsys, *[a.format(**files) for a in args])
    assert code == 2
    assert err.startswith("mechlab: error: ")
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err + out
    assert "done:" not in out


def test_error_messages_say_what_is_wrong(capsys, files):
    _, _, err = run(capsys, "eval", "--ckpt", files["bare"], "--out", files["root"] / "ev_bare2")
    assert "task metadata" in err and "bare.pt" in err
    _, _, err = run(capsys, "train", "--preset", "nope", "--out", files["root"] / "t7")
    assert "unknown preset 'nope'" in err
    _, _, err = run(capsys, "info", "--ckpt", files["missing"])
    assert "missing.pt" in err
    # Nothing was trained by the refused commands.
    assert not (files["root"] / "t7").exists() and not (files["root"] / "t2").exists()
    assert load_checkpoint(files["good"]).step == 4


# typer >= 0.2x vendors click (typer._click): main() catches click.exceptions.* from the
# separate click package, so the parser's own errors escape as tracebacks.
PARSER_ERRORS = {
    "unknown option": ["train", "--nope"],
    "out-of-range value": ["eval", "--ckpt", "x.pt", "--traces", "0"],
    "missing required option": ["eval"],
    "unknown command": ["nope"],
}


@pytest.mark.parametrize("args", list(PARSER_ERRORS.values()), ids=list(PARSER_ERRORS))
def test_parser_errors_are_one_line_and_exit_status_2(capsys, args):
    code, out, err = run(capsys, *args)
    assert code == 2 and err.startswith("mechlab: error: ") and err.count("\n") == 1


def test_a_stopped_run_exits_with_status_1(capsys, monkeypatch, files):
    def stopped(*args, **kwargs):
        raise TrainingStopped(f"stopped by signal 15 at step 2; resume with --resume {files['root']}")

    monkeypatch.setattr(mechlab.train, "train", stopped)
    code, _, err = run(capsys, "train", "--out", files["root"] / "stopped", "--set", "steps=3")
    assert "stopped by signal 15" in err
    assert code == 1


# --------------------------------------------------------------------------- train, eval, resume


def test_train_from_a_yaml_file_then_eval_then_resume(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where eval's default output folder (mechlab-out/) goes
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**SMALL, "steps": 3}))
    out = tmp_path / "run"
    code, stdout, err = run(capsys, "train", "--config", config, "--out", out, "--no-progress",
                            "--set", "lr=2e-3")
    assert code == 0, err
    assert "done: step 3" in stdout and "test_loss" in stdout
    assert (out / "last.pt").is_file() and (out / "config.yaml").is_file()
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["lr"] == 0.002 and saved["task_cfg"] == TASK and saved["steps"] == 3
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [1, 2, 3]
    assert load_checkpoint(out / "last.pt").step == 3

    # eval --suite nih writes nih.json and nih.html (default place: mechlab-out/<run>/eval in the
    # current folder, never beside the checkpoint, whose folder may be committed)
    code, stdout, err = run(capsys, "eval", "--suite", "nih", "--ckpt", out / "last.pt", "--traces", "20")
    assert code == 0, err
    assert not (out / "eval").exists()
    evals = tmp_path / "mechlab-out" / "run" / "eval"
    report = json.loads((evals / "nih.json").read_text())
    assert set(report) == {"suite", "checkpoint", "sha256", "step", "seed", "result", "settings", "settings_sha256"}
    assert report["suite"] == "nih" and report["step"] == 3
    assert set(report["result"]) == {"n_haystack", "seg_len", "n_traces", "offsets", "protocol"}
    assert report["result"]["n_traces"] == 20 and report["result"]["n_haystack"] == 2
    assert set(report["result"]["offsets"]) == {"1", "2", "3"}
    for j, s in report["result"]["offsets"].items():
        assert set(s) == {"median", "q1", "q3", "mean"}
        assert f"{j}-after: median {s['median']:.4f}" in stdout
    html = (evals / "nih.html").read_text()
    assert "plotly" in html.lower()
    # the folder's one plotly.js, beside the page: nothing fetched
    assert re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", html) == ["plotly.min.js"]
    assert sorted(os.listdir(evals)) == ["nih.html", "nih.json", "plotly.min.js"]  # (the lock file is gone)

    # resume continues the run from last.pt to the new step count
    code, stdout, err = run(capsys, "train", "--resume", out, "--steps", "5", "--no-progress")
    assert code == 0, err
    assert "done: step 5" in stdout
    assert load_checkpoint(out / "last.pt").step == 5
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [1, 2, 3, 4, 5]
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 5


def test_eval_several_suites_into_a_chosen_directory(capsys, files, tmp_path):
    code, stdout, err = run(capsys, "eval", "--ckpt", files["good"], "--suite", "uninterleaved",
                            "--suite", "ood", "--traces", "8", "--out", tmp_path / "ev")
    assert code == 0, err
    assert sorted(os.listdir(tmp_path / "ev")) == ["ood.html", "ood.json", "plotly.min.js",
                                                   "uninterleaved.html", "uninterleaved.json"]
    ood = json.loads((tmp_path / "ev" / "ood.json").read_text())
    assert set(ood["result"]["probes"]) == {"clean", "misdirect_incorrect", "sync_rotations",
                                            "misdirect_unseen", "misdirect_restart"}
    assert "least-squares" in stdout and "misdirect_restart" in stdout


def test_prune_and_overlap_cli_errors(tmp_path, capsys):
    """prune/overlap: bad input is one line and exit status 2."""
    from mechlab.cli import main

    assert main(["prune", "--ckpt", str(tmp_path / "missing.pt")]) == 2
    assert main(["overlap", str(tmp_path / "a.json")]) == 2
    assert main(["overlap", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("mechlab: error:") for line in err)


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["--target", "3-before"], "target"),
        (["--sparsity", "1.5"], "sparsity"),
        (["--ablation", "blur"], "ablation"),
    ],
)
def test_prune_cli_rejects_bad_settings(args, phrase, capsys):
    from mechlab.cli import main

    ckpt = Path(__file__).resolve().parents[2] / "examples/checkpoints/recall-cpu/last.pt"
    assert main(["prune", "--ckpt", str(ckpt), "--steps", "1", "--no-progress", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mechlab: error:") and "\n" not in err and phrase in err.lower()


def test_prune_cli_needs_task_metadata(tmp_path, capsys):
    import mechlab
    from mechlab.cli import main

    path = tmp_path / "bare.pt"
    mechlab.save_checkpoint(mechlab.build_model({"arch": "transformer", "d_model": 16, "n_heads": 2}), path)
    assert main(["prune", "--ckpt", str(path), "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mechlab: error:") and "metadata" in err


@pytest.mark.parametrize("command", ["prune", "curve"])
def test_an_unknown_target_is_refused_in_the_command_lines_terms(command, tmp_path, capsys):
    """--target takes a name: the refusal names the names (k-after, all), not the library's
    "or a callable"."""
    ckpt = Path(__file__).resolve().parents[2] / "examples/checkpoints/recall-cpu/last.pt"
    args = [command, "--ckpt", str(ckpt), "--target", "3-before", "--no-progress", "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mechlab: error: unknown target '3-before'") and "\n" not in err, err
    assert "use k-after (e.g. 1-after, 2-after) or all" in err and "callable" not in err, err
    assert not (tmp_path / "o").exists()


def test_info_builds_the_model_a_training_preset_trains(capsys):
    from mechlab.checkpoint import load_checkpoint

    assert main(["info", "--model", "recall-cpu"]) == 0
    out = capsys.readouterr().out
    bundled = load_checkpoint("examples/checkpoints/recall-cpu/last.pt").model
    n_params = sum(p.numel() for p in bundled.parameters())
    assert "fresh recall-cpu" in out and f"parameters:   {n_params:,}" in out


def test_the_cli_lets_idle_openmp_threads_sleep_unless_told_otherwise():
    import subprocess
    import sys

    code = ("import os, sys; from mechlab.cli import main; main(['info', '--model', 'tiny']); "
            "print(os.environ['OMP_WAIT_POLICY'])")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**env, "OMP_WAIT_POLICY": "ACTIVE"})  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "ACTIVE"


def test_every_help_fits_an_80_column_terminal():
    import subprocess
    import sys

    for command in ["", "report", "train", "eval", "recall", "prune", "view", "overlap", "curve",
                    "info", "bench prune", "bench startup"]:  # fmt: skip
        out = subprocess.run([sys.executable, "-m", "mechlab.cli", *command.split(), "--help"],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "COLUMNS": "80"})  # fmt: skip
        long = [line for line in out.stdout.splitlines() if len(line) > 80]
        assert not long, (command, long[:2])
        assert "Usage: mechlab" in out.stdout


COMMANDS = [["prune", "--ckpt", "run.pt"], ["train"], ["eval", "--ckpt", "run.pt"], ["bench", "train"]]


@pytest.mark.parametrize("command", COMMANDS)
def test_too_many_threads_are_refused_before_any_command_runs(command, tmp_path, capsys):
    from mechlab.limits import max_threads

    out = tmp_path / "out"
    code = main([*command, "--threads", "100000", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == (f"mechlab: error: --threads 100000 is more than {max_threads()} (4 per CPU core; this "
                      f"machine has {os.cpu_count()}); give at most {max_threads()}, or leave --threads out "
                      "for torch's default")  # fmt: skip
    assert not out.exists()
    assert main([*command, f"--threads={max_threads() + 1}", "--out", str(out)]) == 2
    assert not out.exists()


@pytest.mark.parametrize(
    "setting, message",
    [
        ("task_cfg.m=1000000", "m 1e+06 is more than mechlab's limit of 16,384 (one token per"),
        ("task_cfg.L=1000000", "L 1e+06 is more than mechlab's limit of 4,096"),
        ("batch_size=1000000", "batch_size=1000000 makes batches of about"),
    ],
)
def test_state_tracking_sizes_are_refused_before_training(setting, message, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run(capsys, "train", "--task", "state_tracking", "--set", setting, "--set",
                       "task_cfg.m=5000" if "batch" in setting else "seed=0", "--out", out,
                       "--no-progress")  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not stdout  # "training ..." is said once the settings are checked
    assert not out.exists()
