"""`mechlab prune --checkpoints RUN_DIR`: every checkpoint's circuits and their join, from the
command line, and its bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import json

import pytest

from mechlab.cli import main
from tests.pipelines.test_through_training import STEPS, tiny_run

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = ["--traces", "8", "--test-traces", "8", "--no-progress", "--threads", "1",
         "--method", "exact", "--edges", "4"]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("run"))


def _prune(*args):
    return main(["prune", *args, *SMALL])


def test_checkpoints_prints_each_circuit_and_the_table(run_dir, tmp_path, capsys):
    out = tmp_path / "tt"
    assert _prune("--checkpoints", str(run_dir), "--target", "1-after", "--target", "2-after",
                  "--out", str(out)) == 0  # fmt: skip
    printed = capsys.readouterr().out
    data = json.loads((out / "across.json").read_text())
    for target in ("1-after", "2-after"):
        assert f"{target} through training (seed 0):" in printed
        for row in data["targets"][target]["checkpoints"]:
            assert f"{row['jaccard_with_last']:.3f}" in printed
        assert (out / f"across_{target}.html").is_file()
    for step in STEPS:
        assert f"checkpoint step {step} ({4 * step} examples seen)" in printed
        assert (out / f"step_{step:07d}" / "1-after_exact_seed0.json").is_file()
    assert f"wrote {out / 'across.json'}" in printed
    assert _prune("--checkpoints", str(run_dir), "--target", "1-after", "--target", "2-after",
                  "--out", str(out)) == 0  # fmt: skip
    assert "read back 6 circuit(s) found before with the same settings: step_0000000/1-after_exact_seed0" in capsys.readouterr().out


def test_every_prunes_every_kth_checkpoint_and_the_last(run_dir, tmp_path, capsys):
    out = tmp_path / "tt"
    assert _prune("--checkpoints", str(run_dir), "--every", "2", "--out", str(out)) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["step_0000000", "step_0000012"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--ckpt", "x.pt"], "give one of --checkpoints"),
        (["--share", "0"], "--share does not apply with --checkpoints"),
        (["--length", "4"], "--length does not apply with --checkpoints"),
        (["--every", "0"], "--every 0"),
        (["--target", "9-after"], "9-after"),
        (["--edges", "0"], "edges"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(run_dir, tmp_path, capsys, extra, message):
    out = tmp_path / "tt"
    assert main(["prune", "--checkpoints", str(run_dir), "--out", str(out), *SMALL, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_no_run_and_every_without_checkpoints_are_refused(tmp_path, capsys, tiny_lds_checkpoint):
    out = tmp_path / "tt"
    assert _prune("--checkpoints", str(tmp_path), "--out", str(out)) == 2
    assert "no checkpoints/step_*.pt" in capsys.readouterr().err
    assert _prune("--ckpt", str(tiny_lds_checkpoint), "--every", "2", "--out", str(out)) == 2
    assert "--every applies with --checkpoints" in capsys.readouterr().err
    assert not out.exists()


def test_ctrl_c_names_every_checkpoints_circuits_kept_and_the_rerun_resumes(run_dir, tmp_path, capsys,
                                                                            monkeypatch):  # fmt: skip
    """Issue 38: a KeyboardInterrupt in the third checkpoint's search ends the command with
    one line naming the two circuits kept (their checkpoints' folders) and how to resume,
    exit 130; the rerun reads them back and prunes the third."""
    import mechlab.pipelines.prune as pipeline

    out, calls = tmp_path / "tt", []
    real = pipeline.prune_request  # one circuit's search

    def stopping(*args, **kwargs):
        calls.append(args[0].step)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "prune_request", stopping)
    assert _prune("--checkpoints", str(run_dir), "--target", "1-after", "--out", str(out)) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "mechlab: stopped by signal 2 (SIGINT, Ctrl-C) after 2 of 3 circuit(s); kept "
        f"step_0000000/1-after_exact_seed0, step_0000005/1-after_exact_seed0 in '{out}'; resume with the same "
        "command"), err  # fmt: skip
    assert not (out / "step_0000012" / "1-after_exact_seed0.json").exists() and not (out / ".mechlab.lock").exists()
    monkeypatch.setattr(pipeline, "prune_request", lambda *a, **k: calls.append(a[0].step) or real(*a, **k))
    assert _prune("--checkpoints", str(run_dir), "--target", "1-after", "--out", str(out)) == 0
    assert calls[3:] == [12] and "read back 2 circuit(s)" in capsys.readouterr().out
