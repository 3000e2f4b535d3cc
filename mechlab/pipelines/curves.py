"""Faithfulness curves of a checkpoint (``mechlab curve``): prune, rank, score every budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechlab.pipelines import outputs
from mechlab.pipelines.checkpoints import Source, open_checkpoint, source_path
from mechlab.pipelines.data import nih_data
from mechlab.prune.curves import RANKINGS, FaithfulnessCurve, check_budgets, curves_to_dict, sweep
from mechlab.prune.forward import ABLATIONS
from mechlab.tasks.lds_prune import DEFAULT_CORRUPTION
from mechlab.traces import check_target


@dataclass
class CurveFiles:
    """One target's curves and the files written: ``curve_<target>.json`` and ``.html``."""

    target: str
    curves: dict[str, FaithfulnessCurve]
    json: Path
    html: Path
    seconds: float


def curve_checkpoint(
    source: Source,
    targets: Sequence[str] = ("1-after",),
    ablations: Sequence[str] = ("interchange",),
    budgets: Sequence[float] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
    out: str | Path | None = None,
    *,
    rank: str = "log_alpha",
    sparsity: float = 0.95,
    steps: int = 500,
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
) -> list[CurveFiles]:
    """Faithfulness and complement faithfulness across edge budgets, per target.

    Every setting and target is checked before the first pruning run.

    Args:
        source: A checkpoint of the lds task, or its file (opened once).
        targets: Targets (``k-after``, ``all``).
        ablations: Ablations (``interchange``, ``mean``, ``zero``; ``["all"]``: every one).
        budgets: Edge budgets in (0, 1] (100% is always added).
        out: Folder (default: ``curves/`` beside the checkpoint).
        rank: ``log_alpha`` (one pruning run ranks the edges) or ``reprune``.
        sparsity: Sparsity of the ranking run.
        steps: Optimiser steps of each pruning run.
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

    Returns:
        One :class:`CurveFiles` per target.
    """
    import torch

    from mechlab.viz import faithfulness_curves_figure

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
    ckpt = open_checkpoint(source, device)
    data = nih_data(ckpt, n_train=n_train, n_test=n_test, n_haystack=n_haystack, seg_len=seg_len,
                    corruption=corruption, protocol=protocol)  # fmt: skip
    for name in targets:  # every target checked before any pruning
        check_target(name, data.train)
    path = source_path(source)
    folder = Path(out) if out is not None else outputs.beside(path, "curves")
    written = []
    for name in targets:
        started = time.perf_counter()
        curves = sweep(
            ckpt.model, data, name, ablations, grid, ranking=rank, sparsity=sparsity, seed=seed,
            steps=steps, progress=progress, checkpoint_sha256=ckpt.sha256,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        info: dict[str, Any] = {
            "checkpoint": str(path), "checkpoint_sha256": ckpt.sha256, "target": name,
            "rank": rank, "sparsity": sparsity, "steps": steps, "seed": seed, "protocol": protocol,
            "threads": torch.get_num_threads(), "seconds": seconds,
        }  # fmt: skip
        files = CurveFiles(
            name, curves, outputs.write_json(folder / f"curve_{name}.json", curves_to_dict(curves, info)),
            outputs.write_figure(faithfulness_curves_figure(curves), folder / f"curve_{name}.html"),
            seconds,
        )  # fmt: skip
        written.append(files)
        if on_target is not None:
            on_target(files)
    return written
