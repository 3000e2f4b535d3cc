"""What to probe for on needle-in-a-haystack traces, and the matching control tasks.

Targets (input position ``i`` = the model has read tokens ``0..i``; ``p`` = the query's
open label, :attr:`~mechlab.tasks.nih.NiH.query_position`):

* ``query_system`` (classification): the haystack slot ``0..N-1`` the query refers to,
  ``t.query``. Defined at every position (before ``p`` it is not knowable: a probe
  should sit at chance there); default positions ``p..`` (the "1-after" prediction is
  made at ``p``).
* ``open_label`` (classification): the label id of the segment being read, at open and
  observation tokens (after a close token no label is open).
* ``state`` (regression): the state shown by the observation token at ``i``.
* ``next_state`` (regression): the state the model must predict at ``i`` (``t.truth``),
  where that target is an observation (``t.observed``).

``groups`` are the test-library ids of the system each sample is about (the query system,
the segment's system, the predicted system), so that a split by group
(``GroupKFold``) never shows a system in both training and test folds: a probe cannot
memorise systems.

Control tasks (Hewitt and Liang, 2019): every *type*, here every system (``groups``),
gets one fixed random target, the target of a uniformly drawn sample, so that the
control targets follow the empirical target distribution; a probe can solve the control
task only by memorising systems. Scored on a split by system, a control task therefore
sits at chance (accuracy of the control's majority class, R^2 <= 0) unless the probe
finds something that generalises across systems it has never seen, which it cannot by
construction: the control tells what a score at chance level looks like for this probe,
these traces and this split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mechlab._deprecated import moved_names
from mechlab.probes.activations import resolve_positions
from mechlab.tasks.lds import OBS, OPEN
from mechlab.tasks.nih import NiH


@dataclass(frozen=True)
class TargetSpec:
    """A probing target: its kind and where it is defined."""

    kind: str  # "classification" or "regression"
    where: str  # the positions it is defined at, for error messages


TARGETS: dict[str, TargetSpec] = {
    "query_system": TargetSpec("classification", "every position"),
    "open_label": TargetSpec("classification", "open and observation tokens"),
    "state": TargetSpec("regression", "observation tokens"),
    "next_state": TargetSpec("regression", "positions whose target is an observation"),
}


def target_spec(name: str) -> TargetSpec:
    """The :class:`TargetSpec` of a target name.

    Raises:
        ValueError: An unknown name (the message lists the known ones).
    """
    if name not in TARGETS:
        raise ValueError(f"unknown probe target {name!r}; known targets: {sorted(TARGETS)}")
    return TARGETS[name]


def _defined(t: NiH, name: str) -> Tensor:
    """``[batch, pos]`` bool: where the target is defined."""
    kind = t.clean_batch.kind[:, : t.n_pos]  # token i is input position i
    if name == "query_system":
        return torch.ones_like(kind, dtype=torch.bool)
    if name == "open_label":
        return (kind == OPEN) | (kind == OBS)
    if name == "state":
        return kind == OBS
    return t.observed.bool()


def probe_positions(
    t: NiH, name: str, positions: int | Sequence[int] | Tensor | None = None
) -> list[int]:
    """The input positions to probe ``name`` at, checked against where it is defined.

    Args:
        t: The traces.
        name: A target of :data:`TARGETS`.
        positions: Positions to use; default ``query_position..`` for ``query_system`` and
            every position where the target is defined for the others.

    Returns:
        Positions in ``0..t.n_pos-1``.

    Raises:
        ValueError: Unknown target, or a position where the target is undefined.
    """
    spec = target_spec(name)
    if not isinstance(t, NiH):
        raise ValueError(f"probe targets need mechlab.nih(...) traces, got {type(t).__name__}")
    defined = _defined(t, name).all(dim=0)  # [pos]: the NiH layout is shared by all traces
    if positions is None:
        if name == "query_system":
            return list(range(t.query_position, t.n_pos))
        return defined.nonzero().flatten().tolist()
    index = resolve_positions(positions, t.n_pos)
    bad = index[~defined[index]].tolist()
    if bad:
        raise ValueError(f"target {name!r} is defined only at {spec.where}; not at positions {bad}")
    return index.tolist()


def recall_targets(
    t: NiH, name: str, positions: int | Sequence[int] | Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Targets and split groups of a probe on needle-in-a-haystack traces.

    Args:
        t: The traces (:func:`mechlab.nih`).
        name: ``"query_system"``, ``"open_label"``, ``"state"`` or ``"next_state"``.
        positions: Input positions (see :func:`probe_positions` for the default).

    Returns:
        ``(y, groups)``: ``y`` is ``[batch, n_positions]`` long class labels or
        ``[batch, n_positions, d_state]`` float states; ``groups`` is
        ``[batch, n_positions]`` long test-library system ids.

    Raises:
        ValueError: Unknown target, positions where it is undefined, or ``query_system``
            on traces that all query the same slot (the study's NiH).
    """
    index = torch.tensor(probe_positions(t, name, positions), dtype=torch.long)
    if name == "query_system" and t.query.unique().numel() < 2 and len(t) > 1:
        raise ValueError(
            f"every trace queries haystack slot {int(t.query[0])} ({t.protocol!r} NiH), so "
            "there is nothing to probe; build the traces with mechlab.nih(..., protocol='uniform')"
        )
    batch = t.clean_batch
    d_state = t.truth.shape[-1]
    if name == "query_system":
        y = t.query[:, None].expand(-1, len(index))
        groups = t.systems.gather(1, t.query[:, None]).expand(-1, len(index))
    elif name == "open_label":
        y, groups = batch.label[:, index], batch.system[:, index]
    elif name == "state":
        y, groups = t.clean[:, index, -d_state:], batch.system[:, index]
    else:  # next_state: the target at i is token i + 1, of the system predicted
        y, groups = t.truth[:, index], batch.system[:, index + 1]
    return y.clone(), groups.clone()


def control_task(y: Tensor, types: Tensor, seed: int = 0) -> Tensor:
    """Hewitt-Liang control targets: each type gets the target of one random sample.

    Every distinct value of ``types`` is assigned the target ``y[j]`` of a uniformly drawn
    sample ``j``, so the control targets are a fixed function of the type that follows the
    empirical distribution of ``y``. For class labels, the draw is repeated (next seed)
    until at least two classes appear, so that a classifier can be fitted.

    Args:
        y: ``[n, ...]`` targets (class labels or vectors).
        types: ``[n]`` the type of each sample (e.g. a system id).
        seed: Seed of the assignment.

    Returns:
        ``[n, ...]`` control targets, same dtype as ``y``.

    Raises:
        ValueError: ``y`` and ``types`` of different lengths.
    """
    if types.dim() != 1 or len(types) != len(y):
        raise ValueError(f"types must be [n] with n = len(y) = {len(y)}, got {list(types.shape)}")
    unique, inverse = torch.unique(types, return_inverse=True)
    categorical = not y.is_floating_point()
    for attempt in range(100):
        generator = torch.Generator().manual_seed(seed + attempt)
        pick = torch.randint(0, len(y), (len(unique),), generator=generator)
        control = y[pick][inverse]
        if not categorical or control.unique().numel() > 1 or y.unique().numel() < 2:
            break
    return control

__getattr__ = moved_names(__name__)  # target_positions: probe_positions
