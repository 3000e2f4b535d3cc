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
