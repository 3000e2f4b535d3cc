"""Memory for the big activations that ``run_with_cache`` keeps, reused from call to call.

A cache keeps every activation alive at once, so its biggest entries (a transformer's
attention scores and patterns, ``[batch, head, query_pos, key_pos]``; the recurrent
families' per-step trajectories) cannot come from the memory a plain forward frees and
reuses layer after layer. On the CPU each fresh multi-megabyte tensor is new pages
that the kernel faults in and zeroes (for the ``tiny`` transformer at batch 64 x 251
positions, 0.58 GB of maps: about 140,000 page faults per call, more time than the
plain forward's arithmetic of those maps). So the model computes these activations
straight into buffers of a pool, and a later call reuses a buffer once nothing holds
it any more: no page faults, and the same kernels writing the same numbers.

The rules:

* Only ``run_with_cache`` asks for pool memory (its storing hooks carry a
  :class:`CacheBuffers` session; :func:`cache_buffer` finds it on a hook point), only on
  the CPU, only for tensors of at least :data:`MIN_BYTES`, and only when the pass builds
  no autograd graph through the activation (writing into given memory has no gradient).
* A buffer is handed out again only when its storage is held by the pool alone: no
  cache, no view, slice or numpy array of it is alive (``torch``'s storage use count).
  So a cache you keep is never overwritten; a loop that holds the previous cache while
  the next call runs uses two sets of buffers in turn.
* When a call ends, the pool keeps the buffers in use and at most one spare set of free
  ones: of each shape no more than the last call that used it took, in all no more
  bytes than the largest of the last 8 calls took (recently used shapes first). :func:`release_cache_buffers` gives all
  free memory back; ``mechlab.models.buffers.POOL.enabled = False`` turns reuse off.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor
from transformer_lens.hook_points import HookPoint

# Smaller tensors come from the allocator's heap, which reuses freed memory anyway.
MIN_BYTES = 1 << 20
SESSION = "cache_buffers"  # the attribute a storing hook carries its session under


def _storage_use_count(t: Tensor) -> int | None:
    """How many tensors and storage objects hold ``t``'s storage (None when torch cannot say)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    storage = t.untyped_storage()  # one more holder while this call runs
    return int(count(storage._cdata)) - 1


Key = tuple[tuple[int, ...], torch.dtype, torch.device]


def _nbytes(key: Key) -> int:
    shape, dtype, _ = key
    n = dtype.itemsize
    for size in shape:
        n *= size
    return n


class CacheBuffers:
    """The pool: shape, dtype and device -> buffers (see the module docstring)."""

    def __init__(self, remember: int = 8) -> None:
        self.enabled = True
        self.remember = remember
        self._buffers: dict[Key, list[Tensor]] = {}
        self._lock = threading.Lock()
        self._depth = 0
        self._session = 0
        self._used: dict[Key, int] = {}  # takes of each key since the last trim (sessions and between)
        self._wanted: dict[Key, tuple[int, int]] = {}  # key -> (last session using it, takes then)
        self._recent_bytes: list[int] = []  # bytes each recent session took

    def take(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor | None:
        """A ``shape`` tensor of uninitialised memory held by nobody else, or None when reuse
        is off, the device is not the CPU, the tensor is small or torch cannot count
        holders of a storage."""
        device = torch.device(device)
        shape = tuple(int(n) for n in shape)
        key = (shape, dtype, device)
        if not self.enabled or device.type != "cpu" or _nbytes(key) < MIN_BYTES:
            return None
        with self._lock:
            self._used[key] = self._used.get(key, 0) + 1
            for buf in self._buffers.get(key, []):
                count = _storage_use_count(buf)
                if count is None:
                    return None
                if count == 1:  # only the pool's own tensor holds it
                    return buf.view(shape)  # a new tensor: while it lives the buffer is taken
            with torch.inference_mode(False):  # a normal tensor, usable outside inference mode
                buf = torch.empty(shape, dtype=dtype, device=device)
            self._buffers.setdefault(key, []).append(buf)
            return buf.view(shape)

    @contextmanager
    def session(self) -> Iterator[CacheBuffers]:
        """Bracket one ``run_with_cache`` call; when the outermost call ends, the free
        buffers beyond one spare set are dropped (see :meth:`_trim`)."""
        with self._lock:
            if self._depth == 0:
                self._session += 1
            self._depth += 1
        try:
            yield self
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._trim()

    def _trim(self) -> None:
        """Keep the buffers in use, and free ones up to one spare set: of each shape at most
        as many as the last call that used it took, most recently used shapes first, in
        all no more bytes than the largest of the last ``remember`` calls took."""
        for key, n in self._used.items():
            self._wanted[key] = (self._session, n)
        taken = sum(n * _nbytes(key) for key, n in self._used.items())
        self._used = {}
        self._recent_bytes = [*self._recent_bytes, taken][-self.remember :]
        budget = max(self._recent_bytes)
        order = sorted(self._buffers, key=lambda k: self._wanted.get(k, (0, 0))[0], reverse=True)
        for key in order:
            last, want = self._wanted.get(key, (0, 0))
            if self._session - last >= self.remember:
                want = 0
            kept = []
            for buf in self._buffers[key]:
                if _storage_use_count(buf) != 1:
                    kept.append(buf)  # in use: a cache (or a view of it) is alive
                elif want > 0 and _nbytes(key) <= budget:
                    kept.append(buf)
                    want -= 1
                    budget -= _nbytes(key)
            if kept:
                self._buffers[key] = kept
            else:
                del self._buffers[key]
                self._wanted.pop(key, None)

    def release(self) -> int:
        """Drop every free buffer; returns the bytes given back."""
        freed = 0
        with self._lock:
            for key in list(self._buffers):
                kept = []
                for buf in self._buffers[key]:
                    if _storage_use_count(buf) == 1:
                        freed += buf.numel() * buf.element_size()
                    else:
                        kept.append(buf)
                self._buffers[key] = kept
                if not kept:
                    del self._buffers[key]
        return freed

    def held_bytes(self) -> int:
        """Bytes of every buffer the pool holds (taken or free)."""
        with self._lock:
            return sum(b.numel() * b.element_size() for bufs in self._buffers.values() for b in bufs)


POOL = CacheBuffers()


def release_cache_buffers() -> int:
    """Give the memory of every free cache buffer back (see the module docstring); returns
    the bytes freed."""
    return POOL.release()


def cache_buffer(point: HookPoint, shape: Sequence[int], like: Tensor, grad: bool = False) -> Tensor | None:
    """Memory to compute ``point``'s activation into, when ``run_with_cache`` keeps it.

    Args:
        point: The hook point the activation will go through.
        shape: The activation's shape.
        like: A tensor of the activation's dtype and device.
        grad: Whether the activation is computed from tensors that need a gradient.

    Returns:
        An uninitialised ``shape`` tensor from the pool, or None (compute as usual) when no
        ``run_with_cache`` storing hook is on ``point``, the pass builds an autograd graph
        (``grad`` and gradients enabled) or the pool declines (see :meth:`CacheBuffers.take`).
    """
    if grad and torch.is_grad_enabled():
        return None
    for handle in getattr(point, "fwd_hooks", ()):
        session = getattr(getattr(handle, "user_hook", None), SESSION, None)
        if session is not None:
            return session.take(shape, like.dtype, like.device)
    return None
