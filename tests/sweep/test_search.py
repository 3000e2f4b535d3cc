"""The N* search on a synthetic oracle whose true threshold is known."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechlab.sweep import OracleTrial, SearchConfig, SweepSpec, run_sweep, search_n_star
from mechlab.sweep.search import NStarSearch

STUDY = SearchConfig()  # multiplier 1000, 20 steps, N_max 16M


def grid_oracle(thresholds):
    """The grid succeeds at N iff some configuration's threshold is <= N."""
    calls = []

    def succeeds(n):
        calls.append(n)
        return any(n >= t for t in thresholds)

    return succeeds, calls


def assert_brackets(result, n_true, resolution):
    """N* is the smallest succeeding N tried; the truth lies in (lo, hi], and the bracket
    is closed to the resolution (or to adjacent integers)."""
    assert result.status == "found"
    assert result.n_star == result.hi
    assert result.lo < n_true <= result.hi
    assert result.hi / result.lo <= resolution or result.hi == result.lo + 1
    assert result.steps <= 20


@pytest.mark.parametrize("n_true", [2, 3, 7, 999, 1000, 1001, 54_321, 999_999, 1_000_001, 7_654_321, 15_999_999, 16_000_000])
def test_found_within_resolution_across_the_range(n_true):
    cfg = SearchConfig(resolution=1.01)
    # per-configuration thresholds: the grid's N* is the smallest of them
    succeeds, calls = grid_oracle([n_true * 3, n_true, n_true * 2])
    result = search_n_star(succeeds, cfg)
    assert_brackets(result, n_true, 1.01)
    assert [n for n, _ in result.history] == calls


@pytest.mark.parametrize("n_true", [2, 5, 17, 100, 1234, 5000])
def test_small_thresholds_are_found_exactly_with_the_studys_settings(n_true):
    result = search_n_star(grid_oracle([n_true])[0], STUDY)
    assert result.status == "found" and result.n_star == n_true and result.lo == n_true - 1


def test_geometric_then_binary_moves():
    cfg = SearchConfig(n_min=1, multiplier=1000, resolution=2.0)
    result = search_n_star(lambda n: n >= 5000, cfg)
    tried = [n for n, _ in result.history]
    # geometric phase: 1 -> 1000 -> 1e6 (brackets 5000); then log-space bisection
    assert tried[:3] == [1, 1000, 1_000_000]
    assert tried[3] == round(math.sqrt(1000 * 1_000_000))
    for (n, ok), nxt in zip(result.history[:-1], tried[1:], strict=True):  # success moves to a smaller N
        assert (nxt < n) if ok else (nxt > n)
    assert_brackets(result, 5000, 2.0)


def test_start_at_the_top_moves_down_by_the_multiplier():
    cfg = SearchConfig(start=16_000_000, resolution=1.01)
    result = search_n_star(lambda n: n >= 300, cfg)
    assert [n for n, _ in result.history[:3]] == [16_000_000, 16_000, 16]
    assert_brackets(result, 300, 1.01)


@pytest.mark.parametrize("n_true", [1, 5, 10])
def test_threshold_at_or_below_n_min(n_true):
    result = search_n_star(lambda n: n >= n_true, SearchConfig(n_min=10))
    assert result.status == "at_min" and result.n_star == 10 and result.lo is None
    assert result.history == [(10, True)]


def test_threshold_above_n_max_is_not_reached():
    result = search_n_star(lambda n: n >= 20_000_000, STUDY)
    assert result.status == "not_reached" and result.n_star is None
    assert result.lo == 16_000_000 and result.hi is None
    assert [n for n, _ in result.history] == [1, 1000, 1_000_000, 16_000_000]


def test_unique_samples_cap_the_search():
    # fewer samples exist than n_max: the search never asks for more, and a threshold
    # above the cap is not reached
    result = search_n_star(lambda n: n >= 500, SearchConfig(), cap=300)
    assert result.status == "not_reached" and result.lo == 300 and result.cap == 300
    assert max(n for n, _ in result.history) == 300
    result = search_n_star(lambda n: n >= 250, SearchConfig(), cap=300)
    assert result.status == "found" and result.n_star == 250
    with pytest.raises(ValueError, match="larger than the 5 unique"):
        NStarSearch(SearchConfig(n_min=10), cap=5)


def test_steps_run_out():
    result = search_n_star(lambda n: n >= 5_000_000, SearchConfig(max_steps=5))
    assert result.status == "bracketed" and result.steps == 5
    assert result.lo < 5_000_000 <= result.hi == result.n_star  # still a valid bracket
    assert result.ratio == result.hi / result.lo > 1.01
    # the study's settings: 20 steps bisect a 1000x bracket to well under 1%, not to 1
    result = search_n_star(lambda n: n >= 40_000, STUDY)
    assert result.status == "bracketed" and result.steps == 20
    assert result.lo < 40_000 <= result.hi and result.ratio < 1.0001
    result = search_n_star(lambda n: n <= 0 or n >= 5_000_000, SearchConfig(start=16_000_000, max_steps=1))
    assert result.status == "exhausted" and result.n_star == 16_000_000 and result.lo is None
    result = search_n_star(lambda n: n >= 5_000_000, SearchConfig(max_steps=2))
    assert result.status == "exhausted" and result.n_star is None and result.lo == 1000


@settings(max_examples=200, deadline=None)
@given(n_true=st.integers(1, 17_000_000), resolution=st.sampled_from([1.0, 1.01, 1.5, 2.0]),
       multiplier=st.sampled_from([10.0, 100.0, 1000.0]))
def test_the_bracket_always_holds_the_threshold(n_true, resolution, multiplier):
    cfg = SearchConfig(resolution=resolution, multiplier=multiplier, max_steps=60)
    r = search_n_star(lambda n: n >= n_true, cfg)
    if n_true == 1:
        assert r.status == "at_min"
    elif n_true > cfg.n_max:
        assert r.status == "not_reached"
    else:
        assert r.status == "found" and r.lo < n_true <= r.hi  # 60 steps always close it
        assert r.hi / r.lo <= resolution or r.hi == r.lo + 1


def test_bad_settings_and_misuse():
    for kwargs in ({"epsilon": 0}, {"multiplier": 1.0}, {"n_min": 0}, {"n_min": 10, "n_max": 5},
                   {"max_steps": 0}, {"resolution": 0.5}, {"start": 10**9}):
        with pytest.raises(ValueError):
            SearchConfig(**kwargs)
    search = NStarSearch(SearchConfig())
    with pytest.raises(ValueError, match="out of turn"):
        search.record(5, True)
    with pytest.raises(ValueError, match="not finished"):
        search.result()


def test_a_sweep_finds_the_oracles_threshold_and_stops_a_point_early(tmp_path):
    # per-configuration thresholds base * (1 + 0.5 |log10(lr/1e-3)| + 0.1 (seed mod 7))
    oracle = OracleTrial(thresholds={"fixed:3": 400.0})
    spec = SweepSpec(models=("st_lstm_small",), formats=("acot",), ms=(10,), Ls=(3,), lengths=("fixed",),
                     kappa=False, ood=False, lrs=(1e-4, 1e-3), seeds=(14, 10),
                     search=SearchConfig(n_min=1, n_max=900, multiplier=10))  # fmt: skip
    result = run_sweep(spec, tmp_path, trial=oracle, local=True, progress=False)
    (key,) = result.searches
    thresholds = {(lr, s): oracle.threshold({"task": spec.task(key), "lr": lr, "seed": s})
                  for lr in spec.lrs for s in spec.seeds}  # fmt: skip
    assert thresholds[(1e-3, 14)] == 400  # seed 14 = 0 mod 7, lr 1e-3: the base
    assert min(thresholds.values()) == 400
    r = result.searches[key]
    assert r.status == "found" and r.n_star == 400 and r.lo == 399
    # early stop: at a succeeding N the configurations after the first success never ran
    at_hi = [t for t in result.trials if t["spec"]["n_train"] == r.n_star]
    order = [(lr, s) for lr in spec.lrs for s in spec.seeds]
    first_ok = next(i for i, c in enumerate(order) if thresholds[c] <= r.n_star)
    assert len(at_hi) == first_ok + 1
    # a failing N ran the whole grid
    assert len([t for t in result.trials if t["spec"]["n_train"] == r.lo]) == 4
