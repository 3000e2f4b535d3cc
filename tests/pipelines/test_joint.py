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


@pytest.mark.slow  # 17 s on 2 shared cores: a fresh interpreter, then the rerun's share
def test_sigterm_during_the_sweep_keeps_the_finished_shares_and_the_rerun_reads_them_back(tiny_lds_checkpoint,
                                                                                         tmp_path, capsys):  # fmt: skip
    import signal

    from mechlab.cli import main
    from tests.interrupt import interrupt, leftovers, stopped_line

    out = tmp_path / "c"
    args = ["prune", "--ckpt", str(tiny_lds_checkpoint), "--target", "1-after", "--target", "2-after", "--share", "0",
            "--share", "1", "--steps", "30", "--traces", "8", "--test-traces", "8", "--threads", "1", "--no-progress",
            "--out", str(out)]  # fmt: skip
    done = interrupt(args, out / "joint" / "share-0" / "2-after_seed0.json", signum=signal.SIGTERM)  # share 1 follows
    line = stopped_line(done, signal.SIGTERM)
    kept = ["share-0/1-after_seed0", "share-0/2-after_seed0"]
    assert line.startswith(f"mechlab: stopped by signal 15 (SIGTERM) after 2 of 4 circuit(s); kept {', '.join(kept)} "
                           f"in '{out / 'joint'}'; resume with the same command"), line  # fmt: skip
    assert sorted(p.relative_to(out / "joint").as_posix() for p in (out / "joint").rglob("*")) == [
        "share-0", *(f"{stem}.json" for stem in kept)]  # the figures and joint.json come at the end
    assert not leftovers(out)
    assert main(args) == 0
    assert f"read back 2 circuit(s) found before with the same settings: {', '.join(kept)}" in capsys.readouterr().out
    assert (out / "joint" / "joint.json").is_file() and (out / "joint" / "share-1" / "2-after_seed0.html").is_file()
