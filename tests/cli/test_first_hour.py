"""Issue 38, "The first hour, round 2": a bad invocation answers at once (before torch and
the model load), and Ctrl-C during prune keeps the circuits written and says how to resume.

The timing tests run the CLI as a user does (a fresh interpreter); the bound is generous
(3 s, for a loaded machine: docs/cli.md records the times measured); that torch is never
imported is the deterministic part of the same promise."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from mechlab.cli import main
from mechlab.pipelines import preflight

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "examples" / "checkpoints"
RECALL = BUNDLED / "recall-cpu" / "last.pt"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
BOUND_S = 3.0  # the issue asks under 1 s; measured 0.24-0.4 s on 2 shared cores (docs/cli.md)


def run_cli(*args: str, cwd: Path | None = None) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mechlab", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=120)  # fmt: skip
    return done, time.perf_counter() - start


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["prune", "--ckpt", "nope.pt", "--target", "1-after"], "checkpoint 'nope.pt' not found"),
        (["prune", "--ckpt", str(RECALL), "--target", "1-aftr"], "unknown target '1-aftr'"),
    ],
)
def test_a_bad_invocation_answers_at_once_in_one_line(args, phrase, tmp_path):
    done, seconds = run_cli(*args, "--threads", "1", cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and phrase in lines[0], done.stderr
    assert seconds < BOUND_S, f"{seconds:.2f} s"
    assert not (tmp_path / "mechlab-out").exists()


NO_TORCH = (
    "import sys\n"
    "from mechlab.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print('torch' in sys.modules, 'mechlab.models' in sys.modules)\n"
    "sys.exit(code)\n"
)


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["prune", "--ckpt", "nope.pt"], "checkpoint 'nope.pt' not found"),
        (["prune", "--ckpt", "."], "is a folder"),
        (["prune", "--ckpt", str(RECALL), "--target", "1-aftr"], "did you mean 1-after?"),
        (["prune", "--ckpt", str(RECALL), "--target", "0-after"], "k must be at least 1"),
        (["prune", "--ckpt", str(RECALL), "--target", "final"], "the checkpoint's task is lds"),
        (["prune", "--ckpt", str(BUNDLED / "induction-cpu" / "last.pt")], "not one of the induction task's"),
        (["prune", "--ckpt", str(BUNDLED / "st-transformer-cpu" / "last.pt"), "--target", "1-after"],
         "use final, changed or all"),
        (["prune", "--ckpt", str(RECALL), "--out", "file.txt"], "is a file, not a folder"),
        (["prune", "--ckpt", str(RECALL), "--recipe", "fats"], "unknown recipe 'fats'"),
        (["prune", "--checkpoints", "nowhere"], "run directory 'nowhere' not found"),
        (["prune", "--model", "nowhere", "--pairs", "p.jsonl"], "model 'nowhere' not found"),
        (["prune", "--ckpt", str(RECALL), "--pairs", "p.jsonl"], "pair file 'p.jsonl' not found"),
        (["report", "--ckpt", "nope.pt", "--out", "r"], "checkpoint 'nope.pt' not found"),
        (["report", "--ckpt", str(RECALL), "--out", "r", "--target", "al"], "did you mean all?"),
        (["report", "--ckpt", str(RECALL), "--out", "file.txt"], "is a file, not a folder"),
        (["eval", "--ckpt", "nope.pt"], "checkpoint 'nope.pt' not found"),
        (["eval", "--ckpt", str(RECALL), "--suite", "nh"], "unknown suite 'nh'"),
        (["eval", "--ckpt", str(BUNDLED / "induction-cpu" / "last.pt")], "not trained on the lds task"),
        (["eval", "--ckpt", str(RECALL), "--nih", "studdy"], "unknown NiH protocol 'studdy'"),
        (["recall", "--ckpt", "nope.pt"], "checkpoint 'nope.pt' not found"),
        (["recall", "--checkpoints", "nowhere"], "run directory 'nowhere' not found"),
        (["curve", "--ckpt", "nope.pt"], "checkpoint 'nope.pt' not found"),
        (["curve", "--ckpt", str(RECALL), "--target", "1-aftr"], "unknown target '1-aftr'"),
        (["overlap", "a.json", "b.json"], "circuit 'a.json' not found"),
        (["view", "a.json", "--out", "v.html"], "circuit 'a.json' not found"),
        (["view", "a.json", "--out", "v.txt"], "must be a .html or .htm file"),
    ],
)
def test_every_main_command_refuses_before_torch_loads(args, phrase, tmp_path):
    (tmp_path / "file.txt").write_text("not a folder\n")
    done = subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, env=ENV,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("mechlab: error: "), done.stderr
    assert phrase in lines[0], lines[0]
    assert done.stdout.split() == ["False", "False"], "torch or the models were imported"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # nothing written


def test_the_task_is_read_from_the_file_without_running_it(tmp_path):
    assert preflight.checkpoint_task(RECALL) == "lds"
    assert preflight.checkpoint_task(BUNDLED / "induction-cpu" / "last.pt") == "induction"
    assert preflight.checkpoint_task(BUNDLED / "st-transformer-cpu" / "last.pt") == "state_tracking"
    assert preflight.checkpoint_task(tmp_path / "missing.pt") is None
    (tmp_path / "junk.pt").write_bytes(b"PK\x03\x04 not a zip")
    assert preflight.checkpoint_task(tmp_path / "junk.pt") is None

    class Hostile:  # unpickling it would create a file
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "ran"),))

    with zipfile.ZipFile(tmp_path / "hostile.pt", "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"metadata": {"task": "lds"}, "x": Hostile()}))
    assert preflight.checkpoint_task(tmp_path / "hostile.pt") is None and not (tmp_path / "ran").exists()
    sidecar = tmp_path / "w.json"
    sidecar.write_text(json.dumps({"format": "mechlab-checkpoint", "metadata": {"task": "induction"}}))
    assert preflight.checkpoint_task(tmp_path / "w.safetensors") == "induction"


def test_the_cheap_checks_name_what_the_pipelines_take():
    from mechlab.evals.suites import SUITES
    from mechlab.pipelines import PRUNE_RECIPES
    from mechlab.tasks.lds_evals import NIH_PROTOCOLS
    from mechlab.tasks.state_tracking_prune import TARGETS

    assert preflight.TASK_TARGETS["state_tracking"] == TARGETS
    assert preflight.RECIPES == tuple(PRUNE_RECIPES) and preflight.NIH_CONSTRUCTIONS == tuple(NIH_PROTOCOLS)
    assert preflight.EVAL_SUITES == SUITES
    from mechlab.tasks import TASK_CONFIGS

    assert set(preflight.TASK_TARGETS) == set(TASK_CONFIGS)


# --------------------------------------------------------------------------- Ctrl-C during prune


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from mechlab.train import TrainConfig, train
    from tests.test_reliability import SMALL

    out = tmp_path_factory.mktemp("first-hour") / "run"
    train(TrainConfig(steps=3, **SMALL), out, progress=False)
    return out / "last.pt"


# 300 steps: a few seconds a circuit, so that the signal sent as the first file appears lands
# in the second circuit's search
SLOW = ["--steps", "300", "--traces", "8", "--test-traces", "8", "--no-progress", "--threads", "1"]


def interrupt_after_first(args: list[str], first: Path, cwd: Path) -> subprocess.CompletedProcess:
    """Run the CLI, send SIGINT as soon as ``first`` is written, return the finished process."""
    proc = subprocess.Popen([sys.executable, "-m", "mechlab", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd)  # fmt: skip
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"finished before the signal: {proc.communicate()}"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize(
    "which, stems",
    [("targets", ["1-after_seed0", "2-after_seed0"]), ("seeds", ["1-after_seed0", "1-after_seed1"])],
)
def test_ctrl_c_during_prune_keeps_the_circuits_written_and_the_rerun_resumes(
    which, stems, tiny_ckpt, tmp_path, capsys, monkeypatch
):
    import mechlab.pipelines.prune as pipeline

    out = tmp_path / "c"
    extra = ["--target", "1-after", "--target", "2-after"] if which == "targets" else ["--seed", "0", "--seed", "1"]
    args = ["prune", "--ckpt", str(tiny_ckpt), *SLOW, *extra, "--out", str(out)]
    done = interrupt_after_first(args, out / f"{stems[0]}.html", tmp_path)  # its last file
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 130 and len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith(f"mechlab: stopped by signal 2 (SIGINT, Ctrl-C) after 1 of 2 circuit(s); kept {stems[0]} "
                           f"in '{out}'"), line  # fmt: skip
    assert "resume with the same command" in line and line.endswith("python -m mechlab " + " ".join(args))
    assert ("written before their consensus" in line) == (which == "seeds")
    assert sorted(os.listdir(out)) == [f"{stems[0]}.html", f"{stems[0]}.json", "plotly.min.js"]  # no temp, no lock

    pruned = []
    real = pipeline.prune_request  # one circuit's search
    monkeypatch.setattr(pipeline, "prune_request", lambda ckpt, request, name, **k: pruned.append((name, request.seed))
                        or real(ckpt, request, name, **k))  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    if which == "targets":
        assert pruned == [("2-after", 0)]
        assert f"read back 1 circuit(s) found before with the same settings: {stems[0]}" in printed
    else:
        assert pruned == [("1-after", 1)]
        assert "rewrote them with this run's consensus (an interrupted run wrote them before it" in printed
    assert sorted(os.listdir(out)) == sorted([f"{s}.{x}" for s in stems for x in ("html", "json")] + ["plotly.min.js"])


def test_interrupted_names_the_signal_and_what_was_kept(tmp_path):
    from mechlab.pipelines import Interrupted

    stop = Interrupted(15, tmp_path, ["1-after_seed0"], 3)
    assert isinstance(stop, KeyboardInterrupt) and stop.exit_code == 143
    assert str(stop) == f"stopped by signal 15 (SIGTERM) after 1 of 3 circuit(s); kept 1-after_seed0 in '{tmp_path}'"
    assert "none was finished" in str(Interrupted(2, tmp_path, [], 2))


def test_ctrl_c_during_report_keeps_its_circuits_and_the_rerun_reads_them_back(tiny_ckpt, tmp_path, capsys,
                                                                                monkeypatch):  # fmt: skip
    import mechlab.pipelines.report as pipeline
    from tests.test_reliability import REPORT_FAST

    out, calls = tmp_path / "r", []
    real = pipeline.prune_request  # one circuit's search

    def stopping(*args, **kwargs):
        calls.append(args[1].seed)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "prune_request", stopping)
    args = ["report", "--ckpt", str(tiny_ckpt), "--out", str(out), *map(str, REPORT_FAST)]
    assert main(args) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == ("mechlab: stopped by signal 2 (SIGINT, Ctrl-C) after 1 of 2 circuit(s); kept "
                    f"circuits/1-after_seed0 in '{out}'; resume with the same command, which reads back what is "
                    f"kept and computes the rest: mechlab {' '.join(args)}"), line  # fmt: skip
    assert sorted(p.name for p in (out / "circuits").iterdir()) == ["1-after_seed0.json"]
    monkeypatch.setattr(pipeline, "prune_request", real)
    assert main(args) == 0
    assert "circuits/1-after_seed0.json: read back (same settings)" in capsys.readouterr().err
