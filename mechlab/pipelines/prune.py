"""Pruning a checkpoint: its task's traces, the recipe's settings, the circuits written.

:func:`prune_checkpoint` prunes one target of a checkpoint (or its file) on its own task's
traces; :func:`prune_targets` is ``mechlab prune``: every target and seed of one opened
checkpoint, each circuit written as it is found, then their overlaps;
several targets pruned jointly (``mechlab prune --share``) are
:mod:`mechlab.pipelines.joint`. The engine (:mod:`mechlab.prune`) knows no
checkpoint and no task.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlab.circuit_methods import DEFAULT_METHOD, is_edge_pruning, method_tag
from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import Source, open_checkpoint, source_path
from mechlab.pipelines.data import (
    check_targets,
    checkpoint_task,
    sample_data,
    task_data,
    task_haystack,
)
from mechlab.pipelines.methods import check_budget, check_finite, check_method, run_method
from mechlab.pipelines.resume import keeper, resume_each
from mechlab.prune.circuit import Circuit, Overlap, Stability, overlap, seed_stability
from mechlab.prune.config import PROTOCOLS, RUN_ARGUMENTS, resolved_settings
from mechlab.prune.consensus import attach_consensus, nearby_sparsities
from mechlab.prune.engine import check_prune_args, prune
from mechlab.prune.stability import bootstrap_stability
from mechlab.tasks.registry import DEFAULT_CORRUPTION
from mechlab.traces import PruneData, Target, check_target, target_name

NIH_OF_RECIPE = {"default": "study", "uniform": "uniform", "fast": "study", "thorough": "study", "study": "study"}
PRUNE_PROTOCOLS: dict[str, dict[str, Any]] = {
    name: {"nih": NIH_OF_RECIPE[name], "sparsity": cfg.sparsity, **cfg.overrides()}
    for name, cfg in PROTOCOLS.items()
}
"""The pruning recipes (``--recipe``): each one's NiH construction (``nih``, the data
side) and its search settings (the :class:`~mechlab.prune.config.PruneConfig` instances
of :data:`mechlab.prune.config.PROTOCOLS`, as the fields that differ from the defaults).
``default``: mechlab's default search at 95% edge sparsity on the study's NiH (oldest
system queried, misdirection to the next); ``uniform``: the same on uniformly drawn NiH
traces; ``fast``: the default search without its second ranking (no exact scores) and
``thorough``: the exact warm start, EAP-IG's ranking in the pool, 200 steps of 64 traces, both
on the study's NiH; ``study``: the recall study's settings (99% edge sparsity, node masks at
80%, loss 1000 x raw MSE to the ground truth, 3000 steps, the Lagrangian) on the study's NiH. A
circuit records its recipe as ``metadata["protocol"]``."""

CONSENSUS_NOTE = "written before their consensus, which the rerun adds"
"""What an interrupted prune of two or more seeds (or nearby budgets) says of the circuits it kept."""
FAITHFULNESS_WARNING = "circuit for"  # the engine's warning, also in metadata["warnings"]


def prune_protocol(recipe: str, **given: Any) -> dict[str, Any]:
    """The settings a recipe prunes with, explicit settings on top.

    Args:
        recipe: A key of :data:`PRUNE_PROTOCOLS`.
        **given: Settings asked for explicitly (``sparsity`` or any :func:`prune` keyword);
            ``None`` means "not given".

    Returns:
        ``nih`` (the NiH construction), ``sparsity`` and the :func:`prune` keywords to use.
    """
    if recipe not in PRUNE_PROTOCOLS:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {list(PRUNE_PROTOCOLS)}")
    return {**PRUNE_PROTOCOLS[recipe], **{k: v for k, v in given.items() if v is not None}}


def _recipe(recipe: str, kwargs: dict[str, Any], where: str) -> str:
    """The recipe, or the value of its deprecated keyword ``protocol`` (popped from ``kwargs``)."""
    if "protocol" not in kwargs:
        return recipe
    from mechlab._deprecated import warn_moved

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
    name to record it by)."""
    if callable(target):
        return None
    settings = prune_protocol(recipe, sparsity=sparsity, loss_scale=loss_scale, **prune_kwargs)
    sparsity, nih = settings.pop("sparsity"), settings.pop("nih")
    # resolved through PruneConfig (its defaults, the effective warm-ups) and prune's run
    # defaults (seed, position_aware), so a default and the same value given record alike
    run = outputs.with_defaults(prune, {k: v for k, v in settings.items() if k in RUN_ARGUMENTS})
    settings = {**{k: v for k, v in run.items() if k != "config"},
                **resolved_settings({**settings, "sparsity": sparsity})}  # fmt: skip
    sparsity = settings.pop("sparsity")
    data: dict[str, Any] = {"n_train": n_train, "n_test": n_test, "corruption": corruption,
                            "data_seed": settings["seed"] if data_seed is None else data_seed}  # fmt: skip
    task = checkpoint_task(ckpt)
    if task.resolves_targets:  # named on its traces (state tracking: <target>_n<length>)
        _, resolved = task_data(ckpt, target, length=length, n_train=1, n_test=1, corruption=corruption)
        name = target_name(resolved)
    else:
        name = target_name(target)
    if task.takes_length:
        data["length"] = length
    if task.haystack is not None:
        data.update(nih=nih, **task_haystack(task, ckpt, n_haystack, seg_len))
    return {"analysis": "prune", "checkpoint_sha256": ckpt.sha256, "target": name, "recipe": recipe,
            "sparsity": sparsity, **data, **settings}  # fmt: skip


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
        recipe: ``"default"``, ``"uniform"`` or ``"study"`` (:data:`PRUNE_PROTOCOLS`):
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
    check_stability(stability)
    settings = prune_protocol(recipe, sparsity=sparsity, loss_scale=loss_scale, **prune_kwargs)
    sparsity, nih = settings.pop("sparsity"), settings.pop("nih")
    check_prune_args(sparsity, **settings)
    data_seed = settings.get("seed", 0) if data_seed is None else data_seed
    method_settings = {"method": method, "n_edges": n_edges, "ig_steps": ig_steps,
                       "acdc_max_edges": acdc_max_edges}  # fmt: skip
    check_method(
        method, settings, ig_steps=ig_steps, n_edges=n_edges, acdc_max_edges=acdc_max_edges
    )
    ckpt = open_checkpoint(source, device)
    data, target = task_data(ckpt, target, length=length, n_train=n_train, n_test=n_test, n_haystack=n_haystack,
                             seg_len=seg_len, nih=nih, corruption=corruption, data_seed=data_seed)  # fmt: skip
    check_target(target, data.train)
    record = prune_settings(ckpt, target, sparsity, n_train=n_train, n_test=n_test, n_haystack=n_haystack,
                            seg_len=seg_len, corruption=corruption, data_seed=data_seed, recipe=recipe,
                            length=length, **settings)  # fmt: skip

    # the engine builds the (windowed) graph and checks the sparsity, once, before any work
    def find(d: PruneData, replicate: bool = False) -> Circuit:
        shown = {"progress": False} if replicate and "progress" in settings else {}
        return _find(ckpt.model, d, target, sparsity, checkpoint_sha256=ckpt.sha256,
                     **method_settings, **{**settings, **shown})  # fmt: skip

    circuit = find(data)
    if stability:  # the same method and settings on resampled training traces
        measured = bootstrap_stability(lambda d: find(d, replicate=True), data, stability,
                                       seed=settings.get("seed", 0), reference=circuit)  # fmt: skip
        circuit.metadata["stability"] = measured.to_dict()
    circuit.metadata["checkpoint"] = str(source_path(source))
    circuit.metadata["checkpoint_step"] = ckpt.step
    circuit.metadata["protocol"] = recipe
    if record is not None:
        record = _with_stability(_with_method(record, method_settings), stability)
        circuit.metadata.update(outputs.settings_record(record))
    return circuit


def check_stability(stability: Any) -> None:
    """One-line ValueError unless ``stability`` is 0 (off) or bootstrap replicates >= 2."""
    if isinstance(stability, bool) or not isinstance(stability, int) or stability < 0 or stability == 1:
        raise ValueError(f"--stability must be 0 (off) or a number of bootstrap resamples >= 2, got {stability!r}")


def _with_stability(record: dict[str, Any] | None, stability: int) -> dict[str, Any] | None:
    """A settings record with the bootstrap replicates when stability is measured (so that a
    circuit made without it is not read back as one with it, nor the other way round; a
    run without it records what it did before)."""
    if record is None or not stability:
        return record
    return {**record, "stability_boots": stability}


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


def _with_method(
    record: dict[str, Any] | None, method_settings: dict[str, Any]
) -> dict[str, Any] | None:
    """A settings record with the method's settings when they are not edge pruning's
    defaults (so that a plain pruning run's record stays what it was)."""
    method = method_settings.get("method") or DEFAULT_METHOD
    if record is None or (is_edge_pruning(method) and method_settings.get("n_edges") is None):
        return record
    return {
        **record,
        **{k: v for k, v in method_settings.items() if v is not None},
        "method": method,
    }


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


def _check_budgets(
    ckpt: Any,
    targets: Sequence[Target],
    method: str,
    sparsity: float | None,
    *,
    n_edges: int | None = None,
    ablation: str = "interchange",
    acdc_max_edges: int | None = None,
    recipe: str = "default",
    **data_settings: Any,
) -> None:
    """:func:`~mechlab.pipelines.methods.check_budget` for every target of an opened checkpoint,
    on a trace of its task (so that a budget or ACDC's limit is refused before the first circuit)."""
    sparsity = prune_protocol(recipe, sparsity=sparsity)["sparsity"]
    for target in targets:
        data, target = sample_data(ckpt, target, nih=prune_protocol(recipe)["nih"], **data_settings)
        check_budget(ckpt.model, data, target, method, sparsity, n_edges=n_edges, ablation=ablation,
                     acdc_max_edges=acdc_max_edges)  # fmt: skip


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
    with other seeds reads back nothing whose consensus it would rewrite.

    Args:
        source: A checkpoint or its file (opened once).
        targets: The targets.
        seeds: Pruning and data seeds (seed ``k`` draws its own traces).
        out: Folder of the circuits (default: ``mechlab-out/<run>/circuits``).
        recipe: The pruning recipe (:data:`PRUNE_PROTOCOLS`).
        on_circuit: Called with ``(stem, circuit, out)`` after each circuit is written (or
            read back).
        force: Recompute and replace circuit files of other settings (without it they are
            refused, naming the settings that differ), and write into a folder git tracks.
        nearby_budgets: Also prune every seed at the nearby budgets (0.8x and 1.25x the
            asked edge count, :func:`~mechlab.prune.consensus.nearby_sparsities`; not
            written, rerun on a resume), so that each circuit's consensus counts seeds and
            budgets; part of each circuit's settings. Without it, two or more seeds give a
            consensus over the seeds.
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
    given = prune_protocol(recipe, **{k: v for k, v in settings.items() if k in _SEARCH_SETTINGS})
    check_prune_args(given.pop("sparsity"), **{k: v for k, v in given.items() if k != "nih"})
    run = PruneRun(
        Path(out) if out is not None else outputs.default_out(source_path(source), "circuits")
    )
    folder = outputs.OutputFolder(run.out, "prune", force=force, inputs=[source_path(source)])
    consensus = len(seeds) >= 2 or nearby_budgets
    # circuits whose JSON is on disk, for the line of an interrupted run (Ctrl-C or SIGTERM: what is
    # written stays, the rerun reads it back)
    tally = stops.Tally(run.out, len(targets) * len(seeds), note=CONSENSUS_NOTE if consensus else "")
    with stops.resumable(tally), folder:
        ckpt = open_checkpoint(source, device)
        planned, status = plan_targets(ckpt, targets, seeds, folder, recipe=recipe,
                                       nearby_budgets=nearby_budgets, **settings)
        tally.total = len(planned)
        found: dict[str, Circuit] = {}

        def compute(stem: str) -> Circuit:
            name, s, _ = planned[stem]
            with warnings.catch_warnings():  # the metadata keeps them (callers print them)
                warnings.filterwarnings("ignore", message=FAITHFULNESS_WARNING, category=UserWarning)
                return prune_checkpoint(ckpt, name, seed=s, recipe=recipe, **settings)

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
                if nearby != asked:
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", message=FAITHFULNESS_WARNING, category=UserWarning)
                        runs[target_name(name)].append(
                            prune_checkpoint(ckpt, name, seed=s, recipe=recipe,
                                             **{**settings, "sparsity": nearby, "stability": 0}))
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


def plan_targets(
    ckpt: Any,
    targets: Sequence[Target],
    seeds: Sequence[int],
    folder: outputs.OutputFolder,
    *,
    recipe: str = "default",
    nearby_budgets: bool = False,
    **settings: Any,
) -> tuple[dict[str, tuple[Target, int, dict[str, Any] | None]], dict[str, str]]:
    """Every check :func:`prune_targets` makes on an opened checkpoint before its first
    circuit (targets, method, budgets, repeated targets or seeds), and the plan of its
    folder (:meth:`~mechlab.pipelines.outputs.OutputFolder.plan`); nothing is written, so
    a caller pruning several checkpoints checks them all first
    (:mod:`mechlab.pipelines.through_training`).

    Returns:
        ``(planned, status)``: circuit stem -> ``(target, seed, settings record)``, and
        ``<stem>.json`` -> ``"new"``, ``"same"`` or ``"redo"``.

    Raises:
        ValueError: As :func:`prune_targets`, one line.
    """
    check_targets(ckpt, list(targets), n_haystack=settings.get("n_haystack"),
                  seg_len=settings.get("seg_len"), length=settings.get("length"),
                  corruption=settings.get("corruption", DEFAULT_CORRUPTION),
                  protocol=prune_protocol(recipe)["nih"])  # fmt: skip
    chosen_method = {k: settings.get(k) for k in _METHOD_KEYS}
    method = chosen_method["method"] or DEFAULT_METHOD
    by_method = not is_edge_pruning(method) or chosen_method["n_edges"] is not None
    if nearby_budgets and by_method:
        raise ValueError("nearby budgets apply to edge pruning at a --sparsity only (not to "
                         f"--method {method} or --edges)")  # fmt: skip
    stability = settings.get("stability", 0)
    check_stability(stability)
    plain = {k: v for k, v in settings.items() if k not in (*_METHOD_KEYS, "stability")}
    if by_method:  # refused before the first circuit
        data_keys = (
            "n_train",
            "n_test",
            "n_haystack",
            "seg_len",
            "corruption",
            "data_seed",
            "length",
        )
        chosen = {k: chosen_method[k] for k in _METHOD_KEYS[1:]}
        given = prune_protocol(recipe, **{k: v for k, v in plain.items() if k not in data_keys})
        sparsity = given.pop("sparsity")
        given.pop("nih")
        check_method(method, given, **chosen)
        _check_budgets(ckpt, list(targets), method, sparsity, recipe=recipe, n_edges=chosen["n_edges"],
                       acdc_max_edges=chosen["acdc_max_edges"], ablation=given.get("ablation", "interchange"),
                       length=settings.get("length"), n_haystack=settings.get("n_haystack"),
                       seg_len=settings.get("seg_len"), corruption=settings.get("corruption", DEFAULT_CORRUPTION))  # fmt: skip
    planned = {}
    for name in targets:
        for s in seeds:
            record = prune_settings(ckpt, name, seed=s, recipe=recipe, **plain)
            record = _with_stability(_with_method(record, chosen_method), stability)
            record = _with_consensus(record, seeds, nearby_budgets)
            tag = method_tag(method)
            stem = f"{record['target'] if record else target_name(name)}{tag}_seed{s}"
            planned[stem] = (name, s, record)
    if len(planned) < len(targets) * len(seeds):
        raise ValueError("targets and seeds must not repeat")
    status = folder.plan(
        {f"{stem}.json": rec for stem, (_, _, rec) in planned.items() if rec is not None}
    )
    return planned, status


# The settings of prune_targets that choose the method and its budget (not edge pruning's).
_METHOD_KEYS = ("method", "n_edges", "ig_steps", "acdc_max_edges")

# The settings of prune_targets that the recipe and the engine's check take (not the data's,
# nor the method's: edge pruning's own options are mechlab.circuit_methods.EDGE_PRUNING_OPTIONS).
_SEARCH_SETTINGS = ("sparsity", "ablation", "loss", "steps", "lr", "lambda_lr", "batch_size", "node_sparsity",
                    "loss_scale", "normalize_loss")  # fmt: skip
