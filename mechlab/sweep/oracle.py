"""A synthetic trial whose N* is known: the sweep machinery's test bench.

:class:`OracleTrial` takes a trial spec (the dict :func:`mechlab.train.trials.run_trial`
takes) and "converges" (validation loss 0, else 1) iff ``n_train`` reaches a threshold
that depends on the task and the configuration, so the true N* of a grid is the
smallest threshold over its configurations. No model is trained; it answers at once
(or after ``sleep`` seconds), which makes it the stand-in for real trials when testing
the search, kappa and the Ray runner.

The default threshold of a task with length distribution ``lengths`` and longest length
L is ``scale * m * L`` for ``fixed`` and ``scale * m * L * joint_factor`` for the joint
distributions, times a per-configuration factor ``1 + lr_spread * |log10(lr / 1e-3)| +
seed_spread * (seed mod 7)`` (the configuration lr = 1e-3, seed a multiple of 7 has
the base threshold). ``thresholds`` overrides the base per task, keyed by
:func:`oracle_key`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def oracle_key(task: Mapping[str, Any], model: Mapping[str, Any] | None = None) -> str:
    """The key of a task (and, optionally, a model) in :attr:`OracleTrial.thresholds`:
    ``"<lengths>:<L>"`` or ``"<model name>:<lengths>:<L>"`` (the model's ``preset``,
    ``arch`` or ``name``)."""
    base = f"{task['lengths']}:{task['L']}"
    if model is None:
        return base
    name = model.get("name") or model.get("preset") or model.get("arch")
    return f"{name}:{base}"


@dataclass(frozen=True)
class OracleTrial:
    """A trial function with a known threshold (module docs).

    Args:
        scale: Base threshold per unit of m * L.
        joint_factor: Factor of the joint distributions' base threshold (kappa of the
            oracle is about ``sum(n) / (L * joint_factor)``).
        lr_spread: How much the threshold grows per decade of lr away from 1e-3.
        seed_spread: How much it grows per unit of ``seed mod 7``.
        thresholds: Base thresholds by :func:`oracle_key` (with the model first, or
            the task alone); they replace the formula.
        sleep: Seconds each trial takes.
        crash_dir: If set, the first attempt of each trial whose seed is in
            ``crash_seeds`` ends its own process (``os._exit(1)``) after leaving a
            marker file here; the next attempt runs normally. For testing retries.
        crash_seeds: The seeds that crash once.
    """

    scale: float = 1.0
    joint_factor: float = 1.0
    lr_spread: float = 0.5
    seed_spread: float = 0.1
    thresholds: dict[str, float] = field(default_factory=dict)
    sleep: float = 0.0
    crash_dir: str | None = None
    crash_seeds: tuple[int, ...] = ()

    def base(self, task: Mapping[str, Any], model: Mapping[str, Any] | None = None) -> float:
        """The base threshold of a task (before the configuration's factor)."""
        for key in ((oracle_key(task, model),) if model is not None else ()) + (oracle_key(task),):
            if key in self.thresholds:
                return float(self.thresholds[key])
        m = 120 if task.get("group") == "s5" else int(task["m"])
        joint = 1.0 if task["lengths"] == "fixed" else self.joint_factor
        return self.scale * m * int(task["L"]) * joint

    def factor(self, lr: float, seed: int) -> float:
        """The configuration's factor (>= 1)."""
        return 1.0 + self.lr_spread * abs(math.log10(lr / 1e-3)) + self.seed_spread * (int(seed) % 7)

    def threshold(self, spec: Mapping[str, Any]) -> int:
        """The smallest ``n_train`` at which this configuration converges."""
        value = self.base(spec["task"], spec.get("model")) * self.factor(spec["lr"], spec["seed"])
        return math.ceil(value - 1e-9)

    def __call__(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Run one synthetic trial; returns the fields ``run_trial`` returns."""
        spec = dict(spec if isinstance(spec, Mapping) else vars(spec))
        started = time.perf_counter()
        if self.crash_dir is not None and int(spec["seed"]) in self.crash_seeds:
            marker = Path(self.crash_dir) / f"crashed-{spec['n_train']}-{spec['lr']:g}-{spec['seed']}"
            if not marker.exists():
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(str(os.getpid()))
                os._exit(1)  # the worker process dies, as if killed
        if self.sleep:
            time.sleep(self.sleep)
        threshold = self.threshold(spec)
        ok = int(spec["n_train"]) >= threshold
        ood = min(1.0, int(spec["n_train"]) / (10.0 * threshold))
        return {
            "val_loss": 0.0 if ok else 1.0, "converged": ok,
            "steps_run": int(spec.get("steps", 0)) // (2 if ok else 1),
            "ood_token_acc": ood, "ood_seq_acc": ood**2,
            "seconds": time.perf_counter() - started, "spec": spec,
        }  # fmt: skip


#: The default oracle (``--trial mechlab.sweep.oracle:oracle_trial``).
oracle_trial = OracleTrial()
