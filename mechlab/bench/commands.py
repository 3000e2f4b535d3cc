"""What the ``mechlab bench`` commands set up around the measurements: the models of a
pruning benchmark, the checks of their names and the task of the ensemble benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mechlab.bench.record import Table


def check_transformer_presets(names: Sequence[str]) -> None:
    """Raise ValueError unless every name is a transformer preset."""
    # lazy: mechlab bench checks its options here before torch loads; this loads torch (1-3 s)
    from mechlab.models.transformer import PRESETS

    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise ValueError(f"unknown preset {unknown[0]!r}; choose from {sorted(PRESETS)}")


def prune_table(names: Sequence[str], *, batch: int, n_pos: int, repeats: int, device: str, memory: bool,
                straightforward: bool) -> Table:  # fmt: skip
    """``mechlab bench prune``'s table: one pruning step of each preset's model vs its plain
    forward+backward (run by run: median [quartiles]), and peak memory vs naive per-layer
    stacking (:func:`~mechlab.bench.prune.bench_prune`), beside the goals (step <= 2x,
    memory <= 2 / n_layers of naive). A recurrent preset (``mamba_130m_shape``) has neither a
    stacking scheme nor an autograd path of its own: its memory is set beside the plain
    step's, its ``straightforward`` cell is ``-``."""
    # lazy: mechlab bench checks its options here before torch loads; this loads torch (1-3 s)
    from mechlab.bench.prune import bench_prune
    from mechlab.bench.timing import fmt_ms, fmt_ratio, paired_ratio
    from mechlab.models import build_model
    from mechlab.models.registry import graph_kind
    from mechlab.prune.graph import build_graph

    columns = ["preset", "layers", "edges", "mem ours MB", "recompute MB", "naive MB", "plain step MB",
               "ours / naive", "recompute / naive", "goal (2 / layers)", "step ms", "plain fwd+bwd ms",
               "step / plain", "step / plain, CPU time", "autograd path / plain"]  # fmt: skip

    def mb(n: int | None) -> str:
        return "-" if n is None else f"{n / 2**20:.0f}"

    def share(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    cells, values = [], []
    for name in names:
        model = build_model(name, n_ctx=max(n_pos, 1))
        transformer = graph_kind(model.cfg.arch) == "transformer"
        r = bench_prune(model, batch=batch, n_pos=n_pos, repeats=repeats, device=device,
                        memory=memory, straightforward=straightforward and transformer)  # fmt: skip
        n_layers = model.cfg.n_layers
        graph = build_graph(model)
        step, plain = r.timings["prune"], r.timings["plain"]
        ratio, cpu = paired_ratio(step, plain), paired_ratio(step, plain, cpu=True)
        slow = paired_ratio(r.timings["straightforward"], plain) if "straightforward" in r.timings else None
        goal = 2 / n_layers if r.memory_naive else None
        cells.append([name, str(n_layers), f"{graph.n_edges:,}", mb(r.memory_ours), mb(r.memory_recompute),
                      mb(r.memory_naive), mb(r.memory_plain), share(r.memory_ratio),
                      share(r.memory_recompute_ratio), share(goal), fmt_ms(step), fmt_ms(plain),
                      fmt_ratio(ratio), fmt_ratio(cpu), "-" if slow is None else fmt_ratio(slow)])  # fmt: skip
        values.append({"preset": name, "arch": model.cfg.arch, "n_layers": n_layers, "n_edges": r.config["n_edges"],
                       "n_writers": graph.n_writers, "d_model": model.cfg.d_model, "batch": batch, "n_pos": n_pos,
                       "memory_ours": r.memory_ours, "memory_recompute": r.memory_recompute,
                       "memory_naive": r.memory_naive, "memory_plain": r.memory_plain, "memory_ratio": r.memory_ratio,
                       "memory_recompute_ratio": r.memory_recompute_ratio, "memory_goal": goal,
                       "step_s": step.median, "plain_s": plain.median, "step_ratio": ratio[1],
                       "step_cpu_ratio": cpu[1], "straightforward_ratio": None if slow is None else slow[1],
                       "timings": {k: t.to_dict() for k, t in r.timings.items()}})  # fmt: skip
    return Table(columns, cells, values=values)


def ensemble_task(overrides: Sequence[str], n_train: int) -> dict[str, Any]:
    """The ensemble benchmark's task (:data:`~mechlab.bench.ensemble.BENCH_TASK`) with
    ``key=value`` overrides; bad fields raise ValueError before any run."""
    # lazy: mechlab bench checks its options here before torch loads; this loads torch (1-3 s)
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
    # lazy: mechlab bench checks its options here before torch loads; this loads torch (1-3 s)
    from mechlab.models.registry import presets

    unknown = [p for p in names if p not in presets()]
    if unknown or not names:
        raise ValueError(f"unknown model preset {unknown[0] if unknown else ''!r}; choose from {sorted(presets())}")


def reference_table(reference: Any, names: Sequence[str], *, batch: int, n_pos: int, repeats: int,
                    python: str | None) -> Table:  # fmt: skip
    """``mechlab bench prune --reference``'s table: mechlab's pruning step beside Edge
    Pruning's on the same weights and batch (:func:`~mechlab.bench.reference.bench_reference`)."""
    # lazy: mechlab bench checks its options here before torch loads; this loads torch (1-3 s)
    from mechlab.bench.reference import bench_reference

    cells, values = [], []
    for name in names:
        r = bench_reference(reference, name, batch=batch, n_pos=n_pos, repeats=repeats, python=python)
        cells.append([name, f"{r.config['n_edges']:,}", f"{r.ours_seconds * 1e3:.1f}",
                      f"{r.reference_seconds * 1e3:.1f}", f"{r.ratio:.2f}x", f"{r.max_output_diff:.1g}"])  # fmt: skip
        values.append({"preset": name, **r.config, "ours_s": r.ours_seconds, "reference_s": r.reference_seconds,
                       "ratio": r.ratio, "max_output_diff": r.max_output_diff})  # fmt: skip
    return Table(["preset", "edges", "ours ms", "reference ms", "reference / ours", "max output diff"], cells,
                 values=values)  # fmt: skip
