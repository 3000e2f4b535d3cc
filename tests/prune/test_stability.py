"""Tests of mechlab.prune.stability: bootstrap Jaccards against a hand computation on a finder
whose circuit is known from the traces it is given, seeding, aligned resampling, errors, and
a method's stability on a planted model."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from mechlab.prune import STABILITY_BAR, BootstrapStability, bootstrap_stability, method_stability
from mechlab.prune.circuit import Circuit
from mechlab.prune.methods import find_circuit
from mechlab.prune.stability import bootstrap_samples, stability_text
from mechlab.traces import PruneData, Traces

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

N = 12


def numbered(n: int = N, offset: int = 0) -> Traces:
    """Traces whose every per-trace field names the trace: inputs ``i``, corrupted ``i + 1000``,
    truth ``i + 2000``, observed True at position ``i % 3``."""
    ids = torch.arange(offset, offset + n, dtype=torch.float32)
    inputs = ids.view(n, 1, 1).expand(n, 3, 2).clone()
    observed = torch.zeros(n, 3, dtype=torch.bool)
    observed[torch.arange(n), torch.arange(n) % 3] = True
    return Traces(inputs=inputs, corrupted=inputs + 1000, truth=inputs[..., :1] + 2000,
                  observed=observed, query_position=1, seg_len=2,
                  windows=[("a", 0, 1), ("b", 1, 3)])  # fmt: skip


def ids_of(traces: Traces) -> list[int]:
    return [int(v) for v in traces.inputs[:, 0, 0]]


class TraceFinder:
    """A circuit finder whose circuit is one edge per distinct training trace (``x -> r<i>``);
    it remembers the traces of every call."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, data: PruneData) -> Circuit:
        ids = ids_of(data.train)
        self.calls.append(ids)
        return Circuit.from_edges({("embed", f"a0.h{i}.q"): 1.0 for i in set(ids)})


def test_jaccards_match_a_hand_computation():
    data = PruneData(numbered(), numbered(8, offset=100))
    finder = TraceFinder()
    result = bootstrap_stability(finder, data, n_boot=6, seed=3)
    assert len(finder.calls) == 7 and finder.calls[0] == list(range(N))  # the reference first
    drawn = [set(ids) for ids in finder.calls[1:]]
    assert all(len(ids) == N and set(ids) <= set(range(N)) for ids in finder.calls[1:])
    assert any(len(s) < N for s in drawn)  # with replacement: some traces drawn twice
    # by hand: the reference keeps all N edges, a replicate the distinct traces it drew
    with_reference = [len(s) / N for s in drawn]
    pairs = [len(a & b) / len(a | b) for a, b in itertools.combinations(drawn, 2)]
    assert result.jaccards == pytest.approx(with_reference, abs=1e-12)
    assert result.mean_jaccard == pytest.approx(sum(with_reference) / 6, abs=1e-12)
    assert result.pairwise_jaccard == pytest.approx(sum(pairs) / 15, abs=1e-12)
    assert result.min_jaccard == min(with_reference)
    ordered = sorted(with_reference)  # numpy's linear percentile, by hand: position q (n-1)
    lo, hi = 0.05 * 5, 0.95 * 5
    assert result.p5 == pytest.approx(ordered[0] + (ordered[1] - ordered[0]) * lo, abs=1e-12)
    assert result.p95 == pytest.approx(ordered[4] + (ordered[5] - ordered[4]) * (hi - 4), abs=1e-12)
    for i in range(N):
        assert result.edge_frequency[("embed", f"a0.h{i}.q")] == pytest.approx(
            sum(i in s for s in drawn) / 6
        )
    assert list(result.edge_frequency.values()) == sorted(
        result.edge_frequency.values(), reverse=True
    )
    assert (
        result.n_boot == 6 and result.n_edges_reference == N and result.bar == STABILITY_BAR == 0.8
    )
    assert result.meets_bar == (result.mean_jaccard >= 0.8)


def test_a_circuit_that_ignores_the_traces_is_perfectly_stable_and_the_reference_can_be_given():
    calls = []
    fixed = Circuit.from_edges({("embed", "out"): 1.0, ("a0.h0", "out"): 0.5})

    def find(data):
        calls.append(1)
        return fixed

    result = bootstrap_stability(find, PruneData(numbered(), numbered()), n_boot=3, reference=fixed)
    assert len(calls) == 3  # the reference was given: not found again
    assert (
        result.jaccards == (1.0, 1.0, 1.0) and result.pairwise_jaccard == 1.0 and result.meets_bar
    )
    assert result.edge_frequency == {("a0.h0", "out"): 1.0, ("embed", "out"): 1.0}
    other = Circuit.from_edges({("embed", "out"): 1.0})  # a reference with one of the two edges
    assert (
        bootstrap_stability(
            find, PruneData(numbered(), numbered()), 2, reference=other
        ).mean_jaccard
        == 0.5
    )


def test_the_same_seed_draws_the_same_replicates_and_another_seed_others():
    data = PruneData(numbered(), numbered())

    def run(seed):
        finder = TraceFinder()
        torch.manual_seed(seed + 99)  # the global generator plays no part
        values = bootstrap_stability(finder, data, n_boot=4, seed=seed).to_dict()
        values.pop("seconds")
        values.pop("summary")
        return finder.calls, values

    assert run(0) == run(0)
    assert run(0)[0] != run(1)[0]


def test_resampling_keeps_every_per_trace_field_aligned():
    data = PruneData(numbered(), numbered(5, offset=50), {"task": "numbers"})
    samples = bootstrap_samples(data, n_boot=5, seed=1)
    for b, sample in enumerate(samples):
        assert sample.test is data.test and sample.info == {
            "task": "numbers",
            "bootstrap": {"seed": 1, "replicate": b},
        }
        ids = ids_of(sample.train)
        assert len(ids) == N
        for f in dataclasses.fields(Traces):
            value, original = getattr(sample.train, f.name), getattr(data.train, f.name)
            if isinstance(
                original, torch.Tensor
            ):  # a per-trace field: row i is the original's row ids[i]
                assert torch.equal(value, original[torch.tensor(ids)]), f.name
            else:
                assert value == original, f.name
        t = sample.train
        assert torch.equal(t.corrupted[:, 0, 0], t.inputs[:, 0, 0] + 1000)
        assert torch.equal(t.truth[:, 0, 0], t.inputs[:, 0, 0] + 2000)
        assert torch.equal(t.observed.float().argmax(1), torch.tensor([i % 3 for i in ids]))


@pytest.mark.parametrize("n_boot", [1, 0, -3, 2.5, True, "5"])
def test_n_boot_below_two_is_one_line_before_any_work(n_boot):
    finder = TraceFinder()
    with pytest.raises(ValueError, match="n_boot must be an integer >= 2") as info:
        bootstrap_stability(finder, PruneData(numbered(), numbered()), n_boot=n_boot)
    assert "\n" not in str(info.value) and finder.calls == []
    with pytest.raises(ValueError, match="n_boot must be an integer >= 2"):
        method_stability(
            torch.nn.Linear(1, 1), PruneData(numbered(), numbered()), "all", "eap", n_boot=n_boot
        )


def test_to_dict_and_words():
    result = bootstrap_stability(TraceFinder(), PruneData(numbered(), numbered()), n_boot=3)
    values = result.to_dict()
    assert isinstance(result, BootstrapStability) and values["meets_bar"] == result.meets_bar
    assert values["n_boot"] == 3 and len(values["edge_frequency"]) == N and values["bar"] == 0.8
    assert values["summary"] == stability_text(values) == result.summary()
    assert (
        f"mean edge Jaccard {result.mean_jaccard:.2f}" in values["summary"]
        and "over 3 resamples" in values["summary"]
    )
    assert stability_text({"mean_jaccard": 0.9, "n_boot": 4}).endswith("bar 0.8: met")
    assert stability_text({"mean_jaccard": 0.5, "n_boot": 4}).endswith("bar 0.8: not met")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.mean_jaccard = 1.0


def test_method_stability_on_a_planted_model_is_find_circuit_on_the_resampled_traces():
    from tests.prune.test_planted import PLANTED, planted_data

    model, truth = PLANTED["value-61"]()
    data = planted_data(0)
    result = method_stability(model, data, "all", "exact", n_boot=3, seed=2, n_edges=len(truth))
    by_hand = [set(find_circuit(model, d, "all", "exact", n_edges=len(truth)).edges)
               for d in bootstrap_samples(data, 3, seed=2)]  # fmt: skip
    assert all(edges == set(truth) for edges in by_hand)  # the planted circuit, whatever traces
    assert result.jaccards == (1.0, 1.0, 1.0) and result.meets_bar
    assert set(result.edge_frequency) == set(truth) and set(result.edge_frequency.values()) == {1.0}
    assert np.isclose(result.pairwise_jaccard, 1.0)
