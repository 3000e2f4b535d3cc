"""Trials trained as one batched ensemble give the results they give one by one."""

import pytest

from mechlab.train.dispatch import run_trials
from mechlab.train.ensemble import train_ensemble
from mechlab.train.trials import TrialSpec, run_trial

pytestmark = pytest.mark.usefixtures("one_thread")


def _specs(preset, task, grid, **fields):
    return [TrialSpec(model={"preset": preset}, task=dict(task), n_train=n, lr=lr, seed=seed, **fields)
            for n, lr, seed in grid]  # fmt: skip


def _same(a, b):
    assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4, abs=1e-7)
    assert a["converged"] == b["converged"] and a["steps_run"] == b["steps_run"]
    assert a["ood_token_acc"] == pytest.approx(b["ood_token_acc"], abs=1e-9)
    assert a["ood_seq_acc"] == pytest.approx(b["ood_seq_acc"], abs=1e-9)
    assert a["spec"] == b["spec"]
    assert a["val_loss_by_length"].keys() == b["val_loss_by_length"].keys()
    for n, v in a["val_loss_by_length"].items():
        assert v == pytest.approx(b["val_loss_by_length"][n], rel=1e-4, abs=1e-7)


def test_members_that_stop_early_leave_and_the_rest_match():
    # parity: lr 1e-2 converges (at steps 50 and 60 for these two); lr 1e-3 does not in 80
    task = {"group": "zm", "m": 2, "L": 4, "format": "acot", "n_ood": 64}
    specs = _specs("st_dense_ssm_small", task, [(24, 1e-2, 3), (24, 1e-3, 3), (20, 1e-2, 3)],
                   steps=80, batch_size=32, eval_every=10)  # fmt: skip
    together = train_ensemble(specs)
    alone = [run_trial(s) for s in specs]
    for a, b in zip(together, alone, strict=True):
        _same(a, b)
    assert [r["converged"] for r in together] == [True, False, True]
    assert [r["steps_run"] for r in together] == [50, 80, 60]
    assert {r["ensemble"] for r in together} == {3}


@pytest.mark.filterwarnings("ignore:the mamba model cannot run under torch.func.vmap")
@pytest.mark.parametrize("preset", ["st_transformer_small", "st_lstm_small", "st_mamba_small"])
def test_each_family_matches_one_by_one(preset):
    task = {"group": "s5", "L": 3, "format": "cot", "lengths": "short_to_long", "n_val": 40, "n_ood": 6}
    specs = _specs(preset, task, [(30, 1e-3, 10), (60, 1e-4, 20)], steps=6, eval_every=3)
    for a, b in zip(train_ensemble(specs), [run_trial(s) for s in specs], strict=True):
        _same(a, b)


def test_run_trials_groups_and_keeps_the_order():
    parity = {"group": "zm", "m": 2, "L": 3, "n_ood": 8}
    z3 = {"group": "zm", "m": 3, "L": 3, "n_ood": 8}
    specs = [
        TrialSpec(model={"preset": "st_dense_ssm_small"}, task=t, n_train=8, lr=1e-3, seed=s, steps=4, eval_every=2)
        for t, s in ((parity, 1), (z3, 1), (parity, 2))
    ]
    results = run_trials(specs)
    assert [r["spec"]["task"]["m"] for r in results] == [2, 3, 2]
    assert [r.get("ensemble") for r in results] == [2, None, 2]  # the lone Z_3 trial runs alone
    for a, b in zip(results, run_trials(specs, ensemble=False), strict=True):
        _same(a, b)


def test_an_ensemble_refuses_trials_of_different_groups():
    specs = _specs("st_dense_ssm_small", {"m": 3, "L": 3}, [(8, 1e-3, 1)], steps=4) + _specs(
        "st_dense_ssm_small", {"m": 3, "L": 3}, [(8, 1e-3, 1)], steps=5
    )
    with pytest.raises(ValueError, match="differ only in n_train, lr and seed"):
        train_ensemble(specs)
    with pytest.raises(ValueError, match="max_members must be positive"):
        run_trials(specs, max_members=0)


def test_the_benchmark_times_both_contenders():
    from mechlab.bench.ensemble import bench_ensemble

    task = {"group": "zm", "m": 3, "L": 3, "n_val": 10, "n_ood": 4}
    result = bench_ensemble(["st_dense_ssm_small"], task=task, n_train=10, steps=1, repeats=1)
    (row,) = result.rows
    assert row.preset == "st_dense_ssm_small" and row.sequential > 0 and row.ensemble > 0
    assert row.gain == pytest.approx(row.sequential / row.ensemble)
    assert "st_dense_ssm_small" in result.format_table() and result.settings["members"] == 15
