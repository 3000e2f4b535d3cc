"""mechlab.pipelines.curves: a target's curves written once, keyed by the whole search."""

from __future__ import annotations

import json

import pytest

from mechlab.pipelines import curve_checkpoint
from mechlab.pipelines.records import settings_record
from mechlab.prune.config import PruneConfig

pytestmark = [pytest.mark.usefixtures("one_thread"),  # tests/conftest.py
              pytest.mark.filterwarnings("ignore:circuit for .* the search likely failed")]  # fmt: skip
KW = {"budgets": (0.1, 0.5), "n_train": 8, "n_test": 8, "progress": False}


def test_the_record_holds_the_resolved_search_and_a_default_reads_back_as_given(tiny_lds_checkpoint, tmp_path):
    out = tmp_path / "c"
    first = curve_checkpoint(tiny_lds_checkpoint, out=out, steps=3, **KW)[0]
    record = json.loads(first.json.read_text())["settings"]
    assert record["search"]["steps"] == 3 and record["search"]["warm_start"] == PruneConfig().warm_start
    assert "steps" not in record  # the steps live in the search, once
    again = curve_checkpoint(tiny_lds_checkpoint, out=out, steps=3, **KW)[0]
    assert again.reused and again.json.read_bytes() == first.json.read_bytes()
    # a file written under another search (the old 500-step record, say) is refused, not read back
    stale = json.loads(first.json.read_text())
    old = {k: v for k, v in stale["settings"].items() if k != "search"} | {"steps": 3, "sparsity": 0.95}
    first.json.write_text(json.dumps({**stale, **settings_record(old)}))
    with pytest.raises(ValueError, match="other settings|differ"):
        curve_checkpoint(tiny_lds_checkpoint, out=out, steps=3, **KW)


def test_ctrl_c_during_curve_keeps_the_targets_written_and_the_rerun_reads_them_back(tiny_lds_checkpoint, tmp_path,
                                                                                    capsys):  # fmt: skip
    from mechlab.cli import main
    from tests.interrupt import interrupt, leftovers, stopped_line

    out = tmp_path / "c"
    args = ["curve", "--ckpt", str(tiny_lds_checkpoint), "--target", "1-after", "--target", "2-after", "--steps", "2400",
            "--budgets", "0.1,0.5", "--traces", "8", "--test-traces", "8", "--threads", "1", "--no-progress",
            "--out", str(out)]  # fmt: skip
    line = stopped_line(interrupt(args, out / "curve_1-after.json"))  # 2-after's pruning run follows
    assert line.startswith(f"mechlab: stopped by signal 2 (SIGINT, Ctrl-C) after 1 of 2 target(s); kept curve_1-after "
                           f"in '{out}'; resume with the same command"), line  # fmt: skip
    assert not (out / "curve_2-after.json").exists() and not leftovers(out)
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert f"1-after: {out / 'curve_1-after.json'}, {out / 'curve_1-after.html'} (read back: same settings)" in printed
    assert (out / "curve_2-after.json").is_file()
