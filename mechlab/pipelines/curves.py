"""Faithfulness curves of a checkpoint (``mechlab curve``): prune, rank, score every budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import Source, open_checkpoint, source_path
from mechlab.pipelines.data import haystack, nih_data
from mechlab.pipelines.resume import resume_each
from mechlab.prune.config import resolved_settings
from mechlab.prune.curves import (
    RANKINGS,
    FaithfulnessCurve,
    check_budgets,
    curves_to_dict,
    read_curves,
    sweep,
)
from mechlab.prune.engine import check_prune_args
from mechlab.prune.forward import ABLATIONS
from mechlab.tasks.lds_prune import DEFAULT_CORRUPTION
from mechlab.traces import check_target
from mechlab.viz import faithfulness_curves_figure


@dataclass
class CurveFiles:
    """One target's curves and the files written: ``curve_<target>.json`` and ``.html``
    (``reused``: read back from a file of the same settings, not computed)."""

    target: str
    curves: dict[str, FaithfulnessCurve]
    json: Path
    html: Path
    seconds: float
    reused: bool = False


def curve_checkpoint(
    source: Source,
    targets: Sequence[str] = ("1-after",),
    ablations: Sequence[str] = ("interchange",),
    budgets: Sequence[float] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
    out: str | Path | None = None,
    *,
    rank: str = "log_alpha",
    sparsity: float = 0.95,
    steps: int | None = None,
    seed: int = 0,
    corruption: str = DEFAULT_CORRUPTION,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    protocol: str = "study",
    device: str | None = None,
    progress: bool = True,
    on_target: Callable[[CurveFiles], None] | None = None,
    force: bool = False,
) -> list[CurveFiles]:
    """Faithfulness and complement faithfulness across edge budgets, per target.

    Every setting and target is checked, and the output folder claimed, before the first
    pruning run. A target whose ``curve_<target>.json`` records the same settings is read
    back instead of computed again (an interrupted run resumes); one of other settings is
    refused, naming them (recomputed with ``force``). A signal (Ctrl-C, SIGTERM) raises
    :class:`~mechlab.pipelines.stops.Interrupted` naming the targets' curves kept.

    Args:
        source: A checkpoint of the lds task, or its file (opened once).
        targets: Targets (``k-after``, ``all``).
        ablations: Ablations (``interchange``, ``mean``, ``zero``; ``["all"]``: every one).
        budgets: Edge budgets in (0, 1] (100% is always added).
        out: Folder (default: ``mechlab-out/<run>/curves``).
        rank: ``log_alpha`` (one pruning run ranks the edges) or ``reprune``.
        sparsity: Sparsity of the ranking run.
        steps: Optimiser steps of each pruning run (None: the search's default,
            :class:`~mechlab.prune.config.PruneConfig`'s 50).
        seed: Pruning seed.
        corruption: Corrupted traces of an interchange ablation.
        n_train: Training traces.
        n_test: Held-out traces the curves are scored on.
        n_haystack: Haystack systems (default: the run's).
        seg_len: Observations per haystack segment (default: the run's).
        protocol: NiH construction (``study`` or ``uniform``).
        device: Where to run.
        progress: Show progress bars.
        on_target: Called with each target's :class:`CurveFiles` once written.
        force: Recompute and replace curve files of other settings.

    Returns:
        One :class:`CurveFiles` per target.
    """
    try:
        grid = check_budgets([float(b) for b in budgets])
    except ValueError as exc:
        raise ValueError(f"--budgets {','.join(f'{b:g}' for b in budgets)}: {exc}") from None
    ablations = list(ABLATIONS) if list(ablations) == ["all"] else list(ablations)
    for name in ablations:
        if name not in ABLATIONS:
            raise ValueError(f"unknown ablation {name!r}; choose from {', '.join(ABLATIONS)} or all")
    if rank not in RANKINGS:
        raise ValueError(f"unknown --rank {rank!r}; choose {' or '.join(RANKINGS)}")
    if len(set(targets)) != len(targets) or len(set(ablations)) != len(ablations):
        raise ValueError("targets and ablations must not repeat")
    given = {} if steps is None else {"steps": steps}
    check_prune_args(sparsity, **given)
    search = resolved_settings({"sparsity": sparsity, **given})  # the whole search: a default that moves is another setting
    path = source_path(source)
    folder = outputs.OutputFolder(Path(out) if out is not None else outputs.default_out(path, "curves"), "curve",
                                  force=force, inputs=[path])  # fmt: skip
    written = []
    tally = stops.Tally(folder.path, len(targets), unit="target")  # Ctrl-C or SIGTERM: the curves written stay
    with stops.resumable(tally), folder:
        ckpt = open_checkpoint(source, device)
        data = nih_data(ckpt, n_train=n_train, n_test=n_test, n_haystack=n_haystack, seg_len=seg_len,
                        corruption=corruption, protocol=protocol)  # fmt: skip
        for name in targets:  # every target checked before any pruning
            check_target(name, data.train)
        n, s = haystack(ckpt, n_haystack, seg_len)
        common = {"analysis": "curve", "checkpoint_sha256": ckpt.sha256, "ablations": ablations, "budgets": grid,
                  "rank": rank, "search": search, "seed": seed, "corruption": corruption,
                  "n_train": n_train, "n_test": n_test, "n_haystack": n, "seg_len": s, "protocol": protocol}  # fmt: skip
        records = {f"curve_{name}.json": {**common, "target": name} for name in targets}
        status = folder.plan(records)

        def compute(name: str) -> tuple[dict[str, Any], float]:
            started = time.perf_counter()
            curves = sweep(
                ckpt.model, data, name, ablations, grid, ranking=rank, sparsity=sparsity, seed=seed,
                progress=progress, checkpoint_sha256=ckpt.sha256, **given,
            )  # fmt: skip
            return curves, time.perf_counter() - started

        def write(name: str, done: tuple[dict[str, Any], float], json_name: str) -> None:
            curves, seconds = done
            info: dict[str, Any] = {
                "checkpoint": str(path), "checkpoint_sha256": ckpt.sha256, "target": name,
                "rank": rank, "sparsity": sparsity, "steps": search["steps"], "seed": seed, "protocol": protocol,
                "threads": torch.get_num_threads(), "seconds": seconds,
            }  # fmt: skip
            folder.write_json(json_name, {**curves_to_dict(curves, info), **outputs.settings_record(records[json_name])})

        for done in resume_each(
            folder, status, {name: f"curve_{name}" for name in targets},
            read=lambda _, file: ({c.ablation: c for c in read_curves(file)}, 0.0), compute=compute, write=write,
            draw=lambda _, result, file: folder.write_figure(faithfulness_curves_figure(result[0]), file),
            kept=lambda name, _: tally.kept.append(f"curve_{name}"),
        ):  # fmt: skip
            (curves, seconds), reused = done.value, done.reused
            files = CurveFiles(done.key, curves, done.json_path, done.html_path, seconds, reused=reused)
            written.append(files)
            if on_target is not None:
                on_target(files)
    return written
