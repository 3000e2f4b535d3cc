"""Where trials run: in this process (:class:`LocalExecutor`) or as Ray tasks
(:class:`RayExecutor`).

Both take *units*: a list of trial specs run by one call (one spec per unit when trials
run one by one, a grid point's specs when they train as one batched ensemble) and give
back the unit's list of results. :meth:`submit` queues a unit, :meth:`next_done` blocks
until one finishes, :meth:`cancel` drops one that is no longer needed.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

UnitFn = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def run_one_by_one(trial: Callable[[dict[str, Any]], dict[str, Any]]) -> UnitFn:
    """A unit function that runs ``trial`` on each spec of the unit in turn."""
    return _OneByOne(trial)


class _OneByOne:
    def __init__(self, trial: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.trial = trial

    def __call__(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self.trial(spec) for spec in specs]


class LocalExecutor:
    """Runs units one at a time in this process, in submission order (for debugging and
    for tests; no Ray needed).

    Args:
        unit_fn: Runs a unit (list of specs) and returns its results.
    """

    def __init__(self, unit_fn: UnitFn) -> None:
        self.unit_fn = unit_fn
        self._queue: deque[tuple[int, list[dict[str, Any]]]] = deque()
        self._next = 0

    def submit(self, specs: list[dict[str, Any]]) -> int:
        """Queue a unit; returns its handle."""
        self._next += 1
        self._queue.append((self._next, specs))
        return self._next

    def next_done(self) -> tuple[int, list[dict[str, Any]]]:
        """Run the oldest queued unit; returns (handle, results)."""
        handle, specs = self._queue.popleft()
        return handle, self.unit_fn(specs)

    def cancel(self, handle: int) -> None:
        """Drop a queued unit."""
        self._queue = deque(item for item in self._queue if item[0] != handle)

    def pending(self) -> int:
        """Units queued and not yet run."""
        return len(self._queue)

    def close(self) -> None:
        """Nothing to release."""


def check_address(address: str | None, timeout: float = 3.0) -> None:
    """Refuse a Ray address that cannot be reached, before anything runs.

    Args:
        address: ``None`` (start a local instance), ``"auto"`` (a cluster started on this
            machine with ``ray start``), ``"host:port"`` (a cluster's GCS) or
            ``"ray://host:port"`` (Ray Client).
        timeout: Seconds to wait for a TCP connection.

    Raises:
        ValueError: the address is malformed or nothing answers there.
    """
    if address is None or address == "local":
        return
    if address == "auto":
        if os.environ.get("RAY_ADDRESS"):
            return check_address(os.environ["RAY_ADDRESS"], timeout)
        if not os.path.exists("/tmp/ray/ray_current_cluster"):
            raise ValueError("--address auto: no Ray cluster runs on this machine (start one with "
                             "`ray start --head`, or leave --address out for a local instance)")  # fmt: skip
        return
    target = address[len("ray://") :] if address.startswith("ray://") else address
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Ray address {address!r} is not host:port (or ray://host:port, or auto)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise ValueError(f"cannot reach a Ray cluster at {address!r}: {exc.strerror or exc}") from None


class RayExecutor:
    """Runs units as Ray tasks, on a local instance (started here with ``num_cpus``) or
    a cluster at ``address``. A task whose worker process dies is retried up to
    ``max_retries`` times; an exception raised by the trial is not (it stops the sweep).

    Args:
        unit_fn: Runs a unit (list of specs) and returns its results; shipped to the
            workers by Ray (pickled), so it must be importable there.
        address: ``None`` starts a local instance (or uses the one this process already
            started); else a cluster address (see :func:`check_address`).
        num_cpus: CPUs of a local instance (default: all).
        cpus_per_trial: CPUs each task reserves.
        gpus_per_trial: GPUs each task reserves (fractions allowed).
        max_retries: Retries of a task whose worker died.
    """

    def __init__(
        self, unit_fn: UnitFn, address: str | None = None, num_cpus: int | None = None,
        cpus_per_trial: float = 1.0, gpus_per_trial: float = 0.0, max_retries: int = 3,
    ) -> None:  # fmt: skip
        if address not in (None, "local"):
            _use_token_auth_if_available()  # read when Ray loads: before the import
        # lazy: optional dependency (the sweep extra)
        import ray

        if cpus_per_trial < 0 or gpus_per_trial < 0:
            raise ValueError("resources per trial must be >= 0")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            check_address(address)
            kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR,
                                      "log_to_driver": False}  # fmt: skip
            if address is None or address == "local":
                kwargs["num_cpus"] = num_cpus
            else:
                kwargs["address"] = address
            try:
                ray.init(**kwargs)
            except ConnectionError as exc:
                raise ValueError(f"could not join the Ray cluster at {address!r}: {exc}; if it uses token "
                                 "authentication, set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or "
                                 "RAY_AUTH_TOKEN_PATH) before Ray is imported") from None  # fmt: skip
            self._started = True
        self._fn = ray.put(unit_fn)
        self._remote = ray.remote(_run_unit).options(
            num_cpus=cpus_per_trial, num_gpus=gpus_per_trial, max_retries=max_retries,
            retry_exceptions=False,
        )  # fmt: skip
        self._refs: dict[Any, int] = {}
        self._next = 0

    def submit(self, specs: list[dict[str, Any]]) -> int:
        """Start a unit as a Ray task; returns its handle."""
        self._next += 1
        self._refs[self._remote.remote(self._fn, specs)] = self._next
        return self._next

    def next_done(self) -> tuple[int, list[dict[str, Any]]]:
        """Wait for any unit to finish; returns (handle, results). A trial's exception is
        raised here."""
        ready, _ = self._ray.wait(list(self._refs), num_returns=1)
        ref = ready[0]
        handle = self._refs.pop(ref)
        return handle, self._ray.get(ref)

    def cancel(self, handle: int) -> None:
        """Cancel a unit (queued or running); its result is never collected."""
        for ref, h in list(self._refs.items()):
            if h == handle:
                del self._refs[ref]
                self._ray.cancel(ref)

    def pending(self) -> int:
        """Units started and not yet collected."""
        return len(self._refs)

    def close(self) -> None:
        """Cancel what is still running; shut Ray down if this executor started it."""
        for ref in list(self._refs):
            self._ray.cancel(ref)
        self._refs.clear()
        if self._started:
            self._ray.shutdown()


def _use_token_auth_if_available() -> None:
    """Send this machine's Ray token when joining a cluster.

    Ray >= 2.59 turns token authentication on for every cluster started with ``ray.init()``
    or ``ray start --head`` and saves the token to ``~/.ray/auth_token``, but a client
    joining with ``ray.init(address=...)`` sends it only when ``RAY_AUTH_MODE=token``
    (ray-project/ray#64755), so joining fails with "Authentication token is missing". Unless
    ``RAY_AUTH_MODE`` is set already, it is set to ``token`` here when a token exists
    (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``); a cluster
    without authentication accepts such a client too. Ray reads the mode when it is
    imported, so this runs before ``import ray``.
    """
    if "RAY_AUTH_MODE" in os.environ:
        return
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(token_path):
        os.environ["RAY_AUTH_MODE"] = "token"


def _run_unit(unit_fn: UnitFn, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return unit_fn(specs)
