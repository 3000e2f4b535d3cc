"""Evaluation suites of the in-context recall study, run on a model and its task config;
attention-pattern scores of induction models (:mod:`mechlab.evals.induction`).

Running a suite on a checkpoint file (the haystack defaulting to the run's evaluation
setting) is :func:`mechlab.pipelines.run_suite`.
"""

from mechlab._deprecated import moved_names
from mechlab.evals.induction import (
    HeadScores,
    head_scores,
    induction_chains,
    induction_edges,
    recovered_roles,
)
from mechlab.evals.suites import (
    SUITES,
    evaluate_model,
    nih_errors,
    summarize,
    summarize_per_example,
    uninterleaved_errors,
)

__all__ = [
    "HeadScores",
    "SUITES",
    "evaluate_model",
    "head_scores",
    "induction_chains",
    "induction_edges",
    "nih_errors",
    "recovered_roles",
    "summarize",
    "summarize_per_example",
    "uninterleaved_errors",
]

__getattr__ = moved_names(__name__)  # run_suite, dynamics: mechlab.pipelines
