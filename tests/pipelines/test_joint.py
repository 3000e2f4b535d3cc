"""mechlab.pipelines.joint: the share sweep of one checkpoint, written, and read back on a rerun."""

from __future__ import annotations

import json

import pytest

from mechlab.pipelines import joint_prune_targets
from mechlab.prune import Circuit

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
KW = {"steps": 3, "n_train": 8, "n_test": 8, "progress": False}


def test_the_sweep_is_written_once_and_a_rerun_reads_it_back(tiny_lds_checkpoint, tmp_path):
    out = tmp_path / "c"
    run = joint_prune_targets(tiny_lds_checkpoint, ["1-after", "2-after"], [0.0, "tied"], out=out, **KW)
    assert set(run.circuits) == {f"share-{s}/{t}_seed0" for s in ("0", "tied") for t in ("1-after", "2-after")}
    table = json.loads(run.table.read_text())
    assert [r["share"] for r in table["rows"]] == [0.0, "tied"]
    for stem, circuit in run.circuits.items():  # each circuit as written is what the run returns
        assert Circuit.from_json(out / "joint" / f"{stem}.json").edges == circuit.edges
    before = {p: p.read_bytes() for p in (out / "joint").rglob("*.json")}
    again = joint_prune_targets(tiny_lds_checkpoint, ["1-after", "2-after"], [0.0, "tied"], out=out, **KW)
    assert {p: p.read_bytes() for p in (out / "joint").rglob("*.json")} == before
    assert {k: c.edges for k, c in again.circuits.items()} == {k: c.edges for k, c in run.circuits.items()}


def test_bad_shares_are_refused_before_anything_is_written(tiny_lds_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="share must be >= 0"):
        joint_prune_targets(tiny_lds_checkpoint, ["1-after", "2-after"], [-1.0], out=tmp_path / "c", **KW)
    assert not (tmp_path / "c").exists()
