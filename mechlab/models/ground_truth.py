"""Ground-truth recurrent models for state tracking: hand-set weights that solve the task exactly.

The state-tracking task (Z_m sums and S_5 compositions, one token per group element)
has a simple exact solution in both recurrent families the study trains. These
functions build that solution into ordinary mechlab models (:func:`mechlab.build_model`,
``io="tokens"``): a check of the task code, and recurrent models whose circuit is known
for the pruning engine's tests.

Token layout (the task's): element tokens ``0 .. V-1`` (``V = m`` for Z_m, 120 for S_5),
``BOS = V``, ``SEP = V + 1``, ``PAD = V + 2`` (``d_vocab = V + 3``), outputs ``0 .. V-1``
(``d_vocab_out = V``). S_5 element ``k`` is the ``k``-th tuple of
``itertools.permutations(range(5))`` (``p[i]`` the image of ``i``); reading ``pi_t``
takes the state ``s`` to ``pi_t o s`` (``s_t[i] = pi_t[s_{t-1}[i]]``), and Z_m's reading
``x_t`` takes ``s`` to ``s + x_t mod m``; the state before any input is the identity.
The models predict the state after every position, so the read-out at ``x_n`` is the
outcome ``s_n`` and the read-outs at ``x_1 .. x_n`` are the aligned chain (ACoT). BOS,
SEP and PAD act as the identity element: they leave the state unchanged.

Shared layout of the residual stream (``d_model = V + 3 + d_block``): coordinates
``0 .. V+2`` hold the token embedding, a one-hot of the token; the next ``d_block``
coordinates (the *state block*) are written only by the layer. The embeddings all have
the same sum and norm, and so does what the layer writes, so the final LayerNorm sees
the same mean and variance at every position and is a fixed affine map; the read-out
reads only the state block. The block's own LayerNorm maps the ``V + 3`` embeddings to
linearly independent vectors ``x_v`` (a one-hot minus its mean, scaled, is independent
of the others while a coordinate outside the token block exists), so any linear map of
the mixer's input can be given any value per token: its weights are
``sum_v target_v dual_v`` with ``dual`` the pseudo-inverse of ``[x_0 .. x_{V+2}]``
(:func:`token_duals`). All weights are computed in float64 from the modules' own
LayerNorm and cast to the model's dtype.

**Dense SSM** (:func:`dense_ssm_group_model`): ``A(x_v)`` is the permutation matrix of
element ``v`` (the identity for BOS, SEP, PAD), ``h_init`` the identity's state,
``W_out`` copies ``h_t`` into the state block. Two representations:

* ``"regular"`` (Z_m and S_5): ``h`` is a one-hot over the ``V`` group elements and
  ``A(g)`` sends element ``s`` to ``g s``: for Z_m the cyclic shift by ``g``. The
  read-out row of element ``s`` is ``e_s``; every wrong element is one unit below.
* ``"permutation"`` (S_5 only, the default there): ``h`` is in R^5 with
  ``h[s[i]] = c[i]``, ``c = (-2, -1, 0, 1, 2)``, and ``A(pi)`` is the 5 x 5 matrix with
  ``A[pi[k], k] = 1``, so ``A(pi) h_s = h_{pi o s}``. The read-out row of element ``s``
  is ``h_s`` itself: ``<h_s, h_t>`` is largest exactly at ``s = t`` (rearrangement
  inequality, the entries of ``c`` being distinct), one unit above the next (an
  adjacent transposition). The state has 5 entries instead of 120, so ``W_A`` has 5 x 5
  x 128 entries instead of 120 x 120 x 243 and the forward pass is about 1000 times
  cheaper; it is the matrix the study's phrase "A(x) a permutation matrix" suggests.

Permutation matrices are orthogonal and exact: float rounding of ``A(x_t)`` (about
``1e-7`` per entry in float32) adds to the state at each step but is never amplified,
so the state drifts by about ``t * 1e-7`` relative to its norm; the read-out's margin is
half a unit out of a norm of 1 (regular) or 10 (permutation), so float32 stays exact
far past any length the task uses (measured in the tests: 2000 positions).

**LSTM** (:func:`lstm_group_model`, Z_m): one hidden unit per pair ``(s, x)``,
``s = 1 .. m-1`` and ``x = 0 .. m-1`` (``d_hidden = m (m - 1)``), on (``h = a``, about
``tanh(1)``) when the state after this position is ``s`` and its input was ``x``, off
(``h ~ 0``) otherwise; state 0 is "no unit on", which is also the LSTM's zero initial
state. "The previous state was ``j``" is linear in ``h_{t-1}``:
``P_j = sum_y h[(j, y)] / a`` for ``j >= 1``, ``P_0 = 1 - sum_{j>=1, y} h[(j, y)] / a``;
"the input is ``x``" (``Q_x``, BOS / SEP / PAD counting as ``x = 0``) is linear in the
mixer input. The input gate of unit ``(s, x)`` is the AND of the two,
``sigmoid(2 G (P_{s-x} + Q_x - 3/2))``, ``sigmoid(+-G)`` at the decision; the forget gate
is ``sigmoid(-G)`` (about 0: nothing is carried in the cell), the candidate
``tanh(G) ~ 1`` and the output gate ``sigmoid(G) ~ 1``. So every step recomputes the
state from saturated units and errors never accumulate: exact at any length. ``out_proj``
writes ``a`` at coordinate ``s`` of the state block (state 0: the embedding writes ``a``
at coordinate 0 and every unit subtracts its own ``a`` there). The size grows as
``4 m^4`` weights (m = 10: 3.6e4; m = 50: 2.5e7).

Both read-outs scale the winning element's logit ``margin`` above the nearest wrong one
(default 30), so the cross-entropy is at most ``(V - 1) exp(-margin)``.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch
from torch import Tensor, nn

from mechlab.models.base import MechModel
from mechlab.models.registry import build_model

GROUPS = ("zm", "s5")
DENSE_SSM_REPRESENTATIONS = ("regular", "permutation")
S5_ELEMENTS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations(range(5)))
N_SPECIAL = 3  # BOS, SEP, PAD after the V element tokens
DEFAULT_MARGIN = 30.0
DEFAULT_GATE_SCALE = 20.0
DEFAULT_N_CTX = 4096
_PERMUTATION_CODE = (-2.0, -1.0, 0.0, 1.0, 2.0)  # c: the identity's state in R^5


# ---------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return float(value)


def group_order(group: str, m: int | None = None) -> int:
    """Number of elements ``V`` of a group (the element tokens ``0 .. V-1``).

    Args:
        group: ``"zm"`` or ``"s5"``.
        m: The modulus of Z_m (needed for ``"zm"``, at least 2); ignored for ``"s5"``,
            as by :class:`~mechlab.tasks.state_tracking.StateTrackingConfig`.

    Returns:
        ``m`` for Z_m, 120 for S_5.

    Raises:
        ValueError: Unknown group, or a missing or bad ``m``.
    """
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}; choose one of {GROUPS}")
    if group == "s5":
        return len(S5_ELEMENTS)
    if m is None:
        raise ValueError("group 'zm' needs m (the modulus, at least 2)")
    return _check_int("m", m, 2)


@functools.cache
def _s5_index() -> dict[tuple[int, ...], int]:
    return {p: k for k, p in enumerate(S5_ELEMENTS)}


def _act(group: str, V: int, g: int, s: int) -> int:
    """The element ``g s`` (the state after reading ``g`` in state ``s``)."""
    if group == "zm":
        return (s + g) % V
    pi, state = S5_ELEMENTS[g], S5_ELEMENTS[s]
    return _s5_index()[tuple(pi[state[i]] for i in range(5))]


def _element_of_token(V: int) -> list[int]:
    """The group element each of the ``V + 3`` tokens acts as: itself, or the identity (0)
    for BOS, SEP and PAD."""
    return list(range(V)) + [0] * N_SPECIAL


# ---------------------------------------------------------------------------------------
# Shared pieces: token duals, the final LayerNorm's scale
# ---------------------------------------------------------------------------------------


@torch.no_grad()
def token_duals(model: MechModel) -> Tensor:
    """Dual vectors of the first block's normalised token embeddings.

    Args:
        model: A 1-block recurrent token model whose embeddings are already set.

    Returns:
        ``[d_model, d_vocab]`` float64 ``D`` with ``x_v . D[:, w] = [v == w]``, ``x_v`` the
        block's LayerNorm of token ``v``'s embedding: a linear map ``W`` of the mixer
        input with ``W x_v = t_v`` for every token is ``sum_v t_v D[:, v]^T``.

    Raises:
        ValueError: The normalised embeddings are not linearly independent.
    """
    norm = model.blocks[0].norm
    embed = model.read_in.embed.weight.double()  # [d_vocab, d_model]
    x = nn.functional.layer_norm(
        embed, (embed.shape[-1],), norm.weight.double(), norm.bias.double(), norm.eps
    )  # [d_vocab, d_model]
    if torch.linalg.matrix_rank(x) < x.shape[0]:
        raise ValueError("the normalised token embeddings are not linearly independent")
    duals = torch.linalg.pinv(x)  # [d_model, d_vocab]
    return duals


def _final_scale(model: MechModel, resid: Tensor) -> float:
    """The standard deviation (with eps) the final LayerNorm divides ``resid`` by."""
    eps = model.ln_final.eps
    return math.sqrt(float(resid.double().var(unbiased=False)) + eps)


def _reset_norms(model: MechModel) -> None:
    for norm in (model.blocks[0].norm, model.ln_final):
        norm.weight.fill_(1.0)
        norm.bias.zero_()


# ---------------------------------------------------------------------------------------
# Dense SSM
# ---------------------------------------------------------------------------------------


def _regular_transitions(group: str, V: int) -> Tensor:
    """``[V + 3, V, V]`` float64: token ``v``'s matrix ``A[g s, s] = 1``."""
    elements = _element_of_token(V)
    A = torch.zeros(len(elements), V, V, dtype=torch.float64)
    for v, g in enumerate(elements):
        for s in range(V):
            A[v, _act(group, V, g, s), s] = 1.0
    return A


def _permutation_transitions() -> Tensor:
    """``[123, 5, 5]`` float64: token ``v``'s matrix ``A[pi[k], k] = 1`` (identity for BOS, SEP, PAD)."""
    elements = _element_of_token(len(S5_ELEMENTS))
    A = torch.zeros(len(elements), 5, 5, dtype=torch.float64)
    for v, g in enumerate(elements):
        pi = S5_ELEMENTS[g]
        for k in range(5):
            A[v, pi[k], k] = 1.0
    return A


def permutation_state(element: int) -> Tensor:
    """The 5-dim state of S_5 element ``s`` in the ``"permutation"`` representation.

    Args:
        element: Index ``0 .. 119`` of ``s``.

    Returns:
        ``[5]`` float64 ``h`` with ``h[s[i]] = c[i]``, ``c = (-2, -1, 0, 1, 2)``.
    """
    if isinstance(element, bool) or not isinstance(element, int) or not 0 <= element < 120:
        raise ValueError(f"element must be an integer in 0..119, got {element!r}")
    s = S5_ELEMENTS[element]
    h = torch.zeros(5, dtype=torch.float64)
    for i in range(5):
        h[s[i]] = _PERMUTATION_CODE[i]
    return h


def dense_ssm_group_model(
    group: str = "zm",
    m: int | None = None,
    representation: str | None = None,
    margin: float = DEFAULT_MARGIN,
    n_ctx: int = DEFAULT_N_CTX,
) -> MechModel:
    """A 1-layer dense SSM whose transitions are the permutation matrices of the group.

    See the module docstring for the construction.

    Args:
        group: ``"zm"`` (needs ``m``) or ``"s5"``.
        m: The modulus of Z_m, at least 2 (ignored for S_5).
        representation: ``"regular"`` (one-hot state over the group's elements; Z_m's
            cyclic shift) or ``"permutation"`` (S_5 only: the 5 x 5 matrix acting on a
            5-dim state). Default: ``"regular"`` for Z_m, ``"permutation"`` for S_5.
        margin: Logit of the right element minus the largest wrong one's.
        n_ctx: Longest sequence the model accepts (the construction has no limit).

    Returns:
        A :class:`~mechlab.models.dense_ssm.DenseSSM` in eval mode (float32, CPU), with
        ``d_vocab = V + 3``, ``d_vocab_out = V``, ``d_model = V + 3 + d_state``.

    Raises:
        ValueError: Unknown group or representation, a bad ``m``, ``margin`` or ``n_ctx``.
    """
    V = group_order(group, m)
    if representation is None:
        representation = "permutation" if group == "s5" else "regular"
    if representation not in DENSE_SSM_REPRESENTATIONS:
        raise ValueError(
            f"unknown representation {representation!r}; choose one of {DENSE_SSM_REPRESENTATIONS}"
        )
    if representation == "permutation" and group != "s5":
        raise ValueError("representation 'permutation' is for group 's5'; Z_m uses 'regular'")
    margin = _check_positive("margin", margin)
    n_ctx = _check_int("n_ctx", n_ctx, 1)
    n_tokens = V + N_SPECIAL
    d_state = 5 if representation == "permutation" else V
    d_model = n_tokens + d_state
    model = build_model(
        {"arch": "dense_ssm", "io": "tokens", "d_vocab": n_tokens, "d_vocab_out": V,
         "d_model": d_model, "d_state": d_state, "n_layers": 1, "n_ctx": n_ctx},
    )  # fmt: skip
    ssm = model.blocks[0].ssm
    with torch.no_grad():
        _reset_norms(model)
        model.read_in.embed.weight.copy_(torch.eye(n_tokens, d_model))  # one-hot tokens
        if representation == "permutation":
            A = _permutation_transitions()  # [V + 3, 5, 5]
            states = torch.stack([permutation_state(s) for s in range(V)])  # [V, 5]
        else:
            A = _regular_transitions(group, V)  # [V + 3, V, V]
            states = torch.eye(V, dtype=torch.float64)  # [V, V]
        duals = token_duals(model)  # [d_model, V + 3]
        ssm.W_A.copy_(torch.einsum("vij,kv->ijk", A, duals))  # [d_state, d_state, d_model]
        ssm.h_init.copy_(states[0])  # the identity's state
        W_out = torch.zeros(d_model, d_state, dtype=torch.float64)
        W_out[n_tokens:, :] = torch.eye(d_state, dtype=torch.float64)
        ssm.W_out.weight.copy_(W_out)
        # Final LayerNorm: the same mean and variance everywhere (one-hot token + a state
        # of fixed sum and norm); one wrong element's raw score is 1 below the right one's.
        resid = torch.zeros(d_model, dtype=torch.float64)
        resid[0] = 1.0
        resid[n_tokens:] = states[0]
        scale = margin * _final_scale(model, resid)
        W_U = torch.zeros(V, d_model, dtype=torch.float64)
        W_U[:, n_tokens:] = scale * states  # row s: the state of element s
        model.read_out.proj.weight.copy_(W_U)
        model.read_out.proj.bias.zero_()
    return model.eval()


# ---------------------------------------------------------------------------------------
# LSTM
# ---------------------------------------------------------------------------------------


def lstm_on_value(gate_scale: float = DEFAULT_GATE_SCALE) -> float:
    """The hidden value ``a`` of an "on" unit of :func:`lstm_group_model`.

    Args:
        gate_scale: ``G``, the gates' saturation.

    Returns:
        ``sigmoid(G) tanh(sigmoid(G) tanh(G))``, about ``tanh(1) = 0.7616``.
    """
    G = _check_positive("gate_scale", gate_scale)
    sig = 1.0 / (1.0 + math.exp(-G))
    return sig * math.tanh(sig * math.tanh(G))


def lstm_group_model(
    m: int,
    margin: float = DEFAULT_MARGIN,
    gate_scale: float = DEFAULT_GATE_SCALE,
    n_ctx: int = DEFAULT_N_CTX,
) -> MechModel:
    """A 1-layer LSTM with saturated gates that tracks the sum in Z_m exactly.

    See the module docstring for the construction (one hidden unit per (state, input)
    pair, ``d_hidden = m (m - 1)``).

    Args:
        m: The modulus, at least 2.
        margin: Logit of the right element minus the largest wrong one's.
        gate_scale: ``G``: each gate's pre-activation is ``+-G`` (at least) at every
            decision; 20 leaves ``sigmoid(-20) = 2e-9`` of a closed gate.
        n_ctx: Longest sequence the model accepts (the construction has no limit).

    Returns:
        An :class:`~mechlab.models.lstm.LSTM` in eval mode (float32, CPU), with
        ``d_vocab = m + 3``, ``d_vocab_out = m``, ``d_model = 2 m + 3``.

    Raises:
        ValueError: A bad ``m``, ``margin``, ``gate_scale`` or ``n_ctx``.
    """
    V = group_order("zm", m)
    margin = _check_positive("margin", margin)
    G = _check_positive("gate_scale", gate_scale)
    n_ctx = _check_int("n_ctx", n_ctx, 1)
    n_tokens = V + N_SPECIAL
    d_model = n_tokens + V
    H = V * (V - 1)  # units (s, x), s = 1 .. V-1, x = 0 .. V-1
    if H == d_model:  # never for integer m (m^2 - 3m - 3 = 0 has none); out_proj must exist
        raise AssertionError("d_hidden == d_model")
    model = build_model(
        {"arch": "lstm", "io": "tokens", "d_vocab": n_tokens, "d_vocab_out": V,
         "d_model": d_model, "d_hidden": H, "n_layers": 1, "n_ctx": n_ctx},
    )  # fmt: skip
    mixer = model.blocks[0].lstm
    rnn = mixer.rnn
    a = lstm_on_value(G)

    def unit(s: int, x: int) -> int:
        return (s - 1) * V + x

    with torch.no_grad():
        _reset_norms(model)
        embed = torch.zeros(n_tokens, d_model, dtype=torch.float64)
        embed[:, :n_tokens] = torch.eye(n_tokens, dtype=torch.float64)
        embed[:, n_tokens] = a  # state 0's coordinate, cancelled by any unit that is on
        model.read_in.embed.weight.copy_(embed)
        duals = token_duals(model)  # [d_model, V + 3]
        elements = _element_of_token(V)
        W_ih = torch.zeros(4 * H, d_model, dtype=torch.float64)
        W_hh = torch.zeros(4 * H, H, dtype=torch.float64)
        bias = torch.zeros(4 * H, dtype=torch.float64)
        for s in range(1, V):
            for x in range(V):
                u = unit(s, x)
                # Q_x: 1 when the token acts as element x
                q = torch.tensor([float(g == x) for g in elements], dtype=torch.float64)
                W_ih[u] = 2 * G * (duals @ q)
                j = (s - x) % V  # the state before, if this unit is to turn on
                if j != 0:  # P_j = sum_y h[(j, y)] / a
                    W_hh[u, unit(j, 0) : unit(j, 0) + V] = 2 * G / a
                    bias[u] = 2 * G * (0.0 - 1.5)
                else:  # P_0 = 1 - sum_{j >= 1, y} h[(j, y)] / a
                    W_hh[u, :] = -2 * G / a
                    bias[u] = 2 * G * (1.0 - 1.5)
        bias[H : 2 * H] = -G  # forget gate ~ 0
        bias[2 * H : 3 * H] = G  # candidate ~ 1
        bias[3 * H : 4 * H] = G  # output gate ~ 1
        rnn.weight_ih_l0.copy_(W_ih)
        rnn.weight_hh_l0.copy_(W_hh)
        rnn.bias_ih_l0.copy_(bias)
        rnn.bias_hh_l0.zero_()
        out = torch.zeros(d_model, H, dtype=torch.float64)  # h -> a * e_state in the block
        for s in range(1, V):
            out[n_tokens + s, unit(s, 0) : unit(s, 0) + V] = 1.0
        out[n_tokens, :] = -1.0
        mixer.out_proj.weight.copy_(out)
        resid = torch.zeros(d_model, dtype=torch.float64)
        resid[0], resid[n_tokens] = 1.0, a
        scale = margin * _final_scale(model, resid) / a
        W_U = torch.zeros(V, d_model, dtype=torch.float64)
        W_U[:, n_tokens:] = scale * torch.eye(V, dtype=torch.float64)
        model.read_out.proj.weight.copy_(W_U)
        model.read_out.proj.bias.zero_()
    return model.eval()
