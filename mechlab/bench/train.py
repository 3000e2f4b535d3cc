"""`mechlab bench train`: the trainer's step against a minimal hand-written PyTorch loop.

Both contenders train the same model (the minimal loop gets a copy of the trainer's
freshly initialised model, so the same architecture and the same initial weights) with
AdamW of the same hyperparameters and the same gradient clipping, on the same batches.
They are timed side by side, interleaved window by window
(:func:`~mechlab.bench.timing.time_interleaved`), in two variants:

* **model step alone**: the batches are generated once, before timing, and both loops
  are fed the same tensors (the trainer through :class:`PregeneratedTask`, which hands
  ``Trainer.train_step`` the pre-generated batch of the step it asks for);
* **with data generation**: each loop draws its batch with the task's generator, as a
  real run does (``task.batch(batch_size, batch_generator(seed, step))``).

A fifth contender times ``task.batch`` alone, which gives the share of a trainer step
spent generating data. Everything is reported as medians over the timed windows, in
seconds per step and examples per second, and as the ratio trainer / minimal of
examples per second (the goal is >= 0.95: the trainer's bookkeeping should cost under 5%).
"""

from __future__ import annotations

import copy
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mechlab.bench.record import Table
from mechlab.bench.timing import Timing, time_interleaved
from mechlab.train.config import resolve_config
from mechlab.train.task import Task
from mechlab.train.trainer import Trainer, batch_generator

Batch = tuple[Tensor, Tensor, Tensor]  # inputs [batch, pos, d_in], targets [batch, pos, d_out], mask [batch, pos]

# Contender names, in the order they are interleaved and reported.
CONTENDERS = ("trainer", "minimal", "trainer+data", "minimal+data", "data")
LABELS = {
    "trainer": "trainer.train_step (pre-generated batches)",
    "minimal": "minimal loop (pre-generated batches)",
    "trainer+data": "trainer.train_step (draws its batch)",
    "minimal+data": "minimal loop (draws its batch)",
    "data": "task.batch alone",
}
RATIO_GOAL = 0.95  # trainer examples/s over minimal examples/s
DATA_SHARE_GOAL = 0.10  # task.batch time over a full trainer step


class MinimalLoop:
    """The training step written out by hand: forward, masked MSE, backward, clip, AdamW.

    The learning rate is constant, as in every training preset; a warm-up or cosine
    schedule set on the trainer changes its losses but not the cost of its steps.

    Args:
        model: The model to train (the caller passes a copy of the trainer's).
        lr: AdamW learning rate (constant).
        weight_decay: AdamW weight decay.
        grad_clip: Gradient-norm clipping (0 disables).
    """

    def __init__(self, model: torch.nn.Module, lr: float, weight_decay: float, grad_clip: float):
        self.model = model
        self.grad_clip = grad_clip
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    @classmethod
    def from_trainer(cls, trainer: Trainer) -> MinimalLoop:
        """A minimal loop on a copy of ``trainer``'s model (same weights) and its AdamW settings."""
        cfg = trainer.cfg
        return cls(copy.deepcopy(trainer.model), cfg.lr, cfg.weight_decay, cfg.grad_clip)

    def step(self, inputs: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
        """One optimiser step; returns the (detached) loss without synchronising."""
        pred = self.model(inputs)  # [batch, pos, d_out]
        sq = (pred - targets).pow(2).mean(-1)  # [batch, pos]
        loss = (sq * mask).sum() / mask.sum().clamp(min=1)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return loss.detach()


class PregeneratedTask:
    """A task whose ``batch`` returns batches generated beforehand.

    The trainer asks for the batch of step ``s`` with ``batch_generator(seed, s)``; the
    generator's ``initial_seed()`` identifies the step, so this hands back exactly the
    batch the real task would have drawn, without drawing it. Everything else is the
    wrapped task's.

    Args:
        task: The real task.
        batches: ``generator seed -> (inputs, targets, mask)``.
    """

    def __init__(self, task: Task, batches: dict[int, Batch]):
        self.task = task
        self.batches = batches

    def batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self.batches[generator.initial_seed()]

    def __getattr__(self, name: str) -> Any:
        if name == "task":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.task, name)


def make_trainer(
    preset: str = "tiny", batch: int | None = None, device: str = "cpu", overrides: Sequence[str] = ()
) -> Trainer:
    """A trainer for a training preset (nothing is written to disk unless it is ``run``).

    Args:
        preset: A training preset (``tiny``, ``small``, ``medium``, ``big``, ``recall-cpu``).
        batch: Batch size; ``None`` keeps the preset's.
        device: Torch device.
        overrides: ``key=value`` settings, as ``mechlab train --set`` takes them.
    """
    cfg = resolve_config(preset=preset, overrides=list(overrides), batch_size=batch, device=device)
    # The benchmark times train_step and never evaluates: no dry evaluation.
    return Trainer(
        cfg, Path(tempfile.gettempdir()) / "mechlab-bench-train-unused", progress=False,
        check_evaluation=False,
    )


def pregenerate(trainer: Trainer, steps: Sequence[int]) -> dict[int, Batch]:
    """The batches of ``steps``, drawn as the trainer draws them and moved to its device."""
    cfg = trainer.cfg
    out = {}
    for step in steps:
        gen = batch_generator(cfg.seed, step)
        inputs, targets, mask = trainer.task.batch(cfg.batch_size, gen)
        out[gen.initial_seed()] = (
            inputs.to(trainer.device), targets.to(trainer.device), mask.to(trainer.device)
        )
    return out


@dataclass
class TrainBenchResult:
    """Speed of ``Trainer.train_step`` against a minimal loop (medians; seconds per step).

    Times are wall-clock; ``cpu_timings`` also gives the process's CPU time per step,
    which other processes on a shared machine disturb far less (on a CUDA device it is
    only the host's share of the work).

    Attributes:
        preset: Training preset.
        device: Torch device.
        threads: Torch CPU threads during the timing.
        batch_size: Traces per step.
        n_ctx: Tokens per trace (the model reads ``n_ctx - 1``).
        n_params: Model parameters.
        steps_per_window: Optimiser steps (or batches) per timed window.
        repeats: Timed windows per contender.
        trainer_s: ``Trainer.train_step`` on pre-generated batches.
        minimal_s: The minimal loop on the same pre-generated batches.
        trainer_data_s: ``Trainer.train_step`` drawing its batch (a real run's step).
        minimal_data_s: The minimal loop drawing the same batch with the task's generator.
        data_s: ``task.batch`` alone (with its generator's construction).
        timings: Contender -> wall-clock median and quartiles, seconds per step.
        cpu_timings: Contender -> process CPU-time median and quartiles, seconds per step.
    """

    preset: str
    device: str
    threads: int
    batch_size: int
    n_ctx: int
    n_params: int
    steps_per_window: int
    repeats: int
    trainer_s: float
    minimal_s: float
    trainer_data_s: float
    minimal_data_s: float
    data_s: float
    timings: dict[str, Timing] = field(default_factory=dict)
    cpu_timings: dict[str, Timing] = field(default_factory=dict)

    def examples_per_s(self, seconds_per_step: float) -> float:
        return self.batch_size / seconds_per_step

    @property
    def trainer_ex_s(self) -> float:
        """Trainer examples per second, model step alone."""
        return self.examples_per_s(self.trainer_s)

    @property
    def minimal_ex_s(self) -> float:
        """Minimal-loop examples per second, model step alone."""
        return self.examples_per_s(self.minimal_s)

    @property
    def ratio(self) -> float:
        """Trainer / minimal examples per second, model step alone (goal >= 0.95)."""
        return self.minimal_s / self.trainer_s

    @property
    def ratio_with_data(self) -> float:
        """Trainer / minimal examples per second, data generation included in both."""
        return self.minimal_data_s / self.trainer_data_s

    @property
    def cpu_ratio(self) -> float:
        """Like :attr:`ratio`, from process CPU time instead of wall-clock time."""
        return self.cpu_timings["minimal"].median / self.cpu_timings["trainer"].median

    @property
    def cpu_ratio_with_data(self) -> float:
        """Like :attr:`ratio_with_data`, from process CPU time."""
        return self.cpu_timings["minimal+data"].median / self.cpu_timings["trainer+data"].median

    @property
    def data_share(self) -> float:
        """Share of a full trainer step spent in ``task.batch`` (goal < 0.10)."""
        return self.data_s / self.trainer_data_s

    def table(self) -> Table:
        """The result as a :class:`~mechlab.bench.record.Table`: one row per contender, the
        ratios and goals as notes (what :meth:`format_table` prints)."""
        cells, values = [], []
        for name in CONTENDERS:
            t, cpu = self.timings[name], self.cpu_timings[name]
            cells.append([LABELS[name], f"{t.median * 1e3:.1f}", f"{t.q1 * 1e3:.1f}-{t.q3 * 1e3:.1f}",
                          f"{self.examples_per_s(t.median):,.1f}" if name != "data" else "-",
                          f"{cpu.median * 1e3:.1f}"])  # fmt: skip
            values.append({"contender": name, "s_per_step": t.median, "cpu_s_per_step": cpu.median})
        title = (f"preset {self.preset}: {self.n_params:,} parameters, batch {self.batch_size} x "
                 f"{self.n_ctx - 1} positions; {self.repeats} windows of {self.steps_per_window} step(s) each, "
                 "interleaved, medians")  # fmt: skip
        notes = self.format_table().splitlines()[-3:]
        return Table(["contender", "ms/step", "q1-q3 ms", "examples/s", "CPU ms/step"], cells, title, values, notes)

    def format_table(self) -> str:
        """The result as aligned text: one row per contender, then the ratios and goals."""
        rows = [("contender", "ms/step", "q1-q3 ms", "examples/s", "CPU ms/step")]
        for name in CONTENDERS:
            t = self.timings[name]
            rows.append((
                LABELS[name], f"{t.median * 1e3:.1f}", f"{t.q1 * 1e3:.1f}-{t.q3 * 1e3:.1f}",
                f"{self.examples_per_s(t.median):,.1f}" if name != "data" else "-",
                f"{self.cpu_timings[name].median * 1e3:.1f}",
            ))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            f"preset {self.preset}: {self.n_params:,} parameters, batch {self.batch_size} x "
            f"{self.n_ctx - 1} positions, device {self.device}, {self.threads} thread(s); "
            f"{self.repeats} windows of {self.steps_per_window} step(s) each, interleaved, medians",
        ]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]

        def verdict(ok: bool) -> str:
            return "ok" if ok else "MISSED"

        lines += [
            f"trainer/minimal examples/s, model step alone:     {self.ratio:.3f} "
            f"(CPU time: {self.cpu_ratio:.3f}; goal >= {RATIO_GOAL}: {verdict(self.ratio >= RATIO_GOAL)})",
            f"trainer/minimal examples/s, with data generation: {self.ratio_with_data:.3f} "
            f"(CPU time: {self.cpu_ratio_with_data:.3f}; goal >= {RATIO_GOAL}: "
            f"{verdict(self.ratio_with_data >= RATIO_GOAL)})",
            f"data generation share of a trainer step:         {self.data_share:.1%} "
            f"(goal < {DATA_SHARE_GOAL:.0%}: {verdict(self.data_share < DATA_SHARE_GOAL)})",
        ]
        return "\n".join(lines)


def bench_train(
    preset: str = "tiny",
    batch: int | None = None,
    steps: int = 1,
    repeats: int = 5,
    device: str = "cpu",
    threads: int | None = None,
    overrides: Sequence[str] = (),
    warmup: int = 1,
) -> TrainBenchResult:
    """Time ``Trainer.train_step`` against a minimal PyTorch loop on the same model and data.

    Each timed window runs ``steps`` optimiser steps (steps ``1..steps`` of the run, so
    every window sees the same batches); the five contenders (:data:`CONTENDERS`) are
    interleaved window by window. The two models start from the same weights but drift
    apart (and away from their start) as they train, which does not change the cost of
    a step.

    Args:
        preset: A training preset (``tiny``, ``small``, ``medium``, ``big``, ``recall-cpu``).
        batch: Batch size; ``None`` keeps the preset's (2048 for ``tiny``; 256 keeps a
            one-thread CPU run to a few minutes).
        steps: Steps per timed window.
        repeats: Timed windows per contender (the median is reported).
        device: Torch device (``cpu`` or ``cuda``).
        threads: Torch CPU threads for the measurement (``None``: leave as is).
        overrides: ``key=value`` training settings (``model.d_model=32``, ...).
        warmup: Untimed windows per contender first.

    Returns:
        The medians and ratios.
    """
    if steps < 1 or repeats < 1 or warmup < 0:
        raise ValueError(
            f"steps and repeats must be >= 1 and warmup >= 0, got steps={steps}, "
            f"repeats={repeats}, warmup={warmup}"
        )
    old_threads = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    try:
        return _bench(preset, batch, steps, repeats, device, overrides, warmup)
    finally:
        torch.set_num_threads(old_threads)


def _per_step(name: str, window_seconds: list[float], steps: int) -> Timing:
    """Median and quartiles of timed windows, per step."""
    xs = [x / steps for x in window_seconds]
    qs = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return Timing(name, statistics.median(xs), qs[0], qs[2], len(xs))


def _bench(
    preset: str, batch: int | None, steps: int, repeats: int, device: str,
    overrides: Sequence[str], warmup: int,
) -> TrainBenchResult:
    trainer = make_trainer(preset, batch, device, overrides)
    cfg, task = trainer.cfg, trainer.task
    minimal = MinimalLoop.from_trainer(trainer)
    step_numbers = list(range(1, steps + 1))
    pregenerated = PregeneratedTask(task, pregenerate(trainer, step_numbers))
    batches = [pregenerated.batches[batch_generator(cfg.seed, s).initial_seed()] for s in step_numbers]
    sync: Callable[[], None] = torch.cuda.synchronize if trainer.device.type == "cuda" else lambda: None

    def check(loss: float) -> None:
        # A non-finite loss makes train_step return before backward: that would time nothing.
        if not math.isfinite(loss):
            raise RuntimeError("the trainer's loss became non-finite during the benchmark; lower the lr")

    def trainer_steps() -> None:
        trainer.task = pregenerated
        try:
            for s in step_numbers:
                check(trainer.train_step(s))
        finally:
            trainer.task = task
        sync()

    def minimal_steps() -> None:
        for b in batches:
            minimal.step(*b)
        sync()

    def trainer_data_steps() -> None:
        for s in step_numbers:
            check(trainer.train_step(s))
        sync()

    def minimal_data_steps() -> None:
        for s in step_numbers:
            inputs, targets, mask = task.batch(cfg.batch_size, batch_generator(cfg.seed, s))
            minimal.step(inputs.to(device), targets.to(device), mask.to(device))
        sync()

    def data_only() -> None:
        for s in step_numbers:
            task.batch(cfg.batch_size, batch_generator(cfg.seed, s))

    contenders = (trainer_steps, minimal_steps, trainer_data_steps, minimal_data_steps, data_only)
    cpu_seconds: dict[str, list[float]] = {name: [] for name in CONTENDERS}

    def with_cpu_clock(name: str, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            start = time.process_time()
            fn()
            cpu_seconds[name].append(time.process_time() - start)

        return run

    fns = {name: with_cpu_clock(name, fn) for name, fn in zip(CONTENDERS, contenders, strict=True)}
    wall = time_interleaved(fns, repeats=repeats, warmup=warmup)
    timings = {name: t.scaled(1 / steps) for name, t in wall.items()}
    cpu_timings = {name: _per_step(name, xs[warmup:], steps) for name, xs in cpu_seconds.items()}
    return TrainBenchResult(
        preset=preset,
        device=str(trainer.device),
        threads=torch.get_num_threads(),
        batch_size=cfg.batch_size,
        n_ctx=trainer.model.cfg.n_ctx,
        n_params=sum(p.numel() for p in trainer.model.parameters()),
        steps_per_window=steps,
        repeats=repeats,
        trainer_s=timings["trainer"].median,
        minimal_s=timings["minimal"].median,
        trainer_data_s=timings["trainer+data"].median,
        minimal_data_s=timings["minimal+data"].median,
        data_s=timings["data"].median,
        timings=timings,
        cpu_timings=cpu_timings,
    )
