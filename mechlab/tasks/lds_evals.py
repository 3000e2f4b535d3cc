"""Evaluation traces of the in-context recall study, and the least-squares baseline.

Every builder returns an :class:`EvalTraces`: an :class:`~mechlab.tasks.lds.LDSBatch`
(same token layout and metadata as training batches, but shorter traces are fine) plus
the *scored positions*, indices on the target axis, i.e. into ``batch.inputs`` /
``batch.targets`` / the model's output (``inputs = tokens[:, :-1]``, ``targets =
tokens[:, 1:]``). Target index ``i`` is the prediction of token ``i + 1`` made while
reading token ``i``. If the query's open label is token ``p``, "``j``-after" is token
``p + j`` and its target index is ``p + j - 1``: "1-after" (the first observation after
the label) is predicted at the label position itself, "2-after" after one observation
of the continuation has been seen.

By default every trace draws fresh initial states ``x0 ~ N(0, I/d)`` for its systems
(``fresh_x0=True``; the study's evaluations use many traces per test system);
``fresh_x0=False`` uses the library's fixed ones.

The metric (:meth:`EvalTraces.errors`) is the squared error summed over the state
dimensions, per trace and scored position (not normalised: the zero predictor scores
``E||y||^2 = 1``); the study reports medians over traces and quartiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from mechlab.limits import check_elements
from mechlab.tasks.lds import (
    CLOSE,
    OBS,
    OPEN,
    START,
    LDSBatch,
    LDSConfig,
    SystemLibrary,
    _check_library,
    batch_from_layout,
    check_batch,
    distinct_ids,
    rollout,
)

PROBES = ("misdirect_incorrect", "sync_rotations", "misdirect_unseen", "misdirect_restart")
NIH_OFFSETS = (1, 2, 3, 7, 8)
QUERY_CHOICES = ("uniform", "oldest")
MISDIRECT_CHOICES = ("uniform", "next")
NIH_PROTOCOLS: dict[str, dict[str, str]] = {
    "uniform": {"query": "uniform", "misdirect": "uniform"},
    "study": {"query": "oldest", "misdirect": "next"},
}
"""Named NiH constructions: ``study`` (the default, the recall study's code: the query is the
oldest haystack system, the misdirection shows the label of the next one) and ``uniform``
(query and misdirection drawn uniformly)."""


def nih_protocol(protocol: str) -> dict[str, str]:
    """The ``query`` / ``misdirect`` options of a named NiH protocol.

    Args:
        protocol: ``"uniform"`` or ``"study"`` (see :data:`NIH_PROTOCOLS`).

    Returns:
        ``{"query": ..., "misdirect": ...}`` for :func:`needle_in_haystack`.
    """
    if protocol not in NIH_PROTOCOLS:
        raise ValueError(f"unknown NiH protocol {protocol!r}; choose one of {list(NIH_PROTOCOLS)}")
    return dict(NIH_PROTOCOLS[protocol])


@dataclass
class EvalTraces:
    """Evaluation traces and where to score them.

    Attributes:
        batch: The traces.
        positions: ``[n_scored]`` indices on the target axis (same for every trace).
        offsets: For each scored position, its offset: ``j`` of "``j``-after" the query
            label (NiH), or the observation number (uninterleaved, 1-based).
        query: ``[batch]`` haystack slot of the query system (NiH only).
        query_position: Token index of the query's open label (NiH only).
        other: ``[batch]`` the other haystack slot whose label ``misdirect_incorrect`` shows
            (NiH only; drawn whatever the probe).
        probe: Name of the out-of-distribution probe, or None.
    """

    batch: LDSBatch
    positions: Tensor  # [n_scored]
    offsets: tuple[int, ...]
    query: Tensor | None = None  # [batch]
    query_position: int | None = None
    probe: str | None = None
    other: Tensor | None = None  # [batch]

    @property
    def targets(self) -> Tensor:
        """The states to predict at the scored positions."""
        return self.batch.targets[:, self.positions]

    def errors(self, predictions: Tensor) -> Tensor:
        """Squared error summed over the state dims at the scored positions.

        Args:
            predictions: The model's output on ``batch.inputs`` (``[batch, pos, d]``).
        """
        pred = predictions[:, self.positions].to(self.targets.dtype)
        return (pred - self.targets).pow(2).sum(-1)


def _check_traces(n_traces: int) -> None:
    if not isinstance(n_traces, int) or isinstance(n_traces, bool) or n_traces <= 0:
        raise ValueError(f"n_traces must be a positive integer, got {n_traces!r}")


def _initial_states(
    library: SystemLibrary, systems: Tensor, fresh_x0: bool, generator: torch.Generator | None
) -> Tensor:
    if fresh_x0:
        d = library.d_state
        shape = (*systems.shape, d)
        return torch.randn(shape, generator=generator, device=systems.device) / math.sqrt(d)
    return library.x0[systems]


def uninterleaved(
    cfg: LDSConfig,
    library: SystemLibrary,
    n_traces: int,
    n_obs: int | None = None,
    generator: torch.Generator | None = None,
    fresh_x0: bool = True,
) -> EvalTraces:
    """One system, one segment: ``start, open, y_0 .. y_{n_obs-1}, close``.

    Each trace draws a system uniformly from ``library`` and a label uniformly from the
    ``n_pairs`` names. Scored positions: every observation, target indices
    ``1..n_obs`` (offset ``j`` = the ``j``-th observation, predicted after ``j - 1``
    observations). ``traces.targets`` is then the observation sequence, ready for
    :func:`least_squares_predict`.

    Args:
        cfg: Task config.
        library: Systems (usually the test library).
        n_traces: Number of traces.
        n_obs: Observations per trace; default ``n_ctx - 3`` (248), the longest that fits.
        generator: Source of randomness.
        fresh_x0: Fresh initial state per trace (else the library's).
    """
    _check_traces(n_traces)
    _check_library(cfg, library, 1)
    n_obs = cfg.n_ctx - 3 if n_obs is None else n_obs
    if not isinstance(n_obs, int) or n_obs < 1 or n_obs + 3 > cfg.n_ctx:
        raise ValueError(f"n_obs must be an integer in 1..n_ctx-3 = {cfg.n_ctx - 3}, got {n_obs!r}")
    check_batch(cfg, n_traces, "n_traces", positions=n_obs + 3)
    check_elements("the systems' matrices", {"n_traces": n_traces, "d_state^2": cfg.d_state**2})
    B, dev, g = n_traces, library.U.device, generator
    systems = torch.randint(0, library.n_systems, (B, 1), generator=g, device=dev)
    labels = torch.randint(0, cfg.n_pairs, (B, 1), generator=g, device=dev)
    x0 = _initial_states(library, systems, fresh_x0, g)  # [B, 1, d]

    T = n_obs + 3
    pos = torch.arange(T, device=dev)
    kind = torch.full((T,), OBS, device=dev)
    kind[0], kind[1], kind[-1] = START, OPEN, CLOSE
    slot = torch.where(pos == 0, -1, 0)
    step = torch.where(kind == OBS, pos - 2, -1)
    trajectories = rollout(library.U[systems].double(), x0.double(), n_obs)  # [B, 1, n_obs, d]
    batch = batch_from_layout(
        cfg,
        kind=kind.expand(B, T),
        slot=slot.expand(B, T),
        label=torch.where(pos == 0, -1, labels),
        segment=slot.expand(B, T),
        step=step.expand(B, T),
        trajectories=trajectories,
        systems=systems,
        slot_labels=labels,
        x0=x0,
        n_systems=torch.ones(B, dtype=torch.long, device=dev),
    )
    return EvalTraces(
        batch=batch,
        positions=torch.arange(1, n_obs + 1, device=dev),
        offsets=tuple(range(1, n_obs + 1)),
    )


def needle_in_haystack(
    cfg: LDSConfig,
    library: SystemLibrary,
    n_traces: int,
    n_haystack: int = 7,
    seg_len: int = 10,
    generator: torch.Generator | None = None,
    probe: str | None = None,
    offsets: tuple[int, ...] = NIH_OFFSETS,
    fresh_x0: bool = True,
    query: str = "uniform",
    misdirect: str = "uniform",
    trials: int = 1,
) -> EvalTraces:
    """Needle in a haystack: ``N`` systems shown once each, then one of them resumes.

    Layout (``N = n_haystack``, ``S = seg_len``; ``(S + 2)(N + 1) + 1`` tokens)::

        start | open_0 y^0_0..y^0_{S-1} close_0 | ... | open_{N-1} ... close_{N-1}
              | open_q y^q_S .. y^q_{2S-1} close_q

    Haystack segment ``h`` shows the first ``S`` states (trajectory indices ``0..S-1``)
    of system ``h``; then the query system ``q`` (uniform among the ``N``, or the oldest,
    ``q = 0``, with ``query="oldest"`` as in the study's code) reappears with
    its open label, and its continuation (indices ``S..2S-1``, where its haystack segment
    stopped) and close label. The query open label is token ``p = 1 + N (S + 2)``;
    scored positions are ``p + j - 1`` for ``j`` in ``offsets`` (default 1, 2, 3, 7, 8).

    Each trace draws: ``N + 1`` distinct systems from ``library`` (slots ``0..N-1`` are
    the haystack, slot ``N`` is an extra system used only by ``misdirect_restart``),
    ``N + 1`` distinct labels (slot ``N``'s label never appears unless a probe uses it),
    the query ``q``, another haystack slot ``o != q`` (for ``misdirect_incorrect``;
    uniform among the other ``N - 1``, or the next one, ``o = (q + 1) mod N``, with
    ``misdirect="next"`` as in the study's code), the initial states and a common state
    ``z ~ N(0, I/d)`` (for ``sync_rotations``). All of them are drawn whatever the probe
    and the ``query``/``misdirect`` options, in this order, so the clean traces and each
    probe's traces built from the same generator state differ only by the probe, and
    ``query="oldest"`` changes nothing but the query.

    With ``trials = K > 1`` the traces come in ``n_traces / K`` *examples* of ``K``
    consecutive traces: the systems, labels, query and misdirection are drawn once per
    example, the initial states (and ``z``) once per trace, as in the study's evaluation
    (50 examples x 1000 initial-state trials; see
    :func:`mechlab.evals.suites.summarize_per_example`). ``trials=1`` is the plain draw.

    Probes (``probe=``):

    * ``"misdirect_incorrect"``: the query segment's labels (open and close) are those of
      haystack system ``o``, while its observations stay the true continuation of ``q``.
      Needs ``N >= 2``.
    * ``"sync_rotations"``: every haystack system's initial state is
      ``x0_h = (U_h^T)^S z``, so that ``x_S = z`` for all of them: at trajectory index
      ``S``, the first continuation observation (the "1-after" target), all systems are
      in the same state, and that state alone cannot tell which system continues (the
      "2-after" prediction ``U_q z`` needs the label). The trajectories are built
      forward and backward from ``z``, so ``x_S == z`` exactly.
    * ``"misdirect_unseen"``: the query segment's labels are slot ``N``'s, a label that
      appears nowhere else in the trace; observations stay the true continuation.
    * ``"misdirect_restart"``: the labels name ``q`` but the observations are indices
      ``S..2S-1`` of the extra system (slot ``N``), which never appeared before.

    Metadata: ``slot``/``system`` of the query segment is the system whose states it
    shows (slot ``N`` under restart), ``label`` the label it shows.

    Args:
        cfg: Task config (``n_pairs`` and ``n_ctx`` bound ``N`` and ``S``).
        library: Systems (usually the test library); needs ``N + 1`` of them.
        n_traces: Number of traces.
        n_haystack: ``N``, systems in the haystack.
        seg_len: ``S``, observations per segment.
        generator: Source of randomness.
        probe: None (clean) or one of :data:`PROBES`.
        offsets: Offsets after the query label to score, each in ``1..S``.
        fresh_x0: Fresh initial states per trace (else the library's).
        query: ``"uniform"`` or ``"oldest"`` (the study's): which haystack slot is queried.
        misdirect: ``"uniform"`` or ``"next"`` (the study's): the slot whose label
            ``misdirect_incorrect`` shows.
        trials: Initial-state trials per example (must divide ``n_traces``).
    """
    _check_traces(n_traces)
    N, S = n_haystack, seg_len
    if query not in QUERY_CHOICES:
        raise ValueError(f"unknown query choice {query!r}; choose one of {list(QUERY_CHOICES)}")
    if misdirect not in MISDIRECT_CHOICES:
        raise ValueError(f"unknown misdirect choice {misdirect!r}; choose one of {list(MISDIRECT_CHOICES)}")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1 or n_traces % trials:
        raise ValueError(f"trials must be a positive integer dividing n_traces={n_traces}, got {trials!r}")
    if not isinstance(N, int) or N < 1:
        raise ValueError(f"n_haystack must be a positive integer, got {N!r}")
    if not isinstance(S, int) or S < 1:
        raise ValueError(f"seg_len must be a positive integer, got {S!r}")
    if probe is not None and probe not in PROBES:
        raise ValueError(f"unknown probe {probe!r}; choose one of {PROBES} or None")
    if cfg.n_pairs < N + 1:
        raise ValueError(
            f"n_pairs={cfg.n_pairs} is too small for n_haystack={N}: need n_pairs >= "
            f"n_haystack + 1 (a label per haystack system plus one never shown)"
        )
    if probe == "misdirect_incorrect" and N < 2:
        raise ValueError("probe 'misdirect_incorrect' needs n_haystack >= 2 (another system)")
    T = (S + 2) * (N + 1) + 1
    if T > cfg.n_ctx:
        raise ValueError(
            f"a haystack of {N} segments of {S} observations takes (seg_len+2)*(n_haystack+1)+1"
            f" = {T} tokens, more than n_ctx={cfg.n_ctx}"
        )
    offsets = tuple(offsets)
    if not offsets or any(not isinstance(j, int) or j < 1 or j > S for j in offsets):
        raise ValueError(f"offsets must be integers in 1..seg_len={S}, got {offsets!r}")
    _check_library(cfg, library, N + 1)
    what = "n_traces" if trials == 1 else f"n_traces ({n_traces // trials} examples x {trials} trials)"
    check_batch(cfg, n_traces, what, positions=T)
    for label, sizes in (
        ("the haystack systems' matrices", {"d_state^2": cfg.d_state**2}),
        ("the haystack systems' trajectories", {"steps": 2 * S, "d_state": cfg.d_state}),
    ):
        check_elements(label, {"n_traces": n_traces, "systems": N + 1, **sizes}, lower=what)

    B, d, dev, g = n_traces, cfg.d_state, library.U.device, generator
    E = B // trials  # examples
    # --- random choices (all of them, whatever the probe and options) ---
    systems = distinct_ids(library.n_systems, E, N + 1, g, dev)  # [E, N+1]
    slot_labels = torch.rand(E, cfg.n_pairs, generator=g, device=dev).argsort(1)[:, : N + 1]
    q_uniform = torch.randint(0, N, (E,), generator=g, device=dev)  # [E]
    other_u = torch.rand(E, generator=g, device=dev)
    query = torch.zeros_like(q_uniform) if query == "oldest" else q_uniform
    if misdirect == "next":
        other = (query + 1) % N
    else:
        other = (query + 1 + (other_u * (N - 1)).long()) % N  # uniform among the other N-1
    if trials > 1:  # every example's choices repeated over its trials
        systems, slot_labels, query, other = (
            t.repeat_interleave(trials, dim=0) for t in (systems, slot_labels, query, other)
        )
    x0 = _initial_states(library, systems, fresh_x0, g).double()  # [B, N+1, d]
    z = torch.randn(B, d, generator=g, device=dev, dtype=torch.float64) / math.sqrt(d)

    # --- trajectories: indices 0..2S-1 of every slot ---
    U = library.U[systems].double()  # [B, N+1, d, d]
    if probe == "sync_rotations":
        hay_U = U[:, :N]
        z_h = z[:, None].expand(B, N, d)
        forward = rollout(hay_U, z_h, S)  # indices S..2S-1
        backward = rollout(hay_U.transpose(-1, -2), z_h, S + 1)  # indices S, S-1, .., 0
        hay = torch.cat([backward.flip(-2), forward[..., 1:, :]], dim=-2)  # [B, N, 2S, d]
        x0 = torch.cat([hay[:, :, 0], x0[:, N:]], dim=1)
        extra = rollout(U[:, N:], x0[:, N:], 2 * S)
        trajectories = torch.cat([hay, extra], dim=1)
    else:
        trajectories = rollout(U, x0, 2 * S)  # [B, N+1, 2S, d]

    # --- the token layout ---
    pos = torch.arange(T, device=dev)
    seg = torch.where(pos == 0, -1, (pos - 1) // (S + 2))  # [T]
    within = (pos - 1) % (S + 2)
    kind = torch.where(within == 0, OPEN, torch.where(within == S + 1, CLOSE, OBS))
    kind = torch.where(pos == 0, START, kind)
    step = torch.where(kind == OBS, within - 1 + torch.where(seg == N, S, 0), -1)
    is_query = seg == N  # [T]

    query_slot = torch.full_like(query, N) if probe == "misdirect_restart" else query
    shown = {"misdirect_incorrect": other, "misdirect_unseen": torch.full_like(query, N)}
    shown_slot = shown.get(probe, query)  # [B] slot whose label the query segment shows
    slot = torch.where(is_query, query_slot[:, None], seg.expand(B, T))  # [B, T]
    label_slot = torch.where(is_query, shown_slot[:, None], seg.expand(B, T))
    label = torch.where(pos == 0, -1, slot_labels.gather(1, label_slot.clamp(min=0)))

    batch = batch_from_layout(
        cfg,
        kind=kind.expand(B, T),
        slot=slot,
        label=label,
        segment=seg.expand(B, T),
        step=step.expand(B, T),
        trajectories=trajectories,
        systems=systems,
        slot_labels=slot_labels,
        x0=x0,
        n_systems=torch.full((B,), N, dtype=torch.long, device=dev),
    )
    p = 1 + N * (S + 2)
    return EvalTraces(
        batch=batch,
        positions=torch.tensor([p + j - 1 for j in offsets], device=dev),
        offsets=offsets,
        query=query,
        query_position=p,
        probe=probe,
        other=other,
    )


def least_squares_predict(obs: Tensor, rtol: float = 1e-12) -> Tensor:
    """The pseudoinverse ("least-squares") predictor of a single noiseless trajectory.

    ``pred[:, i]`` predicts ``obs[:, i]`` from ``obs[:, :i]``: with ``Y1 = [y_0 ..
    y_{i-2}]`` and ``Y2 = [y_1 .. y_{i-1}]`` (column stacks), ``U_hat = Y2 pinv(Y1)``
    and ``pred = U_hat y_{i-1}`` (zero for ``i < 2``, where there is no pair). Exact
    once ``i >= d + 1`` observations are seen (then ``Y1`` has full rank). Computed
    as ``U_hat = (Y2 Y1^T) pinv(Y1 Y1^T)`` with running sums, one batched ``d x d``
    pseudoinverse per position, in float64.

    Args:
        obs: Observation sequences.
        rtol: Relative cutoff of the small eigenvalues of ``Y1 Y1^T`` (rank deficiency
            before ``d`` pairs are seen).

    Returns:
        Predictions, same shape and dtype as ``obs``.
    """
    y = obs.double()
    B, n, d = y.shape
    pred = torch.zeros_like(y)
    if n < 3:
        return pred.to(obs.dtype)
    prev, nxt = y[:, :-2], y[:, 1:-1]  # pairs (y_j, y_{j+1}) usable for predicting y_{j+2..}
    gram = (prev.unsqueeze(-1) * prev.unsqueeze(-2)).cumsum(1)  # [B, n-2, d, d] sum y_j y_j^T
    cross = (nxt.unsqueeze(-1) * prev.unsqueeze(-2)).cumsum(1)  # sum y_{j+1} y_j^T
    U_hat = cross @ torch.linalg.pinv(gram, rtol=rtol, hermitian=True)  # [B, n-2, d, d]
    pred[:, 2:] = (U_hat @ y[:, 1:-1].unsqueeze(-1)).squeeze(-1)
    return pred.to(obs.dtype)
