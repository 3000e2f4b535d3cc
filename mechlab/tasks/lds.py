"""Interleaved orthogonal linear systems: the training traces of the in-context recall study.

A *system* is a Haar-random orthogonal ``d x d`` matrix ``U`` with an initial state
``x0 ~ N(0, I/d)``; its trajectory is ``x_{i+1} = U x_i`` (noiseless; the observation is
the state itself). A *trace* interleaves segments of a few systems' trajectories, each
segment wrapped in an open and a close label token, and a model reads ``tokens[:, :-1]``
and predicts the state part of ``tokens[:, 1:]``.

Token vector (``d_in = 2 * n_pairs + 2 + d_state``, 57 by default)::

    dims 2s, 2s+1         open / close token of label s (value sqrt(2)), s < n_pairs
    dim  2 * n_pairs      start token (sqrt(2)), position 0 only
    dim  2 * n_pairs + 1  payload flag: 1 on observation tokens, 0 elsewhere
    last d_state dims     the state (observation tokens only)

How one trace is drawn (``sample_batch``; this follows the study's public code,
``populate_traces`` and ``generate_seg_lens`` in ``src/datasources/filter_dataset.py`` of
sultandaniels/interleaved_time_series, a copy of sultandaniels/TFs_do_KF_ICL):

1. ``k ~ Zipf(zipf_a)`` truncated to ``min_systems..max_systems``, i.e.
   ``P(k) proportional to k^-zipf_a`` (scipy's ``zipfian``).
2. ``k`` distinct systems drawn uniformly, without replacement, from the library. Each
   trace gets a fresh uniformly random assignment of label names to its systems (slot
   ``i`` of the trace gets label ``perm[i]`` of a random permutation of the ``n_pairs``
   labels), so a label never means a fixed system.
3. ``m = min(Poisson(cut_rate * k), max_cuts)`` cut positions ``c_1..c_m`` drawn i.i.d.
   uniform in ``{0, ..., n_body - 1}`` with ``n_body = n_ctx - 1`` (250), *with
   replacement*: cuts may coincide or be adjacent, as in the reference code.
4. The boundaries ``0 <= c_(1) <= ... <= c_(m) <= n_body`` (``0`` and ``n_body`` always
   included) split the ``n_body`` non-start positions into consecutive *chunks*
   ``[b_j, b_{j+1})``; chunk ``j`` occupies token positions ``1 + b_j .. b_{j+1}``.
   Each chunk is assigned a system of the trace uniformly at random (independently)
   and becomes one segment of length ``L = b_{j+1} - b_j``:

   * ``L >= 3``: open label, ``L - 2`` observations, close label;
   * ``L == 2``: open label, close label (no observation);
   * ``L == 1``: a lone close label;
   * ``L == 0`` (coinciding cuts): nothing.

   These short-chunk rules are the reference code's; no chunk is merged or dropped.
   The last token of every trace is therefore a close label.
5. A segment's observations continue its system's trajectory from where that system's
   previous segment stopped: the i-th observation (0-based, counted over the whole
   trace) of a system is ``U^i x0``. With ``resample_x0=False`` (default, as in the
   study: one stored trajectory per training system) ``x0`` is the library's fixed
   initial state of the system; with ``resample_x0=True`` every trace draws a fresh
   ``x0 ~ N(0, I/d)`` for each of its systems.

Position 0 is the start token. ``inputs = tokens[:, :-1]``, ``targets = tokens[:, 1:,
-d_state:]``, and ``mask[b, i]`` is True exactly when token ``i + 1`` is an observation
(the loss is the MSE over those positions).

Generation is vectorised over the batch (no Python loop over traces or positions); the
states come from a doubling scheme (``log2(n_ctx)`` batched matrix products) over each
system's contiguous run of observations. The systems themselves (matrices, initial states,
libraries) are :mod:`mechlab.tasks.lds_systems`'s; their names are importable from here too.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mechlab.limits import check_elements
from mechlab.tasks.lds_systems import SystemLibrary
from mechlab.tasks.lds_systems import haar_orthogonal as haar_orthogonal
from mechlab.tasks.lds_systems import make_libraries as make_libraries
from mechlab.tasks.lds_systems import rollout as rollout

SQRT2 = math.sqrt(2.0)

# token kinds, as stored in LDSBatch.kind
START, OPEN, OBS, CLOSE = 0, 1, 2, 3


@dataclass
class LDSConfig:
    """Every knob of the interleaved-systems task; defaults are the study's.

    Args:
        d_state: State (= observation) dimension ``d``.
        n_pairs: Number of label names (open/close pairs) in the token vector.
        n_ctx: Tokens per trace, including the start token.
        zipf_a: Exponent of the truncated Zipf law of the number of systems per trace.
        min_systems: Smallest number of systems in a trace.
        max_systems: Largest number of systems in a trace (<= ``n_pairs``).
        cut_rate: A trace with ``k`` systems has ``Poisson(cut_rate * k)`` cuts.
        max_cuts: Cap on the number of cuts.
        n_train_systems: Size of the training library.
        n_test_systems: Size of the (disjoint) test library.
        resample_x0: Draw a fresh initial state per system per trace instead of using
            the library's fixed one.
        seed: Seed of the libraries (the batches use the generator passed to
            :func:`sample_batch`).
    """

    d_state: int = 5
    n_pairs: int = 25
    n_ctx: int = 251
    zipf_a: float = 1.5
    min_systems: int = 1
    max_systems: int = 25
    cut_rate: float = 2.0
    max_cuts: int = 125
    n_train_systems: int = 40000
    n_test_systems: int = 100
    resample_x0: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "d_state",
            "n_pairs",
            "n_ctx",
            "min_systems",
            "max_systems",
            "n_train_systems",
            "n_test_systems",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if (
            not isinstance(self.max_cuts, int)
            or isinstance(self.max_cuts, bool)
            or self.max_cuts < 0
        ):
            raise ValueError(f"max_cuts must be a non-negative integer, got {self.max_cuts!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.n_ctx < 3:
            raise ValueError(f"n_ctx must be >= 3 (start, open, close), got {self.n_ctx}")
        if self.min_systems > self.max_systems:
            raise ValueError(
                f"min_systems ({self.min_systems}) must be <= max_systems ({self.max_systems})"
            )
        if self.max_systems > self.n_pairs:
            raise ValueError(
                f"max_systems ({self.max_systems}) must be <= n_pairs ({self.n_pairs}): "
                "every system of a trace needs its own label"
            )
        if self.max_systems > self.n_train_systems:
            raise ValueError(
                f"max_systems ({self.max_systems}) must be <= n_train_systems "
                f"({self.n_train_systems}): a trace draws its systems without replacement"
            )
        if not (math.isfinite(self.zipf_a) and self.zipf_a >= 0):
            raise ValueError(f"zipf_a must be finite and >= 0, got {self.zipf_a!r}")
        if not (math.isfinite(self.cut_rate) and self.cut_rate >= 0):
            raise ValueError(f"cut_rate must be finite and >= 0, got {self.cut_rate!r}")
        if not isinstance(self.resample_x0, bool):
            raise ValueError(f"resample_x0 must be a bool, got {self.resample_x0!r}")
        # Sizes before work: a config read from a file (a checkpoint's task_cfg) may ask
        # for anything; the system library and one trace must fit the size limit.
        check_elements(
            "the LDS task's system library",
            {"systems": self.n_train_systems + self.n_test_systems, "d_state^2": self.d_state**2},
            lower="n_train_systems or n_test_systems",
        )
        check_elements(
            "one LDS trace", {"positions": self.n_ctx, "width": self.d_in}, lower="n_ctx or n_pairs"
        )

    # ---- derived sizes and the token layout -------------------------------------------
    @property
    def d_in(self) -> int:
        """Size of a token vector: ``2 * n_pairs + 2 + d_state``."""
        return 2 * self.n_pairs + 2 + self.d_state

    @property
    def d_out(self) -> int:
        """Size of a prediction: the state."""
        return self.d_state

    @property
    def n_body(self) -> int:
        """Tokens after the start token."""
        return self.n_ctx - 1

    @property
    def start_dim(self) -> int:
        return 2 * self.n_pairs

    @property
    def payload_dim(self) -> int:
        return 2 * self.n_pairs + 1

    @property
    def state_slice(self) -> slice:
        return slice(2 * self.n_pairs + 2, 2 * self.n_pairs + 2 + self.d_state)

    def open_dim(self, label: int) -> int:
        return 2 * label

    def close_dim(self, label: int) -> int:
        return 2 * label + 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LDSConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown LDSConfig field(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


def zipf_pmf(cfg: LDSConfig) -> Tensor:
    """``P(k)`` for ``k = min_systems..max_systems`` (float64)."""
    k = torch.arange(cfg.min_systems, cfg.max_systems + 1, dtype=torch.float64)
    weights = k.pow(-cfg.zipf_a)
    return weights / weights.sum()


# ---------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------


@dataclass
class LDSBatch:
    """A batch of traces and what is known about every token.

    Per-position metadata is ``[batch, pos]`` over the *tokens* (``pos = 0..n_ctx-1``);
    index it with ``[:, 1:]`` to align it with ``targets``/``mask``.

    Attributes:
        tokens: ``[batch, pos, d_in]`` token vectors.
        mask: ``[batch, pos - 1]`` True where the target (token ``i + 1``) is an observation.
        kind: ``[batch, pos]`` START / OPEN / OBS / CLOSE.
        slot: ``[batch, pos]`` index (into ``systems``) of the system whose segment the token
            belongs to; -1 at the start token.
        system: ``[batch, pos]`` library index of that system; -1 at the start token.
        label: ``[batch, pos]`` label name shown by the segment's open/close tokens (also
            set on its observation tokens); -1 at the start token.
        segment: ``[batch, pos]`` 0-based index of the segment in the trace; -1 at start.
        step: ``[batch, pos]`` trajectory index ``i`` of an observation token (its state is
            ``U^i x0``); -1 on every other token.
        n_systems: ``[batch]`` number of systems ``k`` of each trace.
        n_cuts: ``[batch]`` number of cuts drawn (coinciding cuts counted), so a trace has
            at most ``n_cuts + 1`` segments; for the evaluation layouts, segments - 1.
        systems: ``[batch, n_slots]`` library index of each slot's system (-1: unused slot).
        slot_labels: ``[batch, n_slots]`` label name assigned to each slot (-1: unused).
        x0: ``[batch, n_slots, d_state]`` initial state of each slot's trajectory (zero
            for unused slots).
    """

    tokens: Tensor  # [batch, pos, d_in]
    mask: Tensor  # [batch, pos - 1]
    kind: Tensor  # [batch, pos]
    slot: Tensor  # [batch, pos]
    system: Tensor  # [batch, pos]
    label: Tensor  # [batch, pos]
    segment: Tensor  # [batch, pos]
    step: Tensor  # [batch, pos]
    n_systems: Tensor  # [batch]
    n_cuts: Tensor  # [batch]
    systems: Tensor  # [batch, slots]
    slot_labels: Tensor  # [batch, slots]
    x0: Tensor  # [batch, slots, d_state]

    @property
    def d_state(self) -> int:
        return self.x0.shape[-1]

    @property
    def inputs(self) -> Tensor:
        """What the model reads: ``tokens[:, :-1]``."""
        return self.tokens[:, :-1]

    @property
    def targets(self) -> Tensor:
        """What it predicts: the state part of ``tokens[:, 1:]``."""
        return self.tokens[:, 1:, -self.d_state :]

    def to(self, device: torch.device | str) -> LDSBatch:
        return dataclasses.replace(
            self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)}
        )

    def __len__(self) -> int:
        return self.tokens.shape[0]


def sample_num_systems(
    cfg: LDSConfig,
    batch: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> Tensor:
    """``k ~ Zipf(zipf_a)`` truncated to ``min_systems..max_systems``, by inverse CDF."""
    cdf = zipf_pmf(cfg).cumsum(0).to(device)
    u = torch.rand(batch, generator=generator, dtype=torch.float64, device=device)
    index = torch.searchsorted(cdf, u).clamp_(max=cdf.numel() - 1)
    return index + cfg.min_systems


def distinct_ids(
    n: int,
    batch: int,
    k: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> Tensor:
    """``k`` distinct uniform indices in ``0..n-1`` per row (a uniform ordered sample
    without replacement). Rejection of rows with a repeat when ``n`` is large, a random
    permutation otherwise."""
    if k > n:
        raise ValueError(f"cannot draw {k} distinct systems from a library of {n}")
    if n < 8 * k * k:
        return torch.rand(batch, n, generator=generator, device=device).argsort(dim=1)[:, :k]
    ids = torch.randint(0, n, (batch, k), generator=generator, device=device)
    while True:
        ordered = ids.sort(dim=1).values
        bad = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1)
        n_bad = int(bad.sum())
        if n_bad == 0:
            return ids
        ids[bad] = torch.randint(0, n, (n_bad, k), generator=generator, device=device)


def _check_library(cfg: LDSConfig, library: SystemLibrary, n_needed: int) -> None:
    if library.d_state != cfg.d_state:
        raise ValueError(f"library has d_state={library.d_state}, config has {cfg.d_state}")
    if library.n_systems < n_needed:
        raise ValueError(
            f"library has {library.n_systems} systems but {n_needed} distinct ones are needed"
        )


def _doubling_rollout(U: Tensor, x0: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """``[x0, U x0, ..., U^(n-1) x0]`` for many systems at once (``n = lengths[run]``).

    Doubling: states ``L..2L-1`` are ``U^L`` times states ``0..L-1``, so one batched
    product per doubling (``log2(max_len)`` of them) instead of one per step. The runs
    are processed longest first, so each doubling touches only a prefix of the rows
    (those longer than ``L``).

    Returns:
        ``states[row]`` for the runs in that order (entries past a run's length are
        undefined) and ``row_of_run``: the row of each input run.
    """
    n_runs, d = x0.shape
    order = lengths.argsort(descending=True)
    sorted_len = lengths[order]
    max_len = int(sorted_len[0]) if n_runs else 0
    states = torch.empty(n_runs, max_len, d, dtype=x0.dtype, device=x0.device)
    row_of_run = torch.empty_like(order).scatter_(0, order, torch.arange(n_runs, device=x0.device))
    if max_len == 0:
        return states, row_of_run
    states[:, 0] = x0[order]
    power_t = U[order].transpose(1, 2)  # (U^L)^T: row vectors times it get U^L applied
    L = 1
    while L < max_len:
        rows = int((sorted_len > L).sum())  # runs that need states L..2L-1
        power_t = power_t[:rows]
        n = min(L, max_len - L)
        states[:rows, L : L + n] = torch.bmm(states[:rows, :n], power_t)
        L *= 2
        if L < max_len:
            power_t = torch.bmm(power_t, power_t)
    return states, row_of_run


def _make_tokens(
    cfg: LDSConfig,
    kind: Tensor,
    label: Tensor,
    states: Tensor,
    first: int = 0,
) -> Tensor:
    """Token vectors from the token kinds, the labels shown and the states of positions
    ``first..`` (``states`` must be zero on every non-observation token)."""
    B, T = kind.shape
    tokens = torch.zeros(B, T, cfg.d_in, device=kind.device)
    is_open, is_close = kind == OPEN, kind == CLOSE
    b, p = (is_open | is_close).nonzero(as_tuple=True)  # few: two per segment
    tokens[b, p, 2 * label[b, p] + is_close[b, p].long()] = SQRT2
    b, p = (kind == START).nonzero(as_tuple=True)
    tokens[b, p, cfg.start_dim] = SQRT2
    tokens[..., cfg.payload_dim] = (kind == OBS).to(tokens.dtype)
    tokens[:, first:, cfg.state_slice] = states
    return tokens


def check_batch(cfg: LDSConfig, n_traces: int, name: str = "n_traces", positions: int | None = None) -> int:
    """Refuse ``n_traces`` traces of ``positions`` tokens (default ``n_ctx``) that would not
    fit the size limit (:func:`mechlab.limits.check_elements`), before anything is drawn.

    Args:
        cfg: Task config (the token width ``d_in``).
        n_traces: Traces in the batch.
        name: The count's name, for the message (what to lower).
        positions: Tokens per trace.

    Returns:
        The elements of the token tensor.

    Raises:
        ValueError: One line naming the sizes and what to lower.
    """
    T = cfg.n_ctx if positions is None else positions
    # The largest tensors a batch builds: its tokens, and its systems' trajectories.
    n = check_elements("the traces' tokens", {name: n_traces, "positions": T, "width": cfg.d_in}, lower=name)
    check_elements("the traces' states", {name: n_traces, "positions": T, "d_state": cfg.d_state}, lower=name)
    return n


def sample_batch(
    cfg: LDSConfig, library: SystemLibrary, batch: int, generator: torch.Generator | None = None
) -> LDSBatch:
    """Draw ``batch`` interleaved traces (the process in the module docstring).

    Args:
        cfg: Task config.
        library: Systems to draw from (usually the training library of
            :func:`make_libraries`); its tensors and ``generator`` on the same device.
        batch: Number of traces.
        generator: Source of randomness; the same generator state gives the same batch.

    Returns:
        An :class:`LDSBatch` of ``n_ctx`` tokens per trace, ``max_systems`` slots.
    """
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    check_batch(cfg, batch, "batch")
    check_elements("the batch's cut positions", {"batch": batch, "cuts": cfg.max_cuts + 1}, lower="batch")
    _check_library(cfg, library, cfg.max_systems)
    g, dev = generator, library.U.device
    B, K, P, d = batch, cfg.max_systems, cfg.n_pairs, cfg.d_state
    n_body, M = cfg.n_body, cfg.max_cuts
    C = M + 1  # chunks, some of them empty

    # --- the random choices of every trace ---
    n_systems = sample_num_systems(cfg, B, g, dev)  # [B]
    systems = distinct_ids(library.n_systems, B, K, g, dev)  # [B, K]
    slot_labels = torch.rand(B, P, generator=g, device=dev).argsort(dim=1)[:, :K]  # [B, K]
    n_cuts = torch.poisson(cfg.cut_rate * n_systems.double(), generator=g).long().clamp_(max=M)
    cuts = torch.randint(0, n_body, (B, M), generator=g, device=dev)  # [B, M]
    chunk_u = torch.rand(B, C, generator=g, device=dev)
    if cfg.resample_x0:
        x0 = torch.randn(B, K, d, generator=g, device=dev) / math.sqrt(d)
    else:
        x0 = library.x0[systems]  # [B, K, d]
    used = torch.arange(K, device=dev) < n_systems[:, None]  # [B, K] slots in use

    # --- chunks: start, length, system slot, trajectory index of the first observation ---
    cuts[torch.arange(M, device=dev) >= n_cuts[:, None]] = n_body  # unused cuts: empty chunks
    starts = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev), cuts], 1)
    starts = starts.sort(dim=1).values  # [B, C]
    lengths = torch.diff(starts, dim=1, append=torch.full((B, 1), n_body, device=dev))  # [B, C]
    chunk_slot = torch.minimum((chunk_u * n_systems[:, None]).long(), n_systems[:, None] - 1)
    chunk_obs = (lengths - 2).clamp(min=0)  # [B, C] observations per chunk
    # trajectory index of each chunk's first observation = observations of the earlier
    # chunks of the same system: an exclusive cumsum over chunks sorted by (slot, time)
    order = (chunk_slot * C + torch.arange(C, device=dev)).argsort(dim=1)  # [B, C]
    sorted_obs = chunk_obs.gather(1, order)
    sorted_before = sorted_obs.cumsum(1) - sorted_obs  # obs of all earlier (slot, time) chunks
    run_len = torch.zeros(B, K, dtype=torch.long, device=dev).scatter_add_(1, chunk_slot, chunk_obs)
    run_before = run_len.cumsum(1) - run_len  # [B, K] obs of all lower slots
    chunk_step0 = torch.empty_like(sorted_before).scatter_(1, order, sorted_before)
    chunk_step0 -= run_before.gather(1, chunk_slot)  # [B, C]
    seg_index = (lengths > 0).long().cumsum(1) - 1  # [B, C] segment number of each chunk

    # --- every body token: its chunk, offset in the chunk, kind ---
    q = torch.arange(n_body, device=dev).expand(B, n_body).contiguous()  # [B, n_body]
    chunk = torch.searchsorted(starts, q, right=True) - 1  # last chunk starting at or before q
    r = q - starts.gather(1, chunk)
    last = lengths.gather(1, chunk) - 1
    kind_body = torch.where(r == last, CLOSE, torch.where(r == 0, OPEN, OBS))
    is_obs = kind_body == OBS
    slot_body = chunk_slot.gather(1, chunk)  # [B, n_body]
    step_body = torch.where(is_obs, chunk_step0.gather(1, chunk) + r - 1, -1)

    # --- states: roll out every used system as far as the trace needs, then gather ---
    # (float64, so that the float32 tokens are the exact states rounded once)
    run_row = (used.flatten().cumsum(0) - 1).view(B, K)  # row of slot (b, s) in the rollout
    rollout_, row_of_run = _doubling_rollout(
        library.U[systems[used]].double(), x0[used].double(), run_len[used]
    )  # [n_runs, length, d]
    run_row = row_of_run[run_row]
    length = rollout_.shape[1]
    if length == 0:  # no trace has an observation (only possible for tiny n_ctx)
        states = x0.new_zeros(B, n_body, d)
    else:
        row = torch.where(is_obs, run_row.gather(1, slot_body) * length + step_body, 0)
        states = rollout_.view(-1, d)[row]  # [B, n_body, d]
        states = torch.where(is_obs.unsqueeze(-1), states, 0.0)  # zero off observations

    # --- assemble ---
    def with_start(body: Tensor, first: int = -1) -> Tensor:
        return torch.cat([torch.full((B, 1), first, dtype=body.dtype, device=dev), body], dim=1)

    kind = with_start(kind_body, START)
    label = with_start(slot_labels.gather(1, slot_body))
    tokens = _make_tokens(cfg, kind, label, states, first=1)
    return LDSBatch(
        tokens=tokens,
        mask=is_obs,
        kind=kind,
        slot=with_start(slot_body),
        system=with_start(systems.gather(1, slot_body)),
        label=label,
        segment=with_start(seg_index.gather(1, chunk)),
        step=with_start(step_body),
        n_systems=n_systems,
        n_cuts=n_cuts,
        systems=torch.where(used, systems, -1),
        slot_labels=torch.where(used, slot_labels, -1),
        x0=x0 * used.unsqueeze(-1),
    )


def batch_from_layout(
    cfg: LDSConfig,
    kind: Tensor,
    slot: Tensor,
    label: Tensor,
    segment: Tensor,
    step: Tensor,
    trajectories: Tensor,
    systems: Tensor,
    slot_labels: Tensor,
    x0: Tensor,
    n_systems: Tensor,
) -> LDSBatch:
    """Build an :class:`LDSBatch` from an explicit token layout (used by the evaluation
    traces): each OBS token at ``[b, p]`` gets ``trajectories[b, slot[b, p], step[b, p]]``."""
    is_obs = kind == OBS
    b = torch.arange(kind.shape[0], device=kind.device)[:, None]
    states = trajectories[b, slot.clamp(min=0), step.clamp(min=0)]  # [batch, pos, d]
    states = torch.where(is_obs.unsqueeze(-1), states, 0.0).float()
    tokens = _make_tokens(cfg, kind, label, states)
    system = torch.where(slot >= 0, systems.gather(1, slot.clamp(min=0)), -1)
    return LDSBatch(
        tokens=tokens,
        mask=is_obs[:, 1:],
        kind=kind,
        slot=slot,
        system=system,
        label=label,
        segment=segment,
        step=torch.where(is_obs, step, -1),
        n_systems=n_systems,
        n_cuts=segment.max(dim=1).values,
        systems=systems,
        slot_labels=slot_labels,
        x0=x0.float(),
    )
