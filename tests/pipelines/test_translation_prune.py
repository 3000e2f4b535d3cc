"""Circuits of the start and continue positions: pair files, circuits per target and method,
their overlap against the null models, the rerun that reads back, the refusals."""

from __future__ import annotations

import json

import pytest

from mechlab.pipelines.translation_prune import translation_circuits
from mechlab.tasks.translation import load_words
from tests.pipelines.test_translation import save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = {
    "n_pairs": 8,
    "k": 1,
    "seeds": (0, 1),
    "sparsity": 0.5,
    "n_boot": 20,
    "n_null": 20,
    "steps": 4,
    "progress": False,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("model") / "step10", n_layer=1)


@pytest.mark.slow
def test_circuits_of_both_targets_and_their_overlap(model, tmp_path):
    out = tmp_path / "out"
    seen = []
    report = translation_circuits(
        model, out, methods=("prune", "eap"), on_circuit=seen.append, **FAST
    )
    assert sorted(seen) == sorted(
        f"{t}{m}_seed{s}" for t in ("start", "continue") for m in ("", "_eap") for s in (0, 1)
    )
    start = [json.loads(line) for line in (out / "pairs" / "start.jsonl").read_text().splitlines()]
    cont = [
        json.loads(line) for line in (out / "pairs" / "continue.jsonl").read_text().splitlines()
    ]
    assert len(start) == len(cont) == report["pairs"]["start"]["n"] == 8
    assert [r["clean"] for r in start] == [
        r["clean"] for r in cont
    ]  # the same prompts, two positions
    assert all(s["position"] < c["position"] for s, c in zip(start, cont, strict=True))
    on_disk = json.loads((out / "overlap.json").read_text())
    for method in ("prune", "eap"):
        entry = on_disk["overlap"][method]
        assert entry["n_circuits"] == {"start": 2, "continue": 2}
        pair = entry["across"]["start vs continue"]
        assert {"jaccard_observed", "null_uniform", "null_degree"} <= set(pair)
        assert (
            len(entry["metrics"]["start"]) == 2
            and "logit_diff_full" in entry["metrics"]["start"][0]
        )
        files = on_disk["circuits"][method]["start"]
        assert len(files) == 2 and all((out / f).is_file() for f in files)
    seen.clear()
    again = translation_circuits(
        model, out, methods=("prune", "eap"), on_circuit=seen.append, **FAST
    )
    assert (
        again["overlap"]["prune"]["across"] == report["overlap"]["prune"]["across"]
    )  # read back, same numbers
    with pytest.raises(ValueError, match="made with other settings"):
        translation_circuits(model, out, methods=("prune", "eap"), **{**FAST, "sparsity": 0.6})


def test_one_attribution_method_end_to_end(model, tmp_path):
    report = translation_circuits(model, tmp_path / "out", methods=("eap",), **FAST)
    entry = report["overlap"]["eap"]
    assert entry["n_circuits"] == {"start": 2, "continue": 2}
    pair = entry["across"]["start vs continue"]
    assert (
        0 <= pair["jaccard_observed"] <= 1
        and pair["null_uniform"]["n_universe"] == entry["n_universe"]
    )
    assert report["circuits"]["eap"]["continue"] == [
        "circuits/continue_eap_seed0.json",
        "circuits/continue_eap_seed1.json",
    ]


def test_refusals_write_nothing(model, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="label 'dog' is a word of the word list"):
        translation_circuits(model, out, symbols=("X", "dog"), **FAST)
    words = tmp_path / "w.tsv"
    words.write_text("english\tspanish\tfrench\ndog\tperro\tzzyzx\n", encoding="utf-8")
    with pytest.raises(ValueError, match="cannot encode the word 'zzyzx'"):
        translation_circuits(model, out, words=words, **FAST)
    with pytest.raises(ValueError, match="not found"):
        translation_circuits(tmp_path / "nope", out, **FAST)
    assert not out.exists()
    assert load_words().languages == ("spanish", "french")


def test_a_summary_that_no_longer_matches_its_circuits_is_rewritten(model, tmp_path):
    """Circuits recomputed under the same settings (the search's defaults moved, so each
    circuit's own settings differ) leave overlap.json behind them unless it follows: a
    summary whose content differs from what its circuits give is written again."""
    import json

    out = tmp_path / "out"
    report = translation_circuits(model, out, methods=("eap",), **FAST)
    path = out / "overlap.json"
    stale = json.loads(path.read_text())
    stale["overlap"]["eap"]["within"] = {}
    path.write_text(json.dumps(stale))
    again = translation_circuits(model, out, methods=("eap",), **FAST)
    assert json.loads(path.read_text())["overlap"] == json.loads(json.dumps(again["overlap"]))
    assert again["overlap"]["eap"]["within"] == json.loads(json.dumps(report["overlap"]["eap"]["within"]))
