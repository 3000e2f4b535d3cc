"""examples/underspecification/analyze.py: onsets from a run's log and recall scores, the
partial flag, and the copy of the small evidence files (no training)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def analyze():
    path = ROOT / "examples" / "underspecification" / "analyze.py"
    spec = importlib.util.spec_from_file_location("analyze_underspec", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, name: str, steps_planned: int, nih1: list[float], follows: list[float] | None) -> Path:
    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"steps": steps_planned, "batch_size": 64}))
    lines = [{"step": 10, "examples": 640, "loss": 1.0}]
    for i, e in enumerate(nih1, start=1):
        lines.append({"step": 250 * i, "examples": 16000 * i,
                      "eval": {"nih_1_after": e, "nih_2_after": e / 2, "nih_3_after": e / 3, "test_loss": 0.1}})  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if follows is not None:
        xs = [0, 1000] + [16000 * i for i in range(1, len(follows) - 1)]
        e_label = [1.5, 1.5] + [0.6 * f for f in follows[2:]]
        dyn = {"examples": xs,
               "per_offset": {"1": {"e_label": e_label, "follows_label": follows, "scale": [1.0] * len(xs)},
                              "2": {"e_obs": [0.5] * len(xs)}},
               "errors": {"clean": {"1": [0.8] * len(xs), "2": [0.4] * len(xs)}}}  # fmt: skip
        (run / "recall").mkdir()
        (run / "recall" / "recall_dynamics.json").write_text(json.dumps(dyn))
    return run


def test_onsets_and_partial(analyze, tmp_path):
    # The log: 1-after error 0.8, 0.5, 0.25, 0.15, 0.05 at 16k..80k examples (5 x 250 steps).
    done = _run(tmp_path, "w4-seed1", 1250, [0.8, 0.5, 0.25, 0.15, 0.05],
                [0.9, 0.9, 0.5, 0.62, 0.8, 0.95, 0.97])  # fmt: skip
    o = analyze.onsets(analyze.read_run(done))
    assert (o["w"], o["seed"], o["partial"], o["examples_run"]) == (4.0, 1, False, 80000)
    assert (o["nih1_below_0.3"], o["nih1_below_0.2"], o["nih1_below_0.1"]) == (48000, 64000, 80000)
    assert o["nih1_width_0.3_to_0.1"] == 32000
    # The untrained checkpoints (< 2000 examples: follows 0.9 by chance) are skipped.
    assert (o["follows_0.6"], o["follows_0.75"], o["follows_0.9"]) == (32000, 48000, 64000)
    assert o["follows_width_0.6_to_0.9"] == 32000
    assert o["e_label_0.5"] == 64000  # half the scale: 0.6 * 0.8 < 0.5 <= 0.6 * 0.95
    partial = _run(tmp_path, "w16-seed0", 12000, [0.8, 0.7], None)
    p = analyze.onsets(analyze.read_run(partial))
    assert (p["partial"], p["steps_logged"], p["nih1_below_0.2"], p["final_nih1"]) == (True, 500, None, 0.7)
    assert "follows_0.75" not in p  # no recall scores yet


def test_collect_and_main(analyze, tmp_path, monkeypatch):
    _run(tmp_path, "w1-seed0", 1250, [0.8, 0.5, 0.25, 0.15, 0.05], [0.5, 0.5, 0.5, 0.7, 0.9, 0.95, 0.96])
    _run(tmp_path, "w16-seed0", 12000, [0.8, 0.7], None)
    (tmp_path / "runs" / "w1-seed0" / "last.pt").write_bytes(b"not copied")
    logs = tmp_path / "logs"
    copied = analyze.collect(tmp_path / "runs", logs)
    assert sorted(p.relative_to(logs).as_posix() for p in copied) == [
        "w1-seed0/config.yaml", "w1-seed0/metrics.jsonl", "w1-seed0/recall/recall_dynamics.json",
        "w16-seed0/config.yaml", "w16-seed0/metrics.jsonl"]  # fmt: skip
    monkeypatch.setattr(analyze, "HERE", tmp_path)
    monkeypatch.setattr(analyze, "FIGURES", tmp_path / "figures")
    summary = analyze.main(logs)
    assert [o["run"] for o in summary["onsets"]] == ["w1-seed0", "w16-seed0"]  # sorted by w
    assert [v["onset"] for v in summary["verdicts"]] == ["follows_0.6", "follows_0.9", "nih1_below_0.2"]
    assert summary["verdicts"][2]["verdict"] == "undecided"  # one seed each, one run partial
    first = (tmp_path / "summary.json").read_bytes(), (tmp_path / "figures" / "underspec-recall.html").read_bytes()
    analyze.main(logs)
    assert first == ((tmp_path / "summary.json").read_bytes(),
                     (tmp_path / "figures" / "underspec-recall.html").read_bytes())  # fmt: skip


def _row(w: float, seed: int, onset: float | None, partial: bool = False) -> dict:
    return {"w": w, "seed": seed, "partial": partial, "follows_0.6": onset}


def test_verdict_orders_arms_seed_for_seed(analyze):
    # Every seed of a larger w before every seed of a smaller one: holds.
    earlier = [_row(1, 0, 4e5), _row(1, 1, 5e5), _row(4, 0, 3e5), _row(4, 1, 3.5e5),
               _row(16, 0, 1e5), _row(16, 1, 2e5)]  # fmt: skip
    v = analyze.verdict(earlier)
    assert v["verdict"] == "holds" and [p["order"] for p in v["pairs"]] == ["earlier"] * 3
    assert v["seeds_per_arm"] == {"1": 2, "4": 2, "16": 2}
    # w = 16's seeds straddle w = 4's: that pair overlaps, nothing is later -> undecided.
    mixed = earlier[:4] + [_row(16, 0, 2e5), _row(16, 1, 3.2e5)]
    v = analyze.verdict(mixed)
    assert v["verdict"] == "undecided"
    assert {(p["w_lo"], p["w_hi"]): p["order"] for p in v["pairs"]}[(4, 16)] == "overlap"
    # A larger w later on every seed, one run never getting there (None: after its end): fails.
    later = earlier[:4] + [_row(16, 0, None), _row(16, 1, 6e5)]
    v = analyze.verdict(later)
    assert v["verdict"] == "fails" and v["onsets"]["16"] == [None, 6e5]
    assert {(p["w_lo"], p["w_hi"]): p["order"] for p in v["pairs"]}[(1, 16)] == "later"
    # One seed per arm, or a partial run, never decides.
    assert analyze.verdict(earlier[::2])["verdict"] == "undecided"
    assert analyze.verdict(earlier[:5] + [_row(16, 1, 2e5, partial=True)])["verdict"] == "undecided"
    # Runs without recall scores are left out of a follows_label verdict.
    assert analyze.verdict([{"w": 1, "seed": 0, "partial": False}])["seeds_per_arm"] == {}
