"""``mechlab eval``, ``mechlab report`` and ``mechlab recall``: parse, call the pipeline, print."""

from __future__ import annotations

from pathlib import Path

import typer

from mechlab.cli.app import (
    DEPRECATED_PROTOCOL,
    UsageProblem,
    echo_table,
    fmt,
    force_option,
    renamed_option,
    say_loading,
    stopped,
    use_threads,
)
from mechlab.pipelines import preflight

NIH_HELP = ("NiH construction: study (the default: oldest system queried, misdirection to the next) "
            "or uniform (query and misdirection drawn uniformly).")  # fmt: skip


def eval_(
    ctx: typer.Context,
    ckpt: Path = typer.Option(..., help="Checkpoint of a run trained on the lds task."),
    suite: list[str] = typer.Option(
        ["nih"], help="uninterleaved, nih, ood, dynamics (repeatable) or all."
    ),
    out: Path | None = typer.Option(
        None, help="Directory for <suite>.json and <suite>.html (default: mechlab-out/<run>/eval)."
    ),
    traces: int = typer.Option(1000, min=1, help="Traces per evaluation."),
    haystack: int | None = typer.Option(
        None,
        min=1,
        help="Haystack systems (default: the run's eval setting, shrunk to fit the model).",
    ),
    seg_len: int | None = typer.Option(None, min=1, help="Observations per haystack segment."),
    seed: int = typer.Option(0),
    nih: str = typer.Option("study", help=NIH_HELP),
    trials: int | None = typer.Option(
        None,
        min=1,
        help="nih/ood: initial-state trials per example; --traces is then the number of examples (the study: --traces 50 --trials 1000), median per example then across examples.",
    ),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    device: str = typer.Option("cpu"),
    force: bool = force_option(
        "Recompute and replace suites of other settings found in --out (refused otherwise; the same settings are read back), and write into a folder git tracks."
    ),
    protocol: str | None = DEPRECATED_PROTOCOL,
) -> None:
    """Evaluate a checkpoint: JSON numbers plus plotly HTML figures."""
    nih = renamed_option(protocol, nih, "--protocol", "--nih")
    preflight.check_nih(nih)
    preflight.check_checkpoint(ckpt, task="lds")
    preflight.check_suites(suite)
    preflight.check_folder(out, "eval", source=ckpt, what="eval", force=force)
    say_loading(True, "torch and the model")  # the suites' bars have no --no-progress either
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import evaluate_checkpoint

    use_threads(threads)

    def show(name: str, report: dict, json_path: Path, html_path: Path) -> None:
        typer.echo(f"{name}: {json_path}, {html_path}")
        _print_report(report)

    def start(name: str) -> None:
        typer.echo(
            f"evaluating {name} ({traces} {'examples' if trials else 'traces'})...", err=True
        )

    def reused(name: str, path: Path) -> None:
        typer.echo(
            f"{name}: read back {path} (same settings; --force and other settings recompute)"
        )

    try:
        evaluate_checkpoint(ckpt, suite, out, on_suite=show, on_start=start, on_reuse=reused, n_traces=traces,
                            n_haystack=haystack, seg_len=seg_len, seed=seed, protocol=nih, trials=trials,
                            device=device, force=force)  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, what is kept and how to resume
        stopped(ctx, exc)


def _print_report(report: dict) -> None:
    r = report["result"]
    if report["suite"] == "nih":
        for j, s in r["offsets"].items():
            typer.echo(
                f"  {j}-after: median {s['median']:.4f} (q1 {s['q1']:.4f}, q3 {s['q3']:.4f})"
            )
    elif report["suite"] == "ood":
        for probe, offsets in r["probes"].items():
            typer.echo(
                f"  {probe:20s} "
                + "  ".join(f"{j}-after {s['median']:.3f}" for j, s in offsets.items())
            )
    elif report["suite"] == "uninterleaved":
        m, ls = r["model_median"], r["lstsq_median"]
        for j in (1, 2, 3, 6, 7, 10, 50, len(m)):
            if j <= len(m):
                typer.echo(f"  obs {j:3d}: model {m[j - 1]:.4f}  least-squares {ls[j - 1]:.2e}")
    elif report["suite"] == "dynamics":
        for i, ex in enumerate(r["examples"]):
            typer.echo(
                f"  {ex:>10,} examples: "
                + "  ".join(f"{j}-after {v[i]:.3f}" for j, v in r["offsets"].items())
            )


def report(
    ctx: typer.Context,
    ckpt: Path = typer.Option(..., help="Checkpoint of a run trained on the lds task."),
    out: Path = typer.Option(
        ...,
        help="Directory for index.html and the JSON behind it. A rerun resumes (circuits of the same settings are read back; a finished report is read back whole).",
    ),
    target: list[str] = typer.Option(["1-after", "2-after"], help="Pruning target (repeatable)."),
    seed: list[int] = typer.Option(
        [0, 1],
        help="Pruning seeds per target (repeatable; two or more give the seed baseline, three or more its intervals: --seed 0 --seed 1 --seed 2, 1.4x as long).",
    ),
    eval_traces: int = typer.Option(500, min=1, help="NiH traces of the evaluation."),
    prune_traces: int = typer.Option(
        256, min=1, help="Training traces of each pruning run (held-out: twice as many)."
    ),
    recall_traces: int = typer.Option(256, min=1, help="NiH traces of the recall verdicts."),
    components: bool = typer.Option(True, help="Patch each head / layer in the recall analysis."),
    recipe: str = typer.Option(
        "default",
        help="Pruning recipe: default, uniform, fast, thorough or study (see mechlab prune --help); its NiH construction is used everywhere.",
    ),
    steps: int | None = typer.Option(
        None,
        min=1,
        help="Optimiser steps of each pruning run (default: the recipe's, 50 for default, as mechlab prune).",
    ),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    device: str = typer.Option("cpu", help="Where every stage runs (cpu, cuda, ...)."),
    progress: bool = typer.Option(True, help="Show progress bars."),
    force: bool = force_option(
        "Replace a report of other settings in --out (refused otherwise; its other circuits are removed), write into a folder "
        "that holds files a report does not write, such as a prune's (refused otherwise; they are left as they are), "
        "and write into a folder git tracks."
    ),
    protocol: str | None = DEPRECATED_PROTOCOL,
) -> None:
    """The main job: evaluate, prune each target, compare the circuits, explain recall; one index.html."""
    recipe = renamed_option(protocol, recipe, "--protocol", "--recipe")
    if str(out) in ("", "."):
        raise UsageProblem("give --out a folder of its own (the report writes several files)")
    preflight.check_recipe(recipe)
    preflight.check_checkpoint(ckpt, task="lds", targets=target)
    preflight.check_folder(out, "report", source=ckpt, what="report", force=force)
    say_loading(progress, "torch and the model")
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import ReportConfig, report_checkpoint

    cfg = ReportConfig(targets=tuple(target), seeds=tuple(seed), eval_traces=eval_traces,
                       prune_traces=prune_traces, recall_traces=recall_traces,
                       components=components, recipe=recipe, steps=steps)  # fmt: skip
    use_threads(threads)
    try:
        result = report_checkpoint(ckpt, out, cfg, force=force, device=device, progress=progress,
                                   log=lambda line: typer.echo(line, err=True))  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, what is kept and how to resume
        stopped(ctx, exc)
    s = result.summary
    for name, line in result.task_warnings():  # first: circuits of a task not done mean nothing
        typer.echo(f"WARNING {name}: " + line)
    typer.echo("NiH median: " + ", ".join(f"{k} {v:.4f}" for k, v in s["nih_median"].items()))
    typer.echo("recall: " + ", ".join(f"{k} {v}" for k, v in s["verdict"].items()))
    for name, c in s["circuits"].items():
        faith = ", ".join(fmt(f) for f in c["faithfulness"])
        typer.echo(f"circuit {name}: edges {c['edges']}, faithfulness {faith}")
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines.circuits import report_overlap_line

    for key, o in s["overlap"].items():
        typer.echo(report_overlap_line(key, o, s["within"], len(cfg.seeds)))
    if result.reused:
        typer.echo(
            "read back: the report in --out was finished with the same settings (--force to recompute)"
        )
    typer.echo(f"report: {result.page}")


def recall(
    ctx: typer.Context,
    ckpt: Path | None = typer.Option(None, help="Checkpoint of a run trained on the lds task."),
    checkpoints: Path | None = typer.Option(
        None, help="Run directory: the same scores across its checkpoints/step_*.pt."
    ),
    out: Path | None = typer.Option(
        None,
        help="Directory for recall.json/.html and recall_dynamics.json/.html (default: mechlab-out/<run>/recall).",
    ),
    traces: int = typer.Option(256, min=1, help="NiH traces."),
    haystack: int | None = typer.Option(
        None,
        min=1,
        help="Haystack systems (default: the run's eval setting, shrunk to fit the model).",
    ),
    seg_len: int | None = typer.Option(None, min=1, help="Observations per haystack segment."),
    offset: list[int] = typer.Option(
        [], help="Offset j of j-after (repeatable; default every one of 1..seg_len)."
    ),
    seed: int = typer.Option(0),
    components: bool = typer.Option(
        True, help="Also patch each head / layer at the patched position (--ckpt)."
    ),
    nih: str = typer.Option("study", help=NIH_HELP),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    device: str = typer.Option("cpu"),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    force: bool = force_option(
        "Recompute and replace reports of other settings found in --out (refused otherwise; the same settings are read back), and write into a folder git tracks."
    ),
    protocol: str | None = DEPRECATED_PROTOCOL,
) -> None:
    """Does each prediction after the query label follow the label or the observations? JSON + HTML."""
    nih = renamed_option(protocol, nih, "--protocol", "--nih")
    preflight.check_nih(nih)
    if ckpt is None and checkpoints is None:  # the pipeline's words
        raise UsageProblem("give --ckpt PATH (a checkpoint), --checkpoints DIR (a run directory), or both")
    if ckpt is not None:
        preflight.check_checkpoint(ckpt, task="lds")
    if checkpoints is not None:
        preflight.check_run_dir(checkpoints)
    source = ckpt if ckpt is not None else checkpoints / "last.pt"
    preflight.check_folder(out, "recall", source=source, what="recall", force=force)
    say_loading(progress, "torch and the model")
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import recall_and_write

    use_threads(threads)
    try:
        files = recall_and_write(
            ckpt, checkpoints, out, components=components, progress=progress,
            on_file=lambda stem, j, h: typer.echo(f"{stem}: {j}, {h}"), n_traces=traces, n_haystack=haystack,
            on_reuse=lambda stem, j: typer.echo(f"{stem}: read back {j} (same settings)"),
            seg_len=seg_len, seed=seed, protocol=nih, offsets=tuple(offset) or None, device=device, force=force,
        )  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, what is kept and how to resume
        stopped(ctx, exc)
    if "recall" in files.written:
        _print_recall(files.written["recall"][0]["result"])
    if "recall_dynamics" in files.written:
        _print_recall_dynamics(files.written["recall_dynamics"][0])


def _print_recall(r: dict) -> None:
    rows = [("offset", "E_label", "E_obs", "E_obs_all", "score", "verdict", "score_all", "verdict_all",
             "follows_label", "clean", "misdirected")]  # fmt: skip
    for j, v in r["per_offset"].items():
        rows.append((f"{j}-after", f"{v['e_label']:.4f}", f"{v['e_obs']:.4f}", f"{v['e_obs_all']:.4f}",
                     fmt(v["score"]), v["verdict"], fmt(v["score_all"]), v["verdict_all"],
                     f"{v['follows_label']:.3f}", f"{r['errors']['clean'][j]['median']:.4f}",
                     f"{r['errors']['misdirect_incorrect'][j]['median']:.4f}"))  # fmt: skip
    echo_table(rows)
    for direction, heads in r["label_heads"].items():
        if heads:
            typer.echo(f"heads carrying the label to 1-after ({direction}): "
                       + ", ".join(f"{h} {f:.2f}" for h, f in heads))  # fmt: skip


def _print_recall_dynamics(d: dict) -> None:
    typer.echo("per offset: score verdict (follows_label)")
    rows = [("step", "examples", *(f"{j}-after" for j in d["per_offset"]))]
    for i, (step, ex) in enumerate(zip(d["steps"], d["examples"], strict=True)):
        rows.append((str(step), f"{ex:,}", *(f"{fmt(v['score'][i])} {v['verdict'][i]} ({v['follows_label'][i]:.2f})"
                                             for v in d["per_offset"].values())))  # fmt: skip
    echo_table(rows)
