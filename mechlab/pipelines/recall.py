"""The label- vs observation-based recall harness on a checkpoint or a run (``mechlab recall``).

The harness (:mod:`mechlab.label_vs_observation`) works on a loaded model; here the
checkpoints are opened, the model moved to the device asked for, and the reports written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlab.label_vs_observation import recall_analysis
from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import (
    Source,
    lds_config,
    open_checkpoint,
    run_checkpoints,
    source_path,
)
from mechlab.pipelines.resume import read_result, resume_each
from mechlab.progress import tqdm
from mechlab.tasks.lds import check_batch
from mechlab.viz import recall_dynamics_figure, recall_figure


def recall_checkpoint(source: Source, device: str = "cpu", **kwargs: Any) -> dict[str, Any]:
    """:func:`~mechlab.label_vs_observation.recall_analysis` of a checkpoint, as a JSON-ready dict.

    Args:
        source: A checkpoint of a run trained on the ``lds`` task, or its file.
        device: Where the model runs.
        **kwargs: Passed to :func:`~mechlab.label_vs_observation.recall_analysis`.

    Returns:
        ``{"checkpoint", "sha256", "step", "examples", "result": RecallReport.to_dict()}``.
    """
    ckpt = open_checkpoint(source, device)
    ckpt.task_config  # noqa: B018 -- raises a one-line ValueError without task metadata
    report = recall_analysis(ckpt, model=ckpt.model, **kwargs)
    return {"checkpoint": str(source_path(source)), "sha256": ckpt.sha256, "step": ckpt.step,
            "examples": ckpt.examples_seen, "result": report.to_dict()}  # fmt: skip


def recall_dynamics(
    run_dir: str | Path, *, device: str = "cpu", progress: bool = True, **kwargs: Any
) -> dict[str, Any]:
    """The per-offset scores of every checkpoint of a run (``DIR/checkpoints/step_*.pt``).

    Args:
        run_dir: A training run directory.
        device: Where the models run.
        progress: Show a progress bar over the checkpoints.
        **kwargs: Passed to :func:`~mechlab.label_vs_observation.recall_analysis`
            (``components`` defaults to False).

    Returns:
        ``{"run", "steps", "examples", "offsets", "per_offset": {j: {key: [value per
        checkpoint]}}, "errors": {probe: {j: [median per checkpoint]}}}`` for the keys of
        :meth:`~mechlab.label_vs_observation.RecallReport.to_dict`'s ``per_offset``.
    """
    ckpts = run_checkpoints(run_dir)  # every file checked before any work
    kwargs.setdefault("components", False)
    out: dict[str, Any] = {"run": str(run_dir), "steps": [], "examples": [], "per_offset": {}, "errors": {}}
    for ckpt in tqdm(ckpts, disable=not progress, desc="checkpoints"):
        r = recall_analysis(ckpt, model=ckpt.model.to(device), progress=False, **kwargs).to_dict()
        out["steps"].append(ckpt.step)
        out["examples"].append(ckpt.examples_seen)
        out.update({k: r[k] for k in ("offsets", "n_traces", "n_haystack", "seg_len", "seed", "protocol", "rule")})
        for j, values in r["per_offset"].items():
            for key, v in values.items():
                out["per_offset"].setdefault(j, {}).setdefault(key, []).append(v)
        for probe in ("clean", "misdirect_incorrect"):
            for j, s in r["errors"][probe].items():
                out["errors"].setdefault(probe, {}).setdefault(j, []).append(s["median"])
    return out


@dataclass
class RecallFiles:
    """What :func:`recall_and_write` computed and wrote: stem -> ``(report, json, html)``."""

    out: Path
    written: dict[str, tuple[dict[str, Any], Path, Path]] = field(default_factory=dict)


def recall_and_write(
    ckpt: Source | None = None,
    checkpoints: str | Path | None = None,
    out: str | Path | None = None,
    *,
    components: bool = True,
    progress: bool = True,
    on_file: Callable[[str, Path, Path], None] | None = None,
    on_reuse: Callable[[str, Path], None] | None = None,
    force: bool = False,
    **settings: Any,
) -> RecallFiles:
    """``mechlab recall``: ``recall.json``/``.html`` of a checkpoint and, for a run,
    ``recall_dynamics.json``/``.html``. Every setting and the folder are checked before
    any work; each JSON records its settings, so a rerun reads back a report of the same
    settings and refuses one of other settings, naming them (replaced with ``force``). A
    signal (Ctrl-C, SIGTERM) raises :class:`~mechlab.pipelines.stops.Interrupted` naming the
    reports kept.

    Args:
        ckpt: A checkpoint (or its file).
        checkpoints: A run directory (its ``checkpoints/step_*.pt``).
        out: Folder (default: ``mechlab-out/<run>/recall``).
        components: Also patch each head / layer (``ckpt`` only).
        progress: Show progress bars.
        on_file: Called with ``(stem, json_path, html_path)`` after each write (or read back).
        on_reuse: Called with ``(stem, json_path)`` for a report read back.
        force: Replace reports of other settings (and write into a folder git tracks).
        **settings: :func:`recall_analysis` settings and ``device``.
    """
    if ckpt is None and checkpoints is None:
        raise ValueError("give --ckpt PATH (a checkpoint), --checkpoints DIR (a run directory), or both")
    if checkpoints is not None and not Path(checkpoints).is_dir():
        raise ValueError(f"run directory {str(checkpoints)!r} not found")
    if checkpoints is not None and not any(Path(checkpoints).glob("checkpoints/step_*.pt")):
        raise ValueError(f"no checkpoints/step_*.pt under {str(checkpoints)!r}; is it a training run directory?")
    offsets = settings.get("offsets")
    if offsets is not None and len(set(offsets)) != len(offsets):
        raise ValueError(f"offsets must not repeat, got {list(offsets)}")
    where = source_path(ckpt) if ckpt is not None else Path(checkpoints) / "last.pt"
    # A run's inputs are its checkpoint files, not every file under it: the scores of an
    # earlier `--out RUN/recall` are outputs, read back or (with --force) replaced.
    inputs = [ckpt] if isinstance(ckpt, (str, Path)) else []
    if checkpoints is not None:
        inputs += sorted(Path(checkpoints).glob("checkpoints/step_*.pt"))
    folder = outputs.OutputFolder(Path(out) if out is not None else outputs.default_out(where, "recall"), "recall",
                                  force=force, inputs=inputs)  # fmt: skip
    stems = (["recall"] if ckpt is not None else []) + (["recall_dynamics"] if checkpoints is not None else [])
    for stem in stems:
        folder.check_path(f"{stem}.json")
        folder.check_path(f"{stem}.html")
    files = RecallFiles(folder.path)
    tally = stops.Tally(folder.path, len(stems), unit="report")  # Ctrl-C or SIGTERM: the reports written stay
    with stops.resumable(tally), folder:
        opened = None if ckpt is None else open_checkpoint(ckpt)
        if opened is not None and "n_traces" in settings:
            check_batch(lds_config(opened), settings["n_traces"], "n_traces")  # before any patching
        analysis = outputs.with_defaults(recall_analysis, {**settings, "components": components})
        records: dict[str, dict[str, Any]] = {}
        if opened is not None:
            records["recall"] = {"analysis": "recall", "checkpoint_sha256": opened.sha256, **analysis}
        if checkpoints is not None:
            records["recall_dynamics"] = {
                "analysis": "recall_dynamics", **analysis, "components": False,
                "run_checkpoints": {p.name: outputs.file_sha256(p)
                                    for p in sorted(Path(checkpoints).glob("checkpoints/step_*.pt"))},
            }  # fmt: skip
        status = folder.plan({f"{stem}.json": record for stem, record in records.items()})

        def kept(stem: str, state: str) -> None:
            tally.kept.append(stem)
            if state == "same" and on_reuse is not None:
                on_reuse(stem, folder.file(f"{stem}.json"))

        def compute(stem: str) -> dict[str, Any]:
            if stem == "recall":
                return recall_checkpoint(opened, components=components, progress=progress, **settings)
            return recall_dynamics(checkpoints, progress=progress, **settings)

        for done in resume_each(
            folder, status, {stem: stem for stem in stems}, read=lambda _, path: read_result(path),
            compute=compute, kept=kept,
            write=lambda stem, data, name: folder.write_json(name, {**data, **outputs.settings_record(records[stem])}),
            draw=lambda stem, data, name: folder.write_figure(_figure(stem, data), name),
        ):  # fmt: skip
            files.written[done.key] = (done.value, done.json_path, done.html_path)
            if on_file is not None:
                on_file(done.key, done.json_path, done.html_path)
    return files


def _figure(stem: str, data: dict[str, Any]) -> Any:
    return recall_figure(data) if stem == "recall" else recall_dynamics_figure(data)
