"""Tests of the training loop (mechlab.train.trainer) and the task loss (mechlab.train.task):
metrics and checkpoint files, exact resume after SIGTERM, the NaN guard, every
architecture and the study presets training a step, and a short run that learns."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
import yaml
from torch import nn

from mechlab.checkpoint import load_checkpoint, save_checkpoint
from mechlab.models import build_model
from mechlab.tasks.lds import LDSConfig
from mechlab.train import (
    Trainer,
    TrainingStopped,
    log_spaced_steps,
    masked_mse,
    resolve_config,
    train,
)
from mechlab.train.config import TrainConfig

TASK = {
    "d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
    "n_train_systems": 200, "n_test_systems": 50,
}
MODEL = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2}


def small_cfg(**fields) -> TrainConfig:
    base = dict(
        task_cfg=TASK, model=MODEL, steps=12, batch_size=8, eval_haystack=2, eval_seg_len=4,
        eval_traces=32, eval_every=0, log_every=1, n_checkpoints=4, save_every=100,
    )
    base.update(fields)
    return TrainConfig(**base)


def read_metrics(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_lines = [{k: v for k, v in r.items() if k != "examples_per_s"} for r in lines if "loss" in r]
    eval_lines = [r for r in lines if "eval" in r]
    return train_lines, eval_lines


def state(run_dir, name="last.pt"):
    path = run_dir / name if name == "last.pt" else run_dir / "checkpoints" / name
    return load_checkpoint(path)


class ZeroModel(nn.Module):
    """Predicts 0 everywhere (the baseline a trained model has to beat)."""

    def __init__(self, d_out: int):
        super().__init__()
        self.d_out = d_out
        self.dummy = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*x.shape[:2], self.d_out)


# --------------------------------------------------------------------------- the loss


def test_masked_mse_matches_a_hand_computation_and_ignores_masked_positions():
    g = torch.Generator().manual_seed(0)
    pred = torch.randn(2, 5, 3, generator=g)
    targets = torch.randn(2, 5, 3, generator=g)
    mask = torch.tensor([[True, False, True, True, False], [False, False, True, False, True]])
    total, count = 0.0, 0
    for b in range(2):
        for p in range(5):
            if mask[b, p]:
                total += sum((pred[b, p, i].item() - targets[b, p, i].item()) ** 2 for i in range(3)) / 3
                count += 1
    assert masked_mse(pred, targets, mask).item() == pytest.approx(total / count, rel=1e-6)

    wild = pred.clone()
    wild[~mask] = 1e6  # whatever is predicted where the mask is False does not count
    assert masked_mse(wild, targets, mask).item() == pytest.approx(total / count, rel=1e-6)
    wild.requires_grad_(True)
    masked_mse(wild, targets, mask).backward()
    assert (wild.grad[~mask] == 0).all() and (wild.grad[mask] != 0).any()
    assert masked_mse(pred, targets, torch.zeros_like(mask)).item() == 0.0  # nothing to score


# --------------------------------------------------------------------------- files of a run


def test_run_writes_config_metrics_and_log_spaced_checkpoints(tmp_path):
    cfg = small_cfg(steps=12, log_every=5, eval_every=4, n_checkpoints=4)
    result = train(cfg, tmp_path, progress=False)
    assert result.step == 12 and result.last_checkpoint == tmp_path / "last.pt"
    assert math.isfinite(result.final_loss)

    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == cfg.to_dict()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_lines = [r for r in lines if "loss" in r]
    assert [r["step"] for r in train_lines] == [5, 10, 12]  # every log_every steps and the last
    for r in train_lines:
        assert r["examples"] == 8 * r["step"] and r["lr"] == cfg.lr
        assert math.isfinite(r["loss"]) and r["examples_per_s"] > 0
    assert train_lines[-1]["loss"] == result.final_loss
    eval_lines = [r for r in lines if "eval" in r]
    assert [r["step"] for r in eval_lines] == [4, 8, 12]
    keys = {"nih_1_after", "nih_2_after", "nih_3_after", "test_loss"}  # seg_len 4: offsets 1, 2, 3
    assert all(set(r["eval"]) == keys for r in eval_lines)
    assert eval_lines[-1]["eval"] == result.final_eval

    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    expected = [0, *log_spaced_steps(12, 4)]
    assert names == [f"step_{s:07d}.pt" for s in expected]
    for s in expected:
        ckpt = state(tmp_path, f"step_{s:07d}.pt")
        assert ckpt.step == s and ckpt.metrics["examples"] == 8 * s
        assert ckpt.optimizer_state is None  # analysis checkpoints carry no optimiser
        assert ckpt.metadata["task"] == "lds"
        assert ckpt.metadata["task_cfg"] == LDSConfig(**TASK).to_dict()
        assert ckpt.metadata["train_cfg"] == cfg.to_dict()
    last = state(tmp_path)
    assert last.step == 12 and last.optimizer_state is not None
    assert last.config.d_in == LDSConfig(**TASK).d_in and last.config.n_ctx == 24
    final = state(tmp_path, "step_0000012.pt")
    for name, tensor in last.model.state_dict().items():
        assert torch.equal(tensor, final.model.state_dict()[name])


def test_evaluation_uses_the_same_traces_every_time_and_keeps_train_mode(tmp_path):
    trainer = Trainer(small_cfg(), tmp_path, progress=False)
    first, second = trainer.evaluate(), trainer.evaluate()
    assert first == second
    assert trainer.model.training


# --------------------------------------------------------------------------- resume


def _sigterm_after(trainer: Trainer, stop_step: int) -> None:
    """Make ``trainer`` receive a real SIGTERM right after optimiser step ``stop_step``."""
    original = trainer.train_step

    def step_then_signal(step: int) -> float:
        loss = original(step)
        if step == stop_step:
            os.kill(os.getpid(), signal.SIGTERM)
        return loss

    trainer.train_step = step_then_signal


def test_resume_after_sigterm_equals_the_uninterrupted_run(tmp_path):
    cfg = small_cfg(steps=12, log_every=1, n_checkpoints=4)
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    train(cfg, run_a, progress=False)

    interrupted = Trainer(cfg, run_b, progress=False)
    _sigterm_after(interrupted, 6)
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingStopped) as info:
        interrupted.run()
    message = str(info.value)
    assert "\n" not in message and f"--resume {run_b}" in message
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers  # restored
    assert state(run_b).step == 6
    assert [r["step"] for r in read_metrics(run_b)[0]] == list(range(1, 7))

    resumed = Trainer(cfg, run_b, progress=False).run(resume=True)
    assert resumed.step == 12

    lines_a, evals_a = read_metrics(run_a)
    lines_b, evals_b = read_metrics(run_b)
    assert [r["step"] for r in lines_b] == list(range(1, 13))
    assert lines_b == lines_a  # step, examples, loss and lr of every step, bit for bit
    assert evals_b == evals_a
    assert len({r["loss"] for r in lines_a}) > 1  # (the losses do change from step to step)

    last_a, last_b = state(run_a), state(run_b)
    assert last_b.step == 12
    for name, tensor in last_a.model.state_dict().items():
        assert torch.equal(tensor, last_b.model.state_dict()[name]), name
    moments_a = last_a.optimizer_state["state"]
    moments_b = last_b.optimizer_state["state"]
    for key in moments_a:
        for name, value in moments_a[key].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(moments_b[key][name]))
    names_a = sorted(p.name for p in (run_a / "checkpoints").iterdir())
    assert sorted(p.name for p in (run_b / "checkpoints").iterdir()) == names_a
    for name in names_a:
        sa, sb = state(run_a, name).model.state_dict(), state(run_b, name).model.state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name


def test_sigint_also_stops_with_last_checkpoint(tmp_path):
    trainer = Trainer(small_cfg(steps=10), tmp_path, progress=False)
    original = trainer.train_step

    def step_then_sigint(step: int) -> float:
        loss = original(step)
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    trainer.train_step = step_then_sigint
    with pytest.raises(TrainingStopped, match="--resume"):
        trainer.run()
    assert state(tmp_path).step == 3


def test_refuses_to_overwrite_a_run_and_to_resume_with_changed_settings(tmp_path):
    cfg = small_cfg(steps=3, n_checkpoints=0)
    train(cfg, tmp_path, progress=False)
    with pytest.raises(ValueError, match="already holds a run.*--resume"):
        train(cfg, tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"cannot resume: setting 'batch_size' was 8 in the run, now 4"):
        train(dataclasses.replace(cfg, batch_size=4), tmp_path, resume=True, progress=False)
    with pytest.raises(ValueError, match="cannot resume: setting 'model'"):
        train(dataclasses.replace(cfg, model={**MODEL, "d_model": 8}), tmp_path, resume=True, progress=False)
    with pytest.raises(ValueError, match="nothing to resume"):
        train(cfg, tmp_path / "elsewhere", resume=True, progress=False)
    # More steps is fine: the run continues where it stopped.
    result = train(dataclasses.replace(cfg, steps=5), tmp_path, resume=True, progress=False)
    assert result.step == 5 and state(tmp_path).step == 5
    assert [r["step"] for r in read_metrics(tmp_path)[0]] == [1, 2, 3, 4, 5]


# --------------------------------------------------------------------------- NaN guard


def loss_of_saved(run_dir, cfg):
    """The loss of ``run_dir/last.pt``'s weights on the batch of its next step."""
    ckpt = state(run_dir)
    probe = Trainer(cfg, run_dir / "probe-unused", progress=False)
    probe.model.load_state_dict(ckpt.model.state_dict())
    return ckpt, probe.probe_loss(ckpt.step + 1)


def _diverge_at(trainer: Trainer, bad_step: int) -> None:
    """Make optimiser step ``bad_step`` leave an infinite weight (a diverged update)."""
    original = trainer.optimizer.step
    first = next(trainer.model.parameters())

    def step(*args, **kwargs):
        out = original(*args, **kwargs)
        if trainer.step + 1 == bad_step:  # trainer.step is incremented after the update
            with torch.no_grad():
                first.view(-1)[0] = float("inf")
        return out

    trainer.optimizer.step = step


def test_diverged_weights_never_overwrite_a_good_last_pt(tmp_path):
    # Issue 10 case 2: the NaN guard saved the weights that produced the NaN.
    cfg = small_cfg(steps=12, save_every=2)
    trainer = Trainer(cfg, tmp_path, progress=False)
    _diverge_at(trainer, 4)  # the weights of step 4 (a save step) are not finite
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingStopped, match="step 4 failed the NaN guard") as info:
        trainer.run()
    message = str(info.value)
    assert "\n" not in message and "keeps the last state" in message and "(step 2)" in message
    ckpt, next_loss = loss_of_saved(tmp_path, cfg)
    assert ckpt.step == 2 and math.isfinite(next_loss)
    assert all(torch.isfinite(t).all() for t in ckpt.model.state_dict().values())
    assert signal.getsignal(signal.SIGTERM) == handler


def test_a_non_finite_loss_between_saves_writes_nothing(tmp_path):
    cfg = small_cfg(steps=12, save_every=2, n_checkpoints=0)
    trainer = Trainer(cfg, tmp_path, progress=False)
    _diverge_at(trainer, 5)  # step 6's loss is NaN; last.pt of step 4 stays
    with pytest.raises(TrainingStopped, match="non-finite at step 6.*keeps.*step 4"):
        trainer.run()
    assert state(tmp_path).step == 4
    assert [r["step"] for r in read_metrics(tmp_path)[0]] == [1, 2, 3, 4, 5]


def test_a_log_spaced_checkpoint_of_diverged_weights_is_not_written(tmp_path):
    cfg = small_cfg(steps=12, save_every=2, n_checkpoints=4)
    assert 5 in log_spaced_steps(12, 4)
    trainer = Trainer(cfg, tmp_path, progress=False)
    _diverge_at(trainer, 5)
    with pytest.raises(TrainingStopped, match="weights diverged at step 5.*keeps.*step 4"):
        trainer.run()
    assert not (tmp_path / "checkpoints" / "step_0000005.pt").exists()


@pytest.mark.parametrize(
    "fields",
    [
        {"lr": 1e6, "save_every": 1},
        {"lr": 1e12, "warmup_steps": 1_000_000_000, "save_every": 3},
    ],
    ids=["lr-1e6", "lr-1e12-warmup"],
)
def test_real_divergence_leaves_a_last_pt_with_finite_weights_and_loss(tmp_path, fields):
    # Issue 10 case 2, as reported: with lr=1e6 the saved "last good state" gave NaN on every
    # batch; with save_every=3 the good step-3 last.pt was overwritten by step 5's.
    cfg = small_cfg(steps=100, n_checkpoints=0, **fields)
    with pytest.raises(TrainingStopped) as info:
        train(cfg, tmp_path, progress=False)
    ckpt, next_loss = loss_of_saved(tmp_path, cfg)
    assert f"(step {ckpt.step})" in str(info.value)
    assert math.isfinite(next_loss)
    assert all(torch.isfinite(t).all() for t in ckpt.model.state_dict().values())
    assert ckpt.checksum_verified


def test_non_finite_loss_before_the_first_save_writes_no_last_pt(tmp_path):
    trainer = Trainer(small_cfg(steps=12, save_every=100), tmp_path, progress=False)
    _diverge_at(trainer, 4)
    with pytest.raises(TrainingStopped, match="no last.pt was written.*due at step 12"):
        trainer.run()
    assert not (tmp_path / "last.pt").exists()


# --------------------------------------------------------------------------- settings checked first


def test_evaluation_settings_are_checked_before_training(tmp_path):
    # Issue 10 case 1: a haystack longer than the context failed only after the last step.
    run_dir = tmp_path / "run"
    for fields in ({"eval_haystack": 3, "eval_seg_len": 4}, {"eval_seg_len": 1000}):
        with pytest.raises(ValueError, match="evaluation cannot be built.*n_ctx=24") as info:
            Trainer(small_cfg(**fields), run_dir, progress=False)
        assert "\n" not in str(info.value)
    assert not run_dir.exists()
    with pytest.raises(ValueError, match="eval_seg_len must be positive"):
        small_cfg(eval_seg_len=0)


def test_the_dry_evaluation_leaves_the_random_streams_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    trainer = Trainer(small_cfg(), tmp_path, progress=False)
    torch.manual_seed(123)
    trainer.check_evaluation()
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("device, phrase", [("tpu", "unknown device 'tpu'"), ("meta", "does not run on")])
def test_devices_are_checked_before_anything_is_built(tmp_path, device, phrase):
    with pytest.raises(ValueError, match=phrase):
        Trainer(small_cfg(device=device), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_oversized_batches_and_models_are_refused_before_allocation(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="batch_size=1000000000000 makes batches"):
        Trainer(small_cfg(batch_size=10**12), tmp_path, progress=False)
    with pytest.raises(ValueError, match="would allocate about .* more than the limit"):
        Trainer(small_cfg(model={**MODEL, "d_model": 10**7}), tmp_path, progress=False)
    monkeypatch.setenv("MECHLAB_MAX_ELEMENTS", "1000")
    with pytest.raises(ValueError, match="more than the limit 1e\\+03"):
        Trainer(small_cfg(), tmp_path, progress=False)


# --------------------------------------------------------------------------- resume semantics


def test_settings_that_may_change_on_resume_take_effect(tmp_path):
    # Issue 10 case 8: --resume --set weight_decay=1e6 was recorded but the optimizer kept 0.01.
    cfg = small_cfg(steps=3, n_checkpoints=0, weight_decay=0.01)
    train(cfg, tmp_path, progress=False)
    changed = dataclasses.replace(cfg, steps=5, weight_decay=0.5, grad_clip=0.25, log_every=2)
    trainer = Trainer(changed, tmp_path, progress=False)
    trainer.run(resume=True)
    assert {g["weight_decay"] for g in trainer.optimizer.param_groups} == {0.5}
    last = state(tmp_path)
    assert last.step == 5
    assert {g["weight_decay"] for g in last.optimizer_state["param_groups"]} == {0.5}
    assert last.metadata["train_cfg"]["weight_decay"] == 0.5
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["weight_decay"] == 0.5
    assert [r["step"] for r in read_metrics(tmp_path)[0]] == [1, 2, 3, 4, 5]


def test_resume_refuses_steps_that_do_not_go_past_the_saved_step(tmp_path):
    # Issue 10 case 8: --resume --steps 100 on a 300-step run printed "loss nan" and rewrote steps.
    cfg = small_cfg(steps=4, n_checkpoints=0)
    train(cfg, tmp_path, progress=False)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    for steps in (2, 4):
        with pytest.raises(ValueError, match=r"the run is at step 4.*larger than 4"):
            train(dataclasses.replace(cfg, steps=steps), tmp_path, resume=True, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_resume_refuses_locked_settings_with_the_reason(tmp_path):
    cfg = small_cfg(steps=3, n_checkpoints=0, lr_schedule="cosine")
    train(cfg, tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"'steps' was 3 .* now 6.*cosine schedule spans"):
        train(dataclasses.replace(cfg, steps=6), tmp_path, resume=True, progress=False)
    with pytest.raises(ValueError, match=r"'seed' .*every step's batch is drawn from it"):
        train(dataclasses.replace(cfg, seed=1), tmp_path, resume=True, progress=False)


def test_resume_refuses_a_last_pt_of_another_model(tmp_path):
    # Issue 10 case 5: a last.pt that belongs to another model gave a load_state_dict traceback.
    cfg = small_cfg(steps=3, n_checkpoints=0)
    train(cfg, tmp_path, progress=False)
    other = build_model({**MODEL, "d_model": 8, "d_in": 13, "d_out": 3, "n_ctx": 24})
    save_checkpoint(other, tmp_path / "last.pt", step=3)  # no train_cfg metadata
    with pytest.raises(ValueError, match="holds a different model.*d_model: 8 vs 16"):
        train(dataclasses.replace(cfg, steps=5), tmp_path, resume=True, progress=False)
    save_checkpoint(other, tmp_path / "last.pt", step=3, train_cfg="x")
    with pytest.raises(ValueError, match="metadata entry 'train_cfg' is str, not dict"):
        train(dataclasses.replace(cfg, steps=5), tmp_path, resume=True, progress=False)


def test_a_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path):
    # Issue 10 case 9: a torn last line blocked resume with "Unterminated string...".
    cfg = small_cfg(steps=3, n_checkpoints=0)
    train(cfg, tmp_path, progress=False)
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("a") as fh:
        fh.write('{"step": 4, "examples": 32, "lo')
    with pytest.warns(UserWarning, match=f"torn last line 5 of {re.escape(repr(str(metrics)))}"):
        train(dataclasses.replace(cfg, steps=5), tmp_path, resume=True, progress=False)
    assert [r["step"] for r in read_metrics(tmp_path)[0]] == [1, 2, 3, 4, 5]


def test_a_damaged_metrics_line_before_the_last_names_file_and_line(tmp_path):
    cfg = small_cfg(steps=3, n_checkpoints=0)
    train(cfg, tmp_path, progress=False)
    metrics = tmp_path / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[1] = lines[1][:10]
    metrics.write_text("\n".join(lines) + "\n")
    last_before = (tmp_path / "last.pt").read_bytes()
    with pytest.raises(ValueError, match=r"line 2 of the metrics file .*metrics.jsonl' is damaged"):
        train(dataclasses.replace(cfg, steps=5), tmp_path, resume=True, progress=False)
    assert (tmp_path / "last.pt").read_bytes() == last_before


def test_temporary_files_of_an_interrupted_save_are_removed(tmp_path):
    # Issue 10 case 10: kill -9 during a save left .last.pt.*.tmp files that stayed forever.
    cfg = small_cfg(steps=3, n_checkpoints=2)
    train(cfg, tmp_path, progress=False)
    code = (
        "import os, sys\n"
        "from mechlab.io import atomic_write\n"
        "def killed(f):\n"
        "    f.write(b'half a checkpoint')\n"
        "    os._exit(9)\n"
        "atomic_write(sys.argv[1], killed)\n"
    )
    for target in (tmp_path / "last.pt", tmp_path / "checkpoints" / "step_0000003.pt"):
        subprocess.run([sys.executable, "-c", code, str(target)], check=False)
    orphans = sorted(tmp_path.glob(".last.pt.*.tmp")) + sorted(tmp_path.glob("checkpoints/.step_*.tmp"))
    assert len(orphans) == 2
    (tmp_path / ".notes.tmp").write_text("mine")  # not a name atomic_write makes: kept
    with pytest.warns(UserWarning, match="removed 1 temporary file"):
        train(dataclasses.replace(cfg, steps=4), tmp_path, resume=True, progress=False)
    assert not any(p.exists() for p in orphans)
    assert (tmp_path / ".notes.tmp").read_text() == "mine"


def test_a_second_trainer_on_the_same_directory_is_refused(tmp_path):
    cfg = small_cfg(steps=2, n_checkpoints=0)
    trainer = Trainer(cfg, tmp_path, progress=False)
    other = Trainer(cfg, tmp_path, progress=False)
    original = trainer.train_step

    def step_while_another_starts(step: int) -> float:
        if step == 1:
            with pytest.raises(ValueError, match="another mechlab train is writing"):
                other.run()
        return original(step)

    trainer.train_step = step_while_another_starts
    trainer.run()
    assert state(tmp_path).step == 2


# --------------------------------------------------------------------------- architectures


@pytest.mark.parametrize(
    "model",
    [
        MODEL,
        {"arch": "lstm", "d_model": 16},
        {"arch": "dense_ssm", "d_model": 16, "d_state": 8},
        {"arch": "mamba", "d_model": 16, "d_state": 4},
    ],
    ids=lambda m: m["arch"],
)
def test_every_architecture_trains_in_continuous_mode(tmp_path, model):
    cfg = small_cfg(model=model, steps=3, n_checkpoints=1)
    result = train(cfg, tmp_path, progress=False)
    assert result.step == 3 and math.isfinite(result.final_loss)
    assert all(math.isfinite(v) for v in result.final_eval.values())
    losses = [r["loss"] for r in read_metrics(tmp_path)[0]]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    last, first = state(tmp_path), state(tmp_path, "step_0000000.pt")
    assert last.config.arch == model["arch"] and last.config.io == "continuous"
    assert any(not torch.equal(t, first.model.state_dict()[k]) for k, t in last.model.state_dict().items())


def study_preset_params(d: int, n_layers: int) -> int:
    """Parameter count of the study's transformers (papers.md): blocks, final LN,
    251 positions, read-in 57 -> d, read-out d -> 5."""
    return n_layers * (12 * d * d + 13 * d) + 2 * d + 251 * d + (57 * d + d) + (5 * d + 5)


@pytest.mark.parametrize(
    ("preset", "d_model", "n_layers"),
    [("tiny", 72, 3), ("small", 96, 6), ("medium", 128, 12), ("big", 192, 24)],
)
def test_study_presets_train_one_step(tmp_path, preset, d_model, n_layers):
    cfg = resolve_config(
        preset=preset,
        overrides=["batch_size=3", "steps=1", "eval_traces=4", "eval_haystack=2", "eval_seg_len=4",
                   "n_checkpoints=0"],
    )
    result = train(cfg, tmp_path, progress=False)
    assert result.step == 1 and math.isfinite(result.final_loss)
    model = state(tmp_path).model
    assert (model.cfg.d_in, model.cfg.d_out, model.cfg.n_ctx) == (57, 5, 251)  # the study's task
    assert sum(p.numel() for p in model.parameters()) == study_preset_params(d_model, n_layers)


# --------------------------------------------------------------------------- learning


def test_a_short_run_learns_to_beat_the_zero_predictor(tmp_path):
    cfg = small_cfg(
        model={"arch": "transformer", "d_model": 32, "n_layers": 2, "n_heads": 2},
        steps=300, batch_size=32, lr=3e-3, eval_traces=512, log_every=50, n_checkpoints=0,
        loss_reduction="mean",  # the scale the thresholds below are written in
    )
    trainer = Trainer(cfg, tmp_path, progress=False)
    initial = trainer.evaluate()["test_loss"]
    zero = trainer.task.evaluate(ZeroModel(TASK["d_state"]), cfg, torch.Generator().manual_seed(12345))
    result = trainer.run()
    final = result.final_eval["test_loss"]
    # The zero predictor scores E||y||^2 / d, about 1/3 here; the model gets well below it.
    assert 0.25 < zero["test_loss"] < 0.45
    assert final < 0.75 * zero["test_loss"]
    assert final < 0.6 * initial
