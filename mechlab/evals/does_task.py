"""Does the model do the task? Per target, its median NiH error against the mean predictor's.

:func:`task_status` decides, from an evaluation and a recall report's own numbers, whether
the model does each target's prediction (:data:`DOES_TASK_BELOW`); a report warns first
where it does not, and does not interpret that target's circuits
(:mod:`mechlab.pipelines.report`, worded by :mod:`mechlab.viz.report_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DOES_TASK_BELOW = 0.5
"""The model does a target's prediction when its median NiH error is below this fraction
of the mean predictor's error (1 on the report's scale: predicting the mean state). At or
above it the model does not do the task there: its circuits are drawn but not interpreted.
The bundled run: 0.04 (1-after) at its last step, 0.77 at step 546 (stopped early)."""
MEAN_PREDICTOR_ERROR = 1.0  # the errors are normalised so that predicting the mean state scores 1


def task_status(
    evals: dict[str, Any], recall: dict[str, Any], targets: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Per target, whether the model does its prediction (:data:`DOES_TASK_BELOW`).

    Args:
        evals: The report's evaluations (``nih``'s per-offset medians are used).
        recall: The recall report (its clean errors where the evaluation lacks an offset,
            and its verdicts).
        targets: ``"k-after"`` targets.

    Returns:
        Target -> ``error`` (median squared error, None when unknown), ``ratio`` (error over
        the mean predictor's), ``threshold`` (:data:`DOES_TASK_BELOW`), ``verdict`` (the
        recall verdict at that offset, or None) and ``does_task`` (``ratio < threshold``;
        True when the error is unknown: nothing to warn on).
    """
    offsets = evals.get("nih", {}).get("result", {}).get("offsets", {})
    result = recall.get("result", {})
    clean = result.get("errors", {}).get("clean", {})
    out = {}
    for target in targets:
        j = str(target).split("-")[0]
        error = (offsets.get(j) or clean.get(j) or {}).get("median")
        verdict = result.get("per_offset", {}).get(j, {}).get("verdict")
        ratio = None if error is None else float(error) / MEAN_PREDICTOR_ERROR
        out[str(target)] = {"error": error, "ratio": ratio, "threshold": DOES_TASK_BELOW, "verdict": verdict,
                            "does_task": ratio is None or ratio < DOES_TASK_BELOW}  # fmt: skip
    return out


def not_done(status: dict[str, dict[str, Any]]) -> list[str]:
    """The targets whose prediction the model does not do."""
    return [t for t, s in status.items() if not s["does_task"]]
