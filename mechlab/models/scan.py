"""Chunked scans of the recurrent families' linear recurrences, without hooks.

Three recurrences, each also written as a plain per-step loop in its model file (the
reference, ``scan="loop"``), which these functions equal to float tolerance in the
forward and the backward pass (``tests/models/test_scan.py``, float64 too):

* :func:`linear_recurrence`: the elementwise ``h_t = a_t * h_{t-1} + b_t`` (the LSTM's
  cell state ``c_t = f_t c_{t-1} + i_t g_t``);
* :func:`selective_scan`: Mamba's ``h_t = exp(delta_t A) * h_{t-1} + delta_t x_t B_t``,
  ``y_t = h_t C_t``;
* :func:`dense_scan`: the dense SSM's ``h_t = A(x_t) h_{t-1}``.

How they are chunked: the positions are cut into chunks of ``chunk`` steps; everything
that does not depend on the state (Mamba's decays ``exp(delta A)`` and inputs
``delta x B``, the dense SSM's transitions ``A(x_t)``) is computed for a whole chunk in
one batched operation, the state then advances one fused operation per step (an
``addcmul``, a batched mat-vec), and the read-out of the chunk's states (Mamba's
``h C``) is again one batched operation. Without autograd the chunk's work goes into
buffers reused from chunk to chunk (fresh multi-megabyte tensors cost page faults on
every call).

What was measured and not kept (``mechlab bench scan``, docs/benchmarks.md): on the CPU
the recurrences are bound by elementwise throughput (Mamba: one ``exp`` per batch x
position x d_inner x d_state), not by the Python loop, so the work-inefficient
parallel forms (a log-depth associative scan, the cumulative-product/cumulative-sum
form within chunks) and chunks that leave the L2 cache are slower than stepping a
cache-resident state.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

DEFAULT_CHUNK = 16
# How a mixer runs its recurrence: "loop" (the per-step reference), "chunked" (the
# functions below) or "auto" (chunked when an autograd graph is built, the loop when not).
# Measured on the CPU (docs/benchmarks.md, `mechlab bench scan`): the dense SSM's chunked
# forward+backward is about 1.5x faster than the loop's and its plain forward 0.75x, so the
# dense SSM defaults to "auto"; Mamba's chunked forward is within a few percent of the
# loop and its backward 0.7x, so Mamba defaults to "loop".
SCANS = ("auto", "loop", "chunked")


def use_chunked(scan: str, autograd: bool) -> bool:
    """Whether a mixer set to ``scan`` runs the chunked scan.

    Args:
        scan: One of :data:`SCANS`.
        autograd: Whether this forward builds an autograd graph through the recurrence.

    Returns:
        True for ``"chunked"``, and for ``"auto"`` under autograd; False otherwise.

    Raises:
        ValueError: ``scan`` is not one of :data:`SCANS`.
    """
    if scan not in SCANS:
        raise ValueError(f"scan must be one of {SCANS}, got {scan!r}")
    return scan == "chunked" or (scan == "auto" and autograd)


def _check_chunk(chunk: int) -> None:
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk <= 0:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")


def linear_recurrence(
    a: Float[Tensor, "batch pos ..."],
    b: Float[Tensor, "batch pos ..."],
    h0: Float[Tensor, "batch ..."] | None = None,
) -> Float[Tensor, "batch pos ..."]:
    """Every state of ``h_t = a_t * h_{t-1} + b_t`` (elementwise), from ``h_{-1} = h0``.

    One ``addcmul`` per step on a ``[batch, *rest]`` state (cheaper on the CPU than any
    parallel form at the LSTM's sizes, see the module docstring).

    Args:
        a: The decays.
        b: The inputs.
        h0: The state before position 0, or None for zeros.

    Returns:
        ``[batch, pos, *rest]``: ``h_0 .. h_{T-1}``.
    """
    if a.shape != b.shape:
        raise ValueError(
            f"a and b must have the same shape, got {list(a.shape)} and {list(b.shape)}"
        )
    h = b.new_zeros(b.shape[:1] + b.shape[2:]) if h0 is None else h0
    if not torch.is_grad_enabled() or not (a.requires_grad or b.requires_grad or h.requires_grad):
        out = torch.empty_like(b)  # [batch, pos, *rest]
        for t in range(b.shape[1]):
            h = torch.addcmul(b[:, t], a[:, t], h, out=out[:, t])
        return out
    steps = []
    for a_t, b_t in zip(a.unbind(1), b.unbind(1), strict=True):
        h = torch.addcmul(b_t, a_t, h)
        steps.append(h)
    return torch.stack(steps, dim=1)


def selective_scan(
    x: Float[Tensor, "batch pos d_inner"],
    delta: Float[Tensor, "batch pos d_inner"],
    A: Float[Tensor, "d_inner d_state"],
    B: Float[Tensor, "batch pos d_state"],
    C: Float[Tensor, "batch pos d_state"],
    h0: Float[Tensor, "batch d_inner d_state"] | None = None,
    chunk: int = DEFAULT_CHUNK,
    keep_states: bool = False,
    states_out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Mamba's scan ``h_t = exp(delta_t A) * h_{t-1} + (delta_t x_t) B_t``, ``y_t = h_t C_t``, chunked.

    All inputs must share one dtype (the mixer runs the scan in float32, as HF's).

    Args:
        x: The scan's input.
        delta: The step sizes (after the softplus).
        A: The (negative) state matrix, one row per channel.
        B: The input projections.
        C: The output projections.
        h0: The state before position 0, or None for zeros.
        chunk: Positions per chunk.
        keep_states: Also return every state ``[batch, pos, d_inner, d_state]`` (for
            read-only hooks on ``hook_ssm_state``).
        states_out: Memory for the kept states (e.g. a cache buffer), or None.

    Returns:
        ``(y, h_last, states)``: ``y = sum_n h_t C_t`` ``[batch, pos, d_inner]`` (without
        the ``D x`` skip), the last state ``[batch, d_inner, d_state]`` and the states or
        None.
    """
    _check_chunk(chunk)
    batch, n_pos, d_inner = x.shape
    d_state = A.shape[1]
    h = x.new_zeros(batch, d_inner, d_state) if h0 is None else h0
    delta_x = delta * x  # [batch, pos, d_inner]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, delta, A, B, C, h))
    states = None
    if keep_states:
        states = x.new_empty(batch, n_pos, d_inner, d_state) if states_out is None else states_out
    if grad:
        ys = []
        kept = []
        for s in range(0, n_pos, chunk):
            e = min(s + chunk, n_pos)
            decay = torch.exp(delta[:, s:e, :, None] * A)  # [batch, l, d_inner, d_state]
            inp = delta_x[:, s:e, :, None] * B[:, s:e, None, :]  # [batch, l, d_inner, d_state]
            hs = []
            # unbind, not [:, j]: the backward then stacks the steps' gradients once
            for inp_t, decay_t in zip(inp.unbind(1), decay.unbind(1), strict=True):
                h = torch.addcmul(inp_t, decay_t, h)
                hs.append(h)
            hs_c = torch.stack(hs, dim=1)  # [batch, l, d_inner, d_state]
            ys.append(torch.linalg.vecdot(hs_c, C[:, s:e, None, :]))  # [batch, l, d_inner]
            if keep_states:
                kept.append(hs_c.detach())
        if keep_states:
            torch.cat(kept, dim=1, out=states)
        return torch.cat(ys, dim=1), h, states
    y = x.new_empty(batch, n_pos, d_inner)
    length = min(chunk, n_pos)
    decay_buf = x.new_empty(batch, length, d_inner, d_state)
    inp_buf = x.new_empty(batch, length, d_inner, d_state) if not keep_states else None
    h = h.clone()
    for s in range(0, n_pos, chunk):
        e = min(s + chunk, n_pos)
        decay = decay_buf[:, : e - s]
        torch.mul(delta[:, s:e, :, None], A, out=decay)
        decay.exp_()
        hs = states[:, s:e] if states is not None else inp_buf[:, : e - s]
        torch.mul(delta_x[:, s:e, :, None], B[:, s:e, None, :], out=hs)
        hs[:, 0].addcmul_(decay[:, 0], h)
        for j in range(1, e - s):
            hs[:, j].addcmul_(decay[:, j], hs[:, j - 1])
        h.copy_(hs[:, -1])
        torch.linalg.vecdot(hs, C[:, s:e, None, :], out=y[:, s:e])
    return y, h, states


def dense_scan(
    x: Float[Tensor, "batch pos d_model"],
    W_A: Float[Tensor, "d_state d_state d_model"],
    h0: Float[Tensor, "batch d_state"],
    chunk: int = DEFAULT_CHUNK,
    keep_transitions: bool = False,
    transitions_out: Tensor | None = None,
    states_out: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Every state of the dense SSM's ``h_t = A(x_t) h_{t-1}``, ``A(x)[i, j] = W_A[i, j, :] . x``, chunked.

    Each chunk's transitions come from one matrix product ``[batch * chunk, d_model] x
    [d_model, d_state^2]``; the state then takes one batched mat-vec per step. This costs
    the same multiply-adds as the loop's ``(h outer x_t) W`` (``d_state^2 d_model`` per
    batch row and position), so it is chosen for the hooked path, where ``A(x_t)`` is
    needed anyway, and measured against the loop for the plain forward. When every
    transition is kept and no autograd graph is built, each position's come from one
    matrix product written straight into the kept tensor, just before the state reads them.

    Args:
        x: The (normalised) input.
        W_A: The transition weights.
        h0: The state before position 0.
        chunk: Positions per chunk.
        keep_transitions: Also return every ``A(x_t)`` ``[batch, pos, d_state, d_state]``.
        transitions_out: Memory for the kept transitions (e.g. a cache buffer), or None.
        states_out: Memory for the states ``[batch, pos, d_state]``, or None (no autograd:
            both are written in place).

    Returns:
        ``(states, transitions)``: ``[batch, pos, d_state]`` and the transitions or None.
    """
    _check_chunk(chunk)
    batch, n_pos, d_model = x.shape
    d_state = W_A.shape[0]
    W_T = W_A.reshape(d_state * d_state, d_model).T  # [d_model, d_state^2]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, W_A, h0))
    h = h0.expand(batch, d_state) if h0.dim() == 1 else h0
    if grad:
        hs, kept = [], []
        for s in range(0, n_pos, chunk):
            e = min(s + chunk, n_pos)
            A = (x[:, s:e] @ W_T).unflatten(-1, (d_state, d_state))  # [batch, l, d_state, d_state]
            if keep_transitions:
                kept.append(A.detach())
            for A_t in A.unbind(1):  # (unbind: one stack in the backward)
                h = torch.linalg.vecdot(A_t, h[:, None, :])  # [batch, d_state]
                hs.append(h)
        transitions = None
        if keep_transitions:
            transitions = (
                x.new_empty(batch, n_pos, d_state, d_state)
                if transitions_out is None
                else transitions_out
            )
            torch.cat(kept, dim=1, out=transitions)
        return torch.stack(hs, dim=1), transitions
    states = x.new_empty(batch, n_pos, d_state) if states_out is None else states_out
    if keep_transitions:
        transitions = (
            x.new_empty(batch, n_pos, d_state, d_state)
            if transitions_out is None
            else transitions_out
        )
        # each A(x_t) made just before the state reads it, while it is still in the CPU's
        # cache (one product over all positions first measured ~8% slower at batch 64 x 251,
        # d_state 64: every transition was written before any was read back)
        for t, (x_t, A_t) in enumerate(zip(x.unbind(1), transitions.unbind(1), strict=True)):
            torch.mm(x_t, W_T, out=A_t.view(batch, d_state * d_state))
            h = torch.linalg.vecdot(A_t, h[:, None, :], out=states[:, t])
        return states, transitions
    buf = x.new_empty(batch, min(chunk, n_pos), d_state * d_state)
    for s in range(0, n_pos, chunk):
        e = min(s + chunk, n_pos)
        flat = buf[:, : e - s]
        torch.matmul(x[:, s:e], W_T, out=flat)
        A = flat.unflatten(-1, (d_state, d_state))
        for j in range(e - s):
            h = torch.linalg.vecdot(A[:, j], h[:, None, :], out=states[:, s + j])
    return states, None
