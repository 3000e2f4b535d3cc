"""One state-tracking trial: it learns parity, is deterministic, and refuses bad specs."""

import pytest
import torch

from mechlab.train.task import make_task
from mechlab.train.trials import TrialSpec, as_spec, init_model, run_trial

pytestmark = pytest.mark.usefixtures("one_thread")

PARITY = {"group": "zm", "m": 2, "L": 4, "format": "acot", "lengths": "uniform", "n_ood": 64}


def parity_spec(seed, **fields):
    values = {"model": {"preset": "st_dense_ssm_small"}, "task": dict(PARITY), "n_train": 24, "lr": 1e-2,
              "seed": seed, "steps": 400, "batch_size": 32, "eval_every": 10}  # fmt: skip
    return TrialSpec(**{**values, **fields})


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_dense_ssm_learns_parity(seed):
    result = run_trial(parity_spec(seed))
    assert result["converged"] and result["val_loss"] < 1e-4
    assert result["steps_run"] < 400 and result["steps_run"] % 10 == 0  # stopped at a check
    # it learned parity itself: every state at twice the training length is right
    assert result["ood_token_acc"] == 1.0 and result["ood_seq_acc"] == 1.0
    assert result["spec"]["seed"] == seed and result["seconds"] > 0


def test_a_trial_is_deterministic_and_takes_a_dict():
    spec = parity_spec(5, steps=20, eval_every=7)
    a = run_trial(spec)
    b = run_trial(dict(a["spec"]))
    assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}
    assert a["steps_run"] == 20 and not a["converged"]  # checks at 7, 14 and the last step


def test_a_trial_reports_each_lengths_loss_at_its_best_evaluation():
    from mechlab.tasks.state_tracking import encode, make_data

    spec = parity_spec(5, steps=20, eval_every=7)
    result = run_trial(spec)
    by_n = result["val_loss_by_length"]
    val = make_data(spec.task_config()).val
    lengths = sorted(set(val.lengths.tolist()))
    assert list(by_n) == [str(n) for n in lengths] == ["3", "4"]  # parity of 2 has no validation sequence
    counts = {str(n): int(encode(spec.task_config(), val.subset(val.lengths == n))[2].sum()) for n in lengths}
    mean = sum(by_n[n] * counts[n] for n in by_n) / sum(counts.values())
    assert mean == pytest.approx(result["val_loss"], rel=1e-5)  # the same evaluation as val_loss
    fixed = run_trial(parity_spec(5, n_train=12, steps=20, eval_every=7, task={**PARITY, "lengths": "fixed"}))
    assert list(fixed["val_loss_by_length"]) == ["4"]
    assert fixed["val_loss_by_length"]["4"] == pytest.approx(fixed["val_loss"], rel=1e-6)


def test_the_seed_sets_the_initial_weights():
    a, b, c = (init_model(parity_spec(s)) for s in (1, 1, 2))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters(), strict=True))
    assert a.cfg.io == "tokens" and a.cfg.d_vocab == 5 and a.cfg.d_vocab_out == 2 and a.cfg.n_ctx == 9


@pytest.mark.parametrize("preset", ["st_transformer_small", "st_lstm_small", "st_mamba_small"])
def test_every_family_trains_in_token_mode(preset):
    task = {"group": "s5", "L": 3, "format": "cot", "n_val": 20, "n_ood": 8}
    result = run_trial(TrialSpec(model={"preset": preset}, task=task, n_train=50, lr=1e-3, seed=0, steps=3,
                                 eval_every=3))  # fmt: skip
    assert result["steps_run"] == 3 and result["val_loss"] == pytest.approx(result["val_loss"])  # finite
    assert -1 / 119 <= result["ood_token_acc"] <= 1


@pytest.mark.parametrize(
    "fields, message",
    [({"n_train": 25}, "n_train=25 is more than the 24 unique training sequences"),
     ({"lr": 0}, "lr must be positive"), ({"steps": 0}, "steps must be positive"),
     ({"epsilon": float("nan")}, "epsilon must be a finite number"),
     ({"task": {**PARITY, "n_train": 10}}, "differs from the trial's n_train"),
     ({"task": {**PARITY, "format": "chain"}}, "unknown format"),
     ({"model": "st_lstm_small"}, "model and task must be mappings")],
)  # fmt: skip
def test_bad_specs(fields, message):
    with pytest.raises(ValueError, match=message):
        parity_spec(1, **fields)


def test_bad_spec_dicts():
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['learning_rate'\], missing \['lr'\]"):
        as_spec({"model": {}, "task": {}, "n_train": 1, "seed": 0, "learning_rate": 1e-3})
    with pytest.raises(ValueError, match="must be a TrialSpec or a dict"):
        as_spec([1, 2])


def test_the_trainer_task_scores_tokens():
    task = make_task("state_tracking", {"m": 3, "L": 3, "format": "cot", "n_train": 30, "n_val": 10, "n_ood": 5})
    tokens, targets, mask = task.batch(8, torch.Generator().manual_seed(0))
    assert tokens.shape == targets.shape == mask.shape and tokens.dtype == torch.long
    assert task.model_fields() == {"io": "tokens", "d_vocab": 6, "d_vocab_out": 3, "n_ctx": 13}
    uniform = torch.zeros(*tokens.shape, 3)
    assert float(task.loss(uniform, targets, mask)) == pytest.approx(torch.log(torch.tensor(3.0)).item())


def test_the_trainer_stops_early_on_state_tracking(tmp_path):
    from mechlab.checkpoint import load_checkpoint
    from mechlab.tasks import task_config
    from mechlab.train import resolve_config, train

    cfg = resolve_config(
        task="state_tracking", overrides=[f"task_cfg.{k}={v}" for k, v in {**PARITY, "n_train": 24}.items()]
        + ["model.preset=st_dense_ssm_small", "weight_decay=0", "grad_clip=0", "lr=1e-2", "batch_size=32",
           "early_stop_loss=1e-4", "eval_every=10", "n_checkpoints=0", "seed=3"],
        steps=400,
    )  # fmt: skip
    result = train(cfg, tmp_path / "run", progress=False)
    assert result.step < 400 and result.final_eval["val_loss"] < 1e-4
    assert result.final_eval["ood_token_acc_norm"] == 1.0
    ckpt = load_checkpoint(result.last_checkpoint)
    assert ckpt.step == result.step and task_config(ckpt.metadata).m == 2
    with pytest.raises(ValueError, match="early_stop_loss must be >= 0"):
        resolve_config(overrides=["early_stop_loss=-1"])
