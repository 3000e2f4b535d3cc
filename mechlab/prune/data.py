"""What edge pruning is trained and scored on: traces, their corruptions, and target positions.

:class:`Traces` is a batch of model inputs with, optionally, the *corrupted* inputs
whose activations an interchange ablation patches in, the ground truth, and which
positions are observations. :class:`PruneData` holds a training set and a held-out
set (the circuit's metrics are computed on the held-out one).

For the interleaved-systems task, :func:`nih_prune_data` builds needle-in-a-haystack
traces (:func:`mechlab.tasks.lds_evals.needle_in_haystack`). The default corruption is
the ``misdirect_incorrect`` construction: the corrupted trace is the same trace (same
generator state, same systems, states and query) except that the query segment's open
and close labels are those of another haystack system, chosen uniformly. An
interchange ablation therefore replaces a writer's output by what it would be had the
label pointed to the wrong system, and the pruned circuit is what carries the
*label-dependent* part of the prediction. Other corruptions: the other probes of
:data:`mechlab.tasks.lds_evals.PROBES`, and ``"shuffle"`` (another trace of the batch).
By default (``protocol="study"``) the NiH is the study's: the oldest haystack system is
queried and the misdirection shows the next one's label; ``protocol="uniform"`` draws
both uniformly.

Targets (:func:`target_mask`): ``"k-after"`` (``k >= 1``) is target index
``p + k - 1`` of each trace, ``p`` the query label's token index (``1-after`` is
predicted at the label itself); ``"all"`` is every position whose target is an
observation; a callable receives the :class:`Traces` and returns a ``[batch, pos]`` bool
mask or a 1-D tensor of target indices.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mechlab.prune.graph import Windows, check_windows
from mechlab.tasks.lds import LDSConfig, make_libraries
from mechlab.tasks.lds_evals import PROBES, needle_in_haystack, nih_protocol
from mechlab.tasks.nih import default_haystack

CORRUPTIONS = (*PROBES, "shuffle")
DEFAULT_CORRUPTION = "misdirect_incorrect"

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
    """Raise ValueError unless ``target`` is ``"k-after"``, ``"all"`` or a callable valid for ``traces``."""
    if callable(target):
        return
    if not isinstance(target, str):
        raise ValueError(f"target must be 'k-after', 'all' or a callable, got {target!r}")
    if target == "all":
        return
    m = _K_AFTER.fullmatch(target)
    if m is None:
        raise ValueError(
            f"unknown target {target!r}; use 'k-after' (e.g. '1-after', '2-after'), 'all', or a callable"
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


def _nih_traces(
    cfg: LDSConfig,
    library,
    n_traces: int,
    n_haystack: int,
    seg_len: int,
    seed: int,
    corruption: str,
    protocol: str = "study",
) -> Traces:
    construction = nih_protocol(protocol)
    clean = needle_in_haystack(
        cfg, library, n_traces, n_haystack=n_haystack, seg_len=seg_len,
        generator=torch.Generator().manual_seed(seed), offsets=(1,), **construction,
    )  # fmt: skip
    batch = clean.batch
    if corruption == "shuffle":
        corrupted = batch.inputs.roll(1, dims=0)  # another trace of the batch
    else:
        # Same generator state: the probe's traces differ from the clean ones only by the probe.
        probe = needle_in_haystack(
            cfg, library, n_traces, n_haystack=n_haystack, seg_len=seg_len,
            generator=torch.Generator().manual_seed(seed), probe=corruption, offsets=(1,),
            **construction,
        )  # fmt: skip
        corrupted = probe.batch.inputs
    p, n_pos = clean.query_position, batch.inputs.shape[1]
    return Traces(
        inputs=batch.inputs.float(),
        corrupted=corrupted.float(),
        truth=batch.targets.float(),
        observed=batch.mask.clone(),
        query_position=p,
        seg_len=seg_len,
        windows=nih_windows(p, n_pos),
    )


def nih_windows(query_position: int, n_pos: int) -> Windows:
    """The windows of a NiH trace: ``haystack`` ``[0, p)``, ``label`` ``[p, p + 1)`` (the
    query's open label, where ``1-after`` is predicted), ``continuation`` ``[p + 1, n_pos)``
    (``2-after`` is predicted at ``p + 1``)."""
    p = query_position
    return (("haystack", 0, p), ("label", p, p + 1), ("continuation", p + 1, n_pos))


def nih_prune_data(
    cfg: LDSConfig,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = DEFAULT_CORRUPTION,
    seed: int = 0,
    protocol: str = "study",
) -> PruneData:
    """Needle-in-a-haystack traces for pruning a model of the interleaved-systems task.

    Both sets are drawn from the task's *test* library (systems never trained on), with
    fresh initial states per trace; the training traces from ``Generator(seed)``, the
    held-out ones from ``Generator(seed + 7919)``.

    Args:
        cfg: The task config the model was trained on.
        n_train: Training traces.
        n_test: Held-out traces.
        n_haystack: Haystack systems (default: see :func:`default_haystack`).
        seg_len: Observations per segment.
        corruption: ``misdirect_incorrect`` (default), another probe of
            :data:`~mechlab.tasks.lds_evals.PROBES`, or ``shuffle``.
        seed: Seed of the traces.
        protocol: NiH construction: ``"study"`` (default: oldest system queried,
            misdirection to the next) or ``"uniform"`` (both drawn uniformly).

    Returns:
        The :class:`PruneData`.
    """
    nih_protocol(protocol)  # validate before any work
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; choose one of {CORRUPTIONS}")
    for name, value in (("n_train", n_train), ("n_test", n_test)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    default_n, default_s = default_haystack(cfg)
    n_haystack = default_n if n_haystack is None else n_haystack
    seg_len = default_s if seg_len is None else seg_len
    library = make_libraries(cfg)[1]
    train = _nih_traces(cfg, library, n_train, n_haystack, seg_len, seed, corruption, protocol)
    test = _nih_traces(cfg, library, n_test, n_haystack, seg_len, seed + 7919, corruption, protocol)
    info = {
        "task": "lds-nih", "n_haystack": n_haystack, "seg_len": seg_len, "corruption": corruption,
        "n_train": n_train, "n_test": n_test, "data_seed": seed, "n_pos": train.n_pos,
        "query_position": train.query_position,
    }  # fmt: skip
    info["nih_protocol"] = protocol
    info["windows"] = [list(w) for w in train.windows]
    return PruneData(train=train, test=test, info=info)
