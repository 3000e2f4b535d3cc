"""Pruning a checkpoint: its task's traces, the recipe's settings, the circuits written.

:func:`prune_checkpoint` prunes one target of a checkpoint (or its file) on its own task's
traces; :func:`prune_targets` is ``mechlab prune``: every target and seed of one opened
checkpoint, each circuit written as it is found, then their overlaps;
several targets pruned jointly (``mechlab prune --share``) are
:mod:`mechlab.pipelines.joint`. The engine (:mod:`mechlab.prune`) knows no
checkpoint and no task.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlab._deprecated import moved_names, warn_moved
from mechlab.circuit_methods import DEFAULT_METHOD, is_edge_pruning, method_tag
from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import Source, open_checkpoint, opened_once, source_path
from mechlab.pipelines.methods import check_budget, check_finite, run_method
from mechlab.pipelines.request import (  # noqa: F401 -- the recipes and their checks are also read from here
    NIH_OF_RECIPE,
    PRUNE_RECIPES,
    CircuitRequest,
    TraceCache,
    check_stability,
    prune_recipe,
)
from mechlab.pipelines.resume import keeper, resume_each
from mechlab.prune.circuit import Circuit, Overlap, Stability, overlap, seed_stability
from mechlab.prune.config import RUN_ARGUMENTS
from mechlab.prune.consensus import attach_consensus, nearby_sparsities
from mechlab.prune.engine import prune
from mechlab.prune.stability import bootstrap_stability
from mechlab.tasks.registry import DEFAULT_CORRUPTION
from mechlab.traces import PruneData, Target, check_target, target_name

CONSENSUS_NOTE = "written before their consensus, which the rerun adds"
"""What an interrupted prune of two or more seeds (or nearby budgets) says of the circuits it kept."""
FAITHFULNESS_WARNING = "circuit for"  # the engine's warning, also in metadata["warnings"]


def _recipe(recipe: str, kwargs: dict[str, Any], where: str) -> str:
    """The recipe, or the value of its deprecated keyword ``protocol`` (popped from ``kwargs``)."""
    if "protocol" not in kwargs:
        return recipe
    warn_moved(f"{where}(protocol=)", "recipe=", stacklevel=4)
    return kwargs.pop("protocol")


def prune_settings(
    ckpt: Any,
    target: Target,
    sparsity: float | None = None,
    *,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = DEFAULT_CORRUPTION,
    data_seed: int | None = None,
    recipe: str = "default",
    loss_scale: float | None = None,
    length: int | None = None,
    **prune_kwargs: Any,
) -> dict[str, Any] | None:
    """Every setting that shapes the circuit :func:`prune_checkpoint` finds with these
    arguments, resolved (the recipe's values, the engine's defaults, the run's haystack),
    with the checkpoint's sha256: what the circuit records (``metadata["settings"]``) and
    a resumed ``mechlab prune`` or ``report`` compares. None for a callable target (no
    name to record it by). The same as :meth:`CircuitRequest.settings
    <mechlab.pipelines.request.CircuitRequest.settings>` of the request these arguments make."""
    if callable(target):
        return None
    request = CircuitRequest.resolve(recipe, sparsity=sparsity, n_train=n_train, n_test=n_test, n_haystack=n_haystack,
                                     seg_len=seg_len, corruption=corruption, data_seed=data_seed,
                                     loss_scale=loss_scale, length=length, **prune_kwargs)  # fmt: skip
    return request.settings(ckpt, target)


def _run_defaults(fn: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """``fn``'s run arguments (seed, ...), its defaults filled in, without ``config``."""
    run = outputs.with_defaults(fn, {k: v for k, v in settings.items() if k in RUN_ARGUMENTS})
    return {k: v for k, v in run.items() if k != "config"}


def prune_checkpoint(
    source: Source,
    target: Target,
    sparsity: float | None = None,
    *,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = DEFAULT_CORRUPTION,
    data_seed: int | None = None,
    device: str | None = None,
    recipe: str = "default",
    loss_scale: float | None = None,
    length: int | None = None,
    method: str = DEFAULT_METHOD,
    n_edges: int | None = None,
    ig_steps: int | None = None,
    acdc_max_edges: int | None = None,
    stability: int = 0,
    request: CircuitRequest | None = None,
    traces: tuple[PruneData, Target] | None = None,
    **prune_kwargs: Any,
) -> Circuit:
    """Prune a checkpoint of the interleaved-systems task on needle-in-a-haystack traces.

    The NiH traces are built from the task config in the checkpoint's metadata, with
    the run's evaluation haystack (``eval_haystack`` / ``eval_seg_len``) unless given.

    Args:
        source: A checkpoint or its file.
        target: ``"k-after"``, ``"all"`` or a callable.
        sparsity: Edge sparsity in (0, 1); default the recipe's (0.95; study 0.99).
        n_train: Training traces.
        n_test: Held-out traces for the metrics.
        n_haystack: Haystack systems.
        seg_len: Observations per haystack segment.
        corruption: How interchange-ablation traces are corrupted
            (:data:`mechlab.tasks.lds_prune.CORRUPTIONS`).
        data_seed: Seed of the traces; default the pruning ``seed``, so that a seed
            baseline varies the data as well as the optimiser.
        device: Where to run (default: CPU).
        recipe: ``"default"``, ``"uniform"`` or ``"study"`` (:data:`PRUNE_RECIPES`):
            the NiH construction and the pruning settings that ``sparsity`` and
            ``prune_kwargs`` do not set (``None`` values count as not set).
        loss_scale: Multiplies the task loss (default the recipe's: 1, study 1000).
        length: Elements per sequence of a state-tracking checkpoint (default the run's
            ``L``; refused for other tasks).
        method: ``prune`` (edge pruning, the default) or an attribution method of
            :data:`mechlab.prune.methods.METHODS` (:mod:`mechlab.pipelines.methods`).
        n_edges: Keep at most this many countable edges instead of ``sparsity``.
        ig_steps: Integration points of ``eap-ig`` and ``eap-ig-inputs`` (default 10).
        acdc_max_edges: ACDC's limit on countable edges (default 400).
        stability: Bootstrap replicates of the circuit's stability over resampled training
            traces (:func:`~mechlab.prune.stability.bootstrap_stability`: the same method
            and settings on each resample, seeded with the pruning ``seed``), recorded as
            ``metadata["stability"]``; 0 (the default): not measured.
        request: Every setting at once, resolved
            (:class:`~mechlab.pipelines.request.CircuitRequest`); then the settings above
            (but ``device``) and ``prune_kwargs`` must not be given.
        traces: ``(traces, resolved target)`` of ``target`` built before under these
            settings (:class:`~mechlab.pipelines.request.TraceCache`), so that they are not
            built again; default: built here.
        **prune_kwargs: Passed to :func:`prune` (``ablation``, ``steps``, ``seed``, ...);
            ``protocol`` is the old name of ``recipe``.

    Every checkpoint is pruned on its own task's traces (its entry of
    :mod:`mechlab.tasks.registry`). A state-tracking checkpoint is pruned on
    :func:`mechlab.tasks.state_tracking_prune.state_tracking_prune_data` traces
    (targets ``final``, ``changed``, ``all``; ``corruption`` ``random`` (what the default
    means there) or ``x<k>``); the NiH settings are ignored. An induction checkpoint is
    pruned on :func:`mechlab.tasks.induction_prune.induction_prune_data` traces (target
    ``all``; corruption ``resample``, what the default means there).

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`; its metadata records the
        checkpoint's path and sha256, the pruning ``seed``, the ``data_seed`` and the
        recipe (``protocol``).

    Raises:
        ValueError: Missing task metadata, unknown target, bad sparsity (or one that
            keeps no edge), learning rate or batch size: all before any pruning work.
    """
    recipe = _recipe(recipe, prune_kwargs, "prune_checkpoint")
    if request is None:
        request = CircuitRequest.resolve(recipe, sparsity=sparsity, n_train=n_train, n_test=n_test,
                                         n_haystack=n_haystack, seg_len=seg_len, corruption=corruption,
                                         data_seed=data_seed, loss_scale=loss_scale, length=length, method=method,
                                         n_edges=n_edges, ig_steps=ig_steps, acdc_max_edges=acdc_max_edges,
                                         stability=stability, **prune_kwargs)  # fmt: skip
    else:
        given = {name: value for name, value in locals().items() if name in _REQUEST_SETTINGS}
        changed = sorted(name for name, value in given.items() if value != _REQUEST_SETTINGS[name])
        if prune_kwargs or changed:
            raise ValueError(f"give the settings in the request or as keywords, not both (also given: "
                             f"{', '.join(changed + sorted(prune_kwargs))})")
    ckpt = open_checkpoint(source, device)
    return prune_request(ckpt, request, target, traces=traces, path=source_path(source))


# prune_checkpoint's settings that a request also holds, with their defaults (read from its signature)
_REQUEST_SETTINGS = {
    name: parameter.default
    for name, parameter in inspect.signature(prune_checkpoint).parameters.items()
    if parameter.default is not inspect.Parameter.empty and name not in ("device", "request", "traces")
}


def prune_request(
    ckpt: Any,
    request: CircuitRequest,
    target: Target,
    *,
    traces: tuple[PruneData, Target] | None = None,
    path: str | Path | None = None,
    record: dict[str, Any] | None = None,
) -> Circuit:
    """The circuit of one request on an opened checkpoint (:func:`prune_checkpoint`'s work).

    Args:
        ckpt: The opened :class:`~mechlab.checkpoint.Checkpoint`.
        request: The resolved settings (its seed is the pruning seed).
        target: The target asked for.
        traces: ``(traces, resolved target)`` built before (default: built here, once).
        path: The checkpoint's file as the caller named it (default: the checkpoint's own).
        record: The settings record to keep, made before (default: the request's,
            :meth:`~mechlab.pipelines.request.CircuitRequest.record`).

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`, its settings recorded
        (``metadata["settings"]``; none for a callable target).
    """
    data, target = traces if traces is not None else request.traces(ckpt, target)
    check_target(target, data.train)
    settings, sparsity = dict(request.search), request.sparsity

    # the engine builds the (windowed) graph and checks the sparsity, once, before any work
    def find(d: PruneData, replicate: bool = False) -> Circuit:
        shown = {"progress": False} if replicate and "progress" in settings else {}
        return _find(ckpt.model, d, target, sparsity, checkpoint_sha256=ckpt.sha256,
                     **request.method_settings, **{**settings, **shown})  # fmt: skip

    circuit = find(data)
    if request.stability:  # the same method and settings on resampled training traces
        measured = bootstrap_stability(lambda d: find(d, replicate=True), data, request.stability,
                                       seed=request.seed, reference=circuit)  # fmt: skip
        circuit.metadata["stability"] = measured.to_dict()
    circuit.metadata["checkpoint"] = str(source_path(ckpt) if path is None else path)
    circuit.metadata["checkpoint_step"] = ckpt.step
    circuit.metadata["protocol"] = request.recipe
    record = request.record(ckpt, target, target) if record is None else record
    if record is not None:
        circuit.metadata.update(outputs.settings_record(record))
    return circuit


def _with_consensus(
    record: dict[str, Any] | None, seeds: Sequence[int], nearby_budgets: bool
) -> dict[str, Any] | None:
    """A circuit's settings record with what its consensus is made of, when it records one
    (two or more seeds, or nearby budgets): the seeds and the nearby budgets. The consensus
    is written into every circuit file, so a rerun with other seeds (``--seed 0 --seed 2``
    after ``--seed 0 --seed 1``) or without ``--nearby-budgets`` does not read back a circuit
    whose consensus it would rewrite; a run of one seed records what it did before."""
    if record is None or (len(seeds) < 2 and not nearby_budgets):
        return record
    return {**record, "consensus_seeds": sorted(int(s) for s in seeds),
            **({"nearby_budgets": True} if nearby_budgets else {})}  # fmt: skip


def _find(model: Any, data: PruneData, target: Target, sparsity: float, *, method: str = DEFAULT_METHOD,
          n_edges: int | None = None, **settings: Any) -> Circuit:  # fmt: skip
    """Edge pruning as before, or another method (or a budget in edges) through
    :func:`mechlab.pipelines.methods.run_method`."""
    if is_edge_pruning(method) and n_edges is None:
        circuit = prune(model, data, target, sparsity, **{k: v for k, v in settings.items()
                                                           if k not in ("ig_steps", "acdc_max_edges")})  # fmt: skip
        circuit.metadata.setdefault("method", method)
        return check_finite(circuit)
    ablation = settings.get("ablation", "interchange")
    check_budget(model, data, target, method, sparsity, n_edges=n_edges, ablation=ablation,
                 acdc_max_edges=settings.get("acdc_max_edges"), position_aware=settings.get("position_aware"))  # fmt: skip
    return run_method(model, data, target, method, sparsity, n_edges=n_edges, **settings)


def _check_budgets(ckpt: Any, request: CircuitRequest, built: dict[Any, tuple[PruneData, Target]]) -> None:
    """:func:`~mechlab.pipelines.methods.check_budget` for every target of an opened checkpoint,
    on its traces (``built``: target -> ``(traces, resolved target)``), so that a budget or
    ACDC's limit is refused before the first circuit."""
    for data, target in built.values():
        check_budget(ckpt.model, data, target, request.method, request.sparsity, n_edges=request.n_edges,
                     ablation=request.search.get("ablation", "interchange"),
                     acdc_max_edges=request.acdc_max_edges)  # fmt: skip


@dataclass
class PruneRun:
    """What :func:`prune_targets` found and wrote.

    Attributes:
        out: The folder written into.
        circuits: Target -> circuits (one per seed, in order).
        files: Circuit stem (``<target>_seed<k>``) -> ``(json, html)`` paths.
        overlaps: ``(a, b, Overlap)`` of the first seeds' circuits of consecutive targets.
        stability: Seed-to-seed against cross-target agreement (two or more seeds), or None.
        reused: Stems whose circuit was read back: found before with the same settings.
        replaced: Stems whose file of other settings was recomputed (``force``).
        updated: Stems read back and then rewritten with this run's consensus (an
            interrupted run wrote them before the consensus, or another circuit of their
            target is not the one their consensus was made with); not in ``reused``.
    """

    out: Path
    circuits: dict[str, list[Circuit]] = field(default_factory=dict)
    files: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    overlaps: list[tuple[str, str, Overlap]] = field(default_factory=list)
    stability: Stability | None = None
    reused: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)


def prune_targets(
    source: Source,
    targets: Sequence[Target],
    seeds: Sequence[int] = (0,),
    out: str | Path | None = None,
    *,
    recipe: str = "default",
    on_circuit: Callable[[str, Circuit, Path], None] | None = None,
    force: bool = False,
    nearby_budgets: bool = False,
    request: CircuitRequest | None = None,
    traces: TraceCache | None = None,
    **settings: Any,
) -> PruneRun:
    """``mechlab prune``: every target with every seed, on one opened checkpoint.

    Every setting and target is checked, and the output folder claimed
    (:class:`~mechlab.pipelines.outputs.OutputFolder`: locked, nothing of other settings
    in the way), before the first is pruned; each circuit is written
    (``<target>_seed<k>.json`` and ``.html``; state tracking: ``<target>_n<length>_seed<k>``)
    as soon as it is found. A circuit file that records the same settings is read back
    instead of pruned again, so an interrupted run resumes. With two or more seeds (or
    ``nearby_budgets``) every circuit records the consensus of its target's runs, so its
    settings record the seeds (``consensus_seeds``) and ``nearby_budgets`` too: a rerun
    with other seeds reads back nothing whose consensus it would rewrite. The settings are
    resolved once (:class:`~mechlab.pipelines.request.CircuitRequest`), the checkpoint is
    opened and checked once, and each (target, seed)'s traces are built once: its target
    is checked, named and pruned on them.

    Args:
        source: A checkpoint or its file (opened once).
        targets: The targets.
        seeds: Pruning and data seeds (seed ``k`` draws its own traces).
        out: Folder of the circuits (default: ``mechlab-out/<run>/circuits``).
        recipe: The pruning recipe (:data:`PRUNE_RECIPES`).
        on_circuit: Called with ``(stem, circuit, out)`` after each circuit is written (or
            read back).
        force: Recompute and replace circuit files of other settings (without it they are
            refused, naming the settings that differ), and write into a folder git tracks.
        nearby_budgets: Also prune every seed at the nearby budgets (0.8x and 1.25x the
            asked edge count, :func:`~mechlab.prune.consensus.nearby_sparsities`; not
            written, rerun on a resume), so that each circuit's consensus counts seeds and
            budgets; part of each circuit's settings. Without it, two or more seeds give a
            consensus over the seeds.
        request: Every setting at once, resolved (then ``recipe`` and ``settings`` other
            than ``device`` are not given).
        traces: Traces of ``source`` (opened) under ``request`` built before (by
            :func:`plan_targets`); default: built here.
        **settings: As :func:`prune_checkpoint` (``None`` values: the recipe's). With
            ``method`` other than ``prune`` (or a budget ``n_edges``) the method's settings
            and every target's budget are checked before the first circuit, and the
            circuits are ``<target>_<method>_seed<k>``. ``stability=N`` measures each
            circuit's bootstrap stability (``metadata["stability"]``) before it is
            written, and is part of its settings: a rerun with another ``stability`` does
            not read back circuits made without it.

    Returns:
        The :class:`PruneRun`.
    """
    device = settings.pop("device", None)
    _check_nearby(nearby_budgets, request.method_settings if request is not None else settings)
    request = _request(recipe, settings, request)  # every setting resolved and checked once
    run = PruneRun(
        Path(out) if out is not None else outputs.default_out(source_path(source), "circuits")
    )
    folder = outputs.OutputFolder(run.out, "prune", force=force, inputs=[source_path(source)])
    consensus = len(seeds) >= 2 or nearby_budgets
    # circuits whose JSON is on disk, for the line of an interrupted run (Ctrl-C or SIGTERM: what is
    # written stays, the rerun reads it back)
    tally = stops.Tally(run.out, len(targets) * len(seeds), note=CONSENSUS_NOTE if consensus else "")
    with stops.resumable(tally), folder, opened_once(source, device) as ckpt:
        built = traces if traces is not None and traces.ckpt is ckpt else TraceCache(ckpt, request)
        planned, status = plan_targets(ckpt, targets, seeds, folder, nearby_budgets=nearby_budgets,
                                       request=request, traces=built)  # fmt: skip
        tally.total = len(planned)
        found: dict[str, Circuit] = {}
        path = source_path(source)

        def circuit_of(name: Target, s: int, asked: CircuitRequest, record: dict[str, Any] | None = None) -> Circuit:
            with warnings.catch_warnings():  # the metadata keeps them (callers print them)
                warnings.filterwarnings("ignore", message=FAITHFULNESS_WARNING, category=UserWarning)
                return prune_request(ckpt, asked.with_seed(s), name, traces=built.get(name, s), path=path,
                                     record=record)  # fmt: skip

        def compute(stem: str) -> Circuit:  # the traces its plan built, the settings record it made
            name, s, record = planned[stem]
            return circuit_of(name, s, request, record)

        def write(stem: str, circuit: Circuit, json_name: str) -> None:
            record = planned[stem][2]
            if record is not None:  # what the plan compared: with the consensus's settings
                circuit.metadata.update(outputs.settings_record(record))
            folder.write_circuit(circuit, json_name)

        for done in resume_each(
            folder, status, {stem: stem for stem in planned}, read=lambda _, file: Circuit.from_json(file),
            compute=compute, write=write, kept=keeper(tally.kept, reused=run.reused, replaced=run.replaced),
            draw=lambda _, circuit, file: folder.write_circuit_figure(circuit, file),
        ):  # fmt: skip
            stem, circuit = done.key, done.value
            run.circuits.setdefault(target_name(planned[stem][0]), []).append(circuit)
            run.files[stem] = (done.json_path, done.html_path)
            found[stem] = circuit
            if on_circuit is not None:
                on_circuit(stem, circuit, run.out)
        runs = {t: list(group) for t, group in run.circuits.items()}
        for stem, circuit in found.items() if nearby_budgets else ():
            name, s, _ = planned[stem]
            asked = circuit.metadata["sparsity_asked"]
            for nearby in nearby_sparsities(circuit.metadata["n_edges_countable"], asked):
                if nearby != asked:  # on the same traces
                    nearby_request = dataclasses.replace(request, sparsity=nearby, stability=0)
                    runs[target_name(name)].append(circuit_of(name, s, nearby_request))
        built.clear()  # every circuit is found
        if consensus:  # each circuit records how often its target's runs keep each edge
            for group in runs.values():  # in one order whatever the order of --seed (ties keep it)
                group.sort(key=lambda c: (c.metadata.get("seed", 0), -c.metadata.get("sparsity_asked", 0.0)))
            for target, group in run.circuits.items():
                for circuit in group:
                    attach_consensus(circuit, runs[target])
            for stem, circuit in found.items():  # rewritten with it (unchanged files stay as they are)
                json_path, html_path = run.files[stem]
                before = json_path.read_bytes() if stem in run.reused else None
                folder.write_circuit(circuit, json_path.name)
                folder.write_circuit_figure(circuit, html_path.name)
                if before is not None and json_path.read_bytes() != before:  # not only read back
                    run.reused.remove(stem)
                    run.updated.append(stem)
            tally.note = ""  # the consensus is written
    names = list(run.circuits)
    for a, b in zip(names, names[1:], strict=False):
        run.overlaps.append((a, b, overlap(run.circuits[a][0], run.circuits[b][0])))
    if len(seeds) >= 2:
        run.stability = seed_stability(run.circuits)
    return run


def _check_nearby(nearby_budgets: bool, method_settings: dict[str, Any]) -> None:
    """One-line ValueError for nearby budgets with a method other than edge pruning or a
    budget in edges (checked before the method's own settings)."""
    method = method_settings.get("method") or DEFAULT_METHOD
    if nearby_budgets and (not is_edge_pruning(method) or method_settings.get("n_edges") is not None):
        raise ValueError("nearby budgets apply to edge pruning at a --sparsity only (not to "
                         f"--method {method} or --edges)")  # fmt: skip


def _request(recipe: str, settings: dict[str, Any], request: CircuitRequest | None) -> CircuitRequest:
    """The request a pipeline runs: the one given, else the recipe's with ``settings`` on top
    (resolved once; one-line ValueError for any bad setting)."""
    if request is None:
        return CircuitRequest.resolve(recipe, **settings)
    if settings or recipe != "default":
        raise ValueError("give the settings in the request or as keywords, not both")
    return request


def plan_targets(
    ckpt: Any,
    targets: Sequence[Target],
    seeds: Sequence[int],
    folder: outputs.OutputFolder,
    *,
    recipe: str = "default",
    nearby_budgets: bool = False,
    request: CircuitRequest | None = None,
    traces: TraceCache | None = None,
    **settings: Any,
) -> tuple[dict[str, tuple[Target, int, dict[str, Any] | None]], dict[str, str]]:
    """Every check :func:`prune_targets` makes on an opened checkpoint before its first
    circuit (targets, method, budgets, repeated targets or seeds), and the plan of its
    folder (:meth:`~mechlab.pipelines.outputs.OutputFolder.plan`); nothing is written, so
    a caller pruning several checkpoints checks them all first
    (:mod:`mechlab.pipelines.through_training`). Every (target, seed)'s traces are built
    here, once (into ``traces``: the pruning takes them from there): the target is checked
    and named on them.

    Args:
        ckpt: The opened checkpoint.
        targets: The targets.
        seeds: The seeds.
        folder: The output folder (claimed).
        recipe: As :func:`prune_targets`.
        nearby_budgets: As :func:`prune_targets`.
        request: Every setting, resolved (default: the recipe's with ``settings`` on top).
        traces: Where the traces go (default: a new
            :class:`~mechlab.pipelines.request.TraceCache`, let go after the plan).
        **settings: As :func:`prune_targets`.

    Returns:
        ``(planned, status)``: circuit stem -> ``(target, seed, settings record)``, and
        ``<stem>.json`` -> ``"new"``, ``"same"`` or ``"redo"``.

    Raises:
        ValueError: As :func:`prune_targets`, one line.
    """
    settings.pop("device", None)
    request = _request(recipe, settings, request)
    built = traces if traces is not None else TraceCache(ckpt, request)
    if built.request != request:
        raise ValueError("the traces given were built under other settings than the request's")
    _check_nearby(nearby_budgets, request.method_settings)
    # every target checked (and resolved) on its traces, before any pruning
    resolved = {(i, s): built.get(name, s) for i, name in enumerate(targets) for s in seeds}
    if request.by_method:  # refused before the first circuit: each target's budget, on its first seed's traces
        _check_budgets(ckpt, request, {i: resolved[i, seeds[0]] for i in range(len(targets)) if seeds})
    planned = {}
    tag = method_tag(request.method)
    for i, name in enumerate(targets):
        for s in seeds:
            record = request.with_seed(s).record(ckpt, name, resolved[i, s][1])
            record = _with_consensus(record, seeds, nearby_budgets)
            stem = f"{record['target'] if record else target_name(name)}{tag}_seed{s}"
            planned[stem] = (name, s, record)
    if len(planned) < len(targets) * len(seeds):
        raise ValueError("targets and seeds must not repeat")
    status = folder.plan(
        {f"{stem}.json": rec for stem, (_, _, rec) in planned.items() if rec is not None}
    )
    return planned, status

__getattr__ = moved_names(__name__)  # PRUNE_PROTOCOLS, prune_protocol: renamed PRUNE_RECIPES, prune_recipe
