"""The masked forward's reader mixing as one contraction per reader group, with a hand-written backward.

:class:`~mechlab.prune.forward._Stream` (the straightforward path) keeps one difference
tensor per writer group and builds a reader group's inputs with one ``addmm_`` per
upstream group, each of which reads and writes the whole ``[R, batch * pos * d]`` output:
at layer ``l`` of a transformer that is about ``2 l`` passes over the output, and
autograd runs two more matrix products per group in the backward pass.

:class:`WriterStore` instead writes every writer's difference ``D_w`` into one
preallocated ``[n_writers, batch * pos * d]`` buffer (rows filled in graph order, never
changed afterwards), so a reader group's inputs are a single product

    x = base + z[R, n_up] @ D[:n_up]                         (:func:`mix_norm`)

followed, inside the same autograd node, by each reader's own LayerNorm (or RMSNorm). The backward
pass of that node computes, from the gradient ``G`` of the mixed inputs,
``dz = G @ D[:n_up]^T`` (one product) and adds ``z^T @ G`` to the gradients of the
upstream writers' differences, kept per writer group (:meth:`WriterStore.grad`). Each
group's :func:`store` node hands its accumulated gradient back to autograd once every
reader of the group has run its backward (autograd's topological order guarantees that:
every reader node takes the tokens of the groups it reads as inputs).

What a reader node keeps for its backward pass is chosen by ``recompute``: the mixed
inputs (``[R, batch, pos, d]``, what LayerNorm's backward needs), or nothing but the
per-row mean and inverse deviation, recomputing the mixed inputs from ``D`` when the
backward pass reaches it (activation checkpointing of the reader inputs: one more
product per reader group, and the memory of the stored inputs saved).

Only first derivatives are implemented, and the model's parameters are treated as
constants (:func:`usable` says when this path applies; the masked forward falls back to
the straightforward one otherwise).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from mechlab.models.buffers import POOL


def usable(model: nn.Module, *tensors: Tensor | None) -> bool:
    """Whether the fast path applies: no model parameter needs a gradient and no
    double-backward can be asked for (``create_graph`` is not used by pruning).

    Args:
        model: The model run by the masked forward.
        *tensors: Other constants of the pass (the ablated outputs), None allowed.

    Returns:
        True when every parameter of ``model`` and every given tensor is constant.
    """
    if any(p.requires_grad for p in model.parameters()):
        return False
    return not any(t is not None and t.requires_grad for t in tensors)


def _reused(like: Tensor, *shape: int) -> Tensor:
    """Uninitialised memory of ``shape`` from the pool of reused buffers when it has some
    (:mod:`mechlab.models.buffers`: on the CPU a fresh tensor of this size is fresh pages,
    faulted in and zeroed every step), else a fresh tensor."""
    out = POOL.take(shape, like.dtype, like.device)
    return like.new_empty(shape) if out is None else out


class WriterStore:
    """Every writer's difference ``D_w``, one row each of a preallocated buffer, and their gradients.

    Args:
        n_writers: Rows of the buffer (the graph's writers).
        row_shape: ``(batch, pos, d)`` of one writer's difference.
        like: A tensor whose dtype and device the buffer takes.
        buffer: ``[n_writers, batch * pos * d]`` memory to use as the buffer (None: the
            pool's, or fresh).
    """

    def __init__(self, n_writers: int, row_shape: tuple[int, ...], like: Tensor, buffer: Tensor | None = None):
        self.row_shape = tuple(row_shape)
        n = 1
        for size in row_shape:
            n *= size
        if buffer is not None and tuple(buffer.shape) != (n_writers, n):
            raise ValueError(f"the writer buffer must be [{n_writers}, {n}], got {list(buffer.shape)}")
        self.diffs = _reused(like, n_writers, n) if buffer is None else buffer  # [n_writers, batch * pos * d]
        self.n = 0  # rows written so far
        self.group_starts: list[int] = []  # first row of each stored group
        self.grads: Tensor | None = None  # [n_writers, batch * pos * d], made by the backward pass
        self.n_grads = 0  # leading rows of ``grads`` being accumulated (the rest is stale)
        self.handed_out = False  # rows of ``grads`` were returned to autograd
        self.backward_pass = 0  # backward passes seen (see :meth:`add_grad`)

    def add_grad(self, z: Tensor, grad: Tensor, backward_pass: int) -> None:
        """Add ``z^T @ grad`` to the gradients of the first ``z.shape[1]`` differences.

        A reader whose rows reach past those still being accumulated, or that runs its
        backward for the ``backward_pass``-th time first, starts a new backward pass
        (``retain_graph=True`` and a second ``backward``, as ``gradcheck`` does): the
        gradients start from zero, in a new buffer if the last one's rows were handed out.

        Args:
            z: ``[R, n_up]`` the readers' edge masks.
            grad: ``[R, batch * pos * d]`` the gradient of the readers' mixed inputs.
            backward_pass: How many times this reader's backward has run, this one included.
        """
        n_up = z.shape[1]
        if self.grads is None or n_up > self.n_grads or backward_pass > self.backward_pass:
            if self.grads is None or self.handed_out:
                self.grads = _reused(self.diffs, *self.diffs.shape)  # [n_writers, N]
                self.handed_out = False
            torch.mm(z.T, grad, out=self.grads[:n_up])  # assigned, not added
            self.n_grads = n_up
            self.backward_pass = max(self.backward_pass, backward_pass)
            return
        self.grads[:n_up].addmm_(z.T, grad)  # [n_up, N] += [n_up, R] @ [R, N]

    def take_grad(self, start: int, k: int) -> Tensor:
        """The gradients of rows ``start .. start + k``, once every reader of them has added
        its part (zeros if none did); later readers then no longer add to them."""
        if self.grads is None or self.n_grads < start + k:
            return self.diffs.new_zeros(k, self.diffs.shape[1])
        self.n_grads = min(self.n_grads, start)
        self.handed_out = True
        return self.grads[start : start + k]


class _Store(torch.autograd.Function):
    """Writes a group's differences into the store; returns a token the readers depend on."""

    @staticmethod
    def forward(ctx, diff: Tensor, writers: WriterStore) -> Tensor:  # type: ignore[override]
        k = diff.shape[0]
        start = writers.n
        if start + k > writers.diffs.shape[0]:
            raise AssertionError("more writer outputs than the graph has writers")
        writers.diffs[start : start + k].copy_(diff.reshape(k, -1))
        writers.group_starts.append(start)
        writers.n += k
        ctx.writers, ctx.start, ctx.shape = writers, start, diff.shape
        return diff.new_zeros(())  # token: [] (its gradient is never used)

    @staticmethod
    @once_differentiable
    def backward(ctx, _token_grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        writers: WriterStore = ctx.writers
        k = ctx.shape[0]
        grad = writers.take_grad(ctx.start, k)  # [k, batch * pos * d]
        return grad.view(ctx.shape), None


def _rms_norm(mixed: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``x / sqrt(mean(x^2) + eps) * w`` and the inverse root ``[..., 1]``."""
    rstd = torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + eps)
    return mixed * rstd * weight, rstd


def _rms_norm_backward(grad_out: Tensor, mixed: Tensor, rstd: Tensor, weight: Tensor) -> Tensor:
    """The input gradient of :func:`_rms_norm`: with ``y = w x r`` and ``r = (mean(x^2) +
    eps)^(-1/2)``, ``dx = r (g w - x r^2 mean(g w x))``."""
    gw = grad_out * weight
    return rstd * (gw - mixed * rstd.pow(2) * (gw * mixed).mean(-1, keepdim=True))


class _MixNorm(torch.autograd.Function):
    """``norm(base + z @ D[:n_up])`` for ``R`` readers (a LayerNorm, an RMSNorm or none),
    with its own backward (see the module)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        z: Tensor,
        base: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
        rms: bool,
        writers: WriterStore,
        recompute: bool,
        *tokens: Tensor,
    ) -> Tensor:
        n_readers, n_up = z.shape
        batch, n_pos, d = writers.row_shape
        # kept for the backward pass: reused memory (fresh pages every step otherwise)
        mixed = _mix(z, base, writers, reuse=not recompute and weight is not None)  # [R, batch * pos, d]
        if weight is None:
            out, mean, rstd = mixed, None, None
        elif rms:
            (out, rstd), mean = _rms_norm(mixed, weight, eps), None
        else:
            out, mean, rstd = torch.native_layer_norm(mixed, (d,), weight, bias, eps)
        ctx.writers, ctx.n_up, ctx.recompute, ctx.eps, ctx.rms = writers, n_up, recompute, eps, rms
        ctx.base_shape = base.shape
        ctx.has_norm = weight is not None
        saved_mixed = None if recompute or weight is None else mixed
        ctx.save_for_backward(z, base, weight, bias, mean, rstd, saved_mixed)
        return out.view(n_readers, batch, n_pos, d)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        z, base, weight, bias, mean, rstd, mixed = ctx.saved_tensors
        writers: WriterStore = ctx.writers
        n_up = ctx.n_up
        d_up = writers.diffs[:n_up]  # [n_up, N]
        n_readers = z.shape[0]
        batch, n_pos, d = writers.row_shape
        grad_out = grad_out.reshape(n_readers, batch * n_pos, d)
        if ctx.has_norm:
            if mixed is None:  # recompute the mixed inputs
                mixed = _mix(z, base, writers)
            if ctx.rms:
                grad_mixed = _rms_norm_backward(grad_out, mixed, rstd, weight)
            else:
                grad_mixed = torch.ops.aten.native_layer_norm_backward(
                    grad_out, mixed, [d], mean, rstd, weight, bias, [True, False, False]
                )[0]
        else:
            grad_mixed = grad_out
        grad_flat = grad_mixed.reshape(n_readers, -1)  # [R, N]
        grad_z = grad_flat @ d_up.T if ctx.needs_input_grad[0] else None  # [R, n_up]
        ctx.backward_pass = getattr(ctx, "backward_pass", 0) + 1
        writers.add_grad(z, grad_flat, ctx.backward_pass)  # [n_up, N] += [n_up, R] @ [R, N]
        grad_base = None
        if ctx.needs_input_grad[1]:
            grad_base = grad_flat.sum(0).view(batch, n_pos, d)
            grad_base = _sum_to(grad_base, ctx.base_shape)
        return (grad_z, grad_base, None, None, None, None, None, None) + (None,) * (
            len(ctx.needs_input_grad) - 8
        )


def _mix(z: Tensor, base: Tensor, writers: WriterStore, reuse: bool = False) -> Tensor:
    """``base + z @ D[:n_up]`` as ``[R, batch * pos, d]`` (a product, then the base added in
    place: cheaper than ``addmm`` with a broadcast input, which first copies it out);
    ``reuse``: into memory of the pool of reused buffers."""
    batch, n_pos, d = writers.row_shape
    d_up = writers.diffs[: z.shape[1]]
    out = _reused(d_up, z.shape[0], d_up.shape[1]) if reuse else None
    mixed = torch.mm(z, d_up, out=out)  # [R, batch * pos * d]
    mixed = mixed.view(z.shape[0], batch, n_pos, d).add_(base)
    return mixed.view(z.shape[0], batch * n_pos, d)


def _sum_to(grad: Tensor, shape: torch.Size) -> Tensor:
    """``grad`` summed over the axes that ``shape`` broadcast to it."""
    lead = grad.dim() - len(shape)
    if lead:
        grad = grad.sum(dim=tuple(range(lead)))
    dims = tuple(i for i, size in enumerate(shape) if size == 1 and grad.shape[i] != 1)
    return grad.sum(dim=dims, keepdim=True) if dims else grad


class FastStream:
    """The disentangled residual stream of the fast path (same arithmetic as ``_Stream``).

    Args:
        ablated: ``[n_writers, batch | 1, pos, d]`` ablated writer outputs ``X~``.
        node_mask: ``[n_writers]`` node masks, or None.
        batch: Traces in the pass.
        recompute: Recompute each reader group's mixed inputs in the backward pass
            instead of keeping them.
    """

    def __init__(
        self, ablated: Tensor, node_mask: Tensor | None, batch: int, recompute: bool, buffer: Tensor | None = None
    ):
        self.ablated = ablated
        self.node_mask = node_mask
        self.recompute = recompute
        n_writers, _, n_pos, d = ablated.shape
        self.writers = WriterStore(n_writers, (batch, n_pos, d), ablated, buffer)
        self.tokens: list[Tensor] = []
        self.base: Tensor = ablated.new_zeros(d)  # ablated residual: sum of X~ so far + constants

    def state(self) -> tuple[int, tuple[int, ...], Tensor]:
        """What the stream holds so far besides the buffer's rows: ``(rows written,
        the groups' first rows, the ablated residual)`` (:meth:`resume` takes it back)."""
        return self.writers.n, tuple(self.writers.group_starts), self.base

    @classmethod
    def resume(
        cls, ablated: Tensor, batch: int, buffer: Tensor, state: tuple[int, tuple[int, ...], Tensor]
    ) -> FastStream:
        """A stream (no node masks, no backward pass) whose ``buffer`` already holds the
        first rows of a pass, ``state`` being that pass's :meth:`state` at that point."""
        stream = cls(ablated, None, batch, recompute=True, buffer=buffer)
        n, starts, stream.base = state
        stream.writers.n, stream.writers.group_starts = n, list(starts)
        stream.tokens = [ablated.new_zeros(()) for _ in starts]  # no backward: placeholders
        return stream

    def add(self, outputs: Float[Tensor, "k batch pos d"]) -> None:
        """Store the next ``k`` writers' outputs (in graph order)."""
        n, k = self.writers.n, outputs.shape[0]
        ablated = self.ablated[n : n + k]  # [k, batch | 1, pos, d]
        diff = outputs - ablated  # [k, batch, pos, d]
        if self.node_mask is not None:
            diff = diff * self.node_mask[n : n + k].view(k, 1, 1, 1)
        self.tokens.append(_Store.apply(diff, self.writers))
        self.base = self.base + ablated.sum(0)

    def add_constant(self, value: Tensor) -> None:
        """A bias added to the residual stream that is no writer's output (attention ``b_O``)."""
        self.base = self.base + value

    def read_norm(
        self, z: Float[Tensor, "reader upstream"], norm: nn.Module
    ) -> Float[Tensor, "reader batch pos d"]:
        """Mixed inputs of ``R`` readers that read the first ``z.shape[1]`` writers, each
        through its own copy of the norm ``norm``: a LayerNorm (weights ``w``, ``b``), an
        RMSNorm (``w`` only) or none (a ``NoNorm``)."""
        n_up = z.shape[1]
        tokens = [t for t, start in zip(self.tokens, self.writers.group_starts, strict=True)
                  if start < n_up]  # fmt: skip
        weight, bias = getattr(norm, "w", None), getattr(norm, "b", None)
        rms = weight is not None and bias is None
        if weight is not None and weight.dtype != self.base.dtype:  # Gemma's float32 norms
            weight = weight.to(self.base.dtype)
            bias = None if bias is None else bias.to(self.base.dtype)
        eps = float(getattr(norm, "eps", 0.0))
        return _MixNorm.apply(
            z, self.base, weight, bias, eps, rms, self.writers, self.recompute, *tokens
        )
