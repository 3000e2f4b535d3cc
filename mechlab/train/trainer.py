"""The training loop: AdamW, clipping, gradient accumulation, a progress bar, JSONL
metrics, periodic evaluation, log-spaced checkpoints, exact resume and a NaN guard.

Every batch is drawn from a generator seeded by ``(seed, step)``, so a run
resumed at step ``k`` sees exactly the batches the uninterrupted run saw.

Every setting is checked before any work: the device, the model's size, and
each evaluation the run will do (built once, dry, on two traces), so a bad
evaluation setting fails in a second instead of after the last step.

The NaN guard: ``last.pt`` is only ever written with weights that are finite
and whose loss, on the batch of the next step, is finite (one extra forward
pass per save). When a step's loss is not finite the run stops and writes
nothing, so ``last.pt`` keeps the last verified state.

Resume: settings that shape the steps already taken (the data, the model, the
batches, the learning-rate schedule, the loss) cannot change and are refused
with the reason; the others (``steps`` under a constant schedule, weight
decay, clipping, accumulation, device, logging, evaluation and saving) take
effect for real, and ``config.yaml`` records them.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import Tensor

from mechlab.checkpoint import load_checkpoint, save_checkpoint
from mechlab.devices import check_device
from mechlab.io import atomic_write_text, remove_orphan_temps
from mechlab.models import build_model
from mechlab.models.base import MechModel
from mechlab.models.registry import MAX_ELEMENTS_ENV, max_elements
from mechlab.progress import tqdm
from mechlab.train.config import TrainConfig, target_offsets
from mechlab.train.prefetch import Prefetcher
from mechlab.train.run_files import MetricsFile, exclusive_run_dir, read_metrics_lines
from mechlab.train.seeding import batch_generator
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


# Settings a resumed run cannot change, with the reason.
_LOCKED = {
    "task": "the run's data come from it",
    "task_cfg": "the run's data come from it",
    "model": "last.pt holds the weights of that model",
    "batch_size": "every step's batch is drawn with it",
    "seed": "every step's batch is drawn from it",
    "lr": "it sets the learning-rate schedule the run follows",
    "lr_schedule": "it sets the learning-rate schedule the run follows",
    "warmup_steps": "it sets the learning-rate schedule the run follows",
    "loss_reduction": "it sets the loss the run is trained on",
    "target_weights": "it sets the loss the run is trained on",
    "target_weight_norm": "it sets the loss the run is trained on",
}
# Locked only under the cosine schedule, whose shape depends on them.
_LOCKED_COSINE = {
    "steps": "the cosine schedule spans the run's steps",
    "min_lr_ratio": "it sets the floor of the cosine schedule",
}


def _loss_options(cfg: TrainConfig) -> dict[str, Any]:
    """The task's loss options of a run (target weights, for the lds task)."""
    if not cfg.target_weights:
        return {}

    return {"target_weights": target_offsets(cfg.target_weights), "target_weight_norm": cfg.target_weight_norm}


class Trainer:
    """Trains one model on one task into ``out_dir``.

    Constructing it checks every setting (device, model size, a dry run of the
    evaluation) and writes nothing; :meth:`run` creates ``out_dir``.

    Args:
        cfg: The run's configuration.
        out_dir: Run directory: ``config.yaml``, ``metrics.jsonl``, ``last.pt`` and
            ``checkpoints/step_*.pt``.
        progress: Show a progress bar.
        check_evaluation: Run :meth:`check_evaluation` now (only a caller that never
            evaluates, such as the training benchmark, turns it off).

    Raises:
        ValueError: A setting that cannot work (unknown or missing device, a model
            above the size limit, an evaluation that cannot be built).
    """

    def __init__(
        self, cfg: TrainConfig, out_dir: str | Path, progress: bool = True, check_evaluation: bool = True
    ):
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.progress = progress
        self.device = check_device(cfg.device)
        self.task: Task = make_task(cfg.task, cfg.task_cfg, **_loss_options(cfg))
        self._check_batch_size()
        torch.manual_seed(cfg.seed)
        model_cfg = {**cfg.model, **self.task.model_fields()}
        self.model: MechModel = build_model(model_cfg).to(self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.step = 0
        self._stop_signal: int | None = None
        self._saved_step: int | None = None  # step of the last verified last.pt
        if check_evaluation:
            self.check_evaluation()

    def _check_batch_size(self) -> None:
        """Refuse batches above the size limit before one is drawn (see ``max_elements``)."""
        fields = self.task.model_fields()
        if fields.get("io") == "tokens":  # a trace's logits: one row of the output vocabulary per token
            width = int(fields.get("d_vocab_out") or fields.get("d_vocab", 1)) + 2
        else:
            width = int(fields.get("d_in", 1)) + int(fields.get("d_out", 1)) + 1
        per_trace = int(fields.get("n_ctx", 1)) * width
        for name in ("batch_size", "eval_traces"):
            n = getattr(self.cfg, name) * per_trace
            if n > max_elements():
                raise ValueError(
                    f"{name}={getattr(self.cfg, name)} makes batches of about {n:.3g} elements, more "
                    f"than the limit {max_elements():.3g}; use a smaller {name} (or raise "
                    f"{MAX_ELEMENTS_ENV})"
                )

    def check_evaluation(self) -> None:
        """Build the run's evaluation once, dry (two traces), before any training.

        Runs under a forked RNG, so the run's random streams are untouched.

        Raises:
            ValueError: The evaluation settings cannot work for this task and model
                (e.g. a haystack longer than the model's context).
        """
        probe = dataclasses.replace(self.cfg, eval_traces=2)
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                self.evaluate(probe)
        except ValueError as err:
            raise ValueError(
                f"the run's evaluation cannot be built (eval_haystack={self.cfg.eval_haystack}, "
                f"eval_seg_len={self.cfg.eval_seg_len}): {err}; change these settings - nothing "
                "was trained or written"
            ) from None

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

    def _weights_problem(self) -> str | None:
        """Why the current weights are not finite, or None if they are."""
        for name, tensor in self.model.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                return f"weight {name!r} is not finite"
        return None

    def _state_problem(self) -> str | None:
        """Why the current state must not be saved as ``last.pt``, or None if it may.

        The weights must be finite and their loss on the batch of the next step
        finite (a forward pass without gradients; nothing changes).
        """
        problem = self._weights_problem()
        if problem is not None:
            return problem
        loss = self.probe_loss(self.step + 1)
        return None if math.isfinite(loss) else f"their loss on the next batch is {loss}"

    def probe_loss(self, step: int) -> float:
        """The loss of the current weights on the batch of ``step``, without updating anything."""
        cfg = self.cfg
        inputs, targets, mask = self.task.batch(cfg.batch_size, batch_generator(cfg.seed, step))
        inputs, targets, mask = inputs.to(self.device), targets.to(self.device), mask.to(self.device)
        n_scored = torch.count_nonzero(mask)
        total = 0.0
        with torch.no_grad():
            for part in zip(*(t.chunk(cfg.grad_accum) for t in (inputs, targets, mask)), strict=True):
                micro = self.task.loss(self.model(part[0]), part[1], part[2], cfg.loss_reduction, n_scored)
                total += float(micro)
        return total

    def _save_last(self, loss: float) -> str | None:
        """Write ``last.pt`` if the state passes the NaN guard; else return why not."""
        problem = self._state_problem()
        if problem is None:
            self._save(self.last_path, loss)
            self._saved_step = self.step
        return problem

    def _kept(self) -> str:
        if self._saved_step is None:
            return (
                f"no last.pt was written (the first save was due at step "
                f"{min(self.cfg.save_every, self.cfg.steps)}); "
                "start a new run with a lower lr"
            )
        return (
            f"{self.last_path} keeps the last state whose weights and loss were finite "
            f"(step {self._saved_step}); start a new run with a lower lr"
        )

    def resume(self) -> None:
        """Continue from ``out_dir/last.pt`` (model, optimiser, step).

        Raises:
            ValueError: Nothing to resume; a setting changed that cannot change (with
                the reason); ``last.pt`` holds another model; ``steps`` does not go past
                the saved step.
        """
        if not self.last_path.exists():
            raise ValueError(f"nothing to resume: {str(self.last_path)!r} does not exist")
        ckpt = load_checkpoint(self.last_path, map_location=self.device)
        saved = ckpt.metadata.get("train_cfg", {})
        # Runs saved before loss_reduction existed were trained with the mean over dims.
        saved = {"loss_reduction": "mean", **saved} if saved else saved
        locked = dict(_LOCKED)
        if saved.get("lr_schedule", self.cfg.lr_schedule) == "cosine":
            locked.update(_LOCKED_COSINE)
        for key, reason in locked.items():
            if key in saved and saved[key] != getattr(self.cfg, key):
                hint = f" (add --set loss_reduction={saved[key]})" if key == "loss_reduction" else (
                    "; start a new run (another --out) to change it"
                )
                raise ValueError(
                    f"cannot resume: setting {key!r} was {saved[key]!r} in the run, now "
                    f"{getattr(self.cfg, key)!r}, and it cannot change on resume ({reason}){hint}"
                )
        if ckpt.config.to_dict() != self.model.cfg.to_dict():
            theirs, ours = ckpt.config.to_dict(), self.model.cfg.to_dict()
            diff = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            raise ValueError(
                f"cannot resume: {self.last_path} holds a different model than this run's config "
                f"builds (" + ", ".join(f"{k}: {theirs.get(k)!r} vs {ours.get(k)!r}" for k in diff[:4])
                + "); it belongs to another run - resume that run's directory instead"
            )
        if ckpt.step >= self.cfg.steps:
            raise ValueError(
                f"cannot resume: the run is at step {ckpt.step}, and steps={self.cfg.steps} asks for "
                f"no more; give --steps larger than {ckpt.step} to train further"
            )
        self.model.load_state_dict(ckpt.model.state_dict())
        if ckpt.optimizer_state is not None:
            try:
                self.optimizer.load_state_dict(ckpt.optimizer_state)
            except (ValueError, KeyError, TypeError, RuntimeError) as err:
                raise ValueError(
                    f"cannot resume: the optimizer state in {self.last_path} does not fit the model "
                    f"({' '.join(str(err).split())[:120]}); it belongs to another run"
                ) from None
        # Settings that may change on resume take effect for real (the saved optimizer
        # state carries the old ones).
        for group in self.optimizer.param_groups:
            group["weight_decay"] = self.cfg.weight_decay
        self.step = ckpt.step
        self._saved_step = ckpt.step

    # -- the loop ------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop_signal = signum

    def train_step(self, step: int, batch: tuple[Tensor, Tensor, Tensor] | None = None) -> float:
        """One optimiser step on the batch of ``step``; returns the loss.

        ``batch`` is that step's batch when it was drawn ahead (:class:`Prefetcher`),
        else it is drawn here.

        The batch is drawn whole and, with ``grad_accum = k``, run as ``k`` micro-batches
        whose losses are each divided by the whole batch's count of scored positions:
        their gradients add up to the whole batch's (up to float rounding), so clipping
        and the update see the same step as without accumulation.
        """
        cfg = self.cfg
        if batch is None:
            batch = self._draw(step)
        inputs, targets, mask = (t.to(self.device) for t in batch)
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
            n_scored = torch.count_nonzero(mask)
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

    def _draw(self, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """The batch of ``step`` (it depends only on the seed and the step), on the CPU."""
        return self.task.batch(self.cfg.batch_size, batch_generator(self.cfg.seed, step))

    @property
    def prefetch_depth(self) -> int:
        """Batches drawn ahead: ``cfg.prefetch``, or for -1, 2 on a CUDA device and 0 on the CPU."""
        if self.cfg.prefetch >= 0:
            return self.cfg.prefetch
        return 2 if self.device.type == "cuda" else 0

    def evaluate(self, cfg: TrainConfig | None = None) -> dict[str, float]:
        """The task's evaluation on fixed held-out traces (same traces every time).

        Args:
            cfg: Settings to evaluate with (default: the run's).
        """
        self.model.eval()
        try:
            with torch.no_grad():
                return self.task.evaluate(
                    self.model, cfg or self.cfg, torch.Generator().manual_seed(12345)
                )
        finally:
            self.model.train()

    def _prepare(self, resume: bool) -> None:
        """Check the run directory and, on resume, load ``last.pt``; nothing is created."""
        self._metric_lines = None
        if resume:
            self.resume()
            metrics_path = self.out_dir / "metrics.jsonl"
            if metrics_path.exists():
                self._metric_lines = read_metrics_lines(metrics_path)
        elif self.last_path.exists():
            raise ValueError(
                f"{str(self.out_dir)!r} already holds a run; pass --resume to continue it or choose a new --out"
            )
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise ValueError(f"--out {str(self.out_dir)!r} is a file, not a directory; choose another --out")

    def run(self, resume: bool = False) -> TrainResult:
        """Train to ``cfg.steps``, writing metrics and checkpoints as it goes.

        Nothing is written before the run directory and (on resume) ``last.pt`` have
        been checked. Temporary files left by an interrupted save (``.last.pt.*.tmp``)
        are removed, with a warning.

        Raises:
            ValueError: The directory holds a run (without ``resume``), or the resume is
                refused (see :meth:`resume`), or another trainer is writing to it.
            TrainingStopped: On SIGINT/SIGTERM (after writing ``last.pt``) or a non-finite loss
                (``last.pt`` keeps the last verified state).
        """
        self._prepare(resume)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_run_dir(self.out_dir):
            for directory in (self.out_dir, self.out_dir / "checkpoints"):
                removed = remove_orphan_temps(directory)
                if removed:
                    warnings.warn(
                        f"removed {len(removed)} temporary file(s) left in {str(directory)!r} by an "
                        f"interrupted save: {', '.join(p.name for p in removed[:3])}"
                        + (" ..." if len(removed) > 3 else ""),
                        UserWarning,
                        stacklevel=2,
                    )
            return self._loop(resume)

    def _loop(self, resume: bool) -> TrainResult:
        cfg = self.cfg
        (self.out_dir / "checkpoints").mkdir(exist_ok=True)
        metrics = MetricsFile(self.out_dir / "metrics.jsonl", self.step if resume else None, self._metric_lines)
        atomic_write_text(self.out_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
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
        early = False
        depth = self.prefetch_depth
        ahead = Prefetcher(self._draw, self.step + 1, cfg.steps, self.device, depth) if depth else None
        try:
            while self.step < cfg.steps:
                if self._stop_signal is not None:
                    self._stop(f"stopped by signal {self._stop_signal}", loss)
                if ahead is None:
                    new_loss = self.train_step(self.step + 1)
                else:
                    new_loss = self.train_step(self.step + 1, ahead.get(self.step + 1))
                if not math.isfinite(new_loss):
                    # train_step returns before the update: the weights are those of step
                    # self.step, and they gave this non-finite loss, so they are not saved.
                    raise TrainingStopped(
                        f"loss became non-finite at step {self.step + 1}; the run stopped and "
                        f"{self._kept()}"
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
                    early = cfg.early_stop_loss > 0 and last_eval.get("val_loss", math.inf) < cfg.early_stop_loss
                if self.step in keep or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0):
                    problem = self._weights_problem()
                    if problem is not None:
                        raise TrainingStopped(
                            f"the weights diverged at step {self.step} ({problem}); the run stopped and "
                            f"{self._kept()}"
                        )
                    self._save(self.out_dir / "checkpoints" / f"step_{self.step:07d}.pt", loss, with_optimizer=False)
                if self.step % cfg.save_every == 0 or self.step == cfg.steps or early:
                    problem = self._save_last(loss)
                    if problem is not None:
                        raise TrainingStopped(
                            f"the weights of step {self.step} failed the NaN guard ({problem}); the run "
                            f"stopped and {self._kept()}"
                        )
                if early:  # validation loss below early_stop_loss
                    bar.write(f"step {self.step}: val_loss below early_stop_loss={cfg.early_stop_loss:g}; stopped")
                    break
        except KeyboardInterrupt:
            self._stop("interrupted", loss)
        finally:
            if ahead is not None:
                ahead.close()
            bar.close()
            for s, handler in old_handlers.items():
                signal.signal(s, handler)
        return TrainResult(self.out_dir, self.step, self.last_path, loss, last_eval)

    def _stop(self, what: str, loss: float) -> None:
        """Save ``last.pt`` (if the state passes the NaN guard) and raise TrainingStopped."""
        if self._saved_step == self.step and self.last_path.exists():
            problem = None  # already saved at this step
        else:
            problem = self._save_last(loss)
        if problem is None:
            raise TrainingStopped(f"{what} at step {self.step}; resume with --resume {self.out_dir}") from None
        raise TrainingStopped(
            f"{what} at step {self.step}, whose weights fail the NaN guard ({problem}); "
            f"{self._kept()}"
        ) from None


def train(
    cfg: TrainConfig,
    out_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    on_start: Callable[[], None] | None = None,
) -> TrainResult:
    """Train a model as ``cfg`` says; see :class:`Trainer`.

    Args:
        cfg: The run's configuration (see :func:`mechlab.train.config.resolve_config`).
        out_dir: Run directory.
        resume: Continue the run in ``out_dir`` from its ``last.pt``.
        progress: Show a progress bar.
        on_start: Called once the settings are checked (the trainer is built, nothing
            written yet): where a command says what it trains, so that a refused setting
            is its only output.

    Returns:
        Where the run stands: step, last checkpoint, final loss and evaluation.
    """
    trainer = Trainer(cfg, out_dir, progress=progress)
    if on_start is not None:
        on_start()
    return trainer.run(resume=resume)
