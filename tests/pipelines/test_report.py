"""mechlab.pipelines.report / `mechlab report`: the main job in one command, one self-contained page."""

from __future__ import annotations

import json
import re

import pytest
import torch

from mechlab.cli import main
from mechlab.pipelines import ReportConfig, make_report
from mechlab.prune import Circuit, overlap

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SMALL = {"eval_traces": 16, "prune_traces": 16, "recall_traces": 16, "steps": 4, "n_boot": 50,
         "n_null": 50, "seeds": (0, 1)}  # fmt: skip
# 4 steps on an untrained model: the search fails, on purpose (the engine's warning, filtered here)
pytestmark = [
    pytestmark,
    pytest.mark.filterwarnings("ignore:circuit for .* the search likely failed"),
]


@pytest.fixture(scope="module")
def written(tiny_lds_checkpoint, tmp_path_factory):
    """The report of the tiny checkpoint, with every torch.load call it made counted."""
    out = tmp_path_factory.mktemp("report")
    lines: list[str] = []
    loads: list[str] = []
    real_load = torch.load

    def counted(f, *args, **kwargs):
        loads.append(str(f))
        return real_load(f, *args, **kwargs)

    torch.load = counted
    try:
        report = make_report(
            tiny_lds_checkpoint, ReportConfig(**SMALL), progress=False, log=lines.append
        )
    finally:
        torch.load = real_load
    page = report.write(out)
    return report, out, page, lines, loads


def test_a_report_opens_its_checkpoint_once(written, tiny_lds_checkpoint):
    # evaluation, 4 prunings, the cross-evaluation and the recall verdicts share one opening
    # (main at 4d72a04 read the file 9 times)
    *_, loads = written
    assert loads == [str(tiny_lds_checkpoint)]


def test_every_stage_runs_on_the_device_asked_for(tiny_lds_checkpoint, monkeypatch):
    """`report --device X`: the evaluation, the prunings and the recall verdicts get X."""
    import mechlab.pipelines.report as report_module

    seen: dict[str, list] = {"run_suite": [], "prune_request": [], "recall_checkpoint": []}

    class Stop(Exception):
        pass

    def spy(name, result=None):
        def record(*args, **kwargs):
            seen[name].append(kwargs.get("device"))
            if result is None:
                raise Stop
            return result

        return record

    monkeypatch.setattr(report_module, "run_suite", spy("run_suite", {"result": {}}))
    def pruned(ckpt, request, target, **kwargs):  # runs on the opened model, moved to the device once
        seen["prune_request"].append(next(ckpt.model.parameters()).device.type)
        return object()

    monkeypatch.setattr(report_module, "prune_request", pruned)
    monkeypatch.setattr(report_module, "recall_checkpoint", spy("recall_checkpoint"))
    cfg = ReportConfig(**{**SMALL, "targets": ("1-after",), "seeds": (0,)})
    with pytest.raises(Stop):
        make_report(tiny_lds_checkpoint, cfg, device="cpu", progress=False)
    assert seen == {
        "run_suite": ["cpu", "cpu"],
        "prune_request": ["cpu"],
        "recall_checkpoint": ["cpu"],
    }


def test_the_page_loads_plotly_once_from_its_folder_and_draws_every_circuit(written):
    report, out, page, lines, _ = written
    text = page.read_text()
    assert page == out / "index.html"
    # plotly.js once, in the folder (offline), not inside the page
    assert re.findall(r"<script[^>]+src=[^>]+>", text) == [
        "<script charset='utf-8' src='plotly.min.js'>"
    ]
    assert "* plotly.js v" not in text and "* plotly.js v" in (out / "plotly.min.js").read_text()
    assert len(text) < 500_000  # the page's own content, without the 4.8 MB of plotly.js
    n_figures = len(report.figures())
    assert n_figures == 3  # NiH, OOD, recall; the circuits are in the explorer
    assert text.count("Plotly.newPlot(") == n_figures and text.count("mechlabExplorer('") == 1
    explorer = report.explorer().data()
    assert [c["label"] for c in explorer["circuits"]] == [
        f"{t} · prune · seed {s}" for t in ("1-after", "2-after") for s in (0, 1)
    ]  # every circuit, not only seed 0's
    for stage in (
        "evaluation",
        "pruning 1-after, seed 0",
        "pruning 2-after, seed 1",
        "overlap",
        "recall",
    ):
        assert any(line.startswith(stage) for line in lines), stage


def test_the_page_explains_itself_and_says_why_there_is_no_interval(written):
    report, _, page, _, _ = written
    text = page.read_text()
    for section in ("findings", "evaluation", "circuits", "overlap", "cross-evaluation", "recall",
                    "definitions", "files"):  # fmt: skip
        assert re.search(
            rf"<section id='{section}'><h2>[^<]+</h2><p class='how'><b>How to read this.</b> \S",
            text,
        ), section
    assert (
        "no interval (2 seeds per target; an interval needs 3)" in text
        and "[0." not in text.split("id='overlap'")[1].split("</table>")[0]
    )
    assert "concepts.md#faithfulness-and-complement-faithfulness" in text
    found = report.findings()
    assert found["overlap"] and found["recall"] and found["caveats"]
    # the cross-evaluation's traces are named, and why its own-target numbers differ
    assert "held-out traces of seed 0's 1-after circuit" in text


def test_no_page_links_a_path_of_the_machine_that_wrote_it(written):
    """The page's terms link its own definitions (relative anchors), each naming its section
    of docs/concepts.md in the repository: no file:/// link, so the page works when moved."""
    report, out, page, _, _ = written
    pages = sorted(out.rglob("*.html"))
    assert page in pages
    for path in pages:
        assert "file://" not in path.read_text(), path
    text = page.read_text()
    links = set(re.findall(r"href='#(concept-[a-z]+)'", text))
    assert links and all(f"id='{anchor}'" in text for anchor in links)  # every term finds its definition
    assert "<code>docs/concepts.md#the-recall-task</code>" in text  # the repository's path, not this machine's
    from pathlib import Path

    import mechlab

    for module in Path(mechlab.__file__).parent.rglob("*.py"):  # and no other page links one either
        source = module.read_text()
        assert ".as_uri()" not in source and "file:///" not in source, module


def test_the_json_behind_the_page_is_what_the_page_reports(written):
    report, out, _, _, _ = written
    summary = json.loads((out / "report.json").read_text())["summary"]
    nih = json.loads((out / "eval" / "nih.json").read_text())["result"]["offsets"]
    assert summary["nih_median"] == {f"{j}-after": v["median"] for j, v in nih.items()}
    recall = json.loads((out / "recall.json").read_text())["result"]["per_offset"]
    assert summary["verdict"] == {f"{j}-after": v["verdict"] for j, v in recall.items()}
    files = {t: [Circuit.from_json(out / "circuits" / f"{t}_seed{s}.json") for s in (0, 1)]
             for t in ("1-after", "2-after")}  # fmt: skip
    for target, found in files.items():
        assert summary["circuits"][target]["edges"] == [len(c.edges) for c in found]
        assert all(c.metadata["data"]["nih_protocol"] == "study" for c in found)
    # across-target Jaccard: the mean over every (seed, seed) pair, computed independently
    pairs = [overlap(a, b).jaccard for a in files["1-after"] for b in files["2-after"]]
    assert summary["overlap"]["1-after vs 2-after"]["jaccard"] == pytest.approx(sum(pairs) / 4)
    for (
        found
    ) in files.values():  # each circuit records its target's seed consensus, counted here again
        every = {e for c in found for e in c.edges}
        expected = {e: sum(e in c.edges for c in found) / len(found) for e in every}
        for c in found:
            assert {(w, r): f for w, r, f in c.metadata["consensus"]["scores"]} == pytest.approx(
                expected
            )
    saved = json.loads((out / "overlap.json").read_text())
    edges = saved["across"]["1-after vs 2-after"]["edges"]
    a, b = set(files["1-after"][0].edges) | set(files["1-after"][1].edges), \
        set(files["2-after"][0].edges) | set(files["2-after"][1].edges)  # fmt: skip
    shared = edges["n_shared_stable"] + edges["n_shared_unstable"]
    assert shared == len(a & b) and edges["n_a_only_stable"] + edges["n_a_only_unstable"] == len(
        a - b
    )
    assert "Which edges are stable" in (out / "index.html").read_text()
    assert saved["excluded_writers"] == ["pos"]
    assert len(saved["cross_evaluation"]) == 4 * 2  # every circuit on both targets


def test_cli_report_runs_and_bad_input_creates_nothing(tiny_lds_checkpoint, tmp_path, capsys):
    out = tmp_path / "r"
    args = [
        "report",
        "--ckpt",
        str(tiny_lds_checkpoint),
        "--eval-traces",
        "8",
        "--prune-traces",
        "8",
        "--recall-traces",
        "8",
        "--steps",
        "2",
        "--seed",
        "0",
        "--no-components",
        "--no-progress",
    ]
    assert main([*args, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert (out / "index.html").is_file() and "report:" in captured.out
    assert "torch threads:" in captured.err
    for bad, message in [
        (["--target", "bogus"], "unknown target"),
        (["--recipe", "paper"], "unknown recipe"),
        (["--ckpt", str(tmp_path / "missing.pt")], "not found"),
    ]:
        fresh = tmp_path / f"bad{len(message)}"
        assert main([*args, *bad, "--out", str(fresh)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
        assert not fresh.exists()  # nothing is created before the inputs are checked
    assert main([*args, "--out", ""]) == 2


def test_a_report_into_a_prunes_folder_is_refused_unless_forced(written, tiny_lds_checkpoint, tmp_path, capsys):
    """`report --out P` where a prune wrote its circuits: refused in one line naming them,
    nothing written; with --force the report is written beside them, which stay as they were."""
    report, *_ = written
    prune_out = tmp_path / "p"
    prune_out.mkdir()
    for name in ("1-after_seed0.json", "1-after_seed0.html", "plotly.min.js"):
        (prune_out / name).write_text("the prune's")
    before = sorted(p.name for p in prune_out.iterdir())
    args = ["report", "--ckpt", str(tiny_lds_checkpoint), "--out", str(prune_out), "--eval-traces", "8",
            "--prune-traces", "8", "--recall-traces", "8", "--steps", "2", "--seed", "0", "--no-components",
            "--no-progress", "--threads", "1"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "holds files a report does not write" in err and "1-after_seed0.html, 1-after_seed0.json" in err
    assert "--force" in err
    assert sorted(p.name for p in prune_out.iterdir()) == before  # nothing written
    with pytest.raises(ValueError, match="holds files a report does not write"):
        report.write(prune_out)
    assert sorted(p.name for p in prune_out.iterdir()) == before
    page = report.write(prune_out, force=True)
    assert page.is_file() and (prune_out / "1-after_seed0.json").read_text() == "the prune's"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"targets": ()}, "at least one target"),
        ({"seeds": ()}, "at least one seed"),
        ({"seeds": (0, 0)}, "must not repeat"),
        ({"eval_traces": 0}, "eval_traces must be a positive integer"),
        ({"steps": 0}, "steps must be a positive integer"),
        ({"recipe": "paper"}, "unknown recipe"),
    ],
)
def test_report_config_refuses_bad_settings(bad, message):
    with pytest.raises(ValueError, match=message):
        ReportConfig(**bad)


def test_cross_evaluation_rebuilds_the_circuits_own_traces(tiny_lds_checkpoint, monkeypatch):
    """The report's cross-evaluation runs on the held-out traces the circuit records
    (haystack, segment length, corruption), as `mechlab overlap --ckpt` does, not on the
    run's defaults (which main at 4d72a04 used)."""
    import mechlab.pipelines.report as report_module
    from mechlab.pipelines import open_checkpoint, prune_checkpoint
    from mechlab.pipelines.report import _overlap

    ckpt = open_checkpoint(tiny_lds_checkpoint)
    kw = {
        "n_train": 8,
        "n_test": 8,
        "steps": 1,
        "progress": False,
        "seg_len": 3,
        "corruption": "shuffle",
    }
    circuits = {t: [prune_checkpoint(ckpt, t, 0.9, seed=0, **kw)] for t in ("1-after", "2-after")}
    seen = []
    monkeypatch.setattr(
        report_module, "cross_evaluate", lambda model, data, flat, **kw: seen.append(data.info) or []
    )
    _overlap(ckpt, circuits, ReportConfig(**SMALL))
    info = seen[0]
    assert (info["n_haystack"], info["seg_len"], info["corruption"]) == (2, 3, "shuffle")
    assert (info["n_train"], info["n_test"], info["data_seed"]) == (8, 8, 0)
