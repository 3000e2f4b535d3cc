"""What every task hands every engine: traces, their corruptions, windows and targets.

This module sits below both the tasks (which build traces) and the engines (pruning,
attribution, patching), so data flows one way: a task makes :class:`Traces`, an engine
reads them, and neither imports the other.

:class:`Traces` is a batch of model inputs with, optionally, the *corrupted* inputs
whose activations an interchange ablation patches in, the ground truth, which positions
are observations, and position :data:`Windows`. :class:`PruneData` holds a training set
and a held-out set (a circuit's metrics are computed on the held-out one).

**One trace type per construction.** A task's builders return their own rich types, each
for one construction: :class:`mechlab.tasks.lds_evals.EvalTraces` (one evaluation batch
and its scored positions: the uninterleaved or the NiH layout),
:class:`mechlab.tasks.nih.NiH` (a NiH batch and its probe twin, for patching and probes),
:class:`mechlab.tasks.state_tracking.SequenceSet` (state-tracking sequences). What an
engine reads is :class:`Traces`, and each task builds it from its own type in one place
(:meth:`mechlab.tasks.nih.NiH.traces`, :func:`mechlab.tasks.state_tracking_prune.state_tracking_prune_data`),
so the NiH pair is drawn by one function (:func:`mechlab.tasks.nih.nih`) whether it is
patched, probed or pruned.

Targets (:func:`target_mask`): ``"k-after"`` (``k >= 1``) is target index
``p + k - 1`` of each trace, ``p`` the query label's token index (``1-after`` is
predicted at the label itself); ``"all"`` is every position whose target is an
observation; a callable receives the :class:`Traces` and returns a ``[batch, pos]`` bool
mask or a 1-D tensor of target indices. :func:`target_positions` is the one function
that turns a target into the positions it scores.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "PruneData",
    "Target",
    "Traces",
    "Windows",
    "check_target",
    "check_windows",
    "target_mask",
    "target_name",
    "target_positions",
]

Windows = tuple[tuple[str, int, int], ...]
"""Position windows: ``(name, start, end)`` ranges in order, covering ``0 .. n_pos``."""


def check_windows(windows: Any, n_pos: int | None = None) -> Windows:
    """Validate position windows; returns them as a tuple of ``(name, start, end)``.

    Args:
        windows: ``(name, start, end)`` ranges, in order, each non-empty, each starting
            where the previous ended, the first at 0, names distinct and free of ``@``
            and ``.``.
        n_pos: When given, the last window must end there.

    Raises:
        ValueError: On any violation (one line).
    """
    try:
        out = tuple((str(n), int(a), int(b)) for n, a, b in windows)
    except (TypeError, ValueError):
        raise ValueError(f"windows must be (name, start, end) triples, got {windows!r}") from None
    if not out:
        raise ValueError("windows must not be empty")
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names) or any(not n or "@" in n or "." in n for n in names):
        raise ValueError(f"window names must be distinct, non-empty and without '@' or '.': {names}")
    end = 0
    for name, start, stop in out:
        if start != end or stop <= start:
            raise ValueError(
                f"windows must be non-empty consecutive ranges from 0; {name!r} is [{start}, {stop}) after {end}"
            )
        end = stop
    if n_pos is not None and end != n_pos:
        raise ValueError(f"windows cover positions 0..{end}, the traces have {n_pos}")
    return out


_K_AFTER = re.compile(r"(\d+)-after")


@dataclass
class Traces:
    """Model inputs and what is known about them.

    Attributes:
        inputs: ``[batch, pos, d_in]`` floats or ``[batch, pos]`` token ids.
        corrupted: Same shape: the inputs of an interchange ablation, or None.
        truth: ``[batch, pos, d_out]`` ground-truth targets (or ``[batch, pos]`` ids), or None.
        observed: ``[batch, pos]`` bool, True where the target is an observation (for
            the ``"all"`` target), or None (then every position counts).
        query_position: Token index ``p`` of the query label (NiH), or None.
        seg_len: Observations per segment (bounds ``k`` in ``"k-after"``), or None.
        windows: Position windows ``(name, start, end)``, in order, covering
            ``0 .. pos`` (NiH: ``haystack`` ``[0, p)``, ``label`` ``[p, p + 1)``,
            ``continuation`` ``[p + 1, pos)``), or None. A recurrent model is pruned on
            its windowed graph when they are given
            (:func:`mechlab.prune.graph.pruning_graph`).
    """

    inputs: Tensor
    corrupted: Tensor | None = None
    truth: Tensor | None = None
    observed: Tensor | None = None
    query_position: int | None = None
    seg_len: int | None = None
    windows: Windows | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.inputs.shape[:2])
        for name in ("corrupted", "truth", "observed"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape[:2]) != shape:
                raise ValueError(
                    f"Traces.{name} has shape {list(value.shape)}, expected [batch, pos] = {list(shape)} first"
                )
        if self.windows is not None:
            self.windows = check_windows(self.windows, self.n_pos)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def n_pos(self) -> int:
        return self.inputs.shape[1]

    def subset(self, index: Tensor) -> Traces:
        """The traces at ``index`` (a 1-D index tensor) along the batch axis."""

        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[index.to(t.device)]

        return Traces(
            inputs=pick(self.inputs),
            corrupted=pick(self.corrupted),
            truth=pick(self.truth),
            observed=pick(self.observed),
            query_position=self.query_position,
            seg_len=self.seg_len,
            windows=self.windows,
        )

    def upto(self, n_pos: int) -> Traces:
        """The first ``n_pos`` positions of every trace: what a causal model's outputs up to
        position ``n_pos - 1`` depend on. The windows (which cover the whole trace) are dropped."""
        if not 1 <= n_pos <= self.n_pos:
            raise ValueError(f"cannot keep {n_pos} positions of traces of {self.n_pos}")

        def cut(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[:, :n_pos]

        return Traces(cut(self.inputs), cut(self.corrupted), cut(self.truth), cut(self.observed),
                      self.query_position, self.seg_len, None)  # fmt: skip

    def to(self, device: torch.device | str) -> Traces:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return Traces(
            move(self.inputs), move(self.corrupted), move(self.truth), move(self.observed),
            self.query_position, self.seg_len, self.windows,
        )  # fmt: skip


Target = str | Callable[[Traces], Tensor]
"""``"k-after"``, ``"all"``, or a callable of the traces (see :func:`target_mask`)."""


@dataclass
class PruneData:
    """Training and held-out traces for pruning.

    Attributes:
        train: Traces the masks are optimised on.
        test: Held-out traces the circuit is scored on.
        info: Plain-value description (task, haystack size, corruption, seeds), copied
            into the circuit's metadata.
    """

    train: Traces
    test: Traces
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.train.n_pos != self.test.n_pos:
            raise ValueError(
                f"train and test traces have different lengths ({self.train.n_pos} vs {self.test.n_pos})"
            )
        if self.train.windows != self.test.windows:
            raise ValueError(
                f"train and test traces have different windows ({self.train.windows} vs {self.test.windows})"
            )


def target_name(target: Target) -> str:
    """The name recorded for a target (a callable's ``__name__``)."""
    return target if isinstance(target, str) else getattr(target, "__name__", "custom")


def check_target(target: Target, traces: Traces) -> None:
    """Raise ValueError unless ``target`` is ``"k-after"``, ``"all"`` or a callable valid for ``traces``.

    An unknown name is refused in the command line's terms (``k-after`` or ``all``: a
    command's ``--target`` takes a name, never a Python callable)."""
    if callable(target):
        return
    if not isinstance(target, str):
        raise ValueError(f"target must be 'k-after', 'all' or a callable, got {target!r}")
    if target == "all":
        return
    m = _K_AFTER.fullmatch(target)
    if m is None:
        raise ValueError(  # said as on the command line, where a target is a name
            f"unknown target {target!r}; use k-after (1-after, 2-after, ...) or all"
        )
    k = int(m.group(1))
    if traces.query_position is None:
        raise ValueError(
            f"target {target!r} needs traces with a query label (needle in a haystack)"
        )
    if k < 1 or (traces.seg_len is not None and k > traces.seg_len):
        raise ValueError(
            f"target {target!r}: k must be in 1..{traces.seg_len} (observations after the query label)"
        )


def target_mask(target: Target, traces: Traces) -> Tensor:
    """The ``[batch, pos]`` bool mask of target positions (indices on the prediction axis).

    Args:
        target: ``"k-after"``, ``"all"`` or a callable (see the module docstring).
        traces: The traces.

    Returns:
        ``[batch, pos]`` bool tensor on the inputs' device, with at least one True per trace
        for ``k-after``.
    """
    check_target(target, traces)
    B, T = len(traces), traces.n_pos
    device = traces.inputs.device
    if callable(target):
        chosen = target(traces)
        if not isinstance(chosen, Tensor):
            raise ValueError(f"target callable must return a Tensor, got {type(chosen).__name__}")
        if chosen.dtype == torch.bool:
            if tuple(chosen.shape) != (B, T):
                raise ValueError(
                    f"target mask must be [batch, pos] = [{B}, {T}], got {list(chosen.shape)}"
                )
            mask = chosen.to(device)
        else:
            index = chosen.long().flatten().to(device)
            if index.numel() == 0 or index.min() < 0 or index.max() >= T:
                raise ValueError(f"target positions must be in 0..{T - 1}, got {chosen.tolist()}")
            mask = torch.zeros(B, T, dtype=torch.bool, device=device)
            mask[:, index] = True
    elif target == "all":
        mask = (
            traces.observed if traces.observed is not None else torch.ones(B, T, dtype=torch.bool)
        )
        mask = mask.to(device)
    else:
        k = int(_K_AFTER.fullmatch(target).group(1))
        position = traces.query_position + k - 1
        if position >= T:
            raise ValueError(f"target {target!r} is position {position}, beyond the {T} positions")
        mask = torch.zeros(B, T, dtype=torch.bool, device=device)
        mask[:, position] = True
    if not bool(mask.any()):
        raise ValueError(f"target {target_name(target)!r} selects no position")
    return mask


def target_positions(target: Target, traces: Traces) -> list[int]:
    """The positions (prediction indices) at which ``target`` scores any trace, in order."""
    return target_mask(target, traces).any(0).nonzero().flatten().tolist()
