"""Training on the accelerator against the CPU: the recall trainer's steps, batches drawn
ahead (on by default on CUDA), checkpoints, and state-tracking trials one by one and as
batched ensembles.

Float32 training diverges slowly between devices (different reduction orders, Adam's
division); over the few steps compared here the losses agree to ``rtol 1e-3``.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mechlab.checkpoint import load_checkpoint
from mechlab.train import train
from mechlab.train.config import TrainConfig
from mechlab.train.ensemble import train_ensemble
from mechlab.train.trials import TrialSpec, run_trial

TASK = {"d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
        "n_train_systems": 200, "n_test_systems": 50}  # fmt: skip
MODELS = {
    "transformer": {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2},
    "lstm": {"arch": "lstm", "d_model": 16, "n_layers": 1},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 16, "n_layers": 1},
    "mamba": {"arch": "mamba", "d_model": 16, "n_layers": 1},
}


def cfg(model: dict, device: str, **fields) -> TrainConfig:
    base = dict(task_cfg=TASK, model=model, steps=8, batch_size=8, eval_haystack=2, eval_seg_len=4,
                eval_traces=32, eval_every=4, log_every=1, n_checkpoints=2, save_every=100,
                device=device)  # fmt: skip
    return TrainConfig(**{**base, **fields})


def losses(run_dir) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.mark.parametrize("family", list(MODELS))
def test_training_steps_follow_the_cpu_run(family, accel, tmp_path):
    a = train(cfg(MODELS[family], "cpu"), tmp_path / "cpu", progress=False)
    b = train(cfg(MODELS[family], str(accel)), tmp_path / "dev", progress=False)
    la, lb = losses(tmp_path / "cpu"), losses(tmp_path / "dev")
    assert len(la) == len(lb) == 8
    assert lb == pytest.approx(la, rel=1e-3, abs=1e-6)
    assert a.step == b.step == 8
    ckpt = load_checkpoint(tmp_path / "dev" / "last.pt")  # saved from the accelerator
    assert next(ckpt.model.parameters()).device.type == "cpu"


def test_batches_drawn_ahead_train_exactly_as_batches_drawn_on_demand(accel, tmp_path):
    ahead = cfg(MODELS["transformer"], str(accel), prefetch=2)
    on_demand = dataclasses.replace(ahead, prefetch=0)
    train(ahead, tmp_path / "ahead", progress=False)
    train(on_demand, tmp_path / "demand", progress=False)
    assert losses(tmp_path / "ahead") == losses(tmp_path / "demand")


def test_a_resumed_accelerator_run_ends_where_an_uninterrupted_one_does(accel, tmp_path):
    whole = cfg(MODELS["lstm"], str(accel), steps=10)
    train(whole, tmp_path / "whole", progress=False)
    train(dataclasses.replace(whole, steps=5), tmp_path / "split", progress=False)
    train(whole, tmp_path / "split", resume=True, progress=False)
    a = load_checkpoint(tmp_path / "whole" / "last.pt").model.state_dict()
    b = load_checkpoint(tmp_path / "split" / "last.pt").model.state_dict()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-5, atol=1e-7), name


def _trials(preset: str, device: str) -> list[TrialSpec]:
    task = {"group": "zm", "m": 2, "L": 4, "format": "acot", "n_ood": 32, "n_val": 40}
    return [TrialSpec(model={"preset": preset}, task=dict(task), n_train=n, lr=lr, seed=3, steps=20,
                      batch_size=16, eval_every=10, device=device)
            for n, lr in ((24, 1e-2), (20, 3e-3))]  # fmt: skip


@pytest.mark.parametrize("preset", ["st_transformer_small", "st_lstm_small", "st_dense_ssm_small"])
def test_state_tracking_trials_and_ensembles_follow_the_cpu(preset, accel):
    cpu = [run_trial(s) for s in _trials(preset, "cpu")]
    dev_alone = [run_trial(s) for s in _trials(preset, str(accel))]
    dev_together = train_ensemble(_trials(preset, str(accel)))
    for a, b, c in zip(cpu, dev_alone, dev_together, strict=True):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-3, abs=1e-6)
        assert c["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4, abs=1e-7)
        assert a["steps_run"] == b["steps_run"] == c["steps_run"]
