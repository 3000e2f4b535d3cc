"""What the ``mechlab bench`` commands set up around the measurements: the models of a
pruning benchmark, the checks of their names and the task of the ensemble benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def check_transformer_presets(names: Sequence[str]) -> None:
    """Raise ValueError unless every name is a transformer preset."""
    from mechlab.models.transformer import PRESETS

    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise ValueError(f"unknown preset {unknown[0]!r}; choose from {sorted(PRESETS)}")


def prune_rows(names: Sequence[str], *, batch: int, n_pos: int, repeats: int, device: str, memory: bool,
               straightforward: bool) -> list[tuple[str, ...]]:  # fmt: skip
    """``mechlab bench prune``'s table: one pruning step of each preset's model vs its plain
    forward+backward, and peak memory vs naive per-layer stacking (:func:`~mechlab.bench.prune.bench_prune`)."""
    from mechlab.bench.prune import bench_prune
    from mechlab.models import build_model
    from mechlab.prune.graph import build_graph

    rows = [("preset", "edges", "mem ours MB", "recompute MB", "naive MB", "ours/naive", "recompute/naive",
             "step ms", "plain ms", "step/plain", "autograd path")]  # fmt: skip
    for name in names:
        model = build_model(name, n_ctx=max(n_pos, 1))
        r = bench_prune(model, batch=batch, n_pos=n_pos, repeats=repeats, device=device,
                        memory=memory, straightforward=straightforward)  # fmt: skip
        mem = (f"{r.memory_ours / 2**20:.0f}", f"{r.memory_recompute / 2**20:.0f}", f"{r.memory_naive / 2**20:.0f}",
               f"{r.memory_ratio:.3f}", f"{r.memory_recompute_ratio:.3f}") if memory else ("-",) * 5  # fmt: skip
        slow = f"{r.straightforward_seconds / r.plain_seconds:.2f}x" if straightforward else "-"
        rows.append((name, str(build_graph(model).n_edges), *mem, f"{r.step_seconds * 1e3:.1f}",
                     f"{r.plain_seconds * 1e3:.1f}", f"{r.time_ratio:.2f}x", slow))  # fmt: skip
    return rows


def ensemble_task(overrides: Sequence[str], n_train: int) -> dict[str, Any]:
    """The ensemble benchmark's task (:data:`~mechlab.bench.ensemble.BENCH_TASK`) with
    ``key=value`` overrides; bad fields raise ValueError before any run."""
    from mechlab.bench.ensemble import BENCH_TASK
    from mechlab.tasks.state_tracking import StateTrackingConfig
    from mechlab.train.config import parse_override

    task = dict(BENCH_TASK)
    for text in overrides:
        keys, value = parse_override(text)
        task[".".join(keys)] = value
    StateTrackingConfig.from_dict({**task, "n_train": n_train})
    return task


def check_model_presets(names: Sequence[str]) -> None:
    """Raise ValueError unless there is at least one name and every one is a model preset."""
    from mechlab.models.registry import presets

    unknown = [p for p in names if p not in presets()]
    if unknown or not names:
        raise ValueError(f"unknown model preset {unknown[0] if unknown else ''!r}; choose from {sorted(presets())}")
