"""examples/underspecification/circuits.py: when each run's last circuit forms, read from
the through-training folders and recall scores (no pruning)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def circuits():
    path = ROOT / "examples" / "underspecification" / "circuits.py"
    spec = importlib.util.spec_from_file_location("underspec_circuits", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _across(folder: Path, method: str, examples: list[int], jaccard: list[float]) -> None:
    folder.mkdir(parents=True)
    checkpoints = [{"step": x // 64, "examples": x, "edges": 25, "faithfulness": 0.9, "jaccard_with_last": j}
                   for x, j in zip(examples, jaccard, strict=True)]  # fmt: skip
    tag = "" if method == "prune" else f"_{method}"  # as mechlab names them
    names = {f"{t}{tag}_seed0": "sha" for t in ("1-after", "2-after")}
    across = {"run": "r", "every": 2, "seed": 0,
              "settings": {"circuits": {f"step_{x // 64:07d}": names for x in examples}},
              "targets": {"1-after": {"checkpoints": checkpoints, "edges": []},
                          "2-after": {"checkpoints": checkpoints[:-1] + [{**checkpoints[-1]}], "edges": []}}}  # fmt: skip
    (folder / "across.json").write_text(json.dumps(across))


def _recall(path: Path, examples: list[int], follows: list[float]) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"examples": examples, "per_offset": {"1": {"follows_label": follows}}}))


def test_onsets_of_circuit_and_behaviour(circuits, tmp_path):
    here, root = tmp_path / "underspec", tmp_path
    xs = [0, 64_000, 128_000, 192_000, 256_000]
    _across(here / "through-training" / "w4-seed0", "exact", xs, [0.2, 0.3, 0.55, 0.8, 1.0])
    # The untrained checkpoint (0 examples, follows 0.9 by chance) is not an onset.
    _recall(here / "logs" / "w4-seed0" / "recall" / "recall_dynamics.json", xs, [0.9, 0.5, 0.65, 0.95, 0.97])
    _across(root / "circuits" / "recall-cpu" / "through-training-prune", "prune", xs[:3], [0.1, 0.5, 1.0])
    summary = circuits.main(here, root, tmp_path / "figures")
    w4, bundled = summary["runs"]
    assert (w4["run"], w4["method"], w4["every"]) == ("w4-seed0", "exact", 2)
    assert w4["targets"]["1-after"] == {"jaccard_0.5_at": 128_000, "jaccard_0.9_at": 256_000}
    assert (w4["follows_0.6"], w4["follows_0.9"]) == (128_000, 192_000)
    assert (bundled["method"], bundled["folder"]) == ("prune", "through-training-prune")
    assert bundled["targets"]["2-after"]["jaccard_0.5_at"] == 64_000
    assert bundled["follows_0.6"] is None  # no bundled recall scores under tmp_path
    first = (here / "through_training.json").read_bytes(), (tmp_path / "figures" / "underspec-circuits.html").read_bytes()
    circuits.main(here, root, tmp_path / "figures")
    assert first == ((here / "through_training.json").read_bytes(),
                     (tmp_path / "figures" / "underspec-circuits.html").read_bytes())  # fmt: skip
