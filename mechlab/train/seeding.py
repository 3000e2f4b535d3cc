"""The one seed formula of training: which generator draws the batch of a step.

Both trainers (:mod:`mechlab.train.trainer` for runs, :mod:`mechlab.train.trials` and
:mod:`mechlab.train.ensemble` for state-tracking trials) draw the batch of step ``k`` of
a run seeded ``seed`` from :func:`batch_generator`, so a batch depends on ``(seed, k)``
alone: not on the run's history, on a resume, or on whether the trial ran in an ensemble.
"""

from __future__ import annotations

import torch

STEP_STRIDE = 1_000_003  # a prime above any step count: (seed, step) pairs never collide


def batch_generator(seed: int, step: int) -> torch.Generator:
    """The generator that draws the batch of ``step`` of a run (or trial) seeded ``seed``."""
    return torch.Generator().manual_seed(seed * STEP_STRIDE + step)
