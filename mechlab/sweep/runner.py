"""Run a sweep: drive every N* search (and the OOD trainings) at once over an executor,
persisting each trial as it finishes.

The driver keeps one open *grid point* (a search's current N: one trial per lr and
seed) per unfinished search, submits the trials not yet on disk, and feeds each point's
outcome back to its search as soon as it is known: a success as soon as one
configuration reaches validation loss < epsilon (the point's other trials are then
cancelled unless another point needs them), a failure once all have finished without
one. Every finished trial is written to ``<out>/trials/`` at once (atomically), so a
sweep stopped at any moment resumes where it was: a re-run replays each search from the
stored trials and runs only what is missing. Trials shared between searches (the same
spec) run once.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlab.progress import tqdm
from mechlab.sweep.executors import (
    LocalExecutor,
    RayExecutor,
    UnitFn,
    check_address,
    run_one_by_one,
)
from mechlab.sweep.kappa import Kappa, OodSummary, kappa, ood_summary
from mechlab.sweep.search import NStarSearch, SearchResult
from mechlab.sweep.spec import JOINT, SearchKey, SweepSpec
from mechlab.sweep.store import TrialStore, trial_key

DEFAULT_TRIAL = "mechlab.train.trials:run_trial"
DEFAULT_TRIALS = "mechlab.train.dispatch:run_trials"
UNITS = ("trial", "point")


def resolve_function(name: str | Callable) -> Callable:
    """A callable given as itself or as ``"module:function"`` (or ``module:attribute``).

    Raises:
        ValueError: the module or the name does not exist, or is not callable.
    """
    if callable(name):
        return name
    module_name, _, attr = str(name).partition(":")
    if not module_name or not attr:
        raise ValueError(f"a trial function is named module:function, got {name!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for trial function {name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"trial function {name!r}: module {module_name!r} has no function {attr!r}")
    return fn


def succeeded(result: dict[str, Any], epsilon: float) -> bool:
    """Whether a trial reached validation loss < epsilon (a NaN loss did not)."""
    loss = result.get("val_loss")
    return loss is not None and math.isfinite(float(loss)) and float(loss) < epsilon


@dataclass
class SweepResult:
    """What a sweep found.

    Attributes:
        spec: The sweep that ran.
        searches: Each search's outcome.
        kappas: kappa per joint search (model, format, task at L), when ``spec.kappa``.
        ood: OOD summary per main search, when ``spec.ood`` (``None``: no trial
            reported OOD accuracy).
        trials: Every trial the sweep used (run now or read back), each with its spec.
        ran: Trials run by this call.
        reused: Trials read back from the store instead of run.
    """

    spec: SweepSpec
    searches: dict[SearchKey, SearchResult]
    kappas: dict[SearchKey, Kappa] = field(default_factory=dict)
    ood: dict[SearchKey, OodSummary | None] = field(default_factory=dict)
    trials: list[dict[str, Any]] = field(default_factory=list)
    ran: int = 0
    reused: int = 0


@dataclass
class _Point:
    kind: str  # "search" or "ood"
    key: SearchKey
    n: int
    specs: list[dict[str, Any]]
    keys: list[str]


class _Driver:
    def __init__(self, spec: SweepSpec, store: TrialStore, make_executor: Callable[[], Any],
                 units: str, progress: bool) -> None:  # fmt: skip
        self.spec, self.store, self.make_executor, self.units = spec, store, make_executor, units
        self.executor: Any = None
        self.searches = {key: NStarSearch(spec.search, cap=spec.cap(key)) for key in spec.search_keys()}
        self.open: dict[SearchKey, _Point] = {}  # the open grid point of each search
        self.ood_points: dict[SearchKey, _Point] = {}
        self.ood_done: dict[SearchKey, list[dict[str, Any]]] = {}
        self.handle_specs: dict[int, list[dict[str, Any]]] = {}
        self.inflight: dict[str, int] = {}  # trial key -> handle of its unit
        self.used: dict[str, None] = {}  # trial keys the sweep used, in order
        self.ran: set[str] = set()  # trial keys run by this call
        self.bar = tqdm(total=0, desc="sweep trials", unit="trial", disable=not progress, leave=False)

    # -- points ---------------------------------------------------------------------------
    def _point(self, kind: str, key: SearchKey, n: int) -> _Point:
        specs = self.spec.trial_specs(key, n)
        return _Point(kind, key, n, specs, [trial_key(s) for s in specs])

    def _outcome(self, point: _Point) -> bool | None:
        """True/False once a search point's outcome is known, else None."""
        results = [self.store.get(s) for s in point.specs]
        if any(r is not None and succeeded(r, self.spec.search.epsilon) for r in results):
            return True
        return False if all(r is not None for r in results) else None

    def _submit_missing(self, point: _Point) -> None:
        missing = [s for s, k in zip(point.specs, point.keys, strict=True)
                   if self.store.get(s) is None and k not in self.inflight]  # fmt: skip
        if not missing:
            return
        if self.executor is None:
            self.executor = self.make_executor()
        units = [missing] if self.units == "point" else [[s] for s in missing]
        for unit in units:
            handle = self.executor.submit(unit)
            self.handle_specs[handle] = unit
            for s in unit:
                self.inflight[trial_key(s)] = handle
        self.bar.total += len(missing)
        self.bar.refresh()

    def _use(self, point: _Point) -> None:
        for k, s in zip(point.keys, point.specs, strict=True):
            if k not in self.used and self.store.get(s) is not None:
                self.used[k] = None

    def advance(self) -> None:
        """Open a point for each unfinished search without one; settle what the store
        already answers; submit the rest."""
        progressed = True
        while progressed:
            progressed = False
            for key, search in self.searches.items():
                if search.done or key in self.open:
                    continue
                point = self._point("search", key, search.next_n())
                outcome = self._outcome(point)
                if outcome is None:
                    self.open[key] = point
                    self._submit_missing(point)
                else:
                    self._use(point)
                    search.record(point.n, outcome)
                    progressed = True
        for point in self.ood_points.values():
            if point.key not in self.ood_done:
                self._submit_missing(point)

    def start_ood(self) -> None:
        for key in self.spec.main_keys():
            point = self._point("ood", key, self.spec.ood_n_for(key))
            self.ood_points[key] = point
            if all(self.store.get(s) is not None for s in point.specs):
                self._finish_ood(point)

    def _finish_ood(self, point: _Point) -> None:
        self.ood_done[point.key] = [self.store.get(s) for s in point.specs]
        self._use(point)

    # -- the loop -------------------------------------------------------------------------
    def _needed(self) -> set[str]:
        need: set[str] = set()
        for point in self.open.values():
            need.update(point.keys)
        for key, point in self.ood_points.items():
            if key not in self.ood_done:
                need.update(point.keys)
        return need

    def collect(self) -> None:
        """Take one finished unit, persist its trials, settle the points it answers."""
        handle, results = self.executor.next_done()
        specs = self.handle_specs.pop(handle)
        if len(results) != len(specs):
            raise ValueError(f"a trial unit of {len(specs)} spec(s) returned {len(results)} result(s)")
        for s, r in zip(specs, results, strict=True):
            self.store.put(s, r)
            self.inflight.pop(trial_key(s), None)
            self.ran.add(trial_key(s))
        self.bar.update(len(specs))
        for key, point in list(self.open.items()):
            outcome = self._outcome(point)
            if outcome is not None:
                del self.open[key]
                self._use(point)
                self.searches[key].record(point.n, outcome)
        for key, point in self.ood_points.items():
            if key not in self.ood_done and all(self.store.get(s) is not None for s in point.specs):
                self._finish_ood(point)
        self._cancel_unneeded()
        done = sum(s.done for s in self.searches.values())
        self.bar.set_postfix_str(f"searches {done}/{len(self.searches)}")

    def _cancel_unneeded(self) -> None:
        need = self._needed()
        for handle, specs in list(self.handle_specs.items()):
            keys = [trial_key(s) for s in specs]
            if not any(k in need for k in keys):
                self.executor.cancel(handle)
                del self.handle_specs[handle]
                for k in keys:
                    self.inflight.pop(k, None)
                self.bar.total -= len(specs)

    def run(self) -> None:
        try:
            if self.spec.ood:
                self.start_ood()
            self.advance()
            while self.executor is not None and self.executor.pending():
                self.collect()
                self.advance()
        finally:
            self.bar.close()
            if self.executor is not None:
                self.executor.close()
        unfinished = [k.label for k, s in self.searches.items() if not s.done]
        if unfinished:  # cannot happen unless a unit was lost
            raise RuntimeError(f"searches left unfinished: {unfinished}")


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    trial: str | Callable = DEFAULT_TRIAL,
    trials: str | Callable | None = None,
    units: str = "trial",
    local: bool = False,
    address: str | None = None,
    num_cpus: int | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    max_retries: int = 3,
    progress: bool = True,
) -> SweepResult:
    """Run (or resume) a sweep; finished trials are kept in ``<out>/trials/``.

    Args:
        spec: What to run.
        out: The sweep's folder (trials are read from and written to ``out/trials``).
        trial: The trial function (``spec dict -> result dict``, as
            :func:`mechlab.train.trials.run_trial`) or its ``module:function`` name.
        trials: With ``units="point"``: the function that trains a grid point's specs
            together (as :func:`mechlab.train.dispatch.run_trials`); default ``run_trials``
            when ``trial`` is the default, else ``trial`` on each spec in turn.
        units: ``trial`` (one task per trial; a point stops early once one succeeds)
            or ``point`` (one task per grid point, e.g. a batched ensemble).
        local: Run in this process, one trial at a time (no Ray).
        address: Ray cluster to join (default: start a local instance).
        num_cpus: CPUs of a local Ray instance.
        cpus_per_trial: CPUs each Ray task reserves.
        gpus_per_trial: GPUs each Ray task reserves.
        max_retries: Retries of a Ray task whose worker died.
        progress: Show a progress bar.

    Returns:
        The :class:`SweepResult` (write it with :func:`mechlab.pipelines.write_outputs`).
    """
    if units not in UNITS:
        raise ValueError(f"unknown units {units!r}; choose from {', '.join(UNITS)}")
    trial_fn = resolve_function(trial)
    if units == "point":
        if trials is None:
            trials = DEFAULT_TRIALS if trial == DEFAULT_TRIAL else None
        unit_fn: UnitFn = resolve_function(trials) if trials is not None else run_one_by_one(trial_fn)
    else:
        unit_fn = run_one_by_one(trial_fn)
    if not local:
        check_address(address)  # before any trial or Ray start

        def make_executor() -> Any:
            return RayExecutor(unit_fn, address=address, num_cpus=num_cpus, cpus_per_trial=cpus_per_trial,
                               gpus_per_trial=gpus_per_trial, max_retries=max_retries)  # fmt: skip
    else:

        def make_executor() -> Any:
            return LocalExecutor(unit_fn)

    store = TrialStore(Path(out) / "trials")
    driver = _Driver(spec, store, make_executor, units, progress)
    driver.run()
    result = SweepResult(spec=spec, searches={k: s.result() for k, s in driver.searches.items()},
                         ran=len(driver.ran), reused=sum(k not in driver.ran for k in driver.used))  # fmt: skip
    if spec.kappa:
        for key in spec.main_keys():
            if key.lengths in JOINT:
                per_length = {k.L: result.searches[k] for k in spec.kappa_keys(key)}
                result.kappas[key] = kappa(per_length, result.searches[key], key.L)
    if spec.ood:
        result.ood = {key: ood_summary(driver.ood_done[key]) for key in spec.main_keys()}
    result.trials = [store.get_key(k) for k in driver.used]
    return result
