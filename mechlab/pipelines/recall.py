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
from mechlab.pipelines import outputs
from mechlab.pipelines.checkpoints import (
    Source,
    lds_config,
    open_checkpoint,
    run_checkpoints,
    source_path,
)
from mechlab.progress import tqdm
from mechlab.tasks.lds import check_batch


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
    force: bool = False,
    **settings: Any,
) -> RecallFiles:
    """``mechlab recall``: ``recall.json``/``.html`` of a checkpoint and, for a run,
    ``recall_dynamics.json``/``.html``. Everything is computed before anything is written,
    so bad input leaves no file behind.

    Args:
        ckpt: A checkpoint (or its file).
        checkpoints: A run directory (its ``checkpoints/step_*.pt``).
        out: Folder (default: ``mechlab-out/<run>/recall``). Its ``recall*.json``/``.html``
            must not exist yet (``force``: they are replaced).
        components: Also patch each head / layer (``ckpt`` only).
        progress: Show progress bars.
        on_file: Called with ``(stem, json_path, html_path)`` after each write.
        force: Replace the files if they exist (and write into a folder git tracks).
        **settings: :func:`recall_analysis` settings and ``device``.
    """
    from mechlab.viz import recall_dynamics_figure, recall_figure

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
    folder = outputs.OutputFolder(Path(out) if out is not None else outputs.default_out(where, "recall"), "recall",
                                  force=force, inputs=[p for p in (ckpt, checkpoints) if isinstance(p, (str, Path))])  # fmt: skip
    stems = (["recall"] if ckpt is not None else []) + (["recall_dynamics"] if checkpoints is not None else [])
    folder.check_fresh([f"{stem}.{ext}" for stem in stems for ext in ("json", "html")])
    files = RecallFiles(folder.path)
    with folder:
        opened = None if ckpt is None else open_checkpoint(ckpt)
        if opened is not None and "n_traces" in settings:
            check_batch(lds_config(opened), settings["n_traces"], "n_traces")  # before any patching
        computed: dict[str, tuple[dict[str, Any], Any]] = {}
        if opened is not None:
            report = recall_checkpoint(opened, components=components, progress=progress, **settings)
            computed["recall"] = (report, recall_figure(report))
        if checkpoints is not None:
            dyn = recall_dynamics(checkpoints, progress=progress, **settings)
            computed["recall_dynamics"] = (dyn, recall_dynamics_figure(dyn))
        for stem, (data, figure) in computed.items():
            json_path = folder.write_json(f"{stem}.json", data)
            html_path = folder.write_figure(figure, f"{stem}.html")
            files.written[stem] = (data, json_path, html_path)
            if on_file is not None:
                on_file(stem, json_path, html_path)
    return files
