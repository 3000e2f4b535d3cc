"""kappa and the OOD summary against hand computation."""

import math

import pytest

from mechlab.sweep import OracleTrial, SearchConfig, SweepSpec, kappa, ood_summary, run_sweep
from mechlab.sweep.search import SearchResult


def found(n_star, lo):
    return SearchResult(n_star=n_star, status="found", lo=lo, hi=n_star, cap=10**6, steps=5, ratio=n_star / lo)


def not_reached(lo):
    return SearchResult(n_star=None, status="not_reached", lo=lo, hi=None, cap=lo, steps=4, ratio=None)


def test_kappa_exact():
    per = {2: found(10, 9), 3: found(20, 18), 4: found(40, 30)}
    k = kappa(per, found(35, 25), L=4)
    assert k.bound == "exact"
    assert k.value == pytest.approx((10 + 20 + 40) / 35)  # 2.0
    assert (k.numerator, k.denominator) == (70, 35)
    # the brackets: each N*_n in (lo, hi], N*_joint in (25, 35]
    assert k.low == pytest.approx((10 + 19 + 31) / 35)
    assert k.high == pytest.approx((10 + 20 + 40) / 26)


def test_kappa_at_min_uses_one_as_the_smallest_possible_n():
    at_min = SearchResult(n_star=1, status="at_min", lo=None, hi=1, cap=100, steps=1, ratio=None)
    k = kappa({2: at_min, 3: found(8, 7)}, found(4, 3), L=3)
    assert k.value == pytest.approx(9 / 4) and k.bound == "exact"
    assert k.low == pytest.approx((1 + 8) / 4) and k.high == pytest.approx((1 + 8) / 4)


def test_a_length_not_reached_makes_kappa_a_lower_bound():
    per = {2: found(10, 9), 3: not_reached(500)}
    k = kappa(per, found(50, 40), L=3)
    assert k.bound == "lower"
    assert k.value == pytest.approx((10 + 501) / 50)  # N*_3 > 500
    assert k.low == pytest.approx((10 + 501) / 50) and math.isinf(k.high)
    assert k.to_dict()["high"] is None


def test_joint_not_reached_makes_kappa_an_upper_bound():
    per = {2: found(10, 9), 3: found(30, 20)}
    k = kappa(per, not_reached(1000), L=3)
    assert k.bound == "upper"
    assert k.value == pytest.approx(40 / 1001)
    assert k.low == 0.0 and k.high == pytest.approx(40 / 1001)


def test_both_not_reached_is_undefined_and_a_missing_length_is_refused():
    k = kappa({2: not_reached(5), 3: found(7, 6)}, not_reached(20), L=3)
    assert k.bound == "undefined" and k.value is None
    with pytest.raises(ValueError, match="missing n = \\[3\\]"):
        kappa({2: found(4, 3)}, found(4, 3), L=3)


def trial(n, lr, seed, loss, tok, seq):
    return {"val_loss": loss, "ood_token_acc": tok, "ood_seq_acc": seq,
            "spec": {"n_train": n, "lr": lr, "seed": seed}}  # fmt: skip


def test_ood_takes_the_lowest_loss_configuration_at_the_largest_n():
    trials = [
        trial(100, 1e-3, 10, 0.5, 0.9, 0.8),  # smaller N: ignored
        trial(400, 1e-3, 10, 0.2, 0.3, 0.1),
        trial(400, 1e-4, 20, 0.01, 0.6, 0.5),  # the lowest loss at N = 400
        trial(400, 1e-5, 10, 0.01, 0.7, 0.2),  # tie on loss: the smaller lr wins
        trial(400, 1e-3, 30, 0.9, 0.95, 0.9),
        {"val_loss": 0.0, "ood_token_acc": None, "spec": {"n_train": 800, "lr": 1e-3, "seed": 1}},
    ]
    s = ood_summary(trials)
    assert (s.n_train, s.lr, s.seed) == (400, 1e-5, 10)
    assert (s.token_acc, s.seq_acc, s.val_loss) == (0.7, 0.2, 0.01)
    assert s.best_token_acc == 0.95 and s.n_configs == 4
    assert ood_summary([{"val_loss": 1.0, "ood_token_acc": None, "spec": {}}]) is None


def test_kappa_of_a_sweep_on_the_oracle(tmp_path):
    # exact thresholds (no spread over the grid): N*_2 = 15, N*_3 = 70, N*_4 = 200 and
    # N*_joint = 90, so kappa = 285 / 90; lengths searched alone are shared across L
    base = {"fixed:2": 15, "fixed:3": 70, "fixed:4": 200, "uniform:4": 90, "uniform:3": 60}
    oracle = OracleTrial(thresholds=base, lr_spread=0.0, seed_spread=0.0)
    spec = SweepSpec(models=("st_lstm_small",), formats=("acot",), ms=(5,), Ls=(3, 4), lengths=("uniform",),
                     lrs=(1e-3,), seeds=(10, 20), n_val=20, ood=True,
                     search=SearchConfig(n_min=1, n_max=10_000, multiplier=10))  # fmt: skip
    result = run_sweep(spec, tmp_path, trial=oracle, local=True, progress=False)
    assert len(result.searches) == 2 + 3  # uniform L=3, 4; fixed n = 2, 3, 4
    by = {(k.lengths, k.L): r.n_star for k, r in result.searches.items()}
    assert by == {("uniform", 3): 60, ("uniform", 4): 90, ("fixed", 2): 15, ("fixed", 3): 70, ("fixed", 4): 200}
    kappas = {k.L: v for k, v in result.kappas.items()}
    assert kappas[4].value == pytest.approx(285 / 90) and kappas[4].bound == "exact"
    assert kappas[3].value == pytest.approx(85 / 60)
    # a length whose threshold exceeds what exists (Z_5, n = 2: 25 sequences less 5 for
    # validation) is not reached, and kappa becomes a lower bound
    oracle = OracleTrial(thresholds={**base, "fixed:2": 30}, lr_spread=0.0, seed_spread=0.0)
    result = run_sweep(spec, tmp_path / "capped", trial=oracle, local=True, progress=False)
    n2 = next(r for k, r in result.searches.items() if (k.lengths, k.L) == ("fixed", 2))
    assert n2.status == "not_reached" and n2.lo == n2.cap == 20
    kappas = {k.L: v for k, v in result.kappas.items()}
    assert kappas[4].bound == "lower" and kappas[4].value == pytest.approx((21 + 70 + 200) / 90)
    # OOD: trained at the largest N available (every unique training sequence)
    # (Z_5: 25 + 125 (+ 625) sequences less validation: 20 split over the lengths, each at
    # most 20% of its length: L=3: 5 + 10; L=4: 5 + 7 + 6)
    for key, ood in result.ood.items():
        assert ood.n_train == spec.cap(key) == {3: 150 - 15, 4: 775 - 18}[key.L]
        assert ood.token_acc == pytest.approx(min(1.0, ood.n_train / (10 * base[f"uniform:{key.L}"])))
