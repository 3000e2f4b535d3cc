"""Per-time-step hook points for recurrent models.

TransformerLens' caching hook keeps the *last* tensor a HookPoint saw, and a
patch on a recurrent state must reach every later step. Both are served by
calling a step's HookPoint with a ``[batch, pos, ...]`` buffer that is filled
up to the current step:

* at step ``t`` the hook receives the buffer with positions ``0..t`` filled and
  later positions zero; whatever the hook leaves at position ``t`` (in place,
  or in the tensor it returns) is what the recurrence carries on with;
* after the last step the buffer holds every step, so ``run_with_cache`` stores
  the whole ``[batch, pos, ...]`` trajectory;
* nnsight addresses the ``t``-th call of such a hook point as time step ``t``
  (``for _ in tracer.iter[t]``); its first call is step 0.

Backward hooks (``model.hooks(bwd_hooks=...)``, ``run_with_cache(incl_bwd=True)``)
fire once per backward pass with one ``[batch, pos, ...]`` gradient: position ``t``
holds the total derivative of the loss with respect to the value carried on from
step ``t`` (through every later step). It comes from a zero "gradient tap"
``[batch, pos, ...]`` that each carried step adds (``carried_t = value_t + tap[:, t]``;
adding zero leaves the forward numbers as they are); the tap's gradient is handed to
the point's backward hooks. Such hooks read the gradient: what they return is ignored
(the gradient has already flowed through the recurrence when it is known).

When no hook is attached the buffer is skipped; either way the carried steps
are stacked, so the hooked and unhooked paths compute the same numbers.
Inside an nnsight trace every step hook point counts as hooked, so the buffers
are filled; outside one the fast path is back.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformer_lens.hook_points import HookPoint


def is_hooked(*points: HookPoint) -> bool:
    """True when any of ``points`` has a TransformerLens hook or an nnsight tracer on it."""
    return any(
        len(p._forward_hooks) > 0 or len(p._backward_hooks) > 0 or _in_nnsight_trace(p) for p in points
    )


def _in_nnsight_trace(point: HookPoint) -> bool:
    """nnsight replaces ``forward`` for good when it wraps a model; its per-module
    state says whether a trace is running now."""
    state = point.__dict__.get("__nnsight__")
    if state is None:
        return "forward" in point.__dict__
    return state.active()[0] is not None


class StepHook:
    """Runs one HookPoint once per time step over a growing ``[batch, pos, ...]`` buffer.

    Args:
        point: The HookPoint, e.g. ``blocks.0.lstm.hook_h``.
        n_pos: Number of time steps.
    """

    def __init__(self, point: HookPoint, n_pos: int):
        self.point = point
        self.n_pos = n_pos
        self.active = is_hooked(point)
        self.buffer: Tensor | None = None
        self.steps: list[Tensor] = []
        self.taps: tuple[Tensor, ...] | None = None  # one zero per step, see _add_tap

    def _add_tap(self, t: int, carried: Tensor) -> Tensor:
        """``carried + 0`` through the gradient tap, when backward hooks need it."""
        if self.taps is None:
            if not (len(self.point._backward_hooks) > 0 and torch.is_grad_enabled()):
                self.taps = ()
                return carried
            tap = carried.new_zeros((carried.shape[0], self.n_pos, *carried.shape[1:]))
            tap.requires_grad_(True)
            tap.register_hook(self._fire_backward_hooks)
            # unbind once: its backward stacks the steps' gradients in one go (linear in pos)
            self.taps = tap.unbind(1)
        return carried + self.taps[t] if self.taps else carried

    def _fire_backward_hooks(self, grad: Tensor) -> None:
        """Hand the ``[batch, pos, ...]`` gradient to the point's backward hooks, once."""
        for hook in list(self.point._backward_hooks.values()):
            hook(self.point, (grad,), (grad,))

    def __call__(self, t: int, value: Tensor) -> Tensor:
        """Pass step ``t``'s value through the hook; returns the value to carry on with.

        The buffer the hook sees is detached from the autograd graph (writing live
        values into one shared buffer would make the backward pass quadratic in the
        sequence length). A step the hook leaves unchanged carries on with the
        original value and its gradient; a step the hook changes carries on with the
        hook's value, so a patched step passes no gradient to what produced it.
        """
        if not self.active:
            self.steps.append(value)
            return value
        if self.buffer is None:
            shape = (value.shape[0], self.n_pos, *value.shape[1:])
            self.buffer = value.new_zeros(shape)
        original = value.detach()
        self.buffer[:, t] = original
        out = self.point(self.buffer)
        if out is None:
            out = self.buffer
        step = out[:, t]
        if out is self.buffer and torch.equal(step, original):
            carried = value
        else:
            carried = step.clone()
            if out is not self.buffer:
                self.buffer[:, t] = step.detach()
        carried = self._add_tap(t, carried)
        self.steps.append(carried)
        return carried

    def stacked(self) -> Tensor:
        """All steps as one ``[batch, pos, ...]`` tensor (call after the last step).

        The hook's buffer (what ``run_with_cache`` stored) is overwritten with the carried
        steps, so the cache shows each step once, as the recurrence used it, even when a
        hook edited earlier positions again on later calls.
        """
        out = torch.stack(self.steps, dim=1)
        if self.buffer is not None:
            self.buffer.copy_(out.detach())
        return out
