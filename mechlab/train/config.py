"""The trainer's configuration: presets, YAML files and ``--set key=value`` overrides."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import StrictFloat, StrictInt, StrictStr

from mechlab.limits import check_elements
from mechlab.schema import load_yaml, parse_yaml, validate
from mechlab.tasks.registry import get_task, task_names
from mechlab.train.bundled import BUNDLED_PRESETS

TASKS = task_names()  # the built-in tasks; a task registered later is checked through get_task
LR_SCHEDULES = ("constant", "cosine")
LOSS_REDUCTIONS = ("sum", "mean")
TARGET_WEIGHT_NORMS = ("none", "trace")
_AFTER = re.compile(r"^([0-9]+)-after$")
_INT_FIELDS = (
    "steps", "batch_size", "grad_accum", "warmup_steps", "seed", "log_every", "eval_every", "eval_traces",
    "eval_haystack", "eval_seg_len", "n_checkpoints", "save_every", "prefetch", "checkpoint_every",
)
_FLOAT_FIELDS = ("lr", "weight_decay", "grad_clip", "min_lr_ratio", "early_stop_loss")


@dataclass
class TrainConfig:
    """Everything a training run needs; saved beside the run and in every checkpoint.

    Args:
        task: Task name (``"lds"``: interleaved linear systems; ``"state_tracking"``: Z_m / S_5;
            ``"induction"``: repeated random tokens).
        task_cfg: Fields of the task's config (e.g. ``LDSConfig``) that differ from its defaults.
        model: Model config for :func:`mechlab.build_model` (``{"preset": "tiny"}``,
            ``{"arch": "lstm", "d_model": 64}``, ...). ``d_in``, ``d_out`` and ``n_ctx`` are
            filled in from the task.
        steps: Optimiser steps in total.
        batch_size: Traces per optimiser step (all micro-batches together).
        grad_accum: Micro-batches each step's batch is split into (gradients accumulated;
            ``batch_size`` must be a multiple): the same step with less memory.
        lr: Peak learning rate (AdamW).
        weight_decay: AdamW weight decay.
        grad_clip: Gradient-norm clipping (0 disables).
        loss_reduction: How the squared error is reduced over the state dims: ``"sum"``
            (the study's; the zero predictor scores ``E||y||^2 = 1``) or ``"mean"`` (``1/d``
            of that; the bundled ``recall-cpu`` run's). Either way it is averaged over the
            scored positions. It sets the gradient's scale, hence how often clipping acts.
        warmup_steps: Linear learning-rate warm-up.
        lr_schedule: ``"constant"`` (the study's) or ``"cosine"`` decay after warm-up.
        min_lr_ratio: Floor of the cosine schedule, as a fraction of ``lr``.
        seed: Seeds the model initialisation and, with the step number, every batch.
        device: ``"cpu"`` or ``"cuda"``.
        log_every: Steps between metrics lines.
        eval_every: Steps between evaluations (0: only at the end).
        eval_traces: Traces per evaluation (state tracking: OOD sequences; its validation
            set is always evaluated whole).
        early_stop_loss: Stop once an evaluation's ``val_loss`` is below this (0 disables;
            the state-tracking study's success criterion is 1e-4).
        eval_haystack: Haystack systems in the evaluation's needle-in-a-haystack suite.
        eval_seg_len: Observations per haystack segment in that suite.
        n_checkpoints: Log-spaced checkpoints kept for training-dynamics analysis.
        checkpoint_every: Also keep a checkpoint every this many steps (0: only the
            log-spaced ones), for dense training dynamics through a transition.
        save_every: Steps between refreshes of ``last.pt`` (what ``--resume`` continues from).
        prefetch: Batches drawn ahead in a background thread (:mod:`mechlab.train.prefetch`;
            the same batches either way). -1: 2 on a CUDA device, 0 (none) on the CPU.
        target_weights: ``lds`` task only: loss weights by a target's place in its
            segment, ``{"1-after": 4.0}`` weighs every observation that directly follows
            an open label by 4 and every other observation by 1 (``"k-after"``: the
            ``k``-th observation of a segment). Empty (the default): the plain loss.
        target_weight_norm: ``"none"``: the weighted squared errors are divided by the
            count of scored positions, as the plain loss is (the total weight grows with
            the weights); ``"trace"``: each trace's weights are rescaled to sum to its
            count of scored positions (the same total weight per trace; the other
            positions lose what the weighted ones gain).
    """

    task: StrictStr = "lds"
    task_cfg: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny"})
    steps: StrictInt = 1000
    batch_size: StrictInt = 64
    grad_accum: StrictInt = 1
    lr: StrictFloat = 1e-3
    weight_decay: StrictFloat = 0.01
    grad_clip: StrictFloat = 1.0
    loss_reduction: StrictStr = "sum"
    warmup_steps: StrictInt = 0
    lr_schedule: StrictStr = "constant"
    min_lr_ratio: StrictFloat = 0.1
    seed: StrictInt = 0
    device: StrictStr = "cpu"
    log_every: StrictInt = 10
    eval_every: StrictInt = 500
    eval_traces: StrictInt = 256
    eval_haystack: StrictInt = 7
    eval_seg_len: StrictInt = 10
    n_checkpoints: StrictInt = 12
    save_every: StrictInt = 200
    early_stop_loss: StrictFloat = 0.0
    prefetch: StrictInt = -1
    checkpoint_every: StrictInt = 0
    target_weights: dict[str, StrictFloat] = field(default_factory=dict)
    target_weight_norm: StrictStr = "none"

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            setattr(self, name, float(value))
        get_task(self.task)  # a one-line ValueError for a task mechlab does not know
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; choose one of {list(LR_SCHEDULES)}")
        if self.loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(
                f"unknown loss_reduction {self.loss_reduction!r}; choose one of {list(LOSS_REDUCTIONS)}"
            )
        for name in (
            "steps", "batch_size", "grad_accum", "log_every", "eval_traces", "eval_haystack",
            "eval_seg_len", "save_every",
        ):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"batch_size={self.batch_size} is not a multiple of grad_accum={self.grad_accum}; "
                "choose a batch_size that grad_accum divides"
            )
        for name in ("eval_every", "warmup_steps", "n_checkpoints", "checkpoint_every"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.prefetch < -1:
            raise ValueError(f"prefetch must be >= 0, or -1 for the device's default, got {self.prefetch!r}")
        if self.early_stop_loss < 0:
            raise ValueError(f"early_stop_loss must be >= 0 (0 disables it), got {self.early_stop_loss!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")
        if not isinstance(self.device, str) or not self.device.strip():
            raise ValueError(f"device must be a name such as 'cpu' or 'cuda', got {self.device!r}")
        if not isinstance(self.model, dict) or not isinstance(self.task_cfg, dict):
            raise ValueError("model and task_cfg must be mappings of config fields")
        self._check_counts()
        self.target_weights = {f"{k}-after": w for k, w in target_offsets(self.target_weights).items()}
        if self.target_weight_norm not in TARGET_WEIGHT_NORMS:
            raise ValueError(f"unknown target_weight_norm {self.target_weight_norm!r}; choose one of "
                             f"{list(TARGET_WEIGHT_NORMS)}")  # fmt: skip
        if self.target_weights and not get_task(self.task).target_weights:
            raise ValueError(f"target_weights weigh the lds task's observation targets; the {self.task} "
                             "task has none (remove target_weights)")  # fmt: skip

    def _check_counts(self) -> None:
        """Counts before work: what a run draws and keeps must be representable and fit."""
        # Every batch is drawn from a generator seeded by seed * 1_000_003 + step (a 64-bit
        # seed), and the examples seen (steps x batch_size) are recorded as 64-bit integers.
        if abs(self.seed) * 1_000_003 + self.steps >= 2**63:
            raise ValueError(
                f"steps={self.steps} with seed={self.seed} overflows the 64-bit seed of the batches; "
                "lower steps or seed"
            )
        if self.steps * self.batch_size >= 2**63:
            raise ValueError(
                f"steps x batch_size = {self.steps * self.batch_size:.3g} training examples is more than "
                "a 64-bit count holds; lower steps or batch_size"
            )
        # The log-spaced checkpoint steps are computed as an array of n_checkpoints values.
        check_elements("the log-spaced checkpoint steps", {"n_checkpoints": self.n_checkpoints})

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (what checkpoints and ``config.yaml`` hold)."""
        return copy.deepcopy(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "training settings") -> TrainConfig:
        """Build from a dict (a YAML file's, a checkpoint's), checking every field's type
        against the annotations above and refusing unknown keys with the list of known ones.

        Raises:
            ValueError: One line naming ``source`` and the field.
        """
        if not isinstance(values, dict):
            raise ValueError(f"{source} must be a mapping of settings, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known, key=str)
        if unknown:
            raise ValueError(f"{source}: unknown training setting(s) {unknown}; known: {sorted(known)}")
        return validate(cls, copy.deepcopy(values), source, "fix the setting")


def target_offsets(weights: Any) -> dict[int, float]:
    """``{"k-after": w}`` as ``{k: w}``, checked: ``k >= 1``, ``w`` finite and positive.

    Args:
        weights: A mapping of ``"k-after"`` names (the ``k``-th observation of a segment,
            ``1-after`` the one right after the open label) to loss weights.

    Returns:
        The weights by offset ``k``, in increasing ``k``.

    Raises:
        ValueError: Not a mapping, a name that is not ``k-after`` with ``k >= 1``, or a
            weight that is not a finite positive number.
    """
    if not isinstance(weights, dict):
        raise ValueError(f"target_weights must map target names to weights, e.g. {{1-after: 4}}, got {weights!r}")
    out: dict[int, float] = {}
    for name, w in weights.items():
        match = _AFTER.match(str(name).strip())
        if match is None or int(match.group(1)) < 1:
            raise ValueError(f"unknown target {name!r} in target_weights; name a target k-after with k >= 1 "
                             "(1-after: the observation right after an open label)")  # fmt: skip
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"target weight {name}={w!r} must be a finite number > 0")
        out[int(match.group(1))] = float(w)
    return dict(sorted(out.items()))


# The recall study's presets (Daniels et al., arXiv 2507.01414): the loss summed over the
# state dims, as in the study's code. Its medium run took 3 GPUs x 512 = 1536 traces per step; here that is one
# step of 3 accumulated micro-batches of 512 (the micro-batch the study fit in memory).
# A preset is a partial TrainConfig dict; the CPU-sized bundled ones are in bundled.py.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"model": {"preset": "tiny"}, "batch_size": 2048, "lr": 1.268e-4, "steps": 200_000,
             "loss_reduction": "sum"},
    "small": {"model": {"preset": "small"}, "batch_size": 1024, "lr": 4.48e-5, "steps": 200_000,
              "loss_reduction": "sum"},
    "medium": {"model": {"preset": "medium"}, "batch_size": 1536, "grad_accum": 3, "lr": 1.585e-5,
               "steps": 200_000, "loss_reduction": "sum"},
    "big": {"model": {"preset": "big"}, "batch_size": 640, "lr": 1.477e-5, "steps": 200_000,
            "loss_reduction": "sum"},
    # The state-tracking study (Ebrahimi et al. 2026): Adam (no weight decay, no clipping),
    # batch 64, 250k steps, success at validation loss < 1e-4; its 6 x 256 transformer.
    "state-tracking": {"task": "state_tracking", "model": {"preset": "st_transformer_6x256"}, "batch_size": 64,
                       "lr": 1e-3, "weight_decay": 0.0, "grad_clip": 0.0, "steps": 250_000,
                       "early_stop_loss": 1e-4, "eval_every": 500, "eval_traces": 2000},
    # The same on 2 CPU cores: a 2 x 64 transformer, a few thousand steps.
    "state-tracking-cpu": {"task": "state_tracking", "model": {"preset": "st_transformer_small"},
                           "batch_size": 64, "lr": 1e-3, "weight_decay": 0.0, "grad_clip": 0.0,
                           "steps": 3000, "early_stop_loss": 1e-4, "eval_every": 250, "eval_traces": 500,
                           "n_checkpoints": 6},
}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``key.sub=value`` (value read as YAML: numbers, bools, lists, strings).

    Raises:
        ValueError: Text without ``=`` or with an empty key.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"bad override {text!r}: expected key=value, e.g. lr=3e-4 or model.d_model=64")
    value = parse_yaml(raw, f"the value of override {text!r}", "quote it or fix it") if raw.strip() else ""
    if isinstance(value, str):
        # YAML 1.1 reads "2e-3" (no dot) as a string; users mean a number.
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return key.strip().split("."), value


def resolve_config(
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    **fields: Any,
) -> TrainConfig:
    """Combine a preset, a YAML file, ``--set`` overrides and keyword fields, in that order.

    Args:
        preset: A key of ``PRESETS`` (or of the bundled-task presets).
        config_file: YAML file holding a (partial) TrainConfig mapping.
        overrides: ``key=value`` strings; dotted keys reach into ``model``, ``task_cfg``
            and ``target_weights`` (``target_weights.1-after=4``).
        **fields: Final TrainConfig fields (what CLI flags like ``--steps`` set); ``None`` is ignored.

    Returns:
        The validated config.
    """
    values: dict[str, Any] = {}
    if preset is not None:
        all_presets = available_presets()
        if preset not in all_presets:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(all_presets)}")
        values = _merge(values, all_presets[preset])
    if config_file is not None:
        path = Path(config_file)
        loaded = load_yaml(path, "config file")
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"config file {str(path)!r} must hold a mapping of settings")
        values = _merge(values, loaded or {})
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    for text in overrides:
        keys, value = parse_override(text)
        if keys[0] not in known:
            raise ValueError(f"unknown setting {keys[0]!r} in override {text!r}; known: {sorted(known)}")
        if len(keys) > 1 and keys[0] not in ("model", "task_cfg", "target_weights"):
            raise ValueError(f"setting {keys[0]!r} has no sub-fields (override {text!r})")
        target = values
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = value
    values.update({k: v for k, v in fields.items() if v is not None})
    return TrainConfig.from_dict(values)


def available_presets() -> dict[str, dict[str, Any]]:
    """The study presets plus the bundled CPU-sized ones."""
    return {**PRESETS, **BUNDLED_PRESETS}
