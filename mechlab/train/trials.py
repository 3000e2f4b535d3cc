"""One state-tracking trial (a model, a task, a training-set size, a learning rate and a
seed) trained to the study's success criterion, and many trials at once.

A trial trains with Adam (no weight decay, no clipping) on batches drawn uniformly from
its ``n_train`` unique training sequences, for a fixed ``steps`` whatever ``n_train``,
and stops early once the validation loss (the mean cross-entropy per scored token,
teacher-forced) is below ``epsilon``, checked every ``eval_every`` steps and after the
last. It is deterministic given its spec: the model is initialised from ``seed`` and the
batch of step ``k`` is drawn from a generator seeded by ``(seed, k)``; the data come from
the task's own ``seed`` (:mod:`mechlab.tasks.state_tracking`).

Trials that share the model, the task (up to ``n_train``), the steps, the batch size,
``epsilon``, ``eval_every`` and the device (one :func:`group_key`) can train as one
batched ensemble (:mod:`mechlab.train.ensemble`); :func:`mechlab.train.dispatch.run_trials`,
above both, decides which.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from mechlab._deprecated import moved_names
from mechlab.devices import check_device
from mechlab.models import build_model
from mechlab.models.base import MechModel
from mechlab.tasks.state_tracking import (
    StateTrackingConfig,
    StateTrackingData,
    make_data,
    masked_cross_entropy,
    set_accuracy,
    set_loss,
    set_loss_by_length,
    training_sizes,
)
from mechlab.train.seeding import batch_generator


@dataclass
class TrialSpec:
    """One trial.

    Args:
        model: A :func:`mechlab.build_model` config dict, e.g. ``{"preset":
            "st_transformer_small"}``; ``io``, ``d_vocab``, ``d_vocab_out`` and ``n_ctx``
            are filled in from the task.
        task: :class:`StateTrackingConfig` fields (``n_train``, if given, must equal
            ``n_train`` below).
        n_train: Unique training sequences.
        lr: Adam's learning rate.
        seed: Seeds the model initialisation and the batches.
        steps: Optimiser steps (the most; fewer when the run converges).
        batch_size: Sequences per step.
        epsilon: Success: validation loss below this.
        eval_every: Steps between validation checks.
        device: ``"cpu"`` or ``"cuda"``.
    """

    model: dict
    task: dict
    n_train: int
    lr: float
    seed: int
    steps: int = 250_000
    batch_size: int = 64
    epsilon: float = 1e-4
    eval_every: int = 500
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.model, dict) or not isinstance(self.task, dict):
            raise ValueError("model and task must be mappings of config fields")
        for name in ("n_train", "seed", "steps", "batch_size", "eval_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in ("n_train", "steps", "batch_size", "eval_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("lr", "epsilon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
            setattr(self, name, float(value))
        if not isinstance(self.device, str) or not self.device.strip():
            raise ValueError(f"device must be a name such as 'cpu' or 'cuda', got {self.device!r}")
        if "n_train" in self.task and self.task["n_train"] != self.n_train:
            raise ValueError(
                f"task n_train={self.task['n_train']!r} differs from the trial's n_train={self.n_train}; "
                "give it once, as the trial's n_train"
            )
        training_sizes(self.task_config())  # N larger than what exists fails here, before any work

    def task_config(self) -> StateTrackingConfig:
        """The task with this trial's ``n_train``."""
        return StateTrackingConfig.from_dict({**self.task, "n_train": self.n_train})

    def model_config(self) -> dict[str, Any]:
        """The model config with the task's token fields filled in."""
        cfg = self.task_config()
        return {**self.model, "io": "tokens", "d_vocab": cfg.d_vocab, "d_vocab_out": cfg.d_vocab_out,
                "n_ctx": cfg.n_ctx}  # fmt: skip


def as_spec(spec: TrialSpec | dict[str, Any]) -> TrialSpec:
    """A :class:`TrialSpec` from itself or a dict of its fields.

    Raises:
        ValueError: Unknown or invalid fields.
    """
    if isinstance(spec, TrialSpec):
        return spec
    if not isinstance(spec, dict):
        raise ValueError(f"a trial spec must be a TrialSpec or a dict, not {type(spec).__name__}")
    known = {f.name for f in dataclasses.fields(TrialSpec)}
    unknown = sorted(set(spec) - known)
    missing = sorted(f.name for f in dataclasses.fields(TrialSpec)
                     if f.default is dataclasses.MISSING and f.name not in spec)  # fmt: skip
    if unknown or missing:
        raise ValueError(f"bad trial spec: unknown field(s) {unknown}, missing {missing}; known: {sorted(known)}")
    return TrialSpec(**spec)


def init_model(spec: TrialSpec) -> MechModel:
    """The trial's freshly initialised model (from ``spec.seed``; the global RNG is untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = build_model(spec.model_config())
    return model.to(check_device(spec.device))


def trial_result(
    spec: TrialSpec,
    best: float,
    converged: bool,
    steps_run: int,
    ood: dict[str, float],
    seconds: float,
    best_by_length: dict[int, float] | None = None,
) -> dict[str, Any]:
    """The result dict of a finished trial (see :func:`run_trial`)."""
    out = {"val_loss": float(best), "converged": bool(converged), "steps_run": int(steps_run),
           "ood_token_acc": float(ood["token_acc_norm"]), "ood_seq_acc": float(ood["seq_acc_norm"]),
           "seconds": float(seconds), "spec": dataclasses.asdict(spec)}  # fmt: skip
    if best_by_length is not None:
        out["val_loss_by_length"] = {str(n): float(v) for n, v in sorted(best_by_length.items())}
    return out


def run_trial(spec: TrialSpec | dict[str, Any], data: StateTrackingData | None = None) -> dict[str, Any]:
    """Train one trial to convergence or ``steps``.

    Args:
        spec: The trial.
        data: Its task's data, if already drawn (must be ``make_data(spec.task_config())``).

    Returns:
        ``val_loss`` (the best validation loss seen), ``val_loss_by_length`` (``{"n": loss}``
        of each length's validation sequences at that same evaluation: which length kept a
        mixture above epsilon), ``converged`` (it went below ``epsilon``), ``steps_run``, ``ood_token_acc`` and ``ood_seq_acc`` (chance-normalised
        accuracy at the OOD length, of the final model), ``seconds`` and ``spec``.
    """
    spec = as_spec(spec)
    start = time.perf_counter()
    cfg = spec.task_config()
    device = check_device(spec.device)
    data = (data or make_data(cfg)).to(device)
    model = init_model(spec)
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.lr)
    best, best_by_length, converged, step = math.inf, None, False, 0
    while step < spec.steps and not converged:
        step += 1
        tokens, targets, mask = data.batch(spec.batch_size, batch_generator(spec.seed, step))
        loss = masked_cross_entropy(model(tokens), targets, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % spec.eval_every == 0 or step == spec.steps:
            model.eval()
            val = set_loss(model, cfg, data.val)
            if val < best:
                best, best_by_length = val, set_loss_by_length(model, cfg, data.val)
            model.train()
            converged = val < spec.epsilon
    model.eval()
    ood = set_accuracy(model, cfg, data.ood)
    return trial_result(spec, best, converged, step, ood, time.perf_counter() - start, best_by_length)


def group_key(spec: TrialSpec) -> str:
    """Trials with equal keys can be trained as one ensemble."""
    task = {k: v for k, v in spec.task.items() if k != "n_train"}
    return json.dumps([spec.model_config(), task, spec.steps, spec.batch_size, spec.epsilon,
                       spec.eval_every, spec.device], sort_keys=True, default=str)  # fmt: skip


__getattr__ = moved_names(__name__)  # run_trials, ENSEMBLE_FAMILIES: mechlab.train.dispatch
