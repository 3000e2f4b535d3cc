"""Batches drawn ahead in a background thread, so that a GPU step does not wait for the CPU.

The batch of step ``k`` depends only on the run's seed and ``k``
(:func:`~mechlab.train.trainer.batch_generator`), so drawing it early changes nothing:
a prefetched run sees exactly the batches of an on-demand run. The worker thread draws
(and pins, for a CUDA device) the next ``depth`` batches while the device computes; the
main thread copies each to the device without blocking.

On the CPU the trainer does not prefetch by default: the drawing thread would compete
with the step for the same cores (``TrainConfig.prefetch``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch
from torch import Tensor

Batch = tuple[Tensor, ...]

_DONE = object()


class Prefetcher:
    """Draw the batches of steps ``first..last`` in order, ``depth`` ahead, in a thread.

    Args:
        draw: Step -> its batch (a tuple of CPU tensors).
        first: First step to draw.
        last: Last step to draw (inclusive).
        device: Where :meth:`get` puts the batches.
        depth: How many batches may wait, drawn, at once (>= 1).

    Use as a context manager (or call :meth:`close`), and :meth:`get` steps in order.
    """

    def __init__(
        self, draw: Callable[[int], Batch], first: int, last: int, device: torch.device, depth: int = 2
    ) -> None:
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
        self.device = torch.device(device)
        self._pin = self.device.type == "cuda"
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._next = first
        self._thread = threading.Thread(target=self._work, args=(draw, first, last), daemon=True)
        self._thread.start()

    def _work(self, draw: Callable[[int], Batch], first: int, last: int) -> None:
        for step in range(first, last + 1):
            try:
                batch = draw(step)
                if self._pin:
                    batch = tuple(t.pin_memory() for t in batch)
                item = (step, batch)
            except BaseException as exc:  # handed to the main thread by get()
                item = (step, exc)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or isinstance(item[1], BaseException):
                return
        self._queue.put((last + 1, _DONE))

    def get(self, step: int) -> Batch:
        """The batch of ``step``, on the device (steps must be asked for in order).

        Raises:
            ValueError: ``step`` is not the next one.
            Exception: Whatever drawing that batch raised.
        """
        if step != self._next:
            raise ValueError(f"batches are drawn in order: expected step {self._next}, got {step}")
        got, batch = self._queue.get()
        if batch is _DONE:
            raise ValueError(f"step {step} is past the last step drawn ({got - 1})")
        if isinstance(batch, BaseException):
            raise batch
        self._next += 1
        return tuple(t.to(self.device, non_blocking=self._pin) for t in batch)

    def close(self) -> None:
        """Stop the worker and wait for it."""
        self._stop.set()
        while True:  # unblock a worker waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=5)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Prefetcher"]
