"""``mechlab info`` and ``mechlab train``."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from mechlab.cli.app import echo_table, force_option


def info(
    ckpt: Path | None = typer.Option(None, help="Checkpoint (.pt or .safetensors) to describe."),
    model: str | None = typer.Option(
        None, help="Or: an architecture, model preset or training preset to build fresh (e.g. tiny, lstm, recall-cpu)."
    ),
) -> None:
    """Print architecture, parameter count, training step and every hook with its shape and,
    where it holds components of the pruning graph, their graph names (a0.h4, m1, ...)."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import describe

    d = describe(ckpt, model)
    cfg = d["cfg"]
    typer.echo(f"source:       {d['source']}")
    typer.echo(f"architecture: {cfg.arch} ({cfg.io}, d_model={cfg.d_model}, n_layers={cfg.n_layers})")
    typer.echo(f"parameters:   {d['n_params']:,}")
    typer.echo(f"step:         {d['step']}")
    shapes = d["hooks"]
    names = d.get("graph_names", {})
    typer.echo(f"hooks ({len(shapes)}), shapes for batch 1 and {min(cfg.n_ctx, 8)} positions"
               + (", and the pruning graph's names (circuits, mechlab view):" if names else ":"))  # fmt: skip
    echo_table([(f"  {name}", str(list(shape)), names.get(name, "")) for name, shape in shapes.items()])


def train(
    task: str | None = typer.Option(None, help="Task: lds (interleaved linear systems; the default), state_tracking (Z_m / S_5; see docs/state_tracking.md) or induction (repeated random tokens; docs/induction.md)."),
    preset: str | None = typer.Option(None, help="Training preset: tiny, small, medium, big, or a bundled one."),
    out: Path | None = typer.Option(None, help="Run directory (metrics, checkpoints)."),
    steps: int | None = typer.Option(None, help="Optimiser steps."),
    device: str | None = typer.Option(None, help="cpu or cuda."),
    config: Path | None = typer.Option(None, help="YAML file of training settings."),
    set_: list[str] = typer.Option([], "--set", help="Override a setting: key=value (model.d_model=64, task_cfg.n_pairs=8)."),
    resume: Path | None = typer.Option(None, help="Continue the run in this directory from its last.pt."),
    grad_accum: int | None = typer.Option(None, help="Micro-batches per step (gradient accumulation; divides the batch)."),
    loss_reduction: str | None = typer.Option(None, help="Loss over the state dims: sum (the study's) or mean (recall-cpu's)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    force: bool = force_option("Train into (or resume) a directory that holds files git tracks (refused otherwise)."),
) -> None:
    """Train a model on a task; checkpoints at log-spaced steps plus last.pt."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines.train import TrainingStopped, run_config, train_run

    cfg, out = run_config(out, resume, force=force, preset=preset, config_file=config, overrides=set_, task=task,
                          steps=steps, device=device, grad_accum=grad_accum, loss_reduction=loss_reduction)  # fmt: skip

    def started() -> None:  # once the trainer has checked every setting: a refused one prints alone
        typer.echo(f"training {cfg.model} on {cfg.task} for {cfg.steps} steps -> {out}")
        typer.echo(yaml.safe_dump({"task_cfg": cfg.task_cfg}, default_flow_style=True).strip())

    try:
        result = train_run(cfg, out, resume=resume is not None, progress=progress, on_start=started)
    except TrainingStopped as exc:
        typer.echo(f"mechlab: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"done: step {result.step}, loss {result.final_loss:.5f}, checkpoint {result.last_checkpoint}")
    for key, value in result.final_eval.items():
        typer.echo(f"  {key}: {value:.4f}")
