"""``mechlab bench ...``: the measurements of :mod:`mechlab.bench`, as tables."""

from __future__ import annotations

from pathlib import Path

import typer

from mechlab.cli.app import UsageProblem, bench_app, echo_table, use_threads
from mechlab.limits import check_elements


def _check_batch(batch: int, n_pos: int) -> None:
    """Refuse a batch whose inputs alone are above the size limit, before any model is built."""
    check_elements("the benchmark's input batch", {"batch": batch, "positions": n_pos}, lower="--batch or --pos")


@bench_app.command("prune")
def bench_prune_(
    presets: str = typer.Option("tiny,small,medium", help="Comma-separated transformer presets (also big)."),
    batch: int = typer.Option(16, min=1),
    n_pos: int = typer.Option(64, "--pos", min=2, help="Sequence length."),
    repeats: int = typer.Option(5, min=1),
    device: str = typer.Option("cpu"),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Measure peak memory (naive stacking needs GBs on big)."),
    straightforward: bool = typer.Option(False, help="Also time the straightforward autograd path (fast=False)."),
    reference: Path | None = typer.Option(None, help="A checkout of princeton-nlp/Edge-Pruning: time its GPT-2 pruning step beside ours."),
    reference_python: str | None = typer.Option(None, help="Python that runs the reference (needs transformers 4.x; default: this one)."),
) -> None:
    """One pruning step vs a plain forward+backward; peak memory vs naive per-layer stacking."""
    from mechlab.bench.commands import check_transformer_presets, prune_rows

    _check_batch(batch, n_pos)
    names = [p.strip() for p in presets.split(",") if p.strip()]
    check_transformer_presets(names)
    if reference is not None:
        from mechlab.bench.reference import check_reference

        check_reference(reference)
    n_threads = use_threads(threads)
    typer.echo(f"batch {batch} x {n_pos} positions, {repeats} timed runs, medians, device {device}, "
               f"{n_threads} threads")  # fmt: skip
    if reference is not None:
        from mechlab.bench.reference import bench_reference

        rows = [("preset", "edges", "ours ms", "reference ms", "reference/ours", "max output diff")]
        for name in names:
            r = bench_reference(reference, name, batch=batch, n_pos=n_pos, repeats=repeats,
                                python=reference_python)  # fmt: skip
            rows.append((name, str(r.config["n_edges"]), f"{r.ours_seconds * 1e3:.1f}",
                         f"{r.reference_seconds * 1e3:.1f}", f"{r.ratio:.2f}x", f"{r.max_output_diff:.1g}"))  # fmt: skip
        echo_table(rows)
        return
    echo_table(prune_rows(names, batch=batch, n_pos=n_pos, repeats=repeats, device=device, memory=memory,
                          straightforward=straightforward))  # fmt: skip


@bench_app.command("startup")
def bench_startup_(
    repeats: int = typer.Option(5, min=1, help="Runs of each command line (after a warm-up run)."),
) -> None:
    """How long mechlab takes to answer: --help of every command and import mechlab, fresh processes."""
    from mechlab.bench.startup import bench_startup

    typer.echo(bench_startup(repeats=repeats).format_table())


@bench_app.command("hooks")
def bench_hooks(
    families: str = typer.Option("transformer,lstm,dense_ssm,mamba", help="Comma-separated families."),
    batch: int = typer.Option(64, min=1),
    n_pos: int = typer.Option(251, "--pos", min=2, help="Sequence length."),
    repeats: int = typer.Option(7, min=1, help="Timed runs of each contender."),
    device: str = typer.Option("cpu"),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
) -> None:
    """Plain forward vs run_with_cache (all hooks) vs nnsight saving the same activations."""
    import torch

    from mechlab.bench.hooks import BENCH_MODELS, bench_family

    if threads is not None:
        torch.set_num_threads(threads)

    _check_batch(batch, n_pos)
    names = [f.strip() for f in families.split(",") if f.strip()]
    unknown = [f for f in names if f not in BENCH_MODELS]
    if unknown:
        raise UsageProblem(f"unknown family {unknown[0]!r}; choose from {sorted(BENCH_MODELS)}")
    typer.echo(f"batch {batch} x {n_pos} positions, {repeats} timed runs each, medians, device {device}, "
               f"{torch.get_num_threads()} thread(s)")  # fmt: skip
    rows = [("family", "params", "hooks", "plain ms", "cache ms", "nnsight ms", "cache/plain", "nnsight/plain",
             "unrolled/fused", "step-by-step cache/plain", "fused+recovered cache/plain",
             "cache w/o A, ssm_state or attention maps /plain")]  # fmt: skip
    for family in names:
        r = bench_family(family, batch=batch, n_pos=n_pos, repeats=repeats, device=device)
        rows.append((
            family, f"{r.n_params:,}", str(r.n_hooks), f"{r.plain * 1e3:.1f}", f"{r.cache * 1e3:.1f}",
            f"{r.nnsight * 1e3:.1f}", f"{r.cache_ratio:.2f}x", f"{r.nnsight_ratio:.2f}x",
            f"{r.unrolled / r.plain:.2f}x" if r.unrolled is not None else "-",
            f"{r.cache_steps_ratio:.2f}x" if r.cache_steps_ratio is not None else "-",
            f"{r.cache_fused / r.plain:.2f}x" if r.cache_fused is not None else "-",
            f"{r.cache_light / r.plain:.2f}x" if r.cache_light is not None else "-",
        ))
    echo_table(rows)


@bench_app.command("scan")
def bench_scan_(
    families: str = typer.Option("mamba,dense_ssm", help="Comma-separated families: mamba, dense_ssm."),
    batch: int = typer.Option(64, min=1),
    n_pos: int = typer.Option(251, "--pos", min=2, help="Sequence length."),
    repeats: int = typer.Option(5, min=1, help="Timed runs of each contender."),
    chunk: int = typer.Option(16, min=1, help="Positions per chunk of the chunked scan."),
    device: str = typer.Option("cpu"),
    threads: int = typer.Option(1, min=1, help="Torch CPU threads."),
) -> None:
    """The chunked scans vs the per-step loops: forward, forward+backward, and their differences."""
    import torch

    from mechlab.bench.scan import SCAN_FAMILIES, bench_scan

    _check_batch(batch, n_pos)
    names = [f.strip() for f in families.split(",") if f.strip()]
    unknown = [f for f in names if f not in SCAN_FAMILIES]
    if unknown:
        raise UsageProblem(f"unknown family {unknown[0]!r}; choose from {list(SCAN_FAMILIES)}")
    torch.set_num_threads(threads)
    typer.echo(f"batch {batch} x {n_pos} positions, chunk {chunk}, {repeats} timed runs each, medians, "
               f"device {device}, {threads} thread(s)")  # fmt: skip
    rows = [("family", "loop fwd ms", "chunked fwd ms", "loop/chunked", "loop fwd+bwd ms", "chunked fwd+bwd ms",
             "loop/chunked", "output diff", "grad diff")]  # fmt: skip
    for family in names:
        r = bench_scan(family, batch=batch, n_pos=n_pos, repeats=repeats, chunk=chunk, device=device)
        rows.append((
            family, f"{r.loop_forward * 1e3:.1f}", f"{r.chunked_forward * 1e3:.1f}", f"{r.forward_speedup:.2f}x",
            f"{r.loop_backward * 1e3:.1f}", f"{r.chunked_backward * 1e3:.1f}", f"{r.backward_speedup:.2f}x",
            f"{r.output_diff:.1e}", f"{r.grad_diff:.1e}",
        ))  # fmt: skip
    echo_table(rows)


@bench_app.command("train")
def bench_train(
    preset: str = typer.Option("tiny", help="Training preset: tiny, small, medium, big, recall-cpu."),
    batch: int | None = typer.Option(None, min=1, help="Batch size (default: the preset's; 256 keeps tiny on CPU to minutes)."),
    steps: int = typer.Option(1, min=1, help="Optimiser steps per timed window."),
    repeats: int = typer.Option(5, min=1, help="Timed windows of each contender."),
    device: str = typer.Option("cpu"),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    set_: list[str] = typer.Option([], "--set", help="Override a training setting: key=value (model.d_model=32)."),
) -> None:
    """Trainer.train_step vs a minimal PyTorch loop: same model, weights, data; examples/s and ratios."""
    from mechlab.bench.train import bench_train as run_bench

    typer.echo(f"timing {repeats} windows of {steps} step(s) x 5 contenders (+1 warm-up window each) ...")
    result = run_bench(
        preset=preset, batch=batch, steps=steps, repeats=repeats, device=device, threads=threads, overrides=set_
    )
    typer.echo(result.format_table())


@bench_app.command("ensemble")
def bench_ensemble_(
    presets: str = typer.Option("st_transformer_small,st_lstm_small,st_dense_ssm_small", help="Comma-separated model presets."),
    steps: int = typer.Option(50, min=1, help="Optimiser steps of every trial."),
    n_train: int = typer.Option(2000, min=1, help="Training sequences of every trial."),
    repeats: int = typer.Option(3, min=1, help="Timed runs of each contender."),
    threads: int = typer.Option(1, min=1, help="Torch CPU threads."),
    device: str = typer.Option("cpu"),
    set_: list[str] = typer.Option([], "--set", help="A state-tracking task field: key=value (m=2, format=cot)."),
) -> None:
    """The study's 15 trials (3 lr x 5 seeds) one after another vs as one batched ensemble."""
    from mechlab.bench.commands import check_model_presets, ensemble_task
    from mechlab.bench.ensemble import bench_ensemble

    task = ensemble_task(set_, n_train)  # bad fields fail before any run
    names = [p.strip() for p in presets.split(",") if p.strip()]
    check_model_presets(names)
    typer.echo(f"timing {repeats} runs of 15 trials x 2 contenders per preset (+1 warm-up run each) ...")
    result = bench_ensemble(names, task=task, n_train=n_train, steps=steps, repeats=repeats, threads=threads,
                            device=device)  # fmt: skip
    typer.echo(result.format_table())
