"""The committed stability run on a model you bring (examples/imported/): a Hugging Face
GPT-2 folder that mechlab imports, its pairs, its circuits, and the table docs/pruning.md
quotes, each agreeing with what it is computed from."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from mechlab.pipelines import outputs
from mechlab.pipelines.prompts import source_digest
from mechlab.prune import Circuit

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "imported"
MODEL = HERE / "tiny-gpt2"
TABLE = json.loads((HERE / "stability.json").read_text())
pytestmark = pytest.mark.usefixtures("one_thread")


def _circuit(row: dict) -> Circuit:
    tag = "" if row["method"] == "prune" else f"_{row['method']}"
    folder = HERE / "circuits" / row["target"] / f"sparsity-{row['sparsity']}"
    return Circuit.from_json(folder / f"{row['target']}{tag}_seed{row['seed']}.json")


def test_the_model_is_a_hugging_face_gpt2_folder_that_mechlab_imports():
    import transformers as T

    from mechlab.models.importers import from_pretrained

    hf = T.GPT2LMHeadModel.from_pretrained(MODEL).eval()
    ours = from_pretrained(MODEL).eval()
    ids = torch.tensor([json.loads((HERE / "pairs" / "continue.jsonl").read_text().splitlines()[0])["clean"]])
    with torch.no_grad():
        assert torch.allclose(ours(ids), hf(ids).logits, atol=1e-4)
    committed = [p for p in HERE.rglob("*") if p.is_file() and p.suffix != ".html" and p.name != "plotly.min.js"]
    assert sum(p.stat().st_size for p in committed) < 2_000_000


def test_every_row_is_its_circuit_file_found_on_this_model_and_these_pairs():
    model_sha = source_digest(MODEL)
    assert len(TABLE["circuits"]) == 2 * len(TABLE["sparsities"]) * 4 * len(TABLE["seeds"])
    for row in TABLE["circuits"]:
        circuit = _circuit(row)
        meta, settings = circuit.metadata, circuit.metadata["settings"]
        assert settings["model_sha256"] == model_sha
        assert settings["pairs_sha256"] == outputs.file_sha256(HERE / "pairs" / f"{row['target']}.jsonl")
        assert settings["stability_boots"] == TABLE["bootstrap_replicates"] == meta["stability"]["n_boot"]
        assert settings["sparsity"] == row["sparsity"]
        assert circuit.n_edges == row["edges"]
        assert meta["metrics"]["faithfulness"] == row["faithfulness"]
        assert meta["stability"]["mean_jaccard"] == row["stability"]
        assert row["stability"] == pytest.approx(statistics.mean(meta["stability"]["jaccards"]))
    for key, entry in TABLE["summary"].items():
        target, sparsity, method = key.split()
        rows = [r for r in TABLE["circuits"] if (r["target"], str(r["sparsity"]), r["method"]) == (target, sparsity, method)]
        assert entry["stability"] == pytest.approx(statistics.mean(r["stability"] for r in rows))
        assert entry["faithfulness"] == pytest.approx(statistics.mean(r["faithfulness"] for r in rows))


def test_the_model_has_the_behaviour_the_pairs_ask_about():
    from mechlab.models.importers import from_pretrained
    from mechlab.tasks.prompts import load_pairs

    model = from_pretrained(MODEL).eval()
    for target, recorded in TABLE["clean_accuracy"].items():
        found = load_pairs(HERE / "pairs" / f"{target}.jsonl", MODEL)
        with torch.no_grad():
            logits = model(found.clean)[torch.arange(len(found)), found.position]
        accuracy = float((found.logit_difference(logits) > 0).float().mean())
        assert accuracy == pytest.approx(recorded) and accuracy >= 0.95


def test_a_recorded_stability_is_the_methods_circuits_on_the_resampled_pairs():
    """EAP's circuit of seed 0 (continue, the first budget): its 10 replicates recomputed here
    from the resampled training pairs give the recorded Jaccards."""
    from mechlab.models.importers import from_pretrained
    from mechlab.prune.circuit import jaccard
    from mechlab.prune.methods import find_circuit
    from mechlab.prune.stability import bootstrap_samples
    from mechlab.tasks.prompts import TARGET, load_pairs

    row = next(r for r in TABLE["circuits"] if (r["target"], r["method"], r["seed"]) == ("continue", "eap", 0))
    circuit = _circuit(row)
    data = load_pairs(HERE / "pairs" / "continue.jsonl", MODEL).prune_data(0.5, seed=0)
    model = from_pretrained(MODEL).eval()
    by_hand = [jaccard(circuit.edge_set(), find_circuit(model, d, TARGET, "eap", row["sparsity"]).edge_set())
               for d in bootstrap_samples(data, TABLE["bootstrap_replicates"], seed=0)]  # fmt: skip
    assert circuit.metadata["stability"]["jaccards"] == pytest.approx(by_hand, abs=1e-12)


def test_docs_quote_the_table():
    text = (ROOT / "docs" / "pruning.md").read_text()
    for key, entry in TABLE["summary"].items():
        target, sparsity, method = key.split()
        cells = f"| {target} | {sparsity} | {method} | {entry['edges']:.0f} | {entry['faithfulness']:.3f} | {entry['stability']:.3f}"
        assert cells in text, cells
