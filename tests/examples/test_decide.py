"""examples/sweeps/decide.py: the tables of a partial sweep, the brackets the store allows,
and the kappa-OOD rank correlation with its bootstrap interval (no training)."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import warnings
from pathlib import Path

import pytest
import yaml
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def decide():
    spec = importlib.util.spec_from_file_location("decide", ROOT / "examples" / "sweeps" / "decide.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- Spearman and its bootstrap -------------------------------------------------------------


def test_spearman_matches_scipy_with_ties(decide):
    rng = random.Random(3)
    for _ in range(20):
        n = rng.randrange(3, 15)
        x = [rng.choice([0.5, 1.0, 1.5, 2.0, rng.random()]) for _ in range(n)]
        y = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(n)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy warns on a constant input (nan expected)
            expected = spearmanr(x, y).statistic
        got = decide.spearman(x, y)
        if math.isnan(expected):
            assert math.isnan(got)
        else:
            assert got == pytest.approx(expected, abs=1e-12)


def test_spearman_of_a_constant_is_nan(decide):
    assert math.isnan(decide.spearman([1.0, 1.0, 1.0], [0.1, 0.5, 0.9]))


def test_bootstrap_interval(decide):
    x = [float(i) for i in range(8)]
    assert decide.bootstrap_spearman(x, [2 * v + 1 for v in x], n_boot=500) == pytest.approx((1.0, 1.0))
    assert decide.bootstrap_spearman(x, [-v for v in x], n_boot=500) == pytest.approx((-1.0, -1.0))
    # Every resample constant in x: no rho, no interval (not an IndexError).
    assert decide.bootstrap_spearman([2.0] * 6, x[:6], n_boot=200) == (None, None)
    rng = random.Random(0)
    xs = [rng.random() for _ in range(30)]
    ys = [v + rng.gauss(0, 0.3) for v in xs]
    low, high = decide.bootstrap_spearman(xs, ys, n_boot=1000, seed=1)
    assert low < decide.spearman(xs, ys) < high
    assert (low, high) == decide.bootstrap_spearman(xs, ys, n_boot=1000, seed=1)


def _row(kappa, ood, bound="lower", model="st_lstm_small"):
    return {"sweep": "s", "model": model, "format": "acot", "group": "zm", "m": 5, "L": 4, "kappa": kappa,
            "kappa_bound": bound, "kappa_low": kappa, "kappa_high": None, "ood_n": 712,
            "ood_token_acc": ood, "ood_seq_acc": None if ood is None else ood / 2}  # fmt: skip


def test_kappa_vs_ood_ranks_finished_kappas_only(decide):
    rows = [_row(k, o) for k, o in [(1.0, 0.1), (2.0, 0.4), (3.0, 0.3), (4.0, 0.9), (5.0, 1.0)]]
    rows += [_row(0.004, 1.0, "open-lower"), _row(None, 0.5), _row(2.5, None)]
    out = decide.kappa_vs_ood(rows)
    assert (out["n"], out["n_open"], len(out["points"])) == (5, 1, 6)
    assert [p["in_rank"] for p in out["points"]] == [True] * 5 + [False]
    tok = out["ood_token_acc"]
    assert tok["spearman"] == pytest.approx(spearmanr([1, 2, 3, 4, 5], [0.1, 0.4, 0.3, 0.9, 1.0]).statistic)
    low, high = tok["ci95"]
    assert low <= tok["spearman"] <= high
    json.dumps(out, allow_nan=False)  # no NaN in what is written


def test_kappa_vs_ood_too_few_points(decide):
    three = decide.kappa_vs_ood([_row(1.0, 0.1), _row(2.0, 0.5), _row(3.0, 0.2)])
    assert three["ood_token_acc"]["spearman"] == pytest.approx(0.5)
    assert three["ood_token_acc"]["ci95"] == [None, None]  # below MIN_BOOTSTRAP
    two = decide.kappa_vs_ood([_row(1.0, 0.1), _row(2.0, 0.5), _row(0.1, 0.5, "open-upper")])
    assert two["n"] == 2 and two["ood_token_acc"] == {"spearman": None, "ci95": [None, None]}


# -- A tiny synthetic store ------------------------------------------------------------------

SWEEP = {"models": ["st_lstm_small"], "formats": ["acot"], "lengths": ["uniform"], "group": "zm", "ms": [5],
         "Ls": [3], "kappa": True, "ood": True, "lrs": [1.0e-3], "seeds": [10, 20], "steps": 10,
         "batch_size": 8, "eval_every": 5, "n_val": 100, "data_seed": 0,
         "search": {"epsilon": 1.0e-3, "multiplier": 4, "n_min": 1, "n_max": 16000000, "max_steps": 20,
                    "resolution": 1.25, "start": 16000000}}  # fmt: skip
EPS = SWEEP["search"]["epsilon"]


def _result(val_loss):
    return {"val_loss": val_loss, "converged": val_loss < EPS, "steps_run": 10, "seconds": 1.0,
            "ood_token_acc": 0.9, "ood_seq_acc": 0.8}  # fmt: skip


@pytest.fixture
def folder(tmp_path):
    """A sweep (joint cap 120; n = 2 cap 20; n = 3 cap 100; 2 configurations per N) with:
    joint: 120 one of two succeeds (the replay stops: 30 missing); 16 and 8 all fail; 64
    only one configuration (fails); n = 2: 20 all fail (finished: not reached), 16 all fail;
    n = 3: 100 succeeds (25 missing), 16 one succeeds."""
    from mechlab.sweep.spec import SearchKey, SweepSpec
    from mechlab.sweep.store import TrialStore

    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    spec = SweepSpec.from_yaml(tmp_path / "sweep.yaml")
    store = TrialStore(tmp_path / "trials")
    joint = SearchKey("st_lstm_small", "acot", "uniform", "zm", 5, 3)
    n2, n3 = (SearchKey("st_lstm_small", "acot", "fixed", "zm", 5, n) for n in (2, 3))
    assert (spec.cap(joint), spec.cap(n2), spec.cap(n3)) == (120, 20, 100)
    plan = {(joint, 120): [5e-4, 0.2], (joint, 16): [0.5, 0.6], (joint, 8): [0.7, 0.8], (joint, 64): [0.3],
            (n2, 20): [0.1, 0.2], (n2, 16): [0.3, 0.3], (n3, 100): [1e-4, 2e-4], (n3, 16): [0.4, 9e-4]}  # fmt: skip
    for (key, n), losses in plan.items():
        for s, loss in zip(spec.trial_specs(key, n), losses, strict=False):
            store.put(s, _result(loss))
    return tmp_path, spec, store, {"joint": joint, "n2": n2, "n3": n3}


def test_store_bracket(decide, folder):
    path, spec, store, keys = folder
    assert decide.stored_ns(path) == [8, 16, 20, 64, 100, 120]
    replay = decide._load_summarize().replay
    used: dict[str, None] = {}
    joint = replay(spec, store, keys["joint"], used)
    assert (joint.status, joint.lo, joint.hi) == ("open", None, 120)
    tight = decide.store_bracket(spec, store, keys["joint"], joint, decide.stored_ns(path), used)
    assert (tight.status, tight.lo, tight.hi, tight.n_star, tight.ratio) == ("open", 16, 120, 120, 7.5)
    assert (8, False) in tight.history and (16, False) in tight.history
    assert all(n != 64 for n, _ in tight.history)  # an incomplete grid is no failure
    # A finished search is left as the search protocol ended it.
    n2 = replay(spec, store, keys["n2"], used)
    assert n2.status == "not_reached"
    assert decide.store_bracket(spec, store, keys["n2"], n2, decide.stored_ns(path), used) is n2
    # A success below the replay's hi moves hi down (and no lo is invented).
    n3 = decide.store_bracket(spec, store, keys["n3"], replay(spec, store, keys["n3"], used), [16, 100], used)
    assert (n3.status, n3.lo, n3.hi) == ("open", None, 16)


def test_summarize_tables_and_figures(decide, folder, monkeypatch, tmp_path_factory):
    path, *_ = folder
    figures = tmp_path_factory.mktemp("figures")
    monkeypatch.setattr(decide, "FIGURES", figures)
    decide.summarize([path])
    rows = {(r["lengths"], r["L"]): r for r in json.loads((path / "searches.json").read_text())}
    joint = rows[("uniform", 3)]
    assert (joint["status"], joint["lo"], joint["hi"]) == ("open", 16, 120)
    assert (rows[("fixed", 2)]["status"], rows[("fixed", 2)]["lo"]) == ("not_reached", 20)
    assert rows[("fixed", 3)]["hi"] == 16
    # kappa from the tightened brackets: (20 + 1 stand-in, 16) over 120, open.
    assert joint["kappa"] == pytest.approx((21 + 16) / 120)
    assert joint["kappa_bound"] == "open-lower"
    assert joint["ood_token_acc"] == pytest.approx(0.9)
    summary = json.loads((figures / "kappa_vs_ood.json").read_text())
    assert (summary["n"], summary["n_open"]) == (0, 1)
    trials = json.loads((path / "trials.json").read_text())
    assert {t["n_train"] for t in trials} == {8, 16, 20, 100, 120}  # 64 (incomplete) is not read
    # The same store writes the same bytes (tables and figures).
    names = ["searches.json", "searches.csv", "trials.json", "trials.csv"]
    before = {n: (path / n).read_bytes() for n in names} | {p.name: p.read_bytes() for p in figures.glob("*")}
    decide.summarize([path])
    after = {n: (path / n).read_bytes() for n in names} | {p.name: p.read_bytes() for p in figures.glob("*")}
    assert before == after
    assert {f"{path.name}-nstar.html", f"{path.name}-kappa.html", "kappa-vs-ood.html", "plotly.min.js"} <= set(after)


def test_summarize_a_tracked_store_needs_force(decide, folder, monkeypatch, tmp_path_factory):
    from mechlab.pipelines import outputs

    path, *_ = folder
    monkeypatch.setattr(decide, "FIGURES", tmp_path_factory.mktemp("figures"))
    monkeypatch.setattr(outputs, "git_tracked", lambda p: [f"{p}/searches.csv"])  # as if committed
    before = (path / "searches.csv").read_bytes() if (path / "searches.csv").exists() else None
    with pytest.raises(ValueError, match="git tracks.*--force"):
        decide.summarize([path])
    assert ((path / "searches.csv").read_bytes() if (path / "searches.csv").exists() else None) == before
    decide.summarize([path], force=True)
    assert (path / "searches.csv").exists()
    assert decide.main(["summarize", "--force", str(path)]) == 0


def test_check_steps_trains_finished_searches_at_lo_with_more_steps(decide, folder, monkeypatch):
    import mechlab.train.dispatch as dispatch

    path, spec, store, keys = folder
    calls: list[list[dict]] = []

    def fake(specs, losses):
        calls.append([dict(s) for s in specs])
        return [_result(loss) for loss, _ in zip(losses, specs, strict=False)]

    monkeypatch.setattr(dispatch, "run_trials", lambda specs: fake(specs, [0.05, 0.04]))
    decide.check_steps(path, 2, None, None, "all")
    # Only n = 2 is finished (not reached: lo is its cap, 20); the open joint and n = 3 are skipped.
    assert len(calls) == 1 and {s["n_train"] for s in calls[0]} == {20}
    assert {s["steps"] for s in calls[0]} == {2 * SWEEP["steps"]}
    assert {s["task"]["L"] for s in calls[0]} == {2}
    rows = json.loads((path / "steps-x2" / "check.json").read_text())
    assert [(r["lo"], r["steps_checked"], r["n_star_stays_in_bracket"]) for r in rows] == [(20, 20, True)]
    assert rows[0]["best_val_loss"] == pytest.approx(0.1) and rows[0]["best_val_loss_checked"] == pytest.approx(0.04)
    assert "best_by_length_checked" not in rows[0]  # these trials recorded no loss per length
    # Resumes: the trials are stored, so a rerun trains nothing and writes the same rows.
    decide.check_steps(path, 2, None, None, "all")
    assert len(calls) == 1
    assert json.loads((path / "steps-x2" / "check.json").read_text()) == rows
    # A success with more steps says the search was step-limited; filters select searches.
    def with_lengths(specs):  # trials that record each length's loss: the best one's is kept
        return [{**r, "val_loss_by_length": {"2": r["val_loss"]}} for r in fake(specs, [2e-4, 0.3])]

    monkeypatch.setattr(dispatch, "run_trials", with_lengths)
    decide.check_steps(path, 4, {"st_lstm_small"}, {"acot"}, "joint")  # no finished joint search
    assert len(calls) == 1 and not (path / "steps-x4" / "check.json").exists()
    decide.check_steps(path, 4, None, None, "fixed")
    assert len(calls) == 2 and {s["steps"] for s in calls[1]} == {4 * SWEEP["steps"]}
    (row,) = json.loads((path / "steps-x4" / "check.json").read_text())
    assert row["n_star_stays_in_bracket"] is False
    assert row["best_by_length_checked"] == {"2": pytest.approx(2e-4)}
    assert decide.main(["check-steps", str(path), "--factor", "0"]) == 2  # refused before any work
    assert not (path / "steps-x0").exists() and len(calls) == 2
