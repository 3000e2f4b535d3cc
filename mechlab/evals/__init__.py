"""Evaluation suites of the in-context recall study, run on a model or a checkpoint."""

from mechlab.evals.recall import (
    SUITES,
    dynamics,
    evaluate_model,
    nih_errors,
    run_suite,
    summarize,
    summarize_per_example,
    uninterleaved_errors,
)

__all__ = [
    "SUITES",
    "dynamics",
    "evaluate_model",
    "nih_errors",
    "run_suite",
    "summarize",
    "summarize_per_example",
    "uninterleaved_errors",
]
