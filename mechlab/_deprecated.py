"""Names that moved, and the aliases that keep the old ones working for one release.

:data:`MOVED` maps every old public name (``module:name``) to where it lives now. An old
module resolves its moved names through :func:`moved_names`: reading one issues a
``DeprecationWarning`` that says where the name went, then returns the new object.
Modules that moved as a whole stay as shims whose every public name is such an alias.

The aliases resolve their targets by name at access time (``importlib``), so an alias in
a lower layer pointing at a higher one is not an import of the lower layer on the higher
one; the layer contract (``lint-imports``) checks the code that is not deprecated. The
table is printed in ``docs/api.md`` ("Deprecations"), generated from :data:`MOVED`.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

REMOVED_IN = "0.2.0"

MOVED: dict[str, str] = {
    # the trace types, below tasks and engines
    "mechlab.prune.data:Traces": "mechlab.traces:Traces",
    "mechlab.prune.data:PruneData": "mechlab.traces:PruneData",
    "mechlab.prune.data:Target": "mechlab.traces:Target",
    "mechlab.prune.data:target_name": "mechlab.traces:target_name",
    "mechlab.prune.data:check_target": "mechlab.traces:check_target",
    "mechlab.prune.data:target_mask": "mechlab.traces:target_mask",
    "mechlab.prune.data:target_positions": "mechlab.traces:target_positions",
    # the recall task's NiH pruning traces, beside the task
    "mechlab.prune.data:nih_prune_data": "mechlab.tasks.lds_prune:nih_prune_data",
    "mechlab.prune.data:nih_windows": "mechlab.tasks.lds_prune:nih_windows",
    "mechlab.prune.data:CORRUPTIONS": "mechlab.tasks.lds_prune:CORRUPTIONS",
    "mechlab.prune.data:DEFAULT_CORRUPTION": "mechlab.tasks.lds_prune:DEFAULT_CORRUPTION",
    "mechlab.prune:nih_prune_data": "mechlab.tasks.lds_prune:nih_prune_data",
    "mechlab.prune:CORRUPTIONS": "mechlab.tasks.lds_prune:CORRUPTIONS",
    # Circuit is plain data: its figure lives in viz
    "mechlab.prune.circuit:plot_circuit": "mechlab.viz.circuits:circuit_figure",
    # the NiH evaluation suites (was evals/recall.py); opening checkpoints moved to pipelines
    "mechlab.evals.recall:SUITES": "mechlab.evals.suites:SUITES",
    "mechlab.evals.recall:summarize": "mechlab.evals.suites:summarize",
    "mechlab.evals.recall:summarize_per_example": "mechlab.evals.suites:summarize_per_example",
    "mechlab.evals.recall:nih_errors": "mechlab.evals.suites:nih_errors",
    "mechlab.evals.recall:uninterleaved_errors": "mechlab.evals.suites:uninterleaved_errors",
    "mechlab.evals.recall:evaluate_model": "mechlab.evals.suites:evaluate_model",
    "mechlab.evals.recall:run_suite": "mechlab.pipelines.evaluate:run_suite",
    "mechlab.evals.recall:dynamics": "mechlab.pipelines.evaluate:eval_dynamics",
    "mechlab.evals.recall:task_config_of": "mechlab.tasks:task_config",
    "mechlab.evals:run_suite": "mechlab.pipelines.evaluate:run_suite",
    "mechlab.evals:dynamics": "mechlab.pipelines.evaluate:eval_dynamics",
    # the label-vs-observation harness (was recall.py); opening checkpoints moved to pipelines
    **{
        f"mechlab.recall:{name}": f"mechlab.label_vs_observation:{name}"
        for name in (
            "VERDICTS", "PROBE_NAMES", "DIRECTIONS", "VerdictRule", "recall_score", "verdict",
            "patch_token", "squared_change", "label_continuation", "components_of",
            "component_sweep", "RecallReport", "recall_analysis",
        )
    },  # fmt: skip
    "mechlab.recall:recall_checkpoint": "mechlab.pipelines.recall:recall_checkpoint",
    "mechlab.recall:recall_dynamics": "mechlab.pipelines.recall:recall_dynamics",
    "mechlab.viz.recall:recall_figure": "mechlab.viz.label_vs_observation:recall_figure",
    "mechlab.viz.recall:recall_dynamics_figure": (
        "mechlab.viz.label_vs_observation:recall_dynamics_figure"
    ),
    # the report is a pipeline
    "mechlab.report:ReportConfig": "mechlab.pipelines.report:ReportConfig",
    "mechlab.report:Report": "mechlab.pipelines.report:Report",
    "mechlab.report:make_report": "mechlab.pipelines.report:make_report",
    # the report's page and wording are figures and text: viz; whether the model does the task: evals
    **{
        f"mechlab.pipelines.{module}:{name}": f"mechlab.evals.does_task:{name}"
        for module in ("report_findings", "report_page")
        for name in ("DOES_TASK_BELOW", "MEAN_PREDICTOR_ERROR", "task_status", "not_done")
    },
    **{
        f"mechlab.pipelines.{module}:{name}": f"mechlab.viz.report_text:{name}"
        for module in ("report_findings", "report_page")
        for name in (
            "CONCEPTS", "SIGNIFICANT", "concepts_link", "concepts_source", "task_warning",
            "recall_findings", "head_findings", "null_sentence", "cross_findings", "caveats",
            "findings",
        )
    },  # fmt: skip
    **{
        f"mechlab.pipelines.{module}:MIN_SEEDS_FOR_INTERVAL": "mechlab.prune.circuit:MIN_SEEDS_FOR_INTERVAL"
        for module in ("report_findings", "report_page")
    },
    "mechlab.pipelines.report_page:page": "mechlab.viz.report_page:page",
    "mechlab.pipelines.report_page:STYLE": "mechlab.viz.report_page:STYLE",
    # names that say one thing: a pruning recipe is not a NiH construction (NIH_PROTOCOLS)
    "mechlab.prune.config:PROTOCOLS": "mechlab.prune.config:RECIPES",
    "mechlab.prune:PROTOCOLS": "mechlab.prune.config:RECIPES",
    "mechlab.pipelines:PRUNE_PROTOCOLS": "mechlab.pipelines.request:PRUNE_RECIPES",
    "mechlab.pipelines:prune_protocol": "mechlab.pipelines.request:prune_recipe",
    "mechlab.pipelines.prune:PRUNE_PROTOCOLS": "mechlab.pipelines.request:PRUNE_RECIPES",
    "mechlab.pipelines.prune:prune_protocol": "mechlab.pipelines.request:prune_recipe",
    # names that say one thing: the patching kinds are not the circuit methods
    "mechlab.patching.result:METHODS": "mechlab.patching.result:PATCH_KINDS",
    # attribution patching (patching) is not edge attribution (mechlab.prune.attribution)
    **{
        f"mechlab.patching.attribution:{name}": f"mechlab.patching.attribution_patching:{name}"
        for name in ("GRADIENT_AT", "hook_gradients", "attribution_patch")
    },
    # the trial dispatcher sits above the trials and the ensemble it dispatches to
    "mechlab.train.trials:run_trials": "mechlab.train.dispatch:run_trials",
    "mechlab.train.trials:ENSEMBLE_FAMILIES": "mechlab.train.dispatch:ENSEMBLE_FAMILIES",
    # writing a sweep's tables and figures is output writing: pipelines
    "mechlab.sweep:write_outputs": "mechlab.pipelines.sweep:write_outputs",
    "mechlab.sweep.outputs:write_outputs": "mechlab.pipelines.sweep:write_outputs",
    # one target_positions: the probes' one says what it returns
    "mechlab.probes:target_positions": "mechlab.probes.targets:probe_positions",
    "mechlab.probes.targets:target_positions": "mechlab.probes.targets:probe_positions",
}
"""Old ``module:name`` -> new ``module:name``."""

RENAMED_OPTIONS: dict[str, str] = {
    "mechlab prune --protocol": "--recipe",
    "mechlab report --protocol": "--recipe",
    "mechlab eval --protocol": "--nih",
    "mechlab recall --protocol": "--nih",
    "mechlab curve --protocol": "--nih",
    "prune_checkpoint(protocol=)": "recipe=",
    "joint_prune_checkpoint(protocol=)": "recipe=",
    "ReportConfig(protocol=)": "recipe=",
}
"""Command-line options and keywords renamed (the old spelling still works, with a warning)."""


def resolve(target: str) -> Any:
    """The object ``module:name`` names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def warn_moved(old: str, new: str, stacklevel: int = 3) -> None:
    """Issue the ``DeprecationWarning`` of a moved or renamed name."""
    warnings.warn(
        f"{old} is deprecated and goes in mechlab {REMOVED_IN}; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def moved_names(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving the names of ``module`` listed in :data:`MOVED`.

    Args:
        module: The old module's ``__name__``.

    Returns:
        The function to assign to the module's ``__getattr__``.
    """
    prefix = f"{module}:"
    moved = {old[len(prefix) :]: new for old, new in MOVED.items() if old.startswith(prefix)}

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = moved[name]
        warn_moved(f"{module}.{name}", new.replace(":", "."))
        return resolve(new)

    return __getattr__
