"""The joining layer: open a checkpoint once, pick its task and data, run an analysis,
write the outputs.

Everything below (:mod:`mechlab.prune`, :mod:`mechlab.evals`,
:mod:`mechlab.label_vs_observation`, the patching and probe utilities) computes on models
and traces and knows no checkpoint file; everything above (:mod:`mechlab.cli`) only
parses and prints. Every entry point takes a :class:`~mechlab.checkpoint.Checkpoint` or a
path (:data:`Source`), and opens it once (:func:`open_checkpoint`); every file a command
writes goes through :mod:`mechlab.pipelines.outputs`.

Modules: :mod:`~mechlab.pipelines.checkpoints` (opening), :mod:`~mechlab.pipelines.data`
(a checkpoint's traces), :mod:`~mechlab.pipelines.prune`, :mod:`~mechlab.pipelines.curves`,
:mod:`~mechlab.pipelines.circuits` (view, overlap), :mod:`~mechlab.pipelines.evaluate`,
:mod:`~mechlab.pipelines.prompts` (prompt pairs of models you bring),
:mod:`~mechlab.pipelines.recall`, :mod:`~mechlab.pipelines.report`,
:mod:`~mechlab.pipelines.through_training` (circuits of every checkpoint of a run),
:mod:`~mechlab.pipelines.train`, :mod:`~mechlab.pipelines.sweep`,
:mod:`~mechlab.pipelines.translation` and :mod:`~mechlab.pipelines.translation_prune`
(starting vs continuing a translation across checkpoints, and its circuits),
:mod:`~mechlab.pipelines.outputs` (writing), :mod:`~mechlab.pipelines.preflight` (the checks
a command makes before torch loads), :mod:`~mechlab.pipelines.stops` (a run stopped by a
signal: what it kept).

The names load their module on first use (a command imports only the pipeline it runs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mechlab._deprecated import moved_names

if TYPE_CHECKING:  # for type checkers and IDEs; at run time every name loads on first use
    from mechlab.pipelines.checkpoints import Source, describe, open_checkpoint
    from mechlab.pipelines.circuits import load_circuits, overlap_circuits, view_circuits
    from mechlab.pipelines.curves import curve_checkpoint
    from mechlab.pipelines.data import check_prune_targets, checkpoint_prune_data, circuit_data
    from mechlab.pipelines.evaluate import eval_dynamics, evaluate_checkpoint, run_suite
    from mechlab.pipelines.joint import joint_prune_checkpoint, joint_prune_targets
    from mechlab.pipelines.methods import METHODS, check_method
    from mechlab.pipelines.prompts import prune_prompts, write_ioi_pairs
    from mechlab.pipelines.prune import (
        PRUNE_RECIPES,
        prune_checkpoint,
        prune_recipe,
        prune_targets,
    )
    from mechlab.pipelines.recall import recall_and_write, recall_checkpoint, recall_dynamics
    from mechlab.pipelines.report import (
        Report,
        ReportConfig,
        ReportRun,
        make_report,
        report_checkpoint,
    )
    from mechlab.pipelines.stops import Interrupted
    from mechlab.pipelines.sweep import sweep_spec, write_outputs
    from mechlab.pipelines.through_training import prune_through_training
    from mechlab.pipelines.train import run_config, train_run
    from mechlab.pipelines.translation import checkpoint_series, translation_across_training
    from mechlab.pipelines.translation_prune import translation_circuits

_LAZY = {
    "check_method": "mechlab.pipelines.methods",
    "check_prune_targets": "mechlab.pipelines.data",
    "checkpoint_prune_data": "mechlab.pipelines.data",
    "circuit_data": "mechlab.pipelines.data",
    "curve_checkpoint": "mechlab.pipelines.curves",
    "describe": "mechlab.pipelines.checkpoints",
    "eval_dynamics": "mechlab.pipelines.evaluate",
    "Interrupted": "mechlab.pipelines.stops",
    "evaluate_checkpoint": "mechlab.pipelines.evaluate",
    "joint_prune_checkpoint": "mechlab.pipelines.joint",
    "joint_prune_targets": "mechlab.pipelines.joint",
    "load_circuits": "mechlab.pipelines.circuits",
    "make_report": "mechlab.pipelines.report",
    "METHODS": "mechlab.pipelines.methods",
    "open_checkpoint": "mechlab.pipelines.checkpoints",
    "overlap_circuits": "mechlab.pipelines.circuits",
    "prune_checkpoint": "mechlab.pipelines.prune",
    "prune_recipe": "mechlab.pipelines.prune",
    "PRUNE_RECIPES": "mechlab.pipelines.prune",
    "prune_targets": "mechlab.pipelines.prune",
    "prune_prompts": "mechlab.pipelines.prompts",
    "prune_through_training": "mechlab.pipelines.through_training",
    "recall_and_write": "mechlab.pipelines.recall",
    "recall_checkpoint": "mechlab.pipelines.recall",
    "recall_dynamics": "mechlab.pipelines.recall",
    "Report": "mechlab.pipelines.report",
    "ReportConfig": "mechlab.pipelines.report",
    "ReportRun": "mechlab.pipelines.report",
    "report_checkpoint": "mechlab.pipelines.report",
    "run_config": "mechlab.pipelines.train",
    "run_suite": "mechlab.pipelines.evaluate",
    "Source": "mechlab.pipelines.checkpoints",
    "sweep_spec": "mechlab.pipelines.sweep",
    "train_run": "mechlab.pipelines.train",
    "view_circuits": "mechlab.pipelines.circuits",
    "write_ioi_pairs": "mechlab.pipelines.prompts",
    "write_outputs": "mechlab.pipelines.sweep",
    "checkpoint_series": "mechlab.pipelines.translation",
    "translation_across_training": "mechlab.pipelines.translation",
    "translation_circuits": "mechlab.pipelines.translation_prune",
}


_moved = moved_names(__name__)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    return _moved(name)  # PRUNE_PROTOCOLS, prune_protocol: renamed PRUNE_RECIPES, prune_recipe


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Interrupted",
    "METHODS",
    "PRUNE_RECIPES",
    "Report",
    "ReportConfig",
    "ReportRun",
    "Source",
    "check_method",
    "check_prune_targets",
    "checkpoint_series",
    "checkpoint_prune_data",
    "circuit_data",
    "curve_checkpoint",
    "describe",
    "eval_dynamics",
    "evaluate_checkpoint",
    "joint_prune_checkpoint",
    "joint_prune_targets",
    "load_circuits",
    "make_report",
    "open_checkpoint",
    "overlap_circuits",
    "prune_checkpoint",
    "prune_prompts",
    "prune_recipe",
    "prune_targets",
    "prune_through_training",
    "recall_and_write",
    "recall_checkpoint",
    "recall_dynamics",
    "report_checkpoint",
    "run_config",
    "run_suite",
    "sweep_spec",
    "train_run",
    "translation_across_training",
    "translation_circuits",
    "view_circuits",
    "write_ioi_pairs",
    "write_outputs",
]
