"""``mechlab translation across`` and ``mechlab translation circuits``: parse, call the
pipelines (:mod:`mechlab.pipelines.translation`, :mod:`mechlab.pipelines.translation_prune`),
print."""

from __future__ import annotations

from pathlib import Path

import typer

from mechlab.cli.app import (
    UsageProblem,
    echo_table,
    fmt,
    force_option,
    say_loading,
    stopped,
    use_threads,
)

translation_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                              help="Starting vs continuing an in-context translation, named by a label.")  # fmt: skip

WORDS_HELP = (
    "Word list TSV (english<TAB><language>...; default: the bundled English/Spanish/French list)."
)
SYMBOLS_HELP = "Symbolic labels (repeatable; default X Q Z K W V J XQ ZK QW)."


def _symbols(symbol: list[str]) -> dict[str, tuple[str, ...]]:
    """The ``symbols`` keyword when labels are given (else the pipeline's default pool)."""
    return {"symbols": tuple(symbol)} if symbol else {}


@translation_app.command("across")
def across(
    ctx: typer.Context,
    checkpoints: Path | None = typer.Option(
        None,
        help="Folder of checkpoint folders (step in their names) or of mechlab checkpoint files (step_*.pt).",
    ),
    manifest: Path | None = typer.Option(
        None, help="folder<TAB>step lines (or a JSON list) instead of names."
    ),
    out: Path = typer.Option(
        ..., help="Folder of step_<step>.json, across.json and across.html (resumed)."
    ),
    tokenizer: Path | None = typer.Option(
        None, help="Tokenizer folder (default: the first checkpoint's folder)."
    ),
    words: Path | None = typer.Option(None, help=WORDS_HELP),
    symbol: list[str] = typer.Option([], help=SYMBOLS_HELP),
    prompts: int = typer.Option(
        64, min=1, help="Prompts per set (symbolic, semantic, and each misdirected)."
    ),
    k: int = typer.Option(4, min=1, help="Example pairs per language."),
    queries: int = typer.Option(3, min=2, help="Query items per prompt (the first is the start)."),
    threshold: float = typer.Option(0.5, help="Accuracy at which a curve emerges, in (0, 1]."),
    seed: int = typer.Option(0),
    boot: int = typer.Option(1000, min=1, help="Bootstrap resamples."),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    force: bool = force_option(
        "Replace step files of other settings, and write into a folder git tracks."
    ),
) -> None:
    """Score start and continue over a series of checkpoints; the emergence steps and the verdict."""
    if checkpoints is None and manifest is None:
        raise UsageProblem("give --checkpoints FOLDER (steps in the names) or --manifest FILE")
    say_loading(True, "torch, the tokenizer and the checkpoints")
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines.translation import translation_across_training

    use_threads(threads)
    try:
        summary = translation_across_training(
            checkpoints if checkpoints is not None else [], out, manifest=manifest, tokenizer=tokenizer, words=words,
            **_symbols(symbol), n_prompts=prompts, k=k, n_query=queries, seed=seed, threshold=threshold,
            n_boot=boot, force=force, on_checkpoint=lambda step, how: typer.echo(f"step {step}: {how}"),
        )  # fmt: skip
    except KeyboardInterrupt as exc:
        stopped(ctx, exc)
    rows = [("step", "sym start", "sym continue", "sem start", "sem continue")]
    curves = summary["curves"]
    for i, step in enumerate(summary["steps"]):
        rows.append((str(step), *(fmt(curves[kind][pos][i]["mean"]) for kind in ("symbolic", "semantic")
                                  for pos in ("start", "continue"))))  # fmt: skip
    echo_table(rows)
    typer.echo(f"verdict: {summary['verdict']}")
    typer.echo(f"wrote {out / 'across.json'}, {out / 'across.html'}")


@translation_app.command("circuits")
def circuits(
    ctx: typer.Context,
    model: Path = typer.Option(..., help="A save_pretrained folder or a mechlab token checkpoint."),
    out: Path = typer.Option(
        ..., help="Folder of pairs/, circuits/ and overlap.json (resumed per circuit)."
    ),
    tokenizer: Path | None = typer.Option(
        None, help="Tokenizer folder (default: the model's folder)."
    ),
    words: Path | None = typer.Option(None, help=WORDS_HELP),
    symbol: list[str] = typer.Option([], help=SYMBOLS_HELP),
    kind: str = typer.Option("symbolic", help="Label kind of the pairs: symbolic or semantic."),
    pairs: int = typer.Option(
        64, min=2, help="Prompts per target (half pruned on, half held out)."
    ),
    k: int = typer.Option(4, min=1, help="Example pairs per language."),
    seed: int = typer.Option(0, help="Seed of the prompts."),
    search_seed: list[int] = typer.Option(
        [0, 1, 2], help="Search seeds (repeatable; 3+ give intervals)."
    ),
    method: list[str] = typer.Option(
        ["prune"], help="prune and/or attribution methods (repeatable)."
    ),
    sparsity: float = typer.Option(0.95, help="Edge sparsity in (0, 1)."),
    steps: int | None = typer.Option(
        None, min=1, help="Pruning steps (prune only; default the engine's)."
    ),
    boot: int = typer.Option(1000, min=1, help="Bootstrap resamples of the overlap."),
    null: int = typer.Option(200, min=1, help="Samples of each null model."),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    force: bool = force_option(
        "Replace outputs of other settings, and write into a folder git tracks."
    ),
) -> None:
    """Circuits of the start and the continue positions on label-swapped pairs, and their overlap."""
    say_loading(True, "torch, the tokenizer and the model")
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines.translation_prune import translation_circuits

    use_threads(threads)
    extra = {"steps": steps} if steps is not None else {}
    try:
        report = translation_circuits(
            model, out, tokenizer=tokenizer, words=words, kind=kind, **_symbols(symbol), n_pairs=pairs, k=k,
            seed=seed, seeds=tuple(search_seed), methods=tuple(method), sparsity=sparsity, n_boot=boot, n_null=null,
            force=force, on_circuit=lambda stem: typer.echo(f"circuit {stem}"), **extra,
        )  # fmt: skip
    except KeyboardInterrupt as exc:
        stopped(ctx, exc)
    rows = [
        (
            "method",
            "start edges",
            "continue edges",
            "Jaccard",
            "uniform null",
            "degree null",
            "p (degree)",
        )
    ]
    for name, entry in report["overlap"].items():
        pair = entry["across"]["start vs continue"]
        rows.append((name, *(fmt(sum(v) / len(v)) for v in (entry["n_edges"]["start"], entry["n_edges"]["continue"])),
                     fmt(pair["jaccard_observed"]), fmt(pair["null_uniform"]["mc_mean"]),
                     fmt(pair["null_degree"]["mc_mean"]), fmt(pair["null_degree"]["p_greater"])))  # fmt: skip
    echo_table(rows)
    typer.echo(f"wrote {out / 'overlap.json'}")
