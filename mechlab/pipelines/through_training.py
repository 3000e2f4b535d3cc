"""Circuits through training: ``mechlab prune --checkpoints RUN_DIR``.

Every (or every K-th) checkpoint of a training run (``DIR/checkpoints/step_*.pt``) is
pruned, or attributed (``method``), with one set of targets, seeds and settings through
:func:`~mechlab.pipelines.prune.prune_targets`, each into its own folder
``OUT/step_<step>/`` (so each is resumable and keyed by its settings). Then, per target,
the first seed's circuits are joined across the checkpoints: ``OUT/across.json`` (per
checkpoint: step, examples seen, edges kept, faithfulness, Jaccard with the last
checkpoint's circuit; per edge: the checkpoints that keep it and the step from which every
later checkpoint keeps it, "appears at") and ``OUT/across_<target>.html``
(:func:`mechlab.viz.circuits_across_checkpoints_figure`).

Every checkpoint, target, setting and folder is checked before the first circuit, so bad
input writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlab.checkpoint import Checkpoint
from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import lds_config, opened_once, run_checkpoints
from mechlab.pipelines.prune import (
    PruneRun,
    _request,
    plan_targets,
    prune_targets,
)
from mechlab.pipelines.request import CircuitRequest, TraceCache
from mechlab.prune.circuit import Circuit, jaccard
from mechlab.traces import Target
from mechlab.viz import circuits_across_checkpoints_figure


def thin_checkpoints(ckpts: Sequence[Checkpoint], every: int = 1) -> list[Checkpoint]:
    """Every ``every``-th checkpoint in step order (the first included), plus the last.

    Raises:
        ValueError: ``every`` below 1, or two checkpoints of one step.
    """
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a whole number >= 1, got {every!r}")
    ordered = sorted(ckpts, key=lambda c: c.step)
    steps = [c.step for c in ordered]
    if len(set(steps)) < len(steps):
        repeated = next(s for s in steps if steps.count(s) > 1)
        raise ValueError(f"two checkpoints of the run are at step {repeated}; keep one of them")
    chosen = ordered[::every]
    if ordered and chosen[-1] is not ordered[-1]:
        chosen.append(ordered[-1])
    return chosen


def step_folder(ckpt: Checkpoint) -> str:
    """The folder name of a checkpoint's circuits: its file's stem (``step_0000037``)."""
    return ckpt.path.stem if ckpt.path.stem.startswith("step_") else f"step_{ckpt.step:07d}"


def across_checkpoints(
    circuits: Sequence[Circuit], steps: Sequence[int], examples: Sequence[int]
) -> dict[str, Any]:
    """One target's circuits joined across checkpoints (in training order).

    Returns:
        ``{"checkpoints": [{"step", "examples", "edges", "faithfulness",
        "jaccard_with_last"}], "edges": [{"writer", "reader", "kept_at_steps",
        "in_last", "appears_at_step", "appears_at_examples"}]}``: an edge "appears at"
        the first checkpoint from which every later one keeps it (None unless the last
        keeps it); edges in order of first appearance.
    """
    if not circuits or not len(circuits) == len(steps) == len(examples):
        raise ValueError("give one step and one examples count per circuit, and at least one circuit")
    kept = [set(c.edges) for c in circuits]
    rows = [{"step": int(s), "examples": int(n), "edges": len(k),
             "faithfulness": c.metadata.get("metrics", {}).get("faithfulness"),
             "jaccard_with_last": jaccard(k, kept[-1])}
            for c, k, s, n in zip(circuits, kept, steps, examples, strict=True)]  # fmt: skip
    order: list[tuple[str, str]] = []
    for c in circuits:
        order += [e for e in c.edges if e not in order]
    edges = []
    for edge in order:
        first = None
        for i in range(len(kept) - 1, -1, -1):  # back from the last while every one keeps it
            if edge not in kept[i]:
                break
            first = i
        edges.append({"writer": edge[0], "reader": edge[1],
                      "kept_at_steps": [int(s) for s, k in zip(steps, kept, strict=True) if edge in k],
                      "in_last": edge in kept[-1],
                      "appears_at_step": None if first is None else int(steps[first]),
                      "appears_at_examples": None if first is None else int(examples[first])})  # fmt: skip
    return {"checkpoints": rows, "edges": edges}


@dataclass
class ThroughTraining:
    """What :func:`prune_through_training` found and wrote.

    Attributes:
        out: The folder written into.
        checkpoints: The checkpoints pruned, in step order.
        runs: Step folder name -> its :class:`~mechlab.pipelines.prune.PruneRun`.
        across: Target -> :func:`across_checkpoints` of its first seed's circuits.
        json: ``OUT/across.json``.
        figures: Target -> ``OUT/across_<target>.html``.
    """

    out: Path
    checkpoints: list[Checkpoint] = field(default_factory=list)
    runs: dict[str, PruneRun] = field(default_factory=dict)
    across: dict[str, dict[str, Any]] = field(default_factory=dict)
    json: Path | None = None
    figures: dict[str, Path] = field(default_factory=dict)


def prune_through_training(
    run_dir: str | Path,
    targets: Sequence[Target],
    seeds: Sequence[int] = (0,),
    out: str | Path | None = None,
    *,
    every: int = 1,
    recipe: str = "default",
    force: bool = False,
    on_checkpoint: Callable[[Checkpoint, Path], None] | None = None,
    on_circuit: Callable[[str, Circuit, Path], None] | None = None,
    request: CircuitRequest | None = None,
    **settings: Any,
) -> ThroughTraining:
    """``mechlab prune --checkpoints RUN_DIR``: the circuits of every checkpoint of a run.

    Args:
        run_dir: A training run directory (``DIR/checkpoints/step_*.pt``, lds task).
        targets: The targets (``"1-after"``, ``"2-after"``, ...).
        seeds: Pruning and data seeds; the first one's circuits are joined across
            checkpoints (two or more: each circuit records its seeds' consensus).
        out: Folder (default: ``mechlab-out/<run>/through-training``).
        every: Prune every ``every``-th checkpoint in step order, and the last.
        recipe: The pruning recipe (:data:`~mechlab.pipelines.prune.PRUNE_RECIPES`).
        force: As :func:`~mechlab.pipelines.prune.prune_targets` (replace files of other
            settings; write into a folder git tracks).
        on_checkpoint: Called with ``(checkpoint, its folder)`` before it is pruned.
        on_circuit: Called with ``(stem, circuit, folder)`` after each circuit.
        request: Every setting at once, resolved
            (:class:`~mechlab.pipelines.request.CircuitRequest`; then ``recipe`` and
            ``settings`` other than ``device`` are not given).
        **settings: As :func:`~mechlab.pipelines.prune.prune_targets` (``method``,
            ``n_edges``, ``steps``, ``n_train``, ...; ``device``).

    Returns:
        The :class:`ThroughTraining`.

    Raises:
        ValueError: One line, before anything is written: no run directory or no
            checkpoints in it, a checkpoint without task metadata or not of the lds task,
            a target, setting or budget a checkpoint refuses, files of other settings.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory {str(run_dir)!r} not found")
    if not targets or not seeds:
        raise ValueError("give at least one target and one seed")
    device = settings.pop("device", None)
    chosen = thin_checkpoints(run_checkpoints(run_dir, device), every)
    result = ThroughTraining(Path(out) if out is not None
                             else outputs.default_out(run_dir / "last.pt", "through-training"))  # fmt: skip
    nearby_budgets = settings.pop("nearby_budgets", False)
    request = _request(recipe, settings, request)  # every setting resolved and checked once
    # The run's inputs are its checkpoints (not every file under it: OUT may sit in the run).
    top = outputs.OutputFolder(result.out, "prune", force=force, inputs=[c.path for c in chosen])
    circuit_records: dict[str, dict[str, str]] = {}
    names: list[str] = []
    built: dict[str, TraceCache] = {}  # each checkpoint's traces, built once: planned, then pruned
    for ckpt in chosen:  # every checkpoint checked, and every folder planned, before any work
        lds_config(ckpt, request.length)
        folder = outputs.OutputFolder(result.out / step_folder(ckpt), "prune", force=force,
                                      inputs=[ckpt.path])  # fmt: skip
        built[step_folder(ckpt)] = TraceCache(ckpt, request)
        planned, _ = plan_targets(ckpt, targets, seeds, folder, nearby_budgets=nearby_budgets, request=request,
                                  traces=built[step_folder(ckpt)])  # fmt: skip
        circuit_records[step_folder(ckpt)] = {
            stem: outputs.settings_record(rec)["settings_sha256"] for stem, (_, _, rec) in planned.items()
        }
        names = [rec["target"] for stem, (_, s, rec) in planned.items() if s == seeds[0]]
    record = {"analysis": "prune_through_training", "every": every, "targets": names,
              "seeds": list(seeds), "checkpoints": [step_folder(c) for c in chosen],
              "circuits": circuit_records}  # fmt: skip
    for name in names:
        top.check_path(f"across_{name}.html")
    top.plan({"across.json": record})  # refuses one of other settings (without force)
    result.checkpoints = chosen
    with stops.stop_on_signals(), top:
        for ckpt in chosen:
            where = result.out / step_folder(ckpt)
            if on_checkpoint is not None:
                on_checkpoint(ckpt, where)
            try:
                with opened_once(ckpt, device):  # checked once (prune_targets does not check it again)
                    result.runs[step_folder(ckpt)] = prune_targets(
                        ckpt, targets, seeds, where, on_circuit=on_circuit, force=force, device=device,
                        nearby_budgets=nearby_budgets, request=request, traces=built.pop(step_folder(ckpt)),
                    )  # fmt: skip
            except KeyboardInterrupt as exc:  # what every checkpoint kept, for the one line
                here = exc.kept if isinstance(exc, stops.Interrupted) else []
                kept = [f"{folder}/{stem}" for folder, run in result.runs.items() for stem in run.files]  # finished
                kept += [f"{step_folder(ckpt)}/{stem}" for stem in here]
                note = exc.note if isinstance(exc, stops.Interrupted) else ""
                signum = exc.signum if isinstance(exc, stops.Interrupted) else stops.signal_of(exc)
                total = sum(len(r) for r in circuit_records.values())
                raise stops.Interrupted(signum, result.out, kept, total, note) from None
        steps = [c.step for c in chosen]
        examples = [c.examples_seen for c in chosen]
        for name in names:
            circuits = [result.runs[step_folder(c)].circuits[name][0] for c in chosen]
            result.across[name] = across_checkpoints(circuits, steps, examples)
            result.figures[name] = top.write_figure(_figure(circuits, steps, examples, name),
                                                    f"across_{name}.html")  # fmt: skip
        data = {"run": str(run_dir), "every": every, "seed": seeds[0], "targets": result.across}
        result.json = top.write_json("across.json", {**data, **outputs.settings_record(record)})
    return result


def _figure(circuits: Sequence[Circuit], steps: Sequence[int], examples: Sequence[int], name: str) -> Any:
    """The across-checkpoints figure, its checkpoint axis labelled with steps and examples seen."""
    fig = circuits_across_checkpoints_figure(
        circuits, steps, title=f"Circuit for {name} through training ({len(circuits)} checkpoints)"
    )
    fig.update_layout(xaxis2={"title": "checkpoint step (examples seen)", "tickvals": [str(s) for s in steps],
                              "ticktext": [f"{s}<br>{n:,}" for s, n in zip(steps, examples, strict=True)]})  # fmt: skip
    return fig
