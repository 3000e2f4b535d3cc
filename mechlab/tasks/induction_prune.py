"""Pruning traces of an induction checkpoint: clean sequences, their corruptions, the target.

The engines (:mod:`mechlab.prune`) know no task: this module builds their
:class:`~mechlab.traces.PruneData` from an :class:`~mechlab.tasks.induction.InductionConfig`.

Clean traces are sequences of the task; the corrupted trace of each is an independent draw
(``"resample"``: other random tokens, the repeat at another place), so an interchange
ablation of any writer replaces its output by what it computes on a sequence whose earlier
occurrences lie elsewhere: both the attention pattern of an induction head (its query and
key inputs) and what it copies (its value input) are tested. The traces' ``observed`` mask
is the task's predictable positions, so the target ``"all"`` scores exactly those
(``truth`` holds the next tokens, for ``loss="truth"``).
"""

from __future__ import annotations

from typing import Any

import torch

from mechlab.tasks.induction import InductionConfig, sample_sequences
from mechlab.tasks.registry import get_task
from mechlab.traces import PruneData, Target, Traces

CORRUPTIONS = ("resample",)
TARGET = "all"  # the predictable positions (the traces' observed mask)
TEST_SEED_OFFSET = 7919  # the held-out traces' seed is seed + this


def induction_traces(cfg: InductionConfig, n: int, seed: int, corruption: str = "resample") -> Traces:
    """``n`` clean sequences from ``Generator(seed)`` and their corruptions, with the next
    tokens as ``truth`` and the predictable positions as ``observed``."""
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; choose one of {list(CORRUPTIONS)}")
    gen = torch.Generator().manual_seed(seed)
    clean = sample_sequences(cfg, n, gen)
    corrupted = sample_sequences(cfg, n, gen)
    return Traces(inputs=clean.tokens, corrupted=corrupted.tokens, truth=clean.targets,
                  observed=clean.scored)  # fmt: skip


def induction_prune_data(
    cfg: InductionConfig,
    n_train: int = 256,
    n_test: int = 512,
    corruption: str = "resample",
    seed: int = 0,
) -> PruneData:
    """Pruning traces of an induction checkpoint (target ``"all"``: the predictable positions).

    Args:
        cfg: The task config the model was trained on.
        n_train: Training traces (``Generator(seed)``).
        n_test: Held-out traces (``Generator(seed + 7919)``).
        corruption: ``"resample"``: the corrupted trace is another draw of the task.
        seed: Seed of the traces.

    Returns:
        The :class:`~mechlab.traces.PruneData`.
    """
    for name, value in (("n_train", n_train), ("n_test", n_test)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; choose one of {list(CORRUPTIONS)}")
    train = induction_traces(cfg, n_train, seed, corruption)
    test = induction_traces(cfg, n_test, seed + TEST_SEED_OFFSET, corruption)
    info = {
        "task": "induction", "corruption": corruption, "n_train": n_train, "n_test": n_test,
        "data_seed": seed, "n_pos": cfg.n_ctx,
    }  # fmt: skip
    return PruneData(train=train, test=test, info=info)


def task_prune_data(
    cfg: InductionConfig,
    target: Target,
    *,
    n_train: int,
    n_test: int,
    corruption: str = "resample",
    seed: int = 0,
    **_: Any,
) -> tuple[PruneData, Target]:
    """The induction task's entry of :mod:`mechlab.tasks.registry`: its one target ``all``
    (another is refused in the registry's words) and :func:`induction_prune_data` traces."""
    if target != TARGET:
        raise ValueError(get_task("induction").target_refusal.format(target=target))
    return induction_prune_data(cfg, n_train=n_train, n_test=n_test, corruption=corruption, seed=seed), target
