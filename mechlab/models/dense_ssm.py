"""Dense state-space model: a purely multiplicative recurrence with an input-made transition.

Block ``i``::

    x          = LayerNorm(resid_pre)                        # [batch, pos, d_model]
    A(x_t)     = sum_k W_A[:, :, k] x_t[k]                   # [d_state, d_state]
    h_t        = A(x_t) h_{t-1},   h_{-1} = h_init (learned) # [d_state]
    mixer_out  = W_out h_t                                   # [batch, pos, d_model]
    resid_post = resid_pre + mixer_out

``A`` is linear in ``x_t``, as in the study, with no separate bias matrix: the
LayerNorm's learned bias ``beta`` already gives ``A`` an input-independent part,
``A(gamma * x_hat + beta) = A(gamma * x_hat) + A(beta)``. The state never receives an
additive input, so ``h_t = A(x_t) ... A(x_0) h_init``.

Initialisation keeps the state's norm from growing or vanishing exponentially over long
sequences. At initialisation the mixer input is LayerNorm output, so ``|x_t|^2 = d_model``;
with ``W_A`` entries ``N(0, gain / (d_state * d_model))`` each ``A(x_t)`` has independent
``N(0, gain / d_state)`` entries, and for such matrices
``E log(|A u|^2 / |u|^2) = log(gain) + digamma(d_state / 2) - log(d_state / 2)``. The gain
that makes this zero makes ``log |h_t|`` a random walk without drift: it spreads like
``sqrt(t / (2 d_state))`` but neither blows up nor collapses.

Forward pass: when ``hook_A`` is not in use, each step computes
``h_t = W_A (h_{t-1} outer x_t)`` without forming ``A(x_t)``; when it is, each step's
``A(x_t)`` is built and passed through the hook (the cache then holds
``[batch, pos, d_state, d_state]``, which is large: 4 bytes * batch * pos * d_state^2).
Both paths compute the same numbers. When the hooks only read (``run_with_cache``),
every ``A(x_t)`` comes from one matrix product per chunk of positions
(:func:`mechlab.models.scan.dense_scan`) and each hook gets its whole trajectory once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mechlab.models.base import RESIDUAL_BLOCK_HOOK_AXES, ModelConfig, ResidualBlock
from mechlab.models.buffers import cache_buffer
from mechlab.models.recurrence import StepHook, hook_use, is_hooked, read_trajectory
from mechlab.models.scan import DEFAULT_CHUNK, dense_scan, use_chunked
from mechlab.models.stack import ResidualStack, mixer_scan

# The study's Dense-SSM: one layer, hidden (state) size 256. Add io / vocabulary fields.
PRESETS: dict[str, dict] = {
    "dense_ssm_256": {"d_state": 256, "n_layers": 1},
    "st_dense_ssm_small": {"d_state": 32, "d_model": 32, "n_layers": 1},  # CPU-sized
}


@dataclass
class DenseSSMConfig(ModelConfig):
    """Configuration of :class:`DenseSSM`.

    Args:
        n_layers: Number of residual blocks (the study uses one).
        d_state: Size of the recurrent state ``h_t`` (the study's "hidden 256").
    """

    arch: ClassVar[str] = "dense_ssm"

    n_layers: int = 1
    d_state: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.d_state, int) or isinstance(self.d_state, bool) or self.d_state <= 0:
            raise ValueError(f"d_state must be a positive integer, got {self.d_state!r}")


def neutral_gain(d_state: int) -> float:
    """Variance gain ``g`` for which ``N(0, g / d_state)`` matrices neither grow nor shrink vectors on average in log.

    Args:
        d_state: Size of the square matrices.

    Returns:
        ``exp(log(d_state / 2) - digamma(d_state / 2))``, about ``1 + 1 / d_state``.
    """
    half = torch.tensor(d_state / 2, dtype=torch.float64)
    return math.exp(math.log(d_state / 2) - torch.special.digamma(half).item())


class DenseSSMMixer(nn.Module):
    """The recurrence ``h_t = A(x_t) h_{t-1}`` and its read-out ``W_out h_t``.

    Hook points, filled one step at a time: ``hook_A`` ``[batch, pos, d_state, d_state]``
    (the transition ``A(x_t)``) and ``hook_h`` ``[batch, pos, d_state]`` (the state after
    reading position ``t``).

    ``scan`` chooses the plain forward's algorithm: ``"loop"`` (per step
    ``h_t = W_A (h_{t-1} outer x_t)``, never forming ``A(x_t)``), ``"chunked"``
    (:func:`mechlab.models.scan.dense_scan`: each chunk's ``A(x_t)`` in one matrix
    product, then a batched mat-vec per step) or ``"auto"`` (default: chunked when an
    autograd graph is built, where it measured 1.5x faster, the loop otherwise;
    :data:`mechlab.models.scan.SCANS`). Read-only hooks
    (``run_with_cache``) get the transitions and states once each (a read-only
    ``hook_A`` always takes the chunked scan, which forms ``A(x_t)`` anyway); a hook that
    may write gets the step-by-step loop.

    Args:
        d_model: Width of the input ``x_t`` and of the output.
        d_state: Size of the state.
    """

    def __init__(self, d_model: int, d_state: int):
        super().__init__()
        self.d_model = d_model
        self.d_state = d_state
        self.scan = "auto"
        self.chunk = DEFAULT_CHUNK
        # A(x)[i, j] = W_A[i, j, :] . x
        self.W_A = nn.Parameter(torch.empty(d_state, d_state, d_model))
        self.h_init = nn.Parameter(torch.empty(d_state))  # the state before position 0
        self.W_out = nn.Linear(d_state, d_model, bias=False)
        self.hook_A = HookPoint()  # [batch, pos, d_state, d_state]
        self.hook_h = HookPoint()  # [batch, pos, d_state]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise ``W_A`` at the drift-free scale (see the module docstring) and ``|h_init| ~ 1``."""
        std = math.sqrt(neutral_gain(self.d_state) / (self.d_state * self.d_model))
        nn.init.normal_(self.W_A, std=std)
        nn.init.normal_(self.h_init, std=1 / math.sqrt(self.d_state))
        self.W_out.reset_parameters()

    def transition(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_state d_state"]:
        """The transition matrix ``A(x)`` for any number of inputs."""
        A = x @ self.W_A.reshape(self.d_state * self.d_state, self.d_model).T  # [..., d_state^2]
        return A.unflatten(-1, (self.d_state, self.d_state))

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        initial_state: Float[Tensor, "batch d_state"] | None = None,
        return_state: bool = False,
    ) -> Float[Tensor, "batch pos d_model"] | tuple[Tensor, Tensor]:
        """Run the recurrence over ``x``.

        Args:
            x: The (normalised) input.
            initial_state: ``[batch, d_state]``, the state before the first position, or
                None for the learned ``h_init``.
            return_state: Also return the state after the last position.

        Returns:
            ``[batch, pos, d_model]``, and with ``return_state`` the final state
            ``[batch, d_state]``.
        """
        batch, n_pos, _ = x.shape
        if initial_state is None:
            h = self.h_init.expand(batch, self.d_state)  # [batch, d_state]
        else:
            h = initial_state
        use = hook_use(self.hook_A, self.hook_h)
        read_A = use == "read" and len(self.hook_A._forward_hooks) > 0
        autograd = torch.is_grad_enabled() and any(t.requires_grad for t in (x, h, self.W_A))
        if read_A or (use != "write" and use_chunked(self.scan, autograd)):
            # A(x_t) is needed (read-only hook_A) or asked for: the chunked scan
            # what a cache keeps goes into reused memory (mechlab.models.buffers)
            A_out = cache_buffer(
                self.hook_A, (batch, n_pos, self.d_state, self.d_state), x, autograd
            )
            h_out = cache_buffer(self.hook_h, (batch, n_pos, self.d_state), x, autograd)
            states, transitions = dense_scan(
                x,
                self.W_A,
                h,
                self.chunk,
                keep_transitions=read_A,
                transitions_out=A_out,
                states_out=h_out,
            )
            if transitions is not None:
                read_trajectory(self.hook_A, transitions)
            read_trajectory(self.hook_h, states)
            out = self.W_out(states)  # [batch, pos, d_model]
            return (out, states[:, -1]) if return_state else out
        step_h = StepHook(self.hook_h, n_pos)
        step_h.active = use == "write" and step_h.active  # read-only hooks: once, below
        step_A = StepHook(self.hook_A, n_pos) if use == "write" and is_hooked(self.hook_A) else None
        W_flat = self.W_A.reshape(self.d_state, self.d_state * self.d_model)  # [i, (j, k)]
        for t in range(n_pos):
            x_t = x[:, t]  # [batch, d_model]
            if step_A is None:
                # h_t[i] = sum_{j,k} W_A[i, j, k] h[j] x_t[k], without forming A(x_t)
                h_outer_x = (h.unsqueeze(-1) * x_t.unsqueeze(1)).flatten(1)  # [batch, j * k]
                h = h_outer_x @ W_flat.T
            else:
                A = step_A(t, self.transition(x_t))  # [batch, d_state, d_state]
                h = (A @ h.unsqueeze(-1)).squeeze(-1)
            h = step_h(t, h)
        states = step_h.stacked()  # [batch, pos, d_state]
        if use == "read":
            read_trajectory(self.hook_h, states)
        out = self.W_out(states)  # [batch, pos, d_model]
        return (out, h) if return_state else out


class DenseSSMBlock(ResidualBlock):
    """Pre-norm residual block: ``resid_post = resid_pre + ssm(norm(resid_pre))``."""

    def __init__(self, cfg: DenseSSMConfig):
        super().__init__(nn.LayerNorm(cfg.d_model), "ssm", DenseSSMMixer(cfg.d_model, cfg.d_state))


class DenseSSM(ResidualStack):
    """Read-in, ``n_layers`` residual dense-SSM blocks, final LayerNorm, read-out.

    Args:
        cfg: The model's configuration.

    Hook names: ``hook_embed``; per block ``blocks.{i}.hook_resid_pre``,
    ``blocks.{i}.hook_mixer_in``, ``blocks.{i}.ssm.hook_A``, ``blocks.{i}.ssm.hook_h``,
    ``blocks.{i}.hook_mixer_out``, ``blocks.{i}.hook_resid_post``; ``hook_out``.
    """

    HOOK_AXES: ClassVar[dict[str, tuple[str, ...]]] = {
        **RESIDUAL_BLOCK_HOOK_AXES,
        # A(x_t)[i, j]: row i is the new state's axis, column j the previous state's
        "blocks.*.ssm.hook_A": ("batch", "pos", "d_state", "d_state_in"),
        "blocks.*.ssm.hook_h": ("batch", "pos", "d_state"),
    }
    STEP_HOOKS: ClassVar[frozenset[str]] = frozenset({"blocks.*.ssm.hook_A", "blocks.*.ssm.hook_h"})

    scan = mixer_scan(
        """How the blocks run the recurrence: ``"auto"``, ``"loop"`` or ``"chunked"`` (see
        :class:`DenseSSMMixer`); ``"mixed"`` when the blocks differ."""
    )

    def __init__(self, cfg: DenseSSMConfig):
        super().__init__(cfg)

    def make_block(self, cfg: DenseSSMConfig) -> DenseSSMBlock:
        """One residual dense-SSM block."""
        return DenseSSMBlock(cfg)
