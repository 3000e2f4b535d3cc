"""`mechlab bench train`: the numbers it returns, and that its comparison is fair."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mechlab.bench.train import (
    CONTENDERS,
    MinimalLoop,
    PregeneratedTask,
    TrainBenchResult,
    bench_train,
    make_trainer,
    pregenerate,
)
from mechlab.train.trainer import batch_generator

# recall-cpu shrunk to a 1-layer, 16-wide transformer on 15-token traces: a step takes ~ms.
SMALL = (
    "model.d_model=16", "model.n_layers=1", "model.n_heads=2",
    "task_cfg.n_ctx=16", "task_cfg.max_cuts=6", "task_cfg.n_train_systems=50", "task_cfg.n_test_systems=8",
)


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_bench_train_returns_positive_finite_numbers():
    r = bench_train("recall-cpu", batch=8, steps=2, repeats=3, overrides=SMALL, threads=1)
    assert isinstance(r, TrainBenchResult)
    assert (r.preset, r.device, r.threads, r.batch_size, r.n_ctx) == ("recall-cpu", "cpu", 1, 8, 16)
    assert (r.steps_per_window, r.repeats) == (2, 3)
    assert r.n_params == sum(p.numel() for p in make_trainer("recall-cpu", 8, overrides=SMALL).model.parameters())
    fields = {f.name for f in dataclasses.fields(r)}
    seconds = ["trainer_s", "minimal_s", "trainer_data_s", "minimal_data_s", "data_s"]
    assert set(seconds) <= fields
    derived = [r.trainer_ex_s, r.minimal_ex_s, r.ratio, r.ratio_with_data, r.data_share, r.cpu_ratio,
               r.cpu_ratio_with_data]
    for value in [getattr(r, name) for name in seconds] + derived:
        assert math.isfinite(value) and value > 0
    assert set(r.timings) == set(r.cpu_timings) == set(CONTENDERS)
    for t in [*r.timings.values(), *r.cpu_timings.values()]:
        assert t.runs == 3 and 0 < t.q1 <= t.median <= t.q3
    assert r.trainer_s == r.timings["trainer"].median
    assert r.ratio == pytest.approx(r.trainer_ex_s / r.minimal_ex_s)
    assert r.data_share == pytest.approx(r.data_s / r.trainer_data_s)
    # drawing a batch is part of a full step, so it takes less time than one
    assert r.data_s < r.trainer_data_s
    table = r.format_table()
    assert "trainer/minimal" in table and "data generation share" in table
    assert len(table.splitlines()) == 1 + 1 + len(CONTENDERS) + 3


def test_minimal_loop_and_trainer_follow_the_same_loss_trajectory():
    trainer = make_trainer("recall-cpu", batch=8, overrides=SMALL)
    minimal = MinimalLoop.from_trainer(trainer)
    # same architecture and initial weights, but separate tensors
    for (name, p), (name2, q) in zip(trainer.model.named_parameters(), minimal.model.named_parameters(), strict=True):
        assert name == name2 and torch.equal(p, q) and p.data_ptr() != q.data_ptr()
    n_steps = 4
    batches = pregenerate(trainer, range(1, n_steps + 1))
    seed = trainer.cfg.seed
    # the pre-generated batch of a step is exactly what the task draws for it
    for s in range(1, n_steps + 1):
        fresh = trainer.task.batch(8, batch_generator(seed, s))
        stored = batches[batch_generator(seed, s).initial_seed()]
        assert all(torch.equal(a, b) for a, b in zip(fresh, stored, strict=True))
    # ... and distinct steps get distinct batches
    assert not torch.equal(batches[batch_generator(seed, 1).initial_seed()][0],
                           batches[batch_generator(seed, 2).initial_seed()][0])

    real_task = trainer.task
    trainer.task = PregeneratedTask(real_task, batches)
    trainer_losses = [trainer.train_step(s) for s in range(1, n_steps + 1)]
    minimal_losses = [
        float(minimal.step(*batches[batch_generator(seed, s).initial_seed()])) for s in range(1, n_steps + 1)
    ]
    assert trainer_losses == pytest.approx(minimal_losses, abs=1e-6, rel=0)
    # the models really trained (the trajectory is not flat) and ended on the same weights
    assert trainer_losses[-1] != trainer_losses[0]
    for p, q in zip(trainer.model.parameters(), minimal.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    # PregeneratedTask delegates everything else to the real task
    assert trainer.task.config_dict() == real_task.config_dict()


def test_minimal_loop_clips_and_uses_adamw_settings():
    trainer = make_trainer("recall-cpu", batch=8, overrides=(*SMALL, "lr=0.01", "weight_decay=0.1"))
    minimal = MinimalLoop.from_trainer(trainer)
    group = minimal.optimizer.param_groups[0]
    assert isinstance(minimal.optimizer, torch.optim.AdamW)
    assert (group["lr"], group["weight_decay"], minimal.grad_clip) == (0.01, 0.1, 1.0)
    # a loss scaled up 1e4 times would give huge gradients; after clipping their norm is <= 1
    inputs, targets, mask = trainer.task.batch(8, batch_generator(0, 1))
    minimal.step(inputs, targets * 1e4, mask)
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in minimal.model.parameters()]))
    assert norm == pytest.approx(1.0, rel=1e-4)


def test_bench_train_rejects_bad_arguments():
    with pytest.raises(ValueError, match="steps and repeats"):
        bench_train("recall-cpu", batch=8, steps=0, overrides=SMALL)
    with pytest.raises(ValueError, match="threads"):
        bench_train("recall-cpu", batch=8, threads=0, overrides=SMALL)
    with pytest.raises(ValueError, match="unknown preset"):
        bench_train("no-such-preset")
