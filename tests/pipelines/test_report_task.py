"""The report says first when the model does not do the task (median error at or above half
the mean predictor's, ``DOES_TASK_BELOW``), and does not interpret that target's circuits;
the bundled run's last checkpoint gets no such warning, its early step 546 does."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechlab.cli.evaluate import report as report_command
from mechlab.evals.does_task import DOES_TASK_BELOW, task_status
from mechlab.pipelines import ReportConfig, make_report

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # tests/conftest.py
    pytest.mark.filterwarnings("ignore:circuit for .* the search likely failed"),
]

RUN = Path(__file__).resolve().parents[2] / "examples" / "checkpoints" / "recall-cpu"
# small settings, as tests/pipelines/test_report.py: 2 pruning steps, one seed, no head patching
CHEAP = {"eval_traces": 64, "prune_traces": 16, "recall_traces": 32, "steps": 2, "n_boot": 20,
         "n_null": 20, "seeds": (0,), "components": False}  # fmt: skip


@pytest.fixture(scope="module")
def early():
    """A report of the bundled run at step 546 (stopped early: 1-after error near 0.77)."""
    return make_report(
        RUN / "checkpoints" / "step_0000546.pt", ReportConfig(**CHEAP), progress=False
    )


def test_an_undertrained_checkpoint_is_said_to_not_do_the_task_first(early):
    status = early.summary()["task"]
    one = status["1-after"]
    assert one["does_task"] is False and one["ratio"] >= DOES_TASK_BELOW and one["ratio"] > 0.6
    assert one["threshold"] == DOES_TASK_BELOW
    text = early.to_html()
    # first thing on the page: the warning, before the findings section
    assert text.index("id='not-done'") < text.index("<section id='findings'>")
    warning = text.split("id='not-done'")[1].split("</div>")[0]
    assert "does not do the 1-after prediction" in warning and f"{DOES_TASK_BELOW:.2f}" in warning
    found = early.findings()
    assert found["task"] and "1-after" in found["task"][0]
    # its circuits are shown, marked, and nothing is read into them
    assert found["circuits"][0].startswith("<b>Not interpreted</b>")
    assert all("Not interpreted" in line for line in found["overlap"])
    assert found["heads"][0].startswith("<b>Not interpreted</b>")
    assert "1-after (not done by the model)" in text
    assert "circuits of a model that does not do" in early.explorer().data()["title"]
    assert "exceeds both nulls" not in text and "shapes force" not in text


def test_the_printed_summary_warns_per_target_before_anything_else(
    early, monkeypatch, capsys, tmp_path
):
    import mechlab.pipelines as pipelines
    from mechlab.pipelines.report import ReportRun

    run = ReportRun(tmp_path / "index.html", early.summary(), reused=False)
    monkeypatch.setattr(pipelines, "report_checkpoint", lambda *a, **k: run)
    report_command(ctx=None, ckpt=RUN / "last.pt", out=tmp_path / "r", target=["1-after", "2-after"], seed=[0],
                   eval_traces=8, prune_traces=8, recall_traces=8, components=False, recipe="default",
                   steps=1, threads=None, device="cpu", progress=False, force=False, protocol=None)  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("WARNING 1-after: the model does not do the 1-after prediction")
    assert "shown, not interpreted" in lines[0]


def test_the_bundled_last_checkpoint_does_the_task():
    """The bundled run's own evaluation and recall files (its last step): no warning."""
    import json

    evals = {"nih": json.loads((RUN / "eval" / "nih.json").read_text())}
    recall = json.loads((RUN / "recall" / "recall.json").read_text())
    status = task_status(evals, recall, ["1-after", "2-after"])
    assert all(s["does_task"] for s in status.values())
    assert status["1-after"]["ratio"] < 0.1 and status["1-after"]["verdict"] == "label"


def test_the_bundled_last_checkpoint_report_has_no_warning():
    cfg = ReportConfig(**{**CHEAP, "targets": ("1-after",)})
    report = make_report(RUN / "last.pt", cfg, progress=False)
    assert report.findings()["task"] == [] and "id='not-done'" not in report.to_html()
    assert report.summary()["task"]["1-after"]["does_task"] is True
