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


def planted_redundant(seeds):
    """A stand-in for the redundant generator: value-61 per seed, both budgets the truth's size,
    goal 0.9, and one case whose goal no circuit reaches."""
    model, truth = PLANTED["value-61"]()
    budgets = {"minimal": len(truth), "planted": len(truth)}
    out = [(PlantedCase(f"value-61 seed {s}", model, set(truth), planted_data(s), seed=s), budgets, 0.9)
           for s in seeds]  # fmt: skip
    out.append((PlantedCase("unreachable", model, set(truth), planted_data(0)), {"minimal": 1}, 2.0))
    return out


def test_stability_and_redundant_columns():
    from mechlab.prune.circuit import jaccard
    from mechlab.prune.methods import find_circuit
    from mechlab.prune.stability import bootstrap_samples

    model, truth = PLANTED["value-61"]()
    data = planted_data(0)
    table = bench_methods(model, data, ["all"], ["eap"], sparsity=0.8, progress=False,
                          stability_boots=2, stability_seed=4, redundant=planted_redundant([0, 1]))  # fmt: skip
    row = table.model["eap"]["all"]
    # by hand: eap's circuits on the two resampled training traces against its own circuit
    own = set(find_circuit(model, data, "all", "eap", 0.8).edges)
    by_hand = [jaccard(own, find_circuit(model, d, "all", "eap", 0.8).edges)
               for d in bootstrap_samples(data, 2, seed=4)]  # fmt: skip
    assert row.stability == pytest.approx(sum(by_hand) / 2, abs=1e-12)
    detail = row.stability_detail
    assert detail["jaccards"] == pytest.approx(by_hand) and detail["n_boot"] == 2 and detail["seed"] == 4
    assert detail["seconds"] > 0 and row.seconds > 0  # timed apart
    red = table.redundant["eap"]
    assert red.found == {"minimal": 2, "planted": 2} and red.n_cases == {"minimal": 3, "planted": 2}
    unreachable = [c for c in red.cases if c["case"] == "unreachable"]
    assert len(unreachable) == 1 and unreachable[0]["found"] is False and unreachable[0]["n_edges"] == 1
    assert all(c["found"] and c["faithfulness"] >= 0.9 for c in red.cases if c["case"] != "unreachable")
    head, _, line = table.to_markdown().splitlines()
    assert head.endswith("| all MB | all stability | planted exact | Tracr exact | redundant found (minimal) "
                         "| redundant found (planted) |")  # fmt: skip
    assert line.endswith("| - | - | 2/3 | 2/2 |") and f"| {row.stability:.3f}" in line
    values = table.to_dict()
    assert values["redundant"]["eap"]["found"] == {"minimal": 2, "planted": 2}
    assert values["model"]["eap"]["all"]["stability_detail"]["meets_bar"] == (row.stability >= 0.8)
    assert values["info"]["stability_boots"] == 2 and len(values["info"]["redundant_cases"]) == 3


def test_without_stability_or_redundant_cases_the_table_is_as_before():
    model, _ = PLANTED["value-61"]()
    table = bench_methods(model, planted_data(0), ["all"], ["eap"], sparsity=0.8, progress=False)
    head = table.to_markdown().splitlines()[0]
    assert head == "| method | all CPR | all CMD | all f (edges) | all s | all MB | planted exact | Tracr exact |"
    assert table.model["eap"]["all"].stability is None and table.redundant == {}
    with pytest.raises(ValueError, match="stability_boots must be 0"):
        bench_methods(model, planted_data(0), ["all"], ["eap"], progress=False, stability_boots=1)
