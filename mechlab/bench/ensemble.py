"""The gain of training the state-tracking study's 15-configuration grid (3 learning rates x
5 seeds) as one batched ensemble instead of one trial after another.

Both contenders train the same trials for the same steps (``epsilon`` is set so low that
no trial stops early) and end with the same evaluation; they are timed side by side,
interleaved, and compared by their medians.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mechlab.bench.record import Table
from mechlab.bench.timing import fmt_ratio, paired_ratio, time_interleaved
from mechlab.models import build_model
from mechlab.train.ensemble import train_ensemble
from mechlab.train.trials import TrialSpec, run_trial

STUDY_LRS = (1e-3, 1e-4, 1e-5)
STUDY_SEEDS = (10, 20, 30, 40, 50)
BENCH_TASK = {"group": "zm", "m": 5, "L": 6, "format": "acot", "lengths": "uniform", "n_val": 256,
              "n_ood": 64}  # fmt: skip


@dataclass
class EnsembleRow:
    """One model's timings: seconds for the whole grid, one by one and as an ensemble."""

    preset: str
    n_params: int
    sequential: float
    ensemble: float
    sequential_iqr: tuple[float, float]
    ensemble_iqr: tuple[float, float]
    gain_spread: tuple[float, float, float] | None = None  # one by one / ensemble, run by run

    @property
    def gain(self) -> float:
        """How many times faster the ensemble trains the grid."""
        return self.sequential / self.ensemble


@dataclass
class EnsembleBenchResult:
    """Every measured model, with the settings."""

    rows: list[EnsembleRow]
    settings: dict[str, Any] = field(default_factory=dict)

    def format_table(self) -> str:
        s = self.settings
        lines = [
            f"{s['members']} trials ({s['lrs']} x seeds {s['seeds']}), {s['steps']} steps of batch "
            f"{s['batch_size']}, task {s['task']}, n_train {s['n_train']}, threads {s['threads']}, "
            f"device {s['device']}, medians of {s['repeats']} (+1 warm-up)",
            f"{'preset':24s} {'params':>9s} {'one by one s':>13s} {'ensemble s':>11s} {'gain':>6s}",
        ]
        for r in self.rows:
            lines.append(f"{r.preset:24s} {r.n_params:9,d} {r.sequential:13.2f} {r.ensemble:11.2f} {r.gain:5.2f}x")
        return "\n".join(lines)

    def table(self) -> Table:
        """The result as a :class:`~mechlab.bench.record.Table` (medians [quartiles])."""
        s = self.settings
        title = (f"{s['members']} trials ({s['lrs']} x seeds {s['seeds']}), {s['steps']} steps of batch "
                 f"{s['batch_size']}, n_train {s['n_train']}, medians of {s['repeats']} (+1 warm-up)")  # fmt: skip
        cells, values = [], []
        for r in self.rows:
            gain = r.gain_spread or (r.gain, r.gain, r.gain)
            cells.append([f"`{r.preset}`", f"{r.n_params:,}", f"{r.sequential:.2f} [{r.sequential_iqr[0]:.2f}-"
                          f"{r.sequential_iqr[1]:.2f}]", f"{r.ensemble:.2f} [{r.ensemble_iqr[0]:.2f}-"
                          f"{r.ensemble_iqr[1]:.2f}]", fmt_ratio(gain)])  # fmt: skip
            values.append({"preset": r.preset, "n_params": r.n_params, "sequential_s": r.sequential,
                           "ensemble_s": r.ensemble, "gain": r.gain})  # fmt: skip
        return Table(["preset", "parameters", "one by one s", "ensemble s", "gain"], cells, title, values)


def grid_specs(
    preset: str, task: dict[str, Any], n_train: int, steps: int, batch_size: int = 64, device: str = "cpu"
) -> list[TrialSpec]:
    """The study's 15 trials (3 learning rates x 5 seeds) of one model, none stopping early."""
    return [
        TrialSpec(model={"preset": preset}, task=dict(task), n_train=n_train, lr=lr, seed=seed, steps=steps,
                  batch_size=batch_size, epsilon=1e-30, eval_every=steps, device=device)  # fmt: skip
        for lr in STUDY_LRS
        for seed in STUDY_SEEDS
    ]


def bench_ensemble(
    presets: list[str],
    task: dict[str, Any] | None = None,
    n_train: int = 2000,
    steps: int = 50,
    batch_size: int = 64,
    repeats: int = 3,
    threads: int | None = 1,
    device: str = "cpu",
) -> EnsembleBenchResult:
    """Time the 15-trial grid one trial after another vs as one ensemble, per model.

    Args:
        presets: Model presets (e.g. ``["st_transformer_small", "st_lstm_small"]``).
        task: :class:`~mechlab.tasks.state_tracking.StateTrackingConfig` fields
            (default :data:`BENCH_TASK`).
        n_train: Training sequences of every trial.
        steps: Optimiser steps of every trial.
        batch_size: Sequences per step.
        repeats: Timed runs of each contender (after one warm-up run each).
        threads: Torch CPU threads during the measurement (None: torch's default).
        device: ``"cpu"`` or ``"cuda"``.

    Returns:
        The timings, one row per preset.
    """
    task = dict(BENCH_TASK if task is None else task)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    rows = []
    try:
        for preset in presets:
            specs = grid_specs(preset, task, n_train, steps, batch_size, device)
            n_params = sum(p.numel() for p in build_model(specs[0].model_config()).parameters())
            timings = time_interleaved(
                {"sequential": lambda specs=specs: [run_trial(s) for s in specs],
                 "ensemble": lambda specs=specs: train_ensemble(specs)},  # fmt: skip
                repeats=repeats,
            )
            seq, ens = timings["sequential"], timings["ensemble"]
            rows.append(EnsembleRow(preset, n_params, seq.median, ens.median, (seq.q1, seq.q3), (ens.q1, ens.q3),
                                    paired_ratio(seq, ens)))  # fmt: skip
    finally:
        torch.set_num_threads(old_threads)
    settings = {"members": len(STUDY_LRS) * len(STUDY_SEEDS), "lrs": list(STUDY_LRS), "seeds": list(STUDY_SEEDS),
                "steps": steps, "batch_size": batch_size, "task": task, "n_train": n_train,
                "threads": torch.get_num_threads() if threads is None else threads, "device": device,
                "repeats": repeats}  # fmt: skip
    return EnsembleBenchResult(rows, settings)
