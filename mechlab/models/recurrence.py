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

Reading hooks (:func:`reads_only`, :func:`hook_use`): a hook that only reads, such as
the caching hooks of ``run_with_cache``, needs no step-by-step recurrence, since nothing
it does can change what the recurrence carries on with. A mixer whose step points carry
only forward hooks marked with :func:`reads_only` computes every step's value with its
fast path (the fused LSTM, the scans) and calls each step point **once** with the whole
``[batch, pos, ...]`` trajectory (:func:`read_trajectory`); the hook's final view of the
buffer is the same as after the step-by-step calls. Any other hook counts as possibly
writing and keeps the step-by-step path: an unmarked forward hook (e.g. one added with
``add_hook`` or ``model.hooks(...)``), a hook registered with ``register_forward_hook``
directly, a backward hook (its gradient taps need the steps), and any nnsight trace.
A marked hook that writes anyway (returns a tensor, or edits the trajectory in place)
raises a ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from transformer_lens.hook_points import HookPoint


def is_hooked(*points: HookPoint) -> bool:
    """True when any of ``points`` has a TransformerLens hook or an nnsight tracer on it."""
    return any(
        len(p._forward_hooks) > 0 or len(p._backward_hooks) > 0 or _in_nnsight_trace(p) for p in points
    )


READS_ONLY = "reads_only"  # the attribute :func:`reads_only` sets on a hook function


def reads_only(hook: Callable) -> Callable:
    """Mark a hook function as one that only reads its activation (returns None, edits nothing).

    On a per-step hook point such a hook is called once with the whole ``[batch, pos, ...]``
    trajectory, computed by the mixer's fast path, instead of once per step (see the
    module docstring). ``run_with_cache`` marks its caching hooks this way.

    Args:
        hook: A TransformerLens hook ``fn(activation, hook)`` (a function or a
            ``functools.partial``).

    Returns:
        ``hook`` itself, marked.
    """
    setattr(hook, READS_ONLY, True)
    return hook


def _forward_hooks_read_only(point: HookPoint) -> bool:
    """True when every forward hook on ``point`` went through ``add_hook`` and is marked
    :func:`reads_only` (TransformerLens keeps the user's function on its handle)."""
    handles = getattr(point, "fwd_hooks", [])
    if len(handles) != len(point._forward_hooks):
        return False  # a hook registered with register_forward_hook directly
    return all(getattr(getattr(h, "user_hook", None), READS_ONLY, False) is True for h in handles)


def hook_use(*points: HookPoint) -> str:
    """How a mixer's per-step points are in use: ``"none"``, ``"read"`` or ``"write"``.

    ``"write"`` (the step-by-step path is needed) when any point has a backward hook, a
    forward hook not marked :func:`reads_only`, or an nnsight trace on it; ``"read"`` when
    some point has forward hooks and all of them are marked read-only; ``"none"`` when no
    point has any hook.

    Args:
        *points: The mixer's step hook points.

    Returns:
        ``"none"``, ``"read"`` or ``"write"``.
    """
    use = "none"
    for p in points:
        if len(p._backward_hooks) > 0 or _in_nnsight_trace(p):
            return "write"
        if len(p._forward_hooks) > 0:
            if not _forward_hooks_read_only(p):
                return "write"
            use = "read"
    return use


def read_trajectory(point: HookPoint, trajectory: Tensor) -> None:
    """Hand a whole ``[batch, pos, ...]`` trajectory to a point's read-only hooks, once.

    The hooks see it detached (as they see the step buffer on the step-by-step path).

    Args:
        point: A per-step hook point whose forward hooks are all read-only (or none).
        trajectory: Every step's value, as the recurrence used it.

    Raises:
        ValueError: A hook marked read-only returned a tensor or edited the trajectory.
    """
    if len(point._forward_hooks) == 0:
        return
    value = trajectory.detach()
    version = value._version
    out = point(value)
    if (out is not None and out is not value) or value._version != version:
        raise ValueError(
            f"a hook on {point.name} is marked reads_only but changed the activation; "
            "remove the mark (mechlab.models.recurrence.reads_only) so the step-by-step path runs"
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
