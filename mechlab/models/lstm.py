"""LSTM: a residual stack of one-layer LSTMs whose gates and states are hookable per step.

Block ``i``::

    mixer_in   = LayerNorm(resid_pre)                        # [batch, pos, d_model]
    h          = LSTM(mixer_in)                              # [batch, pos, d_hidden]
    mixer_out  = out_proj(h)                                 # [batch, pos, d_model]
    resid_post = resid_pre + mixer_out

with the LSTM step (PyTorch's gate order i, f, g, o; ``h_{-1} = c_{-1} = 0``)::

    i, f, g, o = split(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)
    i, f, g, o = sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)
    c_t = f * c_{t-1} + i * g
    h_t = o * tanh(c_t)

``out_proj`` is a bias-free Linear ``d_hidden -> d_model`` when ``d_hidden != d_model``
and the identity when they are equal (the default), so the default mixer adds ``h_t``
itself to the stream.

The weights live in a ``torch.nn.LSTM`` (one layer, ``batch_first``). When none of a
layer's step hooks is in use, the forward pass calls that module (cuDNN / the fused
CPU kernel); otherwise it runs the step loop above, in which each step's gates and
states go through a :class:`~mechlab.models.recurrence.StepHook`. When the step hooks
only read (``run_with_cache``; hooks marked
:func:`~mechlab.models.recurrence.reads_only`), every step's values are computed without
hook calls and handed to each hook once. When only ``hook_h`` is read, the fused module's
output is that trajectory. Otherwise, on CUDA, or under autograd, the fused module runs and
the gates and cell states are recovered from its hidden states
(:meth:`LSTMMixer.step_values`: one batched matrix product for the gates, an elementwise
scan for ``c``); on the CPU without autograd a lean step loop that keeps every value
(:meth:`LSTMMixer.stepped_values`) measured faster: it does the fused forward's matrix
products once, where the recovery repeats them. All paths compute the same function;
``model.fused = False`` forces the loop. On CUDA, cuDNN's LSTM uses
TF32 unless ``torch.backends.cudnn.allow_tf32 = False``; the paths then differ by about
``2e-4`` instead of ``1e-6`` (H200, d_model 64, 251 steps), which matters when a clean
fused run is compared with a hooked one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mechlab.models.base import RESIDUAL_BLOCK_HOOK_AXES, ModelConfig, ResidualBlock
from mechlab.models.buffers import cache_buffer
from mechlab.models.recurrence import StepHook, hook_use, read_trajectory
from mechlab.models.scan import linear_recurrence
from mechlab.models.stack import ResidualStack

# How read-only hooks get the steps' values: "fused" (the fused kernel, then the gates and
# c recovered from its h: LSTMMixer.step_values), "stepped" (a lean step loop that keeps
# every value: LSTMMixer.stepped_values) or "auto" (stepped on the CPU without autograd,
# where it measured faster, fused otherwise).
READ_PATHS = ("auto", "fused", "stepped")

# The study's LSTMs (one layer, hidden 768 and 256). Add io / vocabulary fields to use them.
PRESETS: dict[str, dict] = {
    "lstm_768": {"d_model": 768, "n_layers": 1},
    "lstm_256": {"d_model": 256, "n_layers": 1},
    "st_lstm_small": {"d_model": 64, "n_layers": 1},  # CPU-sized, for the state-tracking study
}


@dataclass
class LSTMConfig(ModelConfig):
    """Configuration of :class:`LSTM`.

    Args:
        n_layers: Number of residual LSTM blocks (the study uses one).
        d_hidden: Size of each LSTM's hidden and cell state; ``0`` means ``d_model``.
            When it differs from ``d_model`` a bias-free Linear ``out_proj`` maps
            ``h_t`` back to ``d_model``.
        fused: Call ``torch.nn.LSTM`` when no step hook of a layer is in use. With
            ``False`` every forward pass runs the step-by-step loop.
    """

    arch: ClassVar[str] = "lstm"

    n_layers: int = 1
    d_hidden: int = 0
    fused: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d_hidden == 0:
            self.d_hidden = self.d_model
        if (
            not isinstance(self.d_hidden, int)
            or isinstance(self.d_hidden, bool)
            or self.d_hidden <= 0
        ):
            raise ValueError(
                f"d_hidden must be a positive integer (or 0 for d_model), got {self.d_hidden!r}"
            )
        if not isinstance(self.fused, bool):
            raise ValueError(f"fused must be True or False, got {self.fused!r}")


class LSTMMixer(nn.Module):
    """One LSTM layer plus the projection back to the residual stream.

    Hook points, each ``[batch, pos, d_hidden]`` and filled one step at a time:
    ``hook_i``, ``hook_f``, ``hook_g``, ``hook_o`` (the gates after their
    nonlinearities), ``hook_c`` (cell state) and ``hook_h`` (hidden state).

    Read-only hooks (``run_with_cache``) get each point's whole trajectory once, from the
    path ``read_path`` picks (:data:`READ_PATHS`).

    Args:
        d_model: Width of the input and of the output.
        d_hidden: LSTM hidden size.
        fused: See :class:`LSTMConfig`.
    """

    def __init__(self, d_model: int, d_hidden: int, fused: bool = True):
        super().__init__()
        self.rnn = nn.LSTM(d_model, d_hidden, num_layers=1, batch_first=True)
        self.out_proj = (
            nn.Linear(d_hidden, d_model, bias=False) if d_hidden != d_model else nn.Identity()
        )
        self.fused = fused
        self.read_path = "auto"
        self.hook_i = HookPoint()  # [batch, pos, d_hidden] input gate
        self.hook_f = HookPoint()  # [batch, pos, d_hidden] forget gate
        self.hook_g = HookPoint()  # [batch, pos, d_hidden] candidate cell update
        self.hook_o = HookPoint()  # [batch, pos, d_hidden] output gate
        self.hook_c = HookPoint()  # [batch, pos, d_hidden] cell state
        self.hook_h = HookPoint()  # [batch, pos, d_hidden] hidden state

    def step_points(self) -> tuple[HookPoint, ...]:
        """The per-step hook points, in the order a step calls them."""
        return (self.hook_i, self.hook_f, self.hook_g, self.hook_o, self.hook_c, self.hook_h)

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        initial_state: Float[Tensor, "batch 2 d_hidden"] | None = None,
        return_state: bool = False,
    ) -> Float[Tensor, "batch pos d_model"] | tuple[Tensor, Tensor]:
        """Run the LSTM over ``x``.

        Args:
            x: The (normalised) input.
            initial_state: ``[batch, 2, d_hidden]``, ``h_{-1}`` and ``c_{-1}`` stacked
                (what ``return_state`` gives), or None for zeros.
            return_state: Also return the state after the last position.

        Returns:
            ``[batch, pos, d_model]``, and with ``return_state`` the state
            ``[batch, 2, d_hidden]`` (``h``, ``c``) after the last position.
        """
        use = hook_use(*self.step_points())
        # read-only hooks on h_t alone: the fused kernel's output is every h_t
        only_h = use == "read" and not any(len(p._forward_hooks) for p in self.step_points()[:5])
        if self.fused and use == "read" and not only_h and self._read_by_stepping(x, initial_state):
            values, state = self.stepped_values(x, initial_state)
            for point, name in zip(self.step_points(), "ifgoch", strict=True):
                read_trajectory(point, values[name])
            h = values["h"]
        elif self.fused and use != "write":
            if use == "none" and initial_state is None and not return_state:
                h, _ = self.rnn(x)  # [batch, pos, d_hidden]
                return self.out_proj(h)
            if initial_state is None:
                h, (h_n, c_n) = self.rnn(x)
            else:  # nn.LSTM takes [num_layers = 1, batch, d_hidden] each
                h0, c0 = initial_state.transpose(0, 1).contiguous().unbind(0)
                h, (h_n, c_n) = self.rnn(x, (h0.unsqueeze(0), c0.unsqueeze(0)))
            state = torch.stack([h_n[0], c_n[0]], dim=1)  # [batch, 2, d_hidden]
            if only_h:
                read_trajectory(self.hook_h, h)
            elif use == "read":
                self.read_steps(x, h, initial_state)
        else:
            h, state = self.unrolled(x, initial_state, return_state=True)
        return (self.out_proj(h), state) if return_state else self.out_proj(h)

    def _read_by_stepping(self, x: Tensor, initial_state: Tensor | None) -> bool:
        """Whether read-only hooks get :meth:`stepped_values` (else the fused kernel plus
        :meth:`step_values`); see ``read_path``."""
        if self.read_path == "auto":
            needs_grad = torch.is_grad_enabled() and (
                x.requires_grad
                or (initial_state is not None and initial_state.requires_grad)
                or any(p.requires_grad for p in self.rnn.parameters())
            )
            return x.device.type == "cpu" and not needs_grad
        if self.read_path not in READ_PATHS:
            raise ValueError(f"read_path must be one of {READ_PATHS}, got {self.read_path!r}")
        return self.read_path == "stepped"

    @torch.no_grad()
    def stepped_values(
        self,
        x: Float[Tensor, "batch pos d_model"],
        initial_state: Float[Tensor, "batch 2 d_hidden"] | None = None,
    ) -> tuple[dict[str, Tensor], Tensor]:
        """Every step's gates and states from a lean step loop, without gradients.

        Every value goes into one preallocated ``[batch, pos, 6 * d_hidden + 1]`` buffer
        (rounded up to whole cache lines) whose row holds a step's ``i, f, g, o, c, h`` and a
        one. The input half of every pre-activation comes from one matrix product; then per
        step one ``addmm`` of ``[h_{t-1}, 1]`` with ``[W_hh; b]`` (the bias rides along as
        the last row) and the nonlinearities in place, ``c_t`` and ``h_t`` written beside
        the gates. The trajectories are views of that buffer (strided, not contiguous): a
        cache that keeps any of them keeps the whole buffer alive.

        Args:
            x: The (normalised) input.
            initial_state: As in :meth:`forward`.

        Returns:
            ``({"i", "f", "g", "o", "c", "h"} -> [batch, pos, d_hidden], state)`` with the
            final state ``[batch, 2, d_hidden]``.
        """
        rnn = self.rnn
        batch, n_pos, _ = x.shape
        d = rnn.hidden_size
        # One row per (batch, position) holds i, f, g, o, c, h and a 1: a step's values sit
        # side by side, so writing c_t and h_t finds the lines its gates just brought into
        # the cache, and [h_t, 1] @ [W_hh; b] adds the bias inside the recurrent product.
        # What a cache keeps goes into reused memory (mechlab.models.buffers).
        rows = _cache_buffer(self.step_points(), (batch, n_pos, _row_width(d)), x)
        rows[..., 6 * d].fill_(1)
        gates, cs, hs = rows[..., : 4 * d], rows[..., 4 * d : 5 * d], rows[..., 5 * d : 6 * d]
        h_one = rows[..., 5 * d : 6 * d + 1]  # [batch, pos, d + 1]: h_t, then 1
        # tanh(a) = 2 sigmoid(2a) - 1: with the g rows of the weights and bias doubled (exact
        # in floating point) one sigmoid over the step's row serves all four gates, and one
        # small fix-up turns (g + 1) / 2 into g
        double_g = torch.ones(4 * d, dtype=x.dtype, device=x.device)
        double_g[2 * d : 3 * d] = 2
        bias = (rnn.bias_ih_l0 + rnn.bias_hh_l0) * double_g
        w_ih = rnn.weight_ih_l0.T * double_g  # [d_model, 4 * d]
        w_hh = torch.cat([rnn.weight_hh_l0.T * double_g, bias[None]])  # [d + 1, 4 * d]
        # the input half of every pre-activation in one product (no bias: see w_hh)
        torch.mm(x.flatten(0, 1), w_ih, out=rows.view(batch * n_pos, rows.shape[-1])[:, : 4 * d])
        if initial_state is None:
            h_prev, c = x.new_zeros(batch, d + 1), x.new_zeros(batch, d)
        else:
            h_prev, c = x.new_empty(batch, d + 1), initial_state[:, 1]
            h_prev[:, :d] = initial_state[:, 0]
        h_prev[:, d] = 1
        minus_one = x.new_full((), -1.0).expand(batch, d)
        # every step's views made once (per-step slicing costs more than the small kernels)
        i, f, g, o = gates.chunk(4, dim=-1)  # views, [batch, pos, d] each
        steps = zip(gates.unbind(1), i.unbind(1), f.unbind(1), g.unbind(1), o.unbind(1),
                    cs.unbind(1), hs.unbind(1), h_one.unbind(1), strict=True)  # fmt: skip
        for step, i_t, f_t, g_t, o_t, c_t, h_t, h_one_t in steps:
            step.addmm_(h_prev, w_hh).sigmoid_()  # [batch, 4 * d]: i, f, (g + 1) / 2, o
            torch.add(minus_one, g_t, alpha=2, out=g_t)
            c = torch.mul(i_t, g_t, out=c_t).addcmul_(f_t, c)
            torch.tanh(c, out=h_t).mul_(o_t)
            h_prev = h_one_t
        values = {"i": i, "f": f, "g": g, "o": o, "c": cs, "h": hs}
        return values, torch.stack([h_prev[:, :d], c], dim=1)

    @torch.no_grad()
    def step_values(
        self,
        x: Float[Tensor, "batch pos d_model"],
        h: Float[Tensor, "batch pos d_hidden"],
        initial_state: Float[Tensor, "batch 2 d_hidden"] | None = None,
    ) -> dict[str, Tensor]:
        """Every step's gates and cell state, recovered from the fused path's hidden states.

        The gates follow from ``h_{t-1}`` in one batched matrix product, and the cell states
        from the elementwise recurrence ``c_t = f_t c_{t-1} + i_t g_t``
        (:func:`~mechlab.models.scan.linear_recurrence`); no gradients.

        Args:
            x: The (normalised) input.
            h: Every ``h_t`` ``[batch, pos, d_hidden]``, as the fused LSTM returned them.
            initial_state: As in :meth:`forward`.

        Returns:
            ``{"i", "f", "g", "o", "c", "h"}`` -> ``[batch, pos, d_hidden]`` each.
        """
        rnn = self.rnn
        if initial_state is None:
            h0 = c0 = None
            h_prev = torch.cat(
                [h.new_zeros(h[:, :1].shape), h[:, :-1]], dim=1
            )  # [batch, pos, d_hidden]
        else:
            h0, c0 = initial_state.unbind(1)  # [batch, d_hidden] each
            h_prev = torch.cat([h0[:, None], h[:, :-1]], dim=1)
        # every step's pre-activations in two matrix products, accumulated in one buffer
        # (fresh tensors of this size cost page faults): [batch * pos, 4 * d_hidden]
        gates = torch.addmm(rnn.bias_ih_l0 + rnn.bias_hh_l0, x.flatten(0, 1), rnn.weight_ih_l0.T)
        gates.addmm_(h_prev.flatten(0, 1), rnn.weight_hh_l0.T)
        gates = gates.unflatten(0, h.shape[:2])  # [batch, pos, 4 * d_hidden]
        d_hidden = rnn.hidden_size
        gates[..., : 2 * d_hidden].sigmoid_()  # i, f
        gates[..., 2 * d_hidden : 3 * d_hidden].tanh_()  # g
        gates[..., 3 * d_hidden :].sigmoid_()  # o
        i, f, g, o = gates.chunk(4, dim=-1)  # views, [batch, pos, d_hidden] each
        c = linear_recurrence(f, i * g, c0)  # [batch, pos, d_hidden]
        return {"i": i, "f": f, "g": g, "o": o, "c": c, "h": h}

    def read_steps(
        self,
        x: Float[Tensor, "batch pos d_model"],
        h: Float[Tensor, "batch pos d_hidden"],
        initial_state: Float[Tensor, "batch 2 d_hidden"] | None = None,
    ) -> None:
        """Hand every step hook its whole trajectory once (read-only hooks only, see
        :mod:`mechlab.models.recurrence`)."""
        values = self.step_values(x, h, initial_state)
        for point, name in zip(self.step_points(), "ifgoch", strict=True):
            read_trajectory(point, values[name])

    def unrolled(
        self,
        x: Float[Tensor, "batch pos d_model"],
        initial_state: Float[Tensor, "batch 2 d_hidden"] | None = None,
        return_state: bool = False,
    ) -> Float[Tensor, "batch pos d_hidden"] | tuple[Tensor, Tensor]:
        """The LSTM step by step, calling the step hooks; returns every ``h_t`` (and,
        with ``return_state``, the final ``[batch, 2, d_hidden]`` state ``h``, ``c``)."""
        batch, n_pos, _ = x.shape
        rnn = self.rnn
        d_hidden = rnn.hidden_size
        # The input half of every step's pre-activation at once: [batch, pos, 4 * d_hidden]
        x_gates = x @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + rnn.bias_hh_l0
        step_i, step_f, step_g, step_o, step_c, step_h = (
            StepHook(point, n_pos) for point in self.step_points()
        )
        if initial_state is None:
            h = x.new_zeros(batch, d_hidden)
            c = x.new_zeros(batch, d_hidden)
        else:
            h, c = initial_state.unbind(1)  # [batch, d_hidden] each
        for t in range(n_pos):
            gates = x_gates[:, t] + h @ rnn.weight_hh_l0.T  # [batch, 4*d_hidden]
            i, f, g, o = gates.chunk(4, dim=-1)
            i = step_i(t, torch.sigmoid(i))
            f = step_f(t, torch.sigmoid(f))
            g = step_g(t, torch.tanh(g))
            o = step_o(t, torch.sigmoid(o))
            c = step_c(t, f * c + i * g)
            h = step_h(t, o * torch.tanh(c))
        hs = step_h.stacked()  # [batch, pos, d_hidden]
        return (hs, torch.stack([h, c], dim=1)) if return_state else hs


def _row_width(d_hidden: int) -> int:
    """Floats per row of :meth:`LSTMMixer.stepped_values`' buffer: six values of ``d_hidden``
    and a one, rounded up to whole 64-byte lines (16 float32s)."""
    return -(-(6 * d_hidden + 1) // 16) * 16


def _cache_buffer(points: tuple[HookPoint, ...], shape: tuple[int, ...], like: Tensor) -> Tensor:
    """Reused memory for values a cache keeps (:func:`~mechlab.models.buffers.cache_buffer`
    of the first of ``points`` that a cache stores), else a fresh tensor."""
    for point in points:
        out = cache_buffer(point, shape, like)
        if out is not None:
            return out
    return like.new_empty(shape)


class LSTMBlock(ResidualBlock):
    """Pre-norm residual block: ``resid_post = resid_pre + lstm(norm(resid_pre))``."""

    def __init__(self, cfg: LSTMConfig):
        super().__init__(
            nn.LayerNorm(cfg.d_model), "lstm", LSTMMixer(cfg.d_model, cfg.d_hidden, cfg.fused)
        )


class LSTM(ResidualStack):
    """Read-in, ``n_layers`` residual LSTM blocks, final LayerNorm, read-out.

    Args:
        cfg: The model's configuration.

    Hook names: ``hook_embed``; per block ``blocks.{i}.hook_resid_pre``,
    ``blocks.{i}.hook_mixer_in``, ``blocks.{i}.lstm.hook_{i,f,g,o,c,h}``,
    ``blocks.{i}.hook_mixer_out``, ``blocks.{i}.hook_resid_post``; ``hook_out``.
    """

    HOOK_AXES: ClassVar[dict[str, tuple[str, ...]]] = {
        **RESIDUAL_BLOCK_HOOK_AXES,
        **{f"blocks.*.lstm.hook_{g}": ("batch", "pos", "d_hidden") for g in "ifgoch"},
    }
    STEP_HOOKS: ClassVar[frozenset[str]] = frozenset(f"blocks.*.lstm.hook_{g}" for g in "ifgoch")

    def __init__(self, cfg: LSTMConfig):
        super().__init__(cfg)

    def make_block(self, cfg: LSTMConfig) -> LSTMBlock:
        """One residual LSTM block."""
        return LSTMBlock(cfg)

    @property
    def fused(self) -> bool:
        """Whether unhooked layers call ``torch.nn.LSTM``; set ``False`` to force the loop."""
        return all(mixer.fused for mixer in self.mixers())

    @fused.setter
    def fused(self, value: bool) -> None:
        for mixer in self.mixers():
            mixer.fused = value
