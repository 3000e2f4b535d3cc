"""Evaluation suites of the in-context recall study, run on a model and its task config.

Running a suite on a checkpoint file (the haystack defaulting to the run's evaluation
setting) is :func:`mechlab.pipelines.run_suite`.
"""

from mechlab._deprecated import moved_names
from mechlab.evals.suites import (
    SUITES,
    evaluate_model,
    nih_errors,
    summarize,
    summarize_per_example,
    uninterleaved_errors,
)

__all__ = [
    "SUITES",
    "evaluate_model",
    "nih_errors",
    "summarize",
    "summarize_per_example",
    "uninterleaved_errors",
]

__getattr__ = moved_names(__name__)  # run_suite, dynamics: mechlab.pipelines
