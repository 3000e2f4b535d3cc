"""The trial dispatcher: many state-tracking trials, each group as one ensemble or one by one.

It sits above what it dispatches to (:func:`mechlab.train.trials.run_trial` and
:func:`mechlab.train.ensemble.train_ensemble`), so neither of those imports it.
"""

from __future__ import annotations

from typing import Any

from mechlab.models.registry import ensemble_families, get_family, make_config
from mechlab.train.ensemble import train_ensemble
from mechlab.train.trials import TrialSpec, as_spec, group_key, run_trial

# Families whose batched ensemble beats training their members one after another
# (measured by `mechlab bench ensemble`, see docs/benchmarks.md): each family's registry
# entry says so (mechlab.models.registry.Family.ensemble). This tuple is the built-in
# families' answer, kept for the code that imports it; run_trials asks the registry.
ENSEMBLE_FAMILIES = ensemble_families()


def run_trials(
    specs: list[TrialSpec | dict[str, Any]], ensemble: bool | None = None, max_members: int = 64
) -> list[dict[str, Any]]:
    """Train many trials; those that share a group (see :func:`~mechlab.train.trials.group_key`) as ensembles.

    Args:
        specs: The trials.
        ensemble: True: every group of two or more trials as one ensemble; False: one
            trial after another; None (default): ensembles for the families whose
            registry entry says so (:attr:`~mechlab.models.registry.Family.ensemble`).
        max_members: Most trials in one ensemble (larger groups are split).

    Returns:
        One result per spec, in order (see :func:`run_trial`); an ensemble's members also
        have ``ensemble`` (its size) and ``seconds`` (its wall time shared equally).
    """
    specs = [as_spec(s) for s in specs]
    if max_members < 1:
        raise ValueError(f"max_members must be positive, got {max_members}")
    groups: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        groups.setdefault(group_key(spec), []).append(i)
    results: list[dict[str, Any] | None] = [None] * len(specs)
    for members in groups.values():
        arch = make_config(specs[members[0]].model_config()).arch
        batched = ensemble if ensemble is not None else get_family(arch).ensemble
        if not batched or len(members) == 1:
            for i in members:
                results[i] = run_trial(specs[i])
            continue
        for start in range(0, len(members), max_members):
            part = members[start : start + max_members]
            for i, result in zip(part, train_ensemble([specs[i] for i in part]), strict=True):
                results[i] = result
    return results  # type: ignore[return-value]
