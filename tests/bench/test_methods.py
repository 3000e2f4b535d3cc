"""The methods table (mechlab.bench.methods) on planted models: its rows, recoveries and refusals."""

import pytest
import torch

from mechlab.bench.methods import PlantedCase, bench_methods, peak_rss
from tests.prune.planted_cases import cases
from tests.prune.test_planted import PLANTED, planted_data

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_the_table_on_a_planted_model():
    model, truth = PLANTED["value-61"]()
    planted = [c for c in cases((0,)) if c.name.startswith(("value-61", "qk-61"))]
    wrong = PlantedCase("wrong truth", model, PLANTED["qk-61"]()[1], planted_data(0))
    table = bench_methods(model, planted_data(0), ["all"], ["eap-ig", "exact", "acdc"],
                          planted=[*planted, wrong], sparsity=0.9, progress=False,
                          method_kwargs={"acdc": {"max_edges": 10}})  # fmt: skip
    row = table.model["eap-ig"]["all"]
    assert row.faithfulness > 0.999 and 0 < row.cpr <= 0.999 and row.n_edges_kept == 5
    assert row.seconds > 0
    assert table.model["acdc"]["all"].refused.startswith("ACDC runs one forward pass")
    for method in ("eap-ig", "exact"):
        rec = table.planted[method]
        assert (rec.n_exact, rec.n_cases, rec.misses) == (2, 3, ["wrong truth"])
    assert table.planted["acdc"].refused == 3
    lines = table.to_markdown().splitlines()
    assert len(lines) == 2 + 3 and "| acdc | refused |" in lines[-1]
    assert "loadavg_end" in table.info


def test_peak_rss_sees_an_allocation():
    out, peak = peak_rss(lambda: torch.ones(64, 2**20).sum().item())  # 256 MB
    assert out == 64 * 2**20
    if peak is not None:
        assert peak > 100 * 2**20
