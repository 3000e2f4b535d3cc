"""``mechlab sweep``: N* searches (and kappa, OOD) on Ray or locally, resumable."""

from __future__ import annotations

from pathlib import Path

import typer

from mechlab.cli.app import UsageProblem, echo_table, force_option, stopped


def _csv_list(text: str, kind: type = str) -> list:
    """Comma-separated values of a list option, each converted by ``kind``."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        return [kind(t) for t in items]
    except ValueError:
        raise UsageProblem(f"{text!r} is not a comma-separated list of {kind.__name__} values") from None


def sweep_(
    ctx: typer.Context,
    out: Path = typer.Option(..., help="Sweep folder: trials/ (one file per finished trial), tables, figures; a re-run resumes."),
    config: Path | None = typer.Option(None, help="YAML file of sweep settings (SweepSpec keys; the flags below override it)."),
    models: str | None = typer.Option(None, help="Comma-separated model presets or families (e.g. st_transformer_small,st_lstm_small)."),
    formats: str | None = typer.Option(None, help="Comma-separated formats: outcome, cot, acot."),
    lengths: str | None = typer.Option(None, help="Length distributions searched at each L: fixed, uniform, short_to_long."),
    group: str | None = typer.Option(None, help="zm (sums in Z_m) or s5 (compositions in S_5)."),
    m: str | None = typer.Option(None, "--m", help="Comma-separated moduli of Z_m (each >= 2)."),
    L: str | None = typer.Option(None, "--L", help="Comma-separated longest lengths (each >= 2)."),
    kappa: bool | None = typer.Option(None, "--kappa/--no-kappa", help="Also search each length n = 2..L alone, for kappa (default on)."),
    ood: bool | None = typer.Option(None, "--ood/--no-ood", help="Also train at the largest N available and report OOD accuracy at 2L (default on)."),
    ood_n: int | None = typer.Option(None, help="The N of the OOD training (default: the largest available)."),
    lrs: str | None = typer.Option(None, help="Comma-separated learning rates of the grid (default 1e-3,1e-4,1e-5)."),
    seeds: str | None = typer.Option(None, help="Comma-separated seeds of the grid (default 10,20,30,40,50)."),
    steps: int | None = typer.Option(None, help="Optimiser steps per trial (default 250000)."),
    batch_size: int | None = typer.Option(None, help="Batch size per trial (default 64)."),
    eval_every: int | None = typer.Option(None, help="Steps between validations (default 500)."),
    n_val: int | None = typer.Option(None, help="Validation sequences (default 2000; at most 20% of each length)."),
    data_seed: int | None = typer.Option(None, help="Seed of the task's data sets (default 0)."),
    epsilon: float | None = typer.Option(None, help="Success: validation loss below this (default 1e-4)."),
    multiplier: float | None = typer.Option(None, help="Factor of the search's geometric phase (default 1000)."),
    n_min: int | None = typer.Option(None, help="Smallest N tried (default 1)."),
    n_max: int | None = typer.Option(None, help="Largest N tried (default 16000000; also capped by the unique samples)."),
    max_search_steps: int | None = typer.Option(None, help="Most N values tried per search (default 20)."),
    resolution: float | None = typer.Option(None, help="Stop bisecting at hi/lo <= this (default 1: until steps run out)."),
    start: int | None = typer.Option(None, help="First N tried (default: n_min)."),
    local: bool = typer.Option(False, "--local", help="Run in this process, one trial at a time (no Ray; for debugging)."),
    address: str | None = typer.Option(None, help="Ray cluster to join (host:port, ray://host:port or auto); default: a local instance."),
    cpus: int | None = typer.Option(None, min=1, help="CPUs of the local Ray instance (default: all)."),
    cpus_per_trial: float = typer.Option(1.0, min=0, help="CPUs each Ray task reserves."),
    gpus_per_trial: float = typer.Option(0.0, min=0, help="GPUs each Ray task reserves (fractions allowed)."),
    max_retries: int = typer.Option(3, min=0, help="Retries of a Ray task whose worker died."),
    units: str = typer.Option("trial", help="trial (one task per trial; a grid point stops at its first success) or point (one batched ensemble per grid point)."),
    trial: str = typer.Option("mechlab.train.trials:run_trial", help="The trial function, module:function."),
    device: str | None = typer.Option(None, help="Device of each trial (cpu or cuda)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    force: bool = force_option("Write into a folder git tracks, or reuse the trials of another trial function found in --out (refused otherwise)."),
) -> None:
    """N* searches (and kappa, OOD) over models, formats and tasks; trials on Ray, persisted, resumable."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines.sweep import check_run, run_and_write, sweep_spec

    settings: dict = {}
    lists = {"models": (models, str), "formats": (formats, str), "lengths": (lengths, str), "ms": (m, int),
             "Ls": (L, int), "lrs": (lrs, float), "seeds": (seeds, int)}  # fmt: skip
    for name, (text, kind) in lists.items():
        if text is not None:
            settings[name] = _csv_list(text, kind)
    flags = {"group": group, "kappa": kappa, "ood": ood, "ood_n": ood_n, "steps": steps, "batch_size": batch_size,
             "eval_every": eval_every, "n_val": n_val, "data_seed": data_seed, "device": device}  # fmt: skip
    settings.update({k: v for k, v in flags.items() if v is not None})
    knobs = {"epsilon": epsilon, "multiplier": multiplier, "n_min": n_min, "n_max": n_max,
             "max_steps": max_search_steps, "resolution": resolution, "start": start}  # fmt: skip
    search = {k: v for k, v in knobs.items() if v is not None}
    spec = sweep_spec(config, settings, search)
    check_run(units, local, address, device=spec.device, trial=trial)
    keys = spec.search_keys()
    typer.echo(f"sweep: {len(keys)} N* searches, grid {len(spec.lrs)} lr x {len(spec.seeds)} seeds, "
               f"{spec.steps} steps per trial -> {out}" + (" (local, no Ray)" if local else ""))  # fmt: skip
    try:
        result, paths = run_and_write(spec, out, trial=trial, units=units, local=local, address=address,
                                      num_cpus=cpus, cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial,
                                      max_retries=max_retries, progress=progress, force=force, config=config,
                                      on_note=typer.echo)  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, the trials kept and how to resume
        stopped(ctx, exc)
    rows = [("model", "format", "task", "lengths", "L", "N*", "status", "bracket (lo, hi]", "kappa", "OOD tok/seq")]
    for key, r in result.searches.items():
        k = result.kappas.get(key)
        o = result.ood.get(key)
        mark = {"lower": ">=", "upper": "<=", "exact": ""}.get(k.bound, "") if k else ""
        rows.append((key.model, key.format, "S5" if key.group == "s5" else f"Z{key.m}", key.lengths, str(key.L),
                     "-" if r.n_star is None else str(r.n_star), r.status, f"({r.lo}, {r.hi}]",
                     "-" if k is None or k.value is None else f"{mark}{k.value:.3g}",
                     "-" if o is None else f"{o.token_acc:.2f}/{o.seq_acc:.2f}"))  # fmt: skip
    echo_table(rows)
    typer.echo(f"trials: {result.ran} run, {result.reused} reused from {out / 'trials'}")
    typer.echo("wrote " + ", ".join(p.name for p in paths.values()))
