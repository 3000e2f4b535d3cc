"""`mechlab prune` is never silent for long: every stage names itself on stderr as it runs
(issue 38), and ``--no-progress`` prints none of it."""

from __future__ import annotations

import importlib

import pytest

from mechlab.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

# What each stage's bar (or line) says, in the order the stages run.
STAGES = [
    "loading torch, the model and its traces",
    "references: interchange ablation",
    "warm start: EAP-IG",
    "selection pool: exact single-edge ablation",
    "pruning 1-after (seed 0)",
    "selection: eliminating from a pool of",
    "selection: scoring",
    "evaluation: circuit, complement, ablated on 8 held-out traces",
]


def _prune(ckpt, out, *extra):
    return main(["prune", "--ckpt", str(ckpt), "--target", "1-after", "--steps", "3", "--traces", "8",
                 "--test-traces", "8", "--threads", "1", "--out", str(out), *extra])  # fmt: skip


def test_prune_names_each_stage_in_order_on_stderr(tiny_lds_checkpoint, tmp_path, capsys, monkeypatch):
    app = importlib.import_module("mechlab.cli.app")  # the package's own ``app`` is the Typer app
    monkeypatch.setattr(app, "interactive", lambda: True)  # the loading line is for a terminal
    assert _prune(tiny_lds_checkpoint, tmp_path / "c") == 0
    captured = capsys.readouterr()
    err = captured.err
    where = []
    for stage in STAGES:
        assert stage in err, f"{stage!r} not on stderr:\n{err}"
        where.append(err.index(stage))
    assert where == sorted(where), f"stages out of order:\n{err}"
    for stage in STAGES:  # the bars are on stderr only: stdout keeps the results
        assert stage not in captured.out


def test_no_progress_prints_none_of_the_stages(tiny_lds_checkpoint, tmp_path, capsys):
    assert _prune(tiny_lds_checkpoint, tmp_path / "c", "--no-progress") == 0
    captured = capsys.readouterr()
    for stage in (*STAGES, "warm start", "selection", "evaluation", "references", "%|"):
        assert stage not in captured.err, f"{stage!r} printed with --no-progress:\n{captured.err}"
