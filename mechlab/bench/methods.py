"""`mechlab bench methods`: circuit-finding methods side by side, the MIB way.

For every registered method (:mod:`mechlab.circuit_methods`; :func:`bench_methods`):

* on a model and its traces (the bundled checkpoint's NiH traces), per target: the
  circuit of :func:`~mechlab.prune.methods.find_circuit` at the default budget (sparsity
  0.95 of the countable edges, whole paths), its held-out faithfulness and complement,
  the seconds it took and the peak memory above the process's footprint when it started
  (:func:`peak_rss`; on CUDA the allocator's peak); then MIB's CPR and CMD
  (:func:`~mechlab.prune.curves.faithfulness_curve`: nested top-k circuits across MIB's
  budgets) with the method's scores as the ranking (``|score|`` for attribution, the
  signed removal effect for ACDC, ``log_alpha`` for pruning);
* per target, the circuit's stability over resampled training traces
  (:func:`~mechlab.prune.stability.bootstrap_stability`, ``stability_boots`` replicates:
  the mean edge Jaccard of the method's circuits on the resampled traces with its own
  circuit; not counted in the method's seconds or memory);
* exact recovery on *planted* cases and on compiled Tracr programs
  (:class:`PlantedCase`, each method told the size of the ground truth): how many of the
  cases each method's circuit equals exactly;
* *redundant* planted cases (:func:`redundant_cases`: a case, its edge budgets by name,
  e.g. ``{"minimal": k, "planted": K}``, and the faithfulness a circuit must reach): per
  budget, how many of the cases each method's circuit at that many edges is faithful
  enough on the held-out traces.

Every figure is one run, on however many threads the caller set; the load average is
recorded before and after. ``mechlab bench methods`` is the command that writes the
table of ``docs/pruning.md`` ("Methods side by side"; ``examples/bench_methods.py`` runs it).
"""

from __future__ import annotations

import ctypes
import importlib
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from mechlab.circuit_methods import get_method, is_edge_pruning, method_names
from mechlab.models.tracr import compile_program, load_tracr
from mechlab.progress import tqdm
from mechlab.prune.circuit import Circuit
from mechlab.prune.curves import MIB_BUDGETS, circuit_scores, faithfulness_curve
from mechlab.prune.graph import pruning_graph
from mechlab.prune.methods import circuit_scores_of, find_circuit
from mechlab.prune.stability import STABILITY_BAR, bootstrap_stability
from mechlab.prune.tracr import ablation_edges, tracr_prune_data
from mechlab.traces import PruneData, Target, target_name

Edge = tuple[str, str]


@dataclass
class PlantedCase:
    """A model whose circuit is known, with the traces to find it on.

    Attributes:
        name: What the case is (``value-61 seed 0``).
        model: The model.
        truth: The ground-truth edges.
        data: Training and held-out traces.
        target: The target (``"all"`` for planted models and Tracr programs).
        ablation: The ablation the truth holds under.
        seed: The search seed of a stochastic method (edge pruning).
    """

    name: str
    model: nn.Module
    truth: set[Edge]
    data: PruneData
    target: Target = "all"
    ablation: str = "interchange"
    seed: int = 0


def _page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _page_size()


def peak_rss(fn: Callable[[], Any], interval: float = 0.005) -> tuple[Any, int | None]:
    """``(fn(), peak resident memory above the start while it ran, in bytes)``.

    The resident set is sampled every ``interval`` seconds by a thread (a lower bound of
    the true peak) after glibc's free pages are returned to the system (``malloc_trim``),
    so memory freed by earlier work is not counted as the method's. None where
    ``/proc/self/statm`` cannot be read (not Linux).
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        start = _rss()
    except (OSError, AttributeError):
        return fn(), None
    peak, done = [start], threading.Event()

    def sample() -> None:
        while not done.wait(interval):
            peak[0] = max(peak[0], _rss())

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        out = fn()
    finally:
        done.set()
        watcher.join()
    return out, max(peak[0], _rss()) - start


def measure(fn: Callable[[], Any], device: torch.device) -> tuple[Any, int | None]:
    """``(fn(), peak bytes)``: the CUDA allocator's peak on a GPU, :func:`peak_rss` on the CPU."""
    if device.type != "cuda":
        return peak_rss(fn)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    return out, torch.cuda.max_memory_allocated(device) - before


@dataclass
class TargetResult:
    """One method on one target of the model: its circuit and its curve's areas."""

    n_edges_kept: int | None = None
    n_edges_asked: int | None = None
    faithfulness: float | None = None
    complement_faithfulness: float | None = None
    cpr: float | None = None
    cmd: float | None = None
    cpr_complement: float | None = None
    seconds: float | None = None
    peak_mb: float | None = None
    refused: str | None = None
    stability: float | None = None
    stability_detail: dict[str, Any] | None = None


@dataclass
class RecoveryResult:
    """Exact recoveries of one method over planted (or Tracr) cases."""

    n_exact: int = 0
    n_cases: int = 0
    refused: int = 0
    misses: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class RedundantResult:
    """One method on redundant planted cases: per budget name, the cases whose circuit at
    that many edges reaches the case's faithfulness goal."""

    found: dict[str, int] = field(default_factory=dict)
    n_cases: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    cases: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


RedundantCase = tuple[PlantedCase, Mapping[str, int], float]
"""A redundant planted case: the case, its edge budgets by name, the faithfulness goal."""


@dataclass
class MethodsTable:
    """Every method's results (:func:`bench_methods`)."""

    methods: list[str]
    targets: list[str]
    model: dict[str, dict[str, TargetResult]]  # method -> target -> result
    planted: dict[str, RecoveryResult]
    tracr: dict[str, RecoveryResult]
    info: dict[str, Any] = field(default_factory=dict)
    redundant: dict[str, RedundantResult] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_markdown(self) -> str:
        """The table: one row per method (a stability column per target when it was
        measured, a column per budget of the redundant cases when there were any)."""

        def num(v: float | None, digits: int = 3) -> str:
            return (
                "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"
            )

        stability = any(r.stability is not None or r.stability_detail is not None
                        for rows in self.model.values() for r in rows.values())  # fmt: skip
        budgets = list(dict.fromkeys(b for r in self.redundant.values() for b in r.n_cases))
        head = ["method"]
        for t in self.targets:
            head += [f"{t} CPR", f"{t} CMD", f"{t} f (edges)", f"{t} s", f"{t} MB"]
            head += [f"{t} stability"] if stability else []
        head += ["planted exact", "Tracr exact"]
        head += [f"redundant found ({b})" for b in budgets]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m in self.methods:
            row = [m]
            for t in self.targets:
                r = self.model.get(m, {}).get(t, TargetResult())
                if r.refused:
                    row += ["refused", "", "", "", ""] + ([""] if stability else [])
                    continue
                row += [num(r.cpr), num(r.cmd), f"{num(r.faithfulness)} ({r.n_edges_kept})",
                        num(r.seconds, 1), num(r.peak_mb, 0)]  # fmt: skip
                if stability:
                    below = r.stability is not None and r.stability < STABILITY_BAR
                    row.append(num(r.stability) + (f" (< {STABILITY_BAR:g})" if below else ""))
            for rec in (self.planted.get(m), self.tracr.get(m)):
                if rec is None or rec.n_cases == 0:
                    row.append("-")
                else:
                    refused = f", {rec.refused} refused" if rec.refused else ""
                    row.append(f"{rec.n_exact}/{rec.n_cases}{refused}")
            red = self.redundant.get(m, RedundantResult())
            for b in budgets:
                n = red.n_cases.get(b, 0)
                refused = f", {red.refused[b]} refused" if red.refused.get(b) else ""
                row.append(f"{red.found.get(b, 0)}/{n}{refused}" if n else "-")
            lines.append("| " + " | ".join(row) + " |")
        return "\n".join(lines)


def _ranking(circuit: Circuit, graph, method: str) -> torch.Tensor:
    spec = get_method(method)
    if spec.prunes:
        return circuit_scores(circuit, graph)
    scores = circuit_scores_of(circuit, graph)
    return scores if spec.signed else scores.abs()


def _on_model(
    model: nn.Module,
    data: PruneData,
    target: Target,
    method: str,
    sparsity: float,
    budgets: Sequence[float],
    kwargs: dict[str, Any],
    stability_boots: int = 0,
    stability_seed: int = 0,
) -> TargetResult:
    device = next(model.parameters()).device

    def find(d: PruneData) -> Circuit:
        return find_circuit(model, d, target, method, sparsity, **kwargs)

    try:
        circuit, peak = measure(lambda: find(data), device)
    except ValueError as err:  # a method that refuses this graph (ACDC's size limit)
        return TargetResult(refused=str(err))
    meta = circuit.metadata
    graph = pruning_graph(model, data.test.windows)
    reference = data.train.inputs.to(device) if meta["ablation"] == "mean" else None
    curve = faithfulness_curve(
        model, data.test.to(device), target, meta["ablation"], _ranking(circuit, graph, method),
        budgets, mean_reference=reference, progress=False,
    )  # fmt: skip
    # after the timed search: the replicates count in neither its seconds nor its memory
    stability = (
        bootstrap_stability(find, data, stability_boots, stability_seed, reference=circuit)
        if stability_boots
        else None
    )
    return TargetResult(
        n_edges_kept=meta["n_edges_kept"], n_edges_asked=meta["n_edges_asked"],
        faithfulness=meta["metrics"]["faithfulness"],
        complement_faithfulness=meta["metrics"]["complement_faithfulness"], cpr=curve.cpr,
        cmd=curve.cmd, cpr_complement=curve.cpr_complement, seconds=meta["seconds"],
        peak_mb=None if peak is None else peak / 2**20,
        stability=None if stability is None else stability.mean_jaccard,
        stability_detail=None if stability is None else stability.to_dict(),
    )  # fmt: skip


def _recovery(cases: Sequence[PlantedCase], method: str, kwargs: dict[str, Any]) -> RecoveryResult:
    out = RecoveryResult()
    for case in cases:
        out.n_cases += 1
        started = time.perf_counter()
        seeded = {"seed": case.seed, **kwargs} if is_edge_pruning(method) else kwargs
        try:
            circuit = find_circuit(case.model, case.data, case.target, method,
                                   n_edges=len(case.truth), ablation=case.ablation, **seeded)  # fmt: skip
        except ValueError:
            out.refused += 1
            out.misses.append(f"{case.name} (refused)")
            continue
        out.seconds += time.perf_counter() - started
        if set(circuit.edges) == case.truth:
            out.n_exact += 1
        else:
            out.misses.append(case.name)
    return out


def _redundant(cases: Sequence[RedundantCase], method: str, kwargs: dict[str, Any]) -> RedundantResult:
    out = RedundantResult()
    for case, budgets, goal in cases:
        seeded = {"seed": case.seed, **kwargs} if is_edge_pruning(method) else kwargs
        for name, n_edges in budgets.items():
            out.n_cases[name] = out.n_cases.get(name, 0) + 1
            out.found.setdefault(name, 0)
            row: dict[str, Any] = {"case": case.name, "budget": name, "n_edges": n_edges, "goal": goal}
            started = time.perf_counter()
            try:
                circuit = find_circuit(case.model, case.data, case.target, method, n_edges=n_edges,
                                       ablation=case.ablation, **seeded)  # fmt: skip
            except ValueError as err:
                out.refused[name] = out.refused.get(name, 0) + 1
                out.cases.append({**row, "found": False, "refused": str(err)})
                continue
            out.seconds += time.perf_counter() - started
            faithfulness = float(circuit.metadata["metrics"]["faithfulness"])
            found = faithfulness >= goal  # NaN: not found
            out.found[name] += int(found)
            out.cases.append({**row, "faithfulness": faithfulness, "n_edges_kept": circuit.n_edges,
                              "found": found})  # fmt: skip
    return out


def bench_methods(
    model: nn.Module | None,
    data: PruneData | None,
    targets: Sequence[Target] = ("1-after", "2-after"),
    methods: Sequence[str] | None = None,
    *,
    planted: Iterable[PlantedCase] = (),
    tracr: Iterable[PlantedCase] = (),
    sparsity: float = 0.95,
    budgets: Sequence[float] = MIB_BUDGETS,
    method_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = True,
    stability_boots: int = 0,
    stability_seed: int = 0,
    redundant: Iterable[RedundantCase] = (),
) -> MethodsTable:
    """Run every method on the model's targets and on the planted and Tracr cases.

    Args:
        model: The model (None: planted and Tracr cases only).
        data: Its traces (training: scored or pruned on; held-out: evaluated on).
        targets: Targets of the model.
        methods: Methods (default: every one of :mod:`mechlab.circuit_methods`, the registry).
        planted: Planted cases (the generator is the caller's: see
            ``mechlab bench methods --planted`` and :func:`planted_cases`).
        tracr: Compiled-program cases (:func:`tracr_cases`).
        sparsity: The budget on the model (0.95: 25 of the bundled checkpoint's 496
            countable edges).
        budgets: MIB's edge budgets for the curves.
        method_kwargs: Extra settings per method (e.g. ``{"prune": {"steps": 500}}``).
        progress: Show a progress bar.
        stability_boots: Bootstrap replicates of every circuit on the model (0: none; else
            at least 2): its stability column, the mean Jaccard with the method's own
            circuit over resampled training traces (timed apart from the method).
        stability_seed: Seed of the resampling.
        redundant: Redundant planted cases ``(case, {budget name: edges}, faithfulness
            goal)`` (:func:`redundant_cases`).

    Returns:
        The :class:`MethodsTable`.
    """
    methods = method_names() if methods is None else methods
    unknown = [m for m in methods if m not in method_names()]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(method_names())}")
    if stability_boots and (isinstance(stability_boots, bool) or not isinstance(stability_boots, int)
                            or stability_boots < 2):  # fmt: skip
        raise ValueError(f"stability_boots must be 0 (off) or an integer >= 2, got {stability_boots!r}")
    planted, tracr, redundant = list(planted), list(tracr), list(redundant)
    kwargs = {m: dict((method_kwargs or {}).get(m, {})) for m in methods}
    for m in methods:  # the table times the search, not its progress bars
        kwargs[m].setdefault("progress", False)
    # An optimiser's first step imports torch._dynamo (seconds, once per process): pay it
    # here, so that the first method timed (edge pruning) is not charged for it.
    warm = torch.zeros(1, requires_grad=True)
    warm.sum().backward()
    torch.optim.Adam([warm]).step()
    info = {"loadavg_start": list(os.getloadavg()), "torch_threads": torch.get_num_threads(),
            "sparsity": sparsity, "budgets": list(budgets), "method_kwargs": kwargs,
            "stability_boots": stability_boots, "stability_seed": stability_seed,
            "stability_bar": STABILITY_BAR}  # fmt: skip
    started = time.perf_counter()
    model_rows: dict[str, dict[str, TargetResult]] = {}
    planted_rows: dict[str, RecoveryResult] = {}
    tracr_rows: dict[str, RecoveryResult] = {}
    redundant_rows: dict[str, RedundantResult] = {}
    jobs = [(m, t) for m in methods for t in (targets if model is not None else ())]
    per_method = 2 + bool(redundant)
    with tqdm(total=len(jobs) + per_method * len(methods), disable=not progress, desc="methods",
              unit="job") as bar:  # closed on a Ctrl-C too: the stop's line starts a line of its own
        for m, t in jobs:
            bar.set_postfix(method=m, target=target_name(t))
            model_rows.setdefault(m, {})[target_name(t)] = _on_model(
                model, data, t, m, sparsity, budgets, kwargs[m], stability_boots, stability_seed
            )
            bar.update()
        for m in methods:
            bar.set_postfix(method=m, cases="planted")
            planted_rows[m] = _recovery(planted, m, kwargs[m])
            bar.update()
            bar.set_postfix(method=m, cases="tracr")
            tracr_rows[m] = _recovery(tracr, m, kwargs[m])
            bar.update()
            if redundant:
                bar.set_postfix(method=m, cases="redundant")
                redundant_rows[m] = _redundant(redundant, m, kwargs[m])
                bar.update()
    info.update(loadavg_end=list(os.getloadavg()), seconds=time.perf_counter() - started,
                planted_cases=[c.name for c in planted], tracr_cases=[c.name for c in tracr],
                redundant_cases=[{"case": c.name, "budgets": dict(b), "goal": g} for c, b, g in redundant])  # fmt: skip
    return MethodsTable(list(methods), [target_name(t) for t in targets] if model is not None else [],
                        model_rows, planted_rows, tracr_rows, info, redundant_rows)  # fmt: skip


def tracr_cases(
    programs: Sequence[str] = ("xproportion", "hist", "reverse", "sort_unique"),
    seeds: Sequence[int] = (0, 1, 2),
    n_train: int = 64,
    n_test: int = 128,
) -> list[PlantedCase]:
    """Compiled Tracr programs with their ablation ground truth, one case per seed.

    Needs the ``tracr`` extra (``pip install mechlab[tracr]``).
    """
    cases = []
    for name in programs:
        model, info = load_tracr(compile_program(name))
        for seed in seeds:
            data = tracr_prune_data(name, info, n_train=n_train, n_test=n_test, seed=seed)
            truth = set(ablation_edges(model, data.train))
            cases.append(PlantedCase(f"{name} seed {seed}", model, truth, data, seed=seed))
    return cases


def _generator(spec: str, option: str, missing_ok: bool = False) -> Callable[[list[int]], Iterable[Any]] | None:
    """The function named ``module:function`` (the current folder on the import path), or
    None for ``missing_ok`` when the module or the function does not exist."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{option} must be MODULE:FUNCTION or none, got {spec!r}")
    if str(os.getcwd()) not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as err:
        if missing_ok:
            return None
        raise ValueError(
            f"{option} {spec}: cannot import {module!r} ({err}); run from the repository root "
            f"for the test suite's generator, or pass {option} none"
        ) from None
    except AttributeError:
        if missing_ok:
            return None
        raise ValueError(f"{option} {spec}: {module!r} has no {name!r}") from None


def planted_cases(spec: str, seeds: Sequence[int]) -> list[PlantedCase]:
    """The planted cases of a generator named ``module:function`` (a function of the seeds
    returning :class:`PlantedCase` items; ``none``: no cases). The current folder is on the
    import path, so ``tests.prune.planted_cases:cases`` works from the repository root.

    Raises:
        ValueError: A spec that is not ``module:function``, a module that cannot be
            imported or a function it lacks (one line).
    """
    if spec == "none" or not seeds:
        return []
    found = _generator(spec, "--planted")
    cases = list(found(list(seeds)))
    if not all(isinstance(c, PlantedCase) for c in cases):
        raise ValueError(f"--planted {spec}: the function must return PlantedCase items")
    return cases


DEFAULT_REDUNDANT = "tests.prune.planted_cases:redundant_budget_cases"
"""The test suite's generator of redundant planted cases (used where it exists)."""


def redundant_cases(spec: str, seeds: Sequence[int], *, missing_ok: bool = False) -> list[RedundantCase]:
    """The redundant planted cases of a generator named ``module:function``: a function of the
    seeds returning ``(PlantedCase, {budget name: edges}, faithfulness goal)`` items, e.g.
    budgets ``{"minimal": k, "planted": K}`` (``none``: no cases).

    Args:
        spec: ``module:function`` or ``none``.
        seeds: The seeds (none: no cases).
        missing_ok: No cases (instead of an error) when the module or the function does
            not exist (the default generator, :data:`DEFAULT_REDUNDANT`, before it is written).

    Raises:
        ValueError: A spec that is not ``module:function``, a module or function that
            cannot be found (without ``missing_ok``), or items of another shape (one line).
    """
    if spec == "none" or not seeds:
        return []
    found = _generator(spec, "--redundant", missing_ok)
    if found is None:
        return []
    cases = list(found(list(seeds)))
    for item in cases:
        ok = isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], PlantedCase)
        ok = ok and isinstance(item[1], Mapping) and all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in item[1].items()
        )  # fmt: skip
        ok = ok and isinstance(item[2], (int, float)) and not isinstance(item[2], bool)
        if not ok:
            raise ValueError(f"--redundant {spec}: the function must return (PlantedCase, "
                             "{budget name: edges}, faithfulness goal) items")  # fmt: skip
    return [(case, dict(budgets), float(goal)) for case, budgets, goal in cases]
