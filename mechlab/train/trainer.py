"""The training loop: AdamW, clipping, gradient accumulation, a progress bar, JSONL
metrics, periodic evaluation, log-spaced checkpoints, exact resume and a NaN guard.

Every batch is drawn from a generator seeded by ``(seed, step)``, so a run
resumed at step ``k`` sees exactly the batches the uninterrupted run saw.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from tqdm.auto import tqdm

from mechlab.checkpoint import load_checkpoint, save_checkpoint
from mechlab.io import atomic_write_text
from mechlab.models import build_model
from mechlab.models.base import MechModel
from mechlab.train.config import TrainConfig
from mechlab.train.task import Task, make_task


class TrainingStopped(RuntimeError):
    """The run stopped early (signal or non-finite loss); its last good checkpoint is kept."""


@dataclass
class TrainResult:
    """What a finished (or stopped) run leaves behind."""

    out_dir: Path
    step: int
    last_checkpoint: Path
    final_loss: float
    final_eval: dict[str, float]


def log_spaced_steps(total: int, count: int) -> list[int]:
    """About ``count`` distinct steps spaced evenly in log scale on 1..total, ending at ``total``."""
    if count <= 0 or total <= 0:
        return []
    raw = np.unique(np.round(np.geomspace(1, total, num=count)).astype(int))
    return sorted(set(int(s) for s in raw) | {total})


def batch_generator(seed: int, step: int) -> torch.Generator:
    """The generator that draws the batch of ``step`` (independent of the run's history)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Learning rate for optimiser step ``step`` (1-based): warm-up, then constant or cosine."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


class _Metrics:
    """Append-only JSONL metrics file; on resume, lines after the resumed step are dropped."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        if resume_step is not None and path.exists():
            kept = [
                line for line in path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            atomic_write_text(path, "".join(f"{line}\n" for line in kept))
        elif resume_step is None and path.exists():
            path.unlink()

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")


class Trainer:
    """Trains one model on one task into ``out_dir``.

    Args:
        cfg: The run's configuration.
        out_dir: Run directory: ``config.yaml``, ``metrics.jsonl``, ``last.pt`` and
            ``checkpoints/step_*.pt``.
        progress: Show a progress bar.
    """

    def __init__(self, cfg: TrainConfig, out_dir: str | Path, progress: bool = True):
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.progress = progress
        self.task: Task = make_task(cfg.task, cfg.task_cfg)
        self.device = torch.device(cfg.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' asked for, but torch sees no CUDA device; use --device cpu")
        torch.manual_seed(cfg.seed)
        model_cfg = {**cfg.model, **self.task.model_fields()}
        self.model: MechModel = build_model(model_cfg).to(self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.step = 0
        self._stop_signal: int | None = None

    # -- checkpoints -------------------------------------------------------------
    @property
    def last_path(self) -> Path:
        return self.out_dir / "last.pt"

    def _save(self, path: Path, loss: float, with_optimizer: bool = True) -> None:
        save_checkpoint(
            self.model,
            path,
            optimizer=self.optimizer if with_optimizer else None,
            step=self.step,
            metrics={"loss": loss, "examples": self.step * self.cfg.batch_size},
            task=self.cfg.task,
            task_cfg=self.task.config_dict(),
            train_cfg=self.cfg.to_dict(),
        )

    def resume(self) -> None:
        """Continue from ``out_dir/last.pt`` (model, optimiser, step)."""
        if not self.last_path.exists():
            raise ValueError(f"nothing to resume: {str(self.last_path)!r} does not exist")
        ckpt = load_checkpoint(self.last_path, map_location=self.device)
        saved = ckpt.metadata.get("train_cfg", {})
        # Runs saved before loss_reduction existed were trained with the mean over dims.
        saved = {"loss_reduction": "mean", **saved} if saved else saved
        keys = ("task", "task_cfg", "model", "batch_size", "seed", "lr", "lr_schedule", "warmup_steps",
                "loss_reduction")
        for key in keys:
            if key in saved and saved[key] != getattr(self.cfg, key):
                raise ValueError(
                    f"cannot resume: setting {key!r} was {saved[key]!r} in the run, now {getattr(self.cfg, key)!r}"
                    + (f" (add --set loss_reduction={saved[key]})" if key == "loss_reduction" else "")
                )
        self.model.load_state_dict(ckpt.model.state_dict())
        if ckpt.optimizer_state is not None:
            self.optimizer.load_state_dict(ckpt.optimizer_state)
        self.step = ckpt.step

    # -- the loop ------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop_signal = signum

    def train_step(self, step: int) -> float:
        """One optimiser step on the batch of ``step``; returns the loss.

        The batch is drawn whole and, with ``grad_accum = k``, run as ``k`` micro-batches
        whose losses are each divided by the whole batch's count of scored positions:
        their gradients add up to the whole batch's (up to float rounding), so clipping
        and the update see the same step as without accumulation.
        """
        cfg = self.cfg
        inputs, targets, mask = self.task.batch(cfg.batch_size, batch_generator(cfg.seed, step))
        inputs, targets, mask = inputs.to(self.device), targets.to(self.device), mask.to(self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        if cfg.grad_accum == 1:
            # One batch: the plain step (kept exactly as before accumulation existed).
            pred = self.model(inputs)
            loss = self.task.loss(pred, targets, mask, cfg.loss_reduction)
            if not torch.isfinite(loss):
                return float("nan")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        else:
            n_scored = mask.sum()
            self.optimizer.zero_grad(set_to_none=True)
            loss = torch.zeros((), device=self.device)
            for part in zip(*(t.chunk(cfg.grad_accum) for t in (inputs, targets, mask)), strict=True):
                micro = self.task.loss(self.model(part[0]), part[1], part[2], cfg.loss_reduction, n_scored)
                if not torch.isfinite(micro):
                    self.optimizer.zero_grad(set_to_none=True)
                    return float("nan")
                micro.backward()
                loss = loss + micro.detach()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        return float(loss.detach())

    def evaluate(self) -> dict[str, float]:
        """The task's evaluation on fixed held-out traces (same traces every time)."""
        self.model.eval()
        try:
            with torch.no_grad():
                return self.task.evaluate(self.model, self.cfg, torch.Generator().manual_seed(12345))
        finally:
            self.model.train()

    def run(self, resume: bool = False) -> TrainResult:
        """Train to ``cfg.steps``, writing metrics and checkpoints as it goes.

        Raises:
            TrainingStopped: On SIGINT/SIGTERM (after writing ``last.pt``) or a non-finite loss
                (``last.pt`` keeps the last good state).
        """
        cfg = self.cfg
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "checkpoints").mkdir(exist_ok=True)
        if resume:
            self.resume()
        elif self.last_path.exists():
            raise ValueError(
                f"{str(self.out_dir)!r} already holds a run; pass --resume to continue it or choose a new --out"
            )
        atomic_write_text(self.out_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        metrics = _Metrics(self.out_dir / "metrics.jsonl", self.step if resume else None)
        keep = set(log_spaced_steps(cfg.steps, cfg.n_checkpoints))
        if not resume and cfg.n_checkpoints:
            self._save(self.out_dir / "checkpoints" / "step_0000000.pt", float("nan"), with_optimizer=False)

        # Signal handlers can only be installed from the main thread (not, e.g., in a Ray worker).
        in_main = threading.current_thread() is threading.main_thread()
        old_handlers = (
            {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)} if in_main else {}
        )
        bar = tqdm(total=cfg.steps, initial=self.step, disable=not self.progress, unit="step", dynamic_ncols=True)
        loss, last_eval, window_start, window_examples = float("nan"), {}, time.perf_counter(), 0
        try:
            while self.step < cfg.steps:
                if self._stop_signal is not None:
                    self._save(self.last_path, loss)
                    raise TrainingStopped(
                        f"stopped by signal {self._stop_signal} at step {self.step}; "
                        f"resume with --resume {self.out_dir}"
                    )
                new_loss = self.train_step(self.step + 1)
                if not math.isfinite(new_loss):
                    # train_step returns before the update: the weights are those of step
                    # self.step, whose loss was finite.
                    self._save(self.last_path, loss)
                    raise TrainingStopped(
                        f"loss became non-finite at step {self.step + 1}; the run stopped and "
                        f"{self.last_path} keeps the last good state (step {self.step}); "
                        "start a new run with a lower lr"
                    )
                loss = new_loss
                self.step += 1
                window_examples += cfg.batch_size
                bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                    elapsed = time.perf_counter() - window_start
                    rate = window_examples / elapsed if elapsed > 0 else float("nan")
                    metrics.write({
                        "step": self.step, "examples": self.step * cfg.batch_size, "loss": loss,
                        "lr": learning_rate(cfg, self.step), "examples_per_s": rate,
                    })
                    bar.set_postfix(loss=f"{loss:.4f}", ex_s=f"{rate:,.0f}")
                    window_start, window_examples = time.perf_counter(), 0
                if (cfg.eval_every and self.step % cfg.eval_every == 0) or self.step == cfg.steps:
                    last_eval = self.evaluate()
                    metrics.write({"step": self.step, "examples": self.step * cfg.batch_size, "eval": last_eval})
                    bar.write(f"step {self.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in last_eval.items()))
                if self.step in keep:
                    self._save(self.out_dir / "checkpoints" / f"step_{self.step:07d}.pt", loss, with_optimizer=False)
                if self.step % cfg.save_every == 0 or self.step == cfg.steps:
                    self._save(self.last_path, loss)
        except KeyboardInterrupt:
            self._save(self.last_path, loss)
            raise TrainingStopped(
                f"interrupted at step {self.step}; resume with --resume {self.out_dir}"
            ) from None
        finally:
            bar.close()
            for s, handler in old_handlers.items():
                signal.signal(s, handler)
        return TrainResult(self.out_dir, self.step, self.last_path, loss, last_eval)


def train(cfg: TrainConfig, out_dir: str | Path, resume: bool = False, progress: bool = True) -> TrainResult:
    """Train a model as ``cfg`` says; see :class:`Trainer`.

    Args:
        cfg: The run's configuration (see :func:`mechlab.train.config.resolve_config`).
        out_dir: Run directory.
        resume: Continue the run in ``out_dir`` from its ``last.pt``.
        progress: Show a progress bar.

    Returns:
        Where the run stands: step, last checkpoint, final loss and evaluation.
    """
    return Trainer(cfg, out_dir, progress=progress).run(resume=resume)
