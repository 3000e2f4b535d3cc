"""The committed translation example (examples/translation/): the tiny model's checkpoints,
the run across them and the circuits agree with what they are computed from."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from mechlab.pipelines.translation import summarize

HERE = Path(__file__).resolve().parents[2] / "examples" / "translation"
pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_committed_files_are_small_and_the_checkpoints_dense():
    committed = [p for p in HERE.rglob("*") if p.is_file() and p.name not in ("plotly.min.js", ".lock")
                 and not (p.suffix == ".html" and "circuits" in p.parts)]  # what .gitignore leaves  # fmt: skip
    assert sum(p.stat().st_size for p in committed) < 5_000_000
    steps = sorted(
        int(p.stem.split("_")[1]) for p in (HERE / "tiny" / "checkpoints").glob("step_*.pt")
    )
    assert len(steps) >= 10 and steps == sorted(set(steps))
    assert [json.loads(p.read_text())["step"] for p in sorted((HERE / "across").glob("step_*.json"),
                                                             key=lambda p: int(p.stem[5:]))] == steps  # fmt: skip


def test_across_json_is_the_summary_of_its_step_files():
    across = json.loads((HERE / "across" / "across.json").read_text())
    reports = {
        int(p.stem[5:]): json.loads(p.read_text())["report"]
        for p in (HERE / "across").glob("step_*.json")
    }
    again = summarize(reports, across["threshold"])
    assert again["verdict"] == across["verdict"]
    assert again["emergence"] == across["emergence"] and again["curves"] == across["curves"]


def test_the_final_checkpoint_scores_as_recorded():
    from mechlab.checkpoint import load_checkpoint
    from mechlab.evals.translation import start_vs_continue
    from mechlab.tasks.prompts import load_tokenizer
    from mechlab.tasks.translation import episodes, load_words, usable_words

    across = json.loads((HERE / "across" / "across.json").read_text())
    last = across["steps"][-1]
    record = json.loads((HERE / "across" / f"step_{last}.json").read_text())
    settings = record["settings"]
    tok = load_tokenizer(HERE / "tiny" / "checkpoints")
    words, _ = usable_words(load_words(HERE / "tiny" / "words.tsv"), tok)
    prompts = {
        "symbolic": episodes(
            words, tok, n=32, kind="symbolic", k=4, n_query=3, seed=settings["seed"]
        )
    }
    model = load_checkpoint(HERE / "tiny" / "checkpoints" / f"step_{last:07d}.pt").model
    ours = start_vs_continue(model, prompts, n_boot=10)["symbolic"]
    recorded = record["report"]["symbolic"]  # 128 prompts of the same seed: ours are its first 32
    for key in ("start_acc", "continue_acc"):
        assert abs(ours[key]["mean"] - recorded[key]["mean"]) <= 0.25
    assert ours["continue_acc"]["mean"] == pytest.approx(recorded["continue_acc"]["mean"], abs=0.1)


@pytest.mark.parametrize("kind", ["symbolic", "semantic"])
def test_overlap_json_is_the_jaccard_of_its_circuits(kind):
    from mechlab.prune.circuit import Circuit, jaccard

    folder = HERE / "circuits" / kind
    report = json.loads((folder / "overlap.json").read_text())
    assert report["settings"]["kind"] == kind
    for method, files in report["circuits"].items():
        start = [Circuit.from_json(folder / f) for f in files["start"]]
        cont = [Circuit.from_json(folder / f) for f in files["continue"]]
        pairs = [jaccard(a.edge_set(), b.edge_set()) for a, b in itertools.product(start, cont)]
        entry = report["overlap"][method]
        assert entry["across"]["start vs continue"]["jaccard_observed"] == pytest.approx(
            sum(pairs) / len(pairs)
        )
        assert entry["n_edges"]["start"] == [c.n_edges for c in start]
