"""Needle-in-a-haystack traces ready for analysis: clean and probe inputs side by side.

:func:`nih` is the one call an experiment needs: give it a checkpoint (or a task config)
and it returns an :class:`NiH` with the clean model inputs, the same traces under an
out-of-distribution probe (the *corrupted* run of a patching experiment), the ground
truth, the query label's position and every per-trace choice (which haystack slot is
queried, which one a misdirection points at, the systems and labels), on the checkpoint's
own task settings::

    ckpt = mechlab.load_checkpoint("examples/checkpoints/recall-cpu/last.pt")
    t = mechlab.nih(ckpt, n_traces=256, probe="misdirect_incorrect")
    pred = ckpt.model(t.clean)               # [batch, pos, d_state]
    t.errors(pred)                            # [batch, n_offsets], offsets t.offsets
    pred[:, t.target_index(1)]                # the 1-after prediction (at the label itself)

The traces are built by :func:`mechlab.tasks.lds_evals.needle_in_haystack` (layout,
probes and the scoring convention are documented there) from the task's *test* library;
the clean and probe traces come from the same generator state, so they differ only by
the probe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mechlab.tasks.lds import LDSBatch, LDSConfig
from mechlab.tasks.lds_evals import NIH_OFFSETS, PROBES, needle_in_haystack, nih_protocol
from mechlab.tasks.lds_systems import SystemLibrary, make_libraries
from mechlab.traces import Traces, Windows


def default_haystack(cfg: LDSConfig, train_cfg: dict[str, Any] | None = None) -> tuple[int, int]:
    """``(n_haystack, seg_len)`` for NiH traces of a task.

    The training run's evaluation settings (``eval_haystack``, ``eval_seg_len``) when
    given, else the study's 7 systems of 10 observations; the haystack is then shrunk
    until it fits ``n_ctx`` and ``n_pairs``.

    Args:
        cfg: The task config.
        train_cfg: The run's training settings (a checkpoint's ``metadata["train_cfg"]``).

    Returns:
        ``(n_haystack, seg_len)``.
    """
    train_cfg = train_cfg or {}
    seg_len = int(train_cfg.get("eval_seg_len", 10))
    n_haystack = min(int(train_cfg.get("eval_haystack", 7)), cfg.n_pairs - 1)
    while n_haystack > 1 and (seg_len + 2) * (n_haystack + 1) + 1 > cfg.n_ctx:
        n_haystack -= 1
    return n_haystack, seg_len


def nih_windows(query_position: int, n_pos: int) -> Windows:
    """The windows of a NiH trace: ``haystack`` ``[0, p)``, ``label`` ``[p, p + 1)`` (the
    query's open label, where ``1-after`` is predicted), ``continuation`` ``[p + 1, n_pos)``
    (``2-after`` is predicted at ``p + 1``)."""
    p = query_position
    return (("haystack", 0, p), ("label", p, p + 1), ("continuation", p + 1, n_pos))


@dataclass
class NiH:
    """Needle-in-a-haystack traces: clean inputs, their probe twins and what is known.

    Output position ``i`` of a model is its prediction of token ``i + 1``; the "k-after"
    prediction (the k-th observation after the query's open label at token ``p``) is
    output position ``p + k - 1`` (:meth:`target_index`).

    Attributes:
        clean: ``[batch, pos, d_in]`` float32 model inputs of the clean traces.
        corrupted: ``[batch, pos, d_in]`` the same traces under ``probe`` (None without one).
        truth: ``[batch, pos, d_state]`` float32 targets of the clean traces.
        corrupted_truth: ``[batch, pos, d_state]`` targets of the probe traces (or None).
        observed: ``[batch, pos]`` bool, True where the target is an observation.
        query_position: Token index ``p`` of the query's open label.
        offsets: The scored offsets ``k`` ("k-after").
        positions: ``[n_offsets]`` output positions of those offsets.
        query: ``[batch]`` haystack slot (``0..N-1``) of the query system.
        other: ``[batch]`` the other haystack slot whose label ``misdirect_incorrect`` shows.
        systems: ``[batch, N + 1]`` test-library ids of the slots' systems (slot ``N`` is
            the extra system only ``misdirect_restart`` shows).
        slot_labels: ``[batch, N + 1]`` label id of each slot.
        clean_batch: The clean traces with per-token metadata (``kind``, ``slot``,
            ``label``, ``step``, ...; token ``i`` is input position ``i``).
        corrupted_batch: The probe traces' batch, or None.
        probe: The probe's name, or None.
        n_haystack: Haystack systems ``N``.
        seg_len: Observations per segment ``S``.
        task_config: The task config the traces follow.
        library: The system library (the task's test library) the ids refer to.
        protocol: The NiH construction (``"study"``, the default, or ``"uniform"``).
    """

    clean: Tensor  # [batch, pos, d_in]
    corrupted: Tensor | None  # [batch, pos, d_in]
    truth: Tensor  # [batch, pos, d_state]
    corrupted_truth: Tensor | None  # [batch, pos, d_state]
    observed: Tensor  # [batch, pos]
    query_position: int
    offsets: tuple[int, ...]
    positions: Tensor  # [n_offsets]
    query: Tensor  # [batch]
    other: Tensor  # [batch]
    systems: Tensor  # [batch, N + 1]
    slot_labels: Tensor  # [batch, N + 1]
    clean_batch: LDSBatch
    corrupted_batch: LDSBatch | None
    probe: str | None
    n_haystack: int
    seg_len: int
    task_config: LDSConfig
    library: SystemLibrary
    protocol: str = "study"

    def __len__(self) -> int:
        return self.clean.shape[0]

    @property
    def n_pos(self) -> int:
        """Model positions per trace."""
        return self.clean.shape[1]

    def target_index(self, k: int) -> int:
        """Output position of the "k-after" prediction, ``query_position + k - 1``.

        Raises:
            ValueError: ``k`` outside ``1..seg_len``.
        """
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= self.seg_len:
            raise ValueError(f"offset k must be an integer in 1..seg_len={self.seg_len}, got {k!r}")
        return self.query_position + k - 1

    def errors(self, predictions: Tensor, truth: Tensor | None = None) -> Tensor:
        """Squared error summed over the state dims at the scored offsets.

        Args:
            predictions: ``[batch, pos, d_state]`` model output on ``clean`` (or ``corrupted``).
            truth: Targets to compare with; defaults to :attr:`truth`.

        Returns:
            ``[batch, n_offsets]`` errors, column ``i`` for offset ``offsets[i]``.
        """
        truth = self.truth if truth is None else truth
        if predictions.shape[:2] != truth.shape[:2]:
            raise ValueError(
                f"predictions of shape {list(predictions.shape)} do not match the traces' "
                f"[batch, pos] = {list(truth.shape[:2])}"
            )
        index = self.positions.to(predictions.device)
        diff = predictions[:, index].to(truth.dtype) - truth[:, index.to(truth.device)]
        return diff.pow(2).sum(-1)

    def traces(self, corrupted: Tensor | None = None) -> Traces:
        """What an engine reads: the clean inputs, the corrupted ones, the truth, the
        observation mask, the query position and the NiH windows (:func:`nih_windows`).

        Args:
            corrupted: ``[batch, pos, d_in]`` corrupted inputs to use instead of the probe
                twin's (e.g. another trace of the batch); default :attr:`corrupted`.

        Returns:
            The :class:`~mechlab.traces.Traces`.
        """
        return Traces(
            inputs=self.clean,
            corrupted=self.corrupted if corrupted is None else corrupted,
            truth=self.truth,
            observed=self.observed.clone(),
            query_position=self.query_position,
            seg_len=self.seg_len,
            windows=nih_windows(self.query_position, self.n_pos),
        )

    def to(self, device: torch.device | str) -> NiH:
        """The same traces with every tensor on ``device``."""

        def move(value: Any) -> Any:
            if isinstance(value, (Tensor, LDSBatch, SystemLibrary)):
                return value.to(device)
            return value

        return dataclasses.replace(
            self, **{f.name: move(getattr(self, f.name)) for f in dataclasses.fields(self)}
        )


def nih(
    source: Any,
    n_traces: int = 256,
    *,
    probe: str | None = "misdirect_incorrect",
    n_haystack: int | None = None,
    seg_len: int | None = None,
    offsets: tuple[int, ...] | None = None,
    seed: int = 0,
    fresh_x0: bool = True,
    protocol: str = "study",
    library: SystemLibrary | None = None,
) -> NiH:
    """Needle-in-a-haystack traces and their probe twins, on a checkpoint's own task.

    Args:
        source: A :class:`~mechlab.checkpoint.Checkpoint` of a run trained on the task (its
            task config and evaluation settings are used) or an :class:`LDSConfig`.
        n_traces: Traces in the batch.
        probe: The out-of-distribution probe that makes the corrupted traces
            (``misdirect_incorrect``, ``sync_rotations``, ``misdirect_unseen``,
            ``misdirect_restart``), or None for clean traces only.
        n_haystack: Haystack systems; default: the run's evaluation setting (see
            :func:`default_haystack`).
        seg_len: Observations per segment; default as ``n_haystack``.
        offsets: Offsets after the query label to score; default the study's 1, 2, 3, 7, 8
            that fit ``seg_len``.
        seed: Seed of the traces (the same seed gives the same traces).
        fresh_x0: Fresh initial states per trace (else the library's fixed ones).
        protocol: ``"study"`` (the default, the study's code: the oldest haystack system
            is queried and ``misdirect_incorrect`` shows the next one's label) or
            ``"uniform"`` (query and misdirection drawn uniformly).
        library: The systems to draw from (default: the task's test library, built from
            its config; pass it to draw several batches without rebuilding it).

    Returns:
        The :class:`NiH` traces, on the CPU.

    Raises:
        ValueError: A source without the task's config, an unknown probe, or settings that
            do not fit the task.
    """
    if isinstance(source, LDSConfig):
        cfg, train_cfg = source, None
    elif hasattr(source, "task_config") and hasattr(source, "metadata"):
        cfg, train_cfg = source.task_config, source.metadata.get("train_cfg")
    else:
        raise ValueError(
            f"nih() takes a checkpoint (mechlab.load_checkpoint) or an LDSConfig, "
            f"got {type(source).__name__}"
        )
    if probe is not None and probe not in PROBES:
        raise ValueError(f"unknown probe {probe!r}; choose one of {list(PROBES)} or None")
    construction = nih_protocol(protocol)
    default_n, default_s = default_haystack(cfg, train_cfg if isinstance(train_cfg, dict) else None)
    n_haystack = default_n if n_haystack is None else n_haystack
    seg_len = default_s if seg_len is None else seg_len
    if offsets is None:
        offsets = tuple(j for j in NIH_OFFSETS if isinstance(seg_len, int) and j <= seg_len) or (1,)
    library = make_libraries(cfg)[1] if library is None else library

    def build(which: str | None):
        return needle_in_haystack(
            cfg, library, n_traces, n_haystack=n_haystack, seg_len=seg_len,
            generator=torch.Generator().manual_seed(seed), probe=which, offsets=tuple(offsets),
            fresh_x0=fresh_x0, **construction,
        )  # fmt: skip

    clean = build(None)
    probed = build(probe) if probe is not None else None
    batch = clean.batch
    return NiH(
        clean=batch.inputs.float(),
        corrupted=None if probed is None else probed.batch.inputs.float(),
        truth=batch.targets.float(),
        corrupted_truth=None if probed is None else probed.batch.targets.float(),
        observed=batch.mask.clone(),
        query_position=clean.query_position,
        offsets=clean.offsets,
        positions=clean.positions,
        query=clean.query,
        other=clean.other,
        systems=batch.systems,
        slot_labels=batch.slot_labels,
        clean_batch=batch,
        corrupted_batch=None if probed is None else probed.batch,
        probe=probe,
        n_haystack=n_haystack,
        seg_len=seg_len,
        task_config=cfg,
        library=library,
        protocol=protocol,
    )
