"""``mechlab prune``, ``view``, ``overlap`` and ``curve``: parse, call the pipeline, print."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mechlab.circuit_methods import (
    DEFAULT_METHOD,
    EDGE_PRUNING_OPTIONS,
    is_edge_pruning,
    method_help,
)
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
    warn,
)
from mechlab.cli.evaluate import NIH_HELP
from mechlab.pipelines import preflight

if TYPE_CHECKING:  # the pipelines load after the options are checked
    from mechlab.pipelines.request import CircuitRequest

RECIPE_HELP = ("default: mechlab's settings (sparsity 0.95) on the study's NiH (oldest system queried, "
               "misdirection to the next); uniform: the same on uniformly drawn NiH; fast: the default without its "
               "exact-ablation ranking in the selection (faster, less faithful); thorough: exact warm start, EAP-IG in "
               "the selection, 200 steps of 64 traces (several times slower); study: the study's "
               "settings (sparsity 0.99, node sparsity 0.8, loss truth x 1000, 3000 steps) on its NiH. "
               "Options given explicitly override it.")  # fmt: skip
METHOD_HELP = method_help()  # every registered method's line (mechlab.circuit_methods)
PRUNE_ONLY = EDGE_PRUNING_OPTIONS
"""Options of edge pruning alone (its optimiser, node masks, joint pruning)."""


def prune(
    ctx: typer.Context,
    ckpt: Path | None = typer.Option(None, help="Checkpoint of a run trained on the lds task (or state_tracking: see --length; induction: target all)."),
    target: list[str] = typer.Option(["1-after"], help="k-after (e.g. 1-after, 2-after) or all; repeatable (state tracking: final, changed or all; induction: all)."),
    sparsity: float = typer.Option(0.95, help="Fraction of edges removed, in (0, 1)."),
    ablation: str = typer.Option("interchange", help="interchange, mean or zero."),
    corruption: str = typer.Option("misdirect_incorrect", help="Corrupted traces of an interchange ablation: misdirect_incorrect (query label swapped with another haystack system's), another probe, or shuffle (state tracking: random, the default there, or x<k>)."),
    loss: str = typer.Option("model", help="model (match the full model) or truth (match the ground truth)."),
    node_sparsity: float | None = typer.Option(None, help="Also mask writer nodes, at this sparsity."),
    steps: int | None = typer.Option(None, min=1, help="Optimiser steps (default: the recipe's; the library's default 50)."),
    lr: float | None = typer.Option(None, help="Adam learning rate of the masks (default: the library's, 0.1)."),
    lambda_lr: float | None = typer.Option(None, help="Peak Adam learning rate of the Lagrange multipliers (maximised; warm-up, then linear decay; default: the library's, 1.0)."),
    seed: list[int] = typer.Option([0], help="Pruning and data seed (seed k draws its own traces); repeat for a seed-stability estimate."),
    traces: int = typer.Option(256, min=1, help="Training traces."),
    test_traces: int = typer.Option(512, min=1, help="Held-out traces for the metrics."),
    haystack: int | None = typer.Option(None, min=1, help="Haystack systems (default: the run's eval setting, shrunk to fit the model)."),
    seg_len: int | None = typer.Option(None, min=1, help="Observations per haystack segment."),
    length: int | None = typer.Option(None, help="State-tracking checkpoints: elements per sequence (default the run's L; targets final, changed, all; corruption random or x<k>)."),
    out: Path | None = typer.Option(None, help="Directory for <target>_seed<k>.json/.html (default: mechlab-out/<run>/circuits; state tracking: <target>_n<length>_seed<k>; --pairs: <pairs>_seed<k> in mechlab-out/<model>-<pairs>/circuits). A rerun resumes: circuits of the same settings are read back."),
    device: str = typer.Option("cpu"),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    recipe: str = typer.Option("default", help=RECIPE_HELP),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    normalize_loss: bool | None = typer.Option(None, "--normalize-loss/--raw-loss", help="Divide each target's loss by its fully ablated loss (default: the recipe's, normalised for default, uniform, fast and thorough, raw for study; with --share, normalising weighs targets of different loss scales equally)."),
    share: list[str] = typer.Option([], help="Prune the targets jointly at this sharing weight (a number >= 0, or tied: one circuit for all); repeatable; include 0 for the cost of sharing. Writes joint/ under --out."),
        model: Path | None = typer.Option(None, help="A model you bring: a Hugging Face save_pretrained folder (GPT-2, GPT-NeoX, Llama, Qwen2, Mistral, Qwen3, OLMo, OLMo 2, Phi-3, GPT-J, Gemma 2/3, Mamba), pruned on --pairs."),
    pairs: Path | None = typer.Option(None, help="JSONL clean/corrupted prompt pairs (text or token ids; docs/models.md) to prune --model (or a token --ckpt) on."),
    tokenizer: Path | None = typer.Option(None, help="With --pairs of text: the tokenizer folder (default: the --model folder)."),
    dtype: str | None = typer.Option(None, help="With --model: the dtype the model is imported and run in: bfloat16, float16, float32 or float64 (default: the checkpoint's own; docs/models.md, Precision and memory)."),
    metric: str = typer.Option("logit-diff", help="With --pairs: logit-diff (answer minus wrong token, reported beside the KL faithfulness) or kl."),
    position: int = typer.Option(-1, help="With --pairs: the explained position of pairs that give none (negative: from the prompt's end)."),
    test_fraction: float = typer.Option(0.5, help="With --pairs: share of the pairs held out to score each circuit."),
    method: str = typer.Option(DEFAULT_METHOD, help=METHOD_HELP),
    edges: int | None = typer.Option(None, help="Keep at most this many countable edges (instead of --sparsity)."),
    ig_steps: int | None = typer.Option(None, help="Integration points of eap-ig and eap-ig-inputs (default 10)."),
    acdc_max_edges: int | None = typer.Option(None, help="ACDC's limit on countable edges (default 400; each pass runs one forward per edge)."),
    force: bool = force_option("Recompute and replace circuits of other settings found in --out (refused otherwise), and write into a folder git tracks."),
    nearby_budgets: bool = typer.Option(False, help="Also prune each seed at 0.8x and 1.25x the asked edge count (not written; 3x the time), so that each circuit's consensus counts seeds and budgets (two or more --seed alone: seeds). Part of the circuits' settings, as the set of --seed is when there are two or more: a rerun that differs is refused, naming it."),
    protocol: str | None = DEPRECATED_PROTOCOL,
    checkpoints: Path | None = typer.Option(None, help="A training run directory: prune (or --method) every checkpoint of it (DIR/checkpoints/step_*.pt, lds task) into --out/step_<step>/, then across.json and across_<target>.html: per checkpoint its edges, faithfulness and Jaccard with the last checkpoint's circuit, per edge the step from which every later checkpoint keeps it (first --seed). Instead of --ckpt/--model."),
    every: int | None = typer.Option(None, help="With --checkpoints: every K-th checkpoint in step order, plus the last (default every one)."),
    stability: int = typer.Option(0, min=0, help="Measure each circuit's stability over N bootstrap resamples of the training traces (the same method and settings on each; N more searches per circuit) and record it in the circuit (metadata stability: the mean edge Jaccard with the circuit, bar 0.8). 0: off; else at least 2. Part of the circuit's settings: circuits made with another N are not read back (a rerun names the difference; --force recomputes them)."),
) -> None:
    """Find circuits by edge pruning (or --method eap, eap-ig, ...) on needle-in-a-haystack traces (state tracking: traces that
    change one element; induction: repeated random tokens; --model/--pairs: your prompt pairs):
    JSON + offline HTML per circuit."""

    given = {name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", None) != "DEFAULT"}
    _check_run_options(checkpoints, every, given, ckpt=ckpt, model=model)
    if checkpoints is None and (ckpt is None) == (model is None):
        raise UsageProblem("give exactly one of --ckpt PATH (a mechlab checkpoint) or --model FOLDER (a model you bring)")
    if nearby_budgets and (not is_edge_pruning(method) or edges is not None or pairs is not None or share):
        raise UsageProblem("--nearby-budgets applies to edge pruning of --ckpt at a --sparsity only "
                           "(not with --method, --edges, --pairs or --share)")  # fmt: skip
    if model is not None and pairs is None:
        raise UsageProblem("--model prunes on prompt pairs: give --pairs pairs.jsonl")
    if dtype is not None and model is None:
        raise UsageProblem("--dtype applies with --model FOLDER only (a mechlab checkpoint keeps its dtype)")
    if stability == 1:
        raise UsageProblem("--stability must be 0 (off) or at least 2 bootstrap resamples")
    if stability and share:
        raise UsageProblem("--stability applies to circuits pruned one target at a time, not with --share")
    prompt_only = {"tokenizer", "metric", "position", "test_fraction"} & given
    if pairs is None and prompt_only:
        raise UsageProblem(f"--{sorted(prompt_only)[0].replace('_', '-')} applies with --pairs only")
    if pairs is not None:
        refused = sorted({"target", "corruption", "haystack", "seg_len", "length", "share", "recipe",
                          "protocol", "traces", "test_traces"} & given)  # fmt: skip
        if refused:
            raise UsageProblem(
                f"--{refused[0].replace('_', '-')} does not apply with --pairs: the pairs give the "
                "prompts, their corruptions and the position explained (--test-fraction splits them)"
            )
    if pairs is None:
        recipe = renamed_option(protocol, recipe, "--protocol", "--recipe")
        preflight.check_recipe(recipe)
    _check_prune_first(ckpt=ckpt, model=model, checkpoints=checkpoints, pairs=pairs, target=target, out=out,
                       force=force)  # fmt: skip
    say_loading(progress)  # only now torch, the pipelines and the model load
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import PRUNE_RECIPES, check_method
    from mechlab.pipelines.request import CircuitRequest

    chosen = _method_options(method, given, loss=loss, edges=edges, ig_steps=ig_steps,
                             acdc_max_edges=acdc_max_edges, check=check_method)  # fmt: skip
    if pairs is not None:
        _prune_pairs(ctx, ckpt if ckpt is not None else model, pairs, seed, out, tokenizer=tokenizer,
                     metric=metric, position=position, test_fraction=test_fraction, sparsity=sparsity,
                     ablation=ablation, device=device, progress=progress, threads=threads, force=force, **chosen,
                     **({} if dtype is None else {"dtype": dtype}), **({"stability": stability} if stability else {}),
                     **_prune_only(method, loss=loss, steps=steps, lr=lr, lambda_lr=lambda_lr,
                                   normalize_loss=normalize_loss, node_sparsity=node_sparsity))  # fmt: skip
        return

    if recipe not in PRUNE_RECIPES:
        raise UsageProblem(f"unknown recipe {recipe!r}; choose one of {list(PRUNE_RECIPES)}")
    options = {"sparsity": sparsity, "loss": loss, "node_sparsity": node_sparsity, "steps": steps,
               "normalize_loss": normalize_loss, "n_train": traces, "n_test": test_traces, "n_haystack": haystack,
               "seg_len": seg_len, "corruption": corruption, "ablation": ablation, "lr": lr, "lambda_lr": lambda_lr,
               "progress": progress}  # fmt: skip
    if not is_edge_pruning(method) or edges is not None:
        options = {k: v for k, v in options.items() if is_edge_pruning(method) or k not in (*PRUNE_ONLY, "loss")}
        options.update(chosen)
    # every setting resolved once: a recipe's setting applies unless the option was given on the command line
    request = CircuitRequest.resolve(recipe, given=given, stability=stability,
                                     length=None if share or checkpoints is not None else length, **options)  # fmt: skip
    try:
        _prune_ckpt(ckpt, checkpoints, target, seed, out, request, share=share, threads=threads, every=every,
                    force=force, nearby_budgets=nearby_budgets, device=device)  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, what is kept and how to resume
        stopped(ctx, exc)


def _prune_ckpt(ckpt: Path | None, checkpoints: Path | None, target: list[str], seed: list[int], out: Path | None,
                request: CircuitRequest, *, share: list[str], threads: int | None, every: int | None, force: bool,
                nearby_budgets: bool, device: str) -> None:  # fmt: skip
    """``mechlab prune`` of a checkpoint (``--share``: jointly) or of every checkpoint of a run."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import joint_prune_targets, prune_targets

    if checkpoints is not None:
        use_threads(threads)
        _prune_run(checkpoints, target, seed, out, every=every or 1, force=force,
                   nearby_budgets=nearby_budgets, request=request, device=device)  # fmt: skip
        return
    if share:
        shares = [_share(v) for v in share]
        use_threads(threads)
        run = joint_prune_targets(ckpt, target, shares, seed, out, force=force, device=device, **request.keywords())
        for stem, circuit in run.circuits.items():
            for line in circuit.metadata["warnings"]:
                warn(f"joint {stem}: {line}")
        _print_resumed(run.reused, [])
        typer.echo(run.sweep.table())
        typer.echo(f"wrote {run.table} and the circuits under {run.out}/share-*/")
        return
    use_threads(threads)
    result = prune_targets(ckpt, target, seed, out, on_circuit=_print_circuit, force=force,
                           nearby_budgets=nearby_budgets, request=request, device=device)  # fmt: skip
    _print_resumed(result.reused, result.replaced, result.updated)
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines.circuits import pair_line

    for a, b, o in result.overlaps:  # the first seeds' circuits; the means over seeds below
        seeds = (result.circuits[a][0].metadata.get("seed"), result.circuits[b][0].metadata.get("seed"))
        typer.echo(pair_line(a, b, o, seeds))
    if result.stability is not None:
        typer.echo(result.stability.summary())


def _check_prune_first(*, ckpt: Path | None, model: Path | None, checkpoints: Path | None, pairs: Path | None,
                       target: list[str], out: Path | None, force: bool) -> None:  # fmt: skip
    """What ``mechlab prune`` can refuse before torch and the model load
    (:mod:`mechlab.pipelines.preflight`): the checkpoint, model folder, run directory or
    pair file missing, a target no task (or not the checkpoint's task, read from its file)
    takes, an output folder that cannot be one. A bad invocation answers at once."""

    if pairs is not None:
        if ckpt is not None:
            preflight.check_checkpoint_file(ckpt)
        elif model is not None and not model.exists():
            raise UsageProblem(f"model {str(model)!r} not found; give a save_pretrained folder or a mechlab checkpoint")
        preflight.check_input_file(pairs, "pair file")
        return
    if checkpoints is not None:
        preflight.check_run_dir(checkpoints)
        preflight.check_targets(target, "lds")
        preflight.check_folder(out, "prune", source=checkpoints / "last.pt", what="through-training", force=force)
        return
    if ckpt is None:
        return
    preflight.check_checkpoint(ckpt, targets=target)
    preflight.check_folder(out, "prune", source=ckpt, what="circuits", force=force)


def _check_run_options(checkpoints: Path | None, every: int | None, given: set[str], *,
                       ckpt: Path | None, model: Path | None) -> None:  # fmt: skip
    """Refuse (one line) what ``--checkpoints`` does not combine with, and ``--every`` without it."""
    if checkpoints is None:
        if every is not None:
            raise UsageProblem("--every applies with --checkpoints RUN_DIR only")
        return
    if ckpt is not None or model is not None:
        raise UsageProblem("give one of --checkpoints RUN_DIR (every checkpoint of a run), --ckpt PATH or --model FOLDER")
    refused = sorted({"pairs", "share", "length", "tokenizer", "metric", "position", "test_fraction"} & given)
    if refused:
        raise UsageProblem(f"--{refused[0].replace('_', '-')} does not apply with --checkpoints (lds runs, "
                           "targets pruned one by one)")  # fmt: skip
    if every is not None and every < 1:
        raise UsageProblem(f"--every {every}: give a whole number >= 1")


def _prune_run(run_dir: Path, targets: list[str], seeds: list[int], out: Path | None, **settings) -> None:
    """``mechlab prune --checkpoints RUN_DIR``: every checkpoint's circuits, then their table per target."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import prune_through_training

    def show(ckpt, where: Path) -> None:
        typer.echo(f"checkpoint step {ckpt.step} ({ckpt.examples_seen} examples seen) -> {where}/")

    run = prune_through_training(run_dir, targets, seeds, out, on_checkpoint=show,
                                 on_circuit=_print_circuit, **settings)  # fmt: skip
    _print_resumed([f"{folder}/{stem}" for folder, r in run.runs.items() for stem in r.reused],
                   [f"{folder}/{stem}" for folder, r in run.runs.items() for stem in r.replaced],
                   [f"{folder}/{stem}" for folder, r in run.runs.items() for stem in r.updated])  # fmt: skip
    for name, across in run.across.items():
        typer.echo(f"{name} through training (seed {seeds[0]}):")
        echo_table([("  step", "examples", "edges", "faithfulness", "Jaccard with last")]
                   + [(f"  {r['step']}", str(r["examples"]), str(r["edges"]), fmt(r["faithfulness"]),
                       fmt(r["jaccard_with_last"])) for r in across["checkpoints"]])  # fmt: skip
        final = [e for e in across["edges"] if e["in_last"]]
        typer.echo(f"  the last circuit's {len(final)} edges appear at (examples seen): " + ", ".join(
            f"{e['writer']} -> {e['reader']} {e['appears_at_examples']}" for e in final))  # fmt: skip
    typer.echo(f"wrote {run.json} and " + ", ".join(str(p) for p in run.figures.values()))


def _method_options(method: str, given: set[str], *, loss: str, edges: int | None, ig_steps: int | None,
                    acdc_max_edges: int | None, check) -> dict:  # fmt: skip
    """The method's settings for the pipeline; refuses (one line) what the method does not take."""
    check(method, {}, ig_steps=ig_steps, n_edges=edges, acdc_max_edges=acdc_max_edges)
    if edges is not None and "sparsity" in given:
        raise UsageProblem("give the budget once: --sparsity (a fraction of the countable edges) or --edges N")
    if edges is not None and "share" in given:
        raise UsageProblem("--share prunes at a sparsity: give --sparsity, not --edges")
    if not is_edge_pruning(method):
        refused = sorted(set(PRUNE_ONLY) & given)
        if refused:
            hint = "; use --ig-steps for the integration points of eap-ig" if refused[0] == "steps" else ""
            raise UsageProblem(f"--{refused[0].replace('_', '-')} is edge pruning's option (--method prune), "
                               f"not --method {method}'s{hint}")  # fmt: skip
        if loss != "model":
            raise UsageProblem(f"--method {method} scores edges by the loss to the full model; --loss {loss} "
                               "is edge pruning's (--method prune)")  # fmt: skip
    return {"method": method, "n_edges": edges, "ig_steps": ig_steps, "acdc_max_edges": acdc_max_edges}


def _prune_only(method: str, **settings) -> dict:
    """Edge pruning's settings, for ``--method prune`` only."""
    return settings if is_edge_pruning(method) else {}


def _prune_pairs(ctx: typer.Context, source: Path, pairs: Path, seeds: list[int], out: Path | None, *,
                 threads: int | None, **settings) -> None:  # fmt: skip
    """``mechlab prune --model/--ckpt ... --pairs``: the prompt pipeline, one circuit per seed."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import prune_prompts

    use_threads(threads)
    try:
        run = prune_prompts(source, pairs, seeds, out, on_circuit=_print_prompt_circuit, **settings)
    except KeyboardInterrupt as exc:
        stopped(ctx, exc)
    _print_resumed(run.reused, run.replaced)
    if run.stability is not None:
        typer.echo(run.stability.summary())


def _print_prompt_circuit(stem: str, circuit, out: Path) -> None:
    m, meta = circuit.metadata["metrics"], circuit.metadata
    typer.echo(f"{stem}: {circuit.n_edges} edges, {circuit.n_nodes} nodes, sparsity asked "
               f"{meta['sparsity_asked']:.4f} reached {meta['sparsity_reached']:.4f} -> {out / stem}.json/.html")  # fmt: skip
    _print_method(meta)
    typer.echo(f"  faithfulness {m['faithfulness']:.3f} (KL to full {m['circuit_vs_full']:.4f}, all "
               f"ablated {m['ablated_vs_full']:.4f}), complement {m['complement_faithfulness']:.3f}, "
               f"on {m['n_traces']} held-out pairs")  # fmt: skip
    if "logit_diff_full" in m:
        typer.echo(f"  logit difference: full {m['logit_diff_full']:.3f}  circuit {m['logit_diff_circuit']:.3f}  "
                   f"all ablated {m['logit_diff_ablated']:.3f}  complement {m['logit_diff_complement']:.3f}  "
                   f"(recovered {m['logit_diff_recovered']:.3f})")  # fmt: skip
    if isinstance(meta.get("stability"), dict):
        typer.echo(f"  {meta['stability'].get('summary', 'bootstrap stability recorded')}")
    if meta.get("sparsity_limited_by_open_edges"):
        typer.echo(f"mechlab: {stem}: {budget_note(meta, circuit.n_edges)}", err=True)
    for line in meta["warnings"]:
        warn(f"{stem}: {line}")


def _print_resumed(reused: list[str], replaced: list[str], updated: list[str] | None = None) -> None:
    """Say which circuits a resumed prune read back unchanged, which it recomputed (--force)
    and which it read back but rewrote with this run's consensus."""
    if reused:
        typer.echo(f"read back {len(reused)} circuit(s) found before with the same settings: {', '.join(reused)}")
    if replaced:
        typer.echo(f"recomputed {len(replaced)} circuit(s) of other settings (--force): {', '.join(replaced)}")
    if updated:
        typer.echo(f"read back {len(updated)} circuit(s) of the same settings and rewrote them with this run's "
                   f"consensus (an interrupted run wrote them before it, or another circuit of their target "
                   f"changed): {', '.join(updated)}")  # fmt: skip


def _share(value: str) -> float:
    """A ``--share`` value as a float (``tied``: inf); a number too large for a float
    (``1e400``) is refused, not taken as tied."""
    if value.strip().lower() in ("tied", "inf"):
        return math.inf
    try:
        share = float(value)
    except ValueError:
        raise UsageProblem(f"--share must be a number >= 0 or tied, got {value!r}") from None
    if not math.isfinite(share):
        raise UsageProblem(f"--share {value!r} is not a finite number; give a number >= 0, or tied for one "
                           "circuit shared by every target")  # fmt: skip
    return share


def _print_circuit(stem: str, circuit, out: Path) -> None:
    m, meta = circuit.metadata["metrics"], circuit.metadata
    typer.echo(f"{stem}: {circuit.n_edges} edges, {circuit.n_nodes} nodes, sparsity asked "
               f"{meta['sparsity_asked']:.4f} reached {meta['sparsity_reached']:.4f} -> {out / stem}.json/.html")  # fmt: skip
    _print_method(meta)
    typer.echo(f"  faithfulness {m['faithfulness']:.3f} (mse to full {m['circuit_vs_full']:.4f}, all ablated {m['ablated_vs_full']:.4f})")
    if "error_circuit" in m:
        typer.echo(f"  error vs truth: circuit {m['error_circuit']:.4f}  full {m['error_full']:.4f}  "
                   f"all ablated {m['error_ablated']:.4f}  complement {m['error_complement']:.4f}")  # fmt: skip
    if meta.get("n_edges_excluded_inert"):
        typer.echo(f"  sparsity over {meta['n_edges_countable']} edges: {meta['n_edges_excluded_inert']} edges of "
                   f"{', '.join(meta['inert_writers'])} excluded (they cannot matter under {meta['ablation']} ablation)")  # fmt: skip
    if meta.get("n_edges_excluded_unreachable"):
        typer.echo(f"  sparsity over {meta['n_edges_countable']} edges: {meta['n_edges_excluded_unreachable']} edges "
                   f"excluded (they reach no read-out of the target windows: {', '.join(meta['target_windows'])})")  # fmt: skip
    if isinstance(meta.get("stability"), dict):
        typer.echo(f"  {meta['stability'].get('summary', 'bootstrap stability recorded')}")
    if meta.get("sparsity_limited_by_open_edges"):
        typer.echo(f"mechlab: {stem}: {budget_note(meta, circuit.n_edges)}", err=True)
    for line in meta["warnings"]:
        warn(f"{stem}: {line}")


def budget_note(meta: dict, n_kept: int) -> str:
    """What happened when a circuit kept fewer edges than its sparsity allows, and what to do."""
    on_paths = meta.get("n_open_edges_on_paths", -1)
    paths = f", {on_paths} of them on complete paths from the input to the read-out" if on_paths >= 0 else ""
    return (f"kept {n_kept} edges where sparsity {meta['sparsity_asked']:.4g} allows {meta['n_edges_asked']}: "
            f"the search closed every other edge ({meta['n_open_edges']} stayed open{paths}; a circuit "
            "keeps whole paths). Not an error: the target needs fewer edges than the budget, and the "
            "faithfulness above says how well they do. If it is low, try more --steps or another --seed.")  # fmt: skip


def _print_method(meta: dict) -> None:
    """A circuit's method line (methods other than edge pruning): settings, seconds, a short circuit."""
    if is_edge_pruning(meta.get("method", DEFAULT_METHOD)):
        return
    settings = ", ".join(f"{k} {v}" for k, v in meta.get("method_settings", {}).items()
                         if v is not None and k not in ("sparsity", "n_edges"))  # fmt: skip
    typer.echo(f"  method {meta['method']} ({settings}): {meta['n_edges_kept']} of {meta['n_edges_asked']} "
               f"edges asked, of {meta['n_edges_countable']} countable, in {meta['seconds']:.1f} s")  # fmt: skip
    if meta.get("sparsity_limited_by_paths"):
        typer.echo(f"  fewer edges than asked: the next edges by rank complete no input-to-read-out path "
                   f"within the {meta['n_edges_asked']}")  # fmt: skip


def pairs_ioi(
    tokenizer: Path = typer.Option(..., help="The model's tokenizer folder (save_pretrained): names must be single tokens under it."),
    out: Path = typer.Option(..., help="The JSONL pair file to write."),
    n: int = typer.Option(200, min=1, help="Pairs."),
    seed: int = typer.Option(0, help="Seed of the templates, names, places and objects."),
    force: bool = force_option("Replace --out if it exists."),
) -> None:
    """Write IOI-style prompt pairs (Wang et al. 2023; the ABC corruption) for a tokenizer,
    for mechlab prune --model FOLDER --pairs FILE."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import write_ioi_pairs

    path, found = write_ioi_pairs(tokenizer, out, n=n, seed=seed, force=force)
    typer.echo(f"wrote {len(found)} pairs ({int(found.lengths.min())}-{int(found.lengths.max())} tokens) to {path}")


def view(
    circuits: list[Path] = typer.Argument(..., help="Circuit JSON files (from mechlab prune)."),
    out: Path = typer.Option(..., help="HTML file to write (self-contained, works offline)."),
    label: list[str] = typer.Option([], help="A name per circuit (default: target and seed)."),
    force: bool = force_option("Replace --out if it exists."),
) -> None:
    """Render circuits: one file draws its graph; two or more open the explorer with two compared on one
    layout (shared edges, only one, only the other). Circuits of two or more targets open comparing the targets:
    the first file with another target's circuit of the same seed (1-after_seed0.json with 2-after_seed0.json,
    whatever the order of the files); one target's circuits of two or more methods open comparing the methods;
    otherwise the first two files (seed with seed).
    The page's menus change either circuit."""

    if label and len(label) != len(circuits):
        raise UsageProblem(f"give one --label per circuit: {len(label)} labels for {len(circuits)} circuits")
    preflight.check_output_file(out, force=force, inputs=circuits, suffixes=(".html", ".htm"))
    for path in circuits:
        preflight.check_input_file(path, "circuit")
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import view_circuits

    typer.echo(f"wrote {view_circuits(circuits, out, label, force=force)}")


def overlap_(
    ctx: typer.Context,
    circuits: list[Path] = typer.Argument(..., help="Circuit JSON files (from mechlab prune)."),
    ckpt: Path | None = typer.Option(None, help="Checkpoint the circuits come from: adds cross-evaluation (each circuit scored on every target)."),
    boot: int = typer.Option(2000, min=1, help="Bootstrap resamples (each target's circuits resampled with replacement; intervals need 3 circuits per target)."),
    null_samples: int = typer.Option(1000, "--null", min=1, help="Monte Carlo samples of each null model."),
    level: float = typer.Option(0.95, help="Coverage of the bootstrap intervals, in (0, 1)."),
    exclude_writer: list[str] = typer.Option([], help="Leave this writer's edges out of the null models' edge pool (e.g. pos); repeatable."),
    seed: int = typer.Option(0, help="Seed of the bootstrap and the null models."),
    json_out: Path | None = typer.Option(None, "--json", help="Write everything as JSON here (a new file)."),
    device: str = typer.Option("cpu"),
    mixed_checkpoints: bool = typer.Option(False, "--mixed-checkpoints", help="Compare circuits found on different checkpoints (refused otherwise; edge names match across checkpoints of one shape, their meaning need not)."),
    progress: bool = typer.Option(True, help="Show progress bars (null models, cross-evaluation)."),
    force: bool = force_option("Replace --json if it exists."),
) -> None:
    """Overlap of circuits: pairwise edge Jaccard table, each target's seed-baseline Jaccard and each
    pair's cross-target Jaccard (the mean over every pair of seeds; a bootstrap interval over seeds
    from 3 circuits per target), uniform and degree-preserving null models, cross-evaluation with --ckpt."""

    if len(circuits) < 2:
        raise UsageProblem("give at least two circuit files")
    if ckpt is not None:
        preflight.check_checkpoint_file(ckpt)
    if json_out is not None:
        preflight.check_output_file(json_out, force=force, option="--json",
                                    inputs=[*circuits, *([ckpt] if ckpt is not None else [])])  # fmt: skip
    for path in circuits:
        preflight.check_input_file(path, "circuit")
    say_loading(progress, "torch and the circuits")
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import overlap_circuits
    from mechlab.pipelines.circuits import overlap_lines

    try:
        r = overlap_circuits(circuits, ckpt, n_boot=boot, n_null=null_samples, level=level,
                             exclude_writers=exclude_writer, seed=seed, device=device,
                             mixed_checkpoints=mixed_checkpoints, json_out=json_out, progress=progress,
                             log=(lambda line: typer.echo(line, err=True)) if progress else None,
                             force=force)  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, nothing written
        stopped(ctx, exc)
    rows = [("a", "b", "edges a", "edges b", "shared", "edge Jaccard", "overlap coef", "shared nodes")]
    for p in r["pairs"]:
        rows.append((Path(p["a"]).name, Path(p["b"]).name, str(p["n_edges_a"]), str(p["n_edges_b"]),
                     str(p["n_shared_edges"]), f"{p['jaccard']:.3f}", f"{p['overlap_coefficient']:.3f}",
                     str(len(p["shared_nodes"]))))  # fmt: skip
    echo_table(rows)
    if r["stability"] is not None:
        typer.echo(r["stability"].summary())
    for line in overlap_lines(r):
        typer.echo(line)
    if "cross_evaluation" in r:
        table = [("circuit", "seed", "evaluated on", "faithfulness", "complement faithfulness")]
        for c in r["cross_evaluation"]:
            table.append((c["circuit_target"], str(c["seed"]), c["evaluated_on"] + (" (own)" if c["own"] else ""),
                          f"{c['faithfulness']:.3f}", f"{c['complement_faithfulness']:.3f}"))  # fmt: skip
        typer.echo(f"cross-evaluation, on the held-out traces of {Path(circuits[0]).name} (so a circuit's own-target "
                   "row differs a little from its faithfulness, measured on its own seed's traces):")  # fmt: skip
        echo_table(table)
    if json_out is not None:
        typer.echo(f"wrote {json_out}")


def curve(
    ctx: typer.Context,
    ckpt: Path = typer.Option(..., help="Checkpoint of a run trained on the lds task."),
    target: list[str] = typer.Option(["1-after"], help="k-after (e.g. 1-after, 2-after) or all; repeatable."),
    ablation: list[str] = typer.Option(["interchange"], help="interchange, mean, zero (repeatable) or all."),
    budgets: str = typer.Option(",".join(f"{b:g}" for b in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)),
                                help="Comma-separated edge budgets in (0, 1] (default MIB's 0.1%..50%; 100% is always added)."),
    rank: str = typer.Option("log_alpha", help="log_alpha (one pruning run ranks the edges) or reprune (one run per budget, slower)."),
    sparsity: float = typer.Option(0.95, help="Sparsity of the pruning run whose log_alpha ranks the edges."),
    steps: int | None = typer.Option(None, min=1, help="Optimiser steps of each pruning run (default: the library's, 50)."),
    seed: int = typer.Option(0, help="Pruning seed."),
    corruption: str = typer.Option("misdirect_incorrect", help="Corrupted traces of an interchange ablation."),
    traces: int = typer.Option(256, min=1, help="Training traces (pruning; the mean ablation's reference)."),
    test_traces: int = typer.Option(512, min=1, help="Held-out traces the curve is scored on."),
    haystack: int | None = typer.Option(None, min=1, help="Haystack systems (default: the run's eval setting, shrunk to fit the model)."),
    seg_len: int | None = typer.Option(None, min=1, help="Observations per haystack segment."),
    nih: str = typer.Option("study", help=NIH_HELP),
    out: Path | None = typer.Option(None, help="Directory for curve_<target>.json/.html (default: mechlab-out/<run>/curves). A rerun resumes: curves of the same settings are read back."),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    device: str = typer.Option("cpu"),
    progress: bool = typer.Option(True, help="Show progress bars."),
    force: bool = force_option("Recompute and replace curves of other settings found in --out (refused otherwise), and write into a folder git tracks."),
    protocol: str | None = DEPRECATED_PROTOCOL,
) -> None:
    """Faithfulness and complement faithfulness across edge budgets (MIB's CPR, CMD): JSON + HTML per target."""

    nih = renamed_option(protocol, nih, "--protocol", "--nih")
    preflight.check_nih(nih)
    preflight.check_checkpoint(ckpt, task="lds", targets=target)
    preflight.check_folder(out, "curve", source=ckpt, what="curves", force=force)
    say_loading(progress)
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.pipelines import curve_checkpoint

    try:
        grid = [float(b) for b in budgets.split(",") if b.strip()]
    except ValueError:
        raise UsageProblem(f"--budgets {budgets!r}: not a comma-separated list of numbers") from None

    def show(files) -> None:
        when = "read back: same settings" if files.reused else f"{files.seconds:.0f} s"
        typer.echo(f"{files.target}: {files.json}, {files.html} ({when})")
        for c in files.curves.values():
            typer.echo(f"  {c.summary()}")
            typer.echo("    budget  " + " ".join(f"{100 * b:>6g}%" for b in c.budgets))
            typer.echo("    edges   " + " ".join(f"{k:>7d}" for k in c.n_kept))
            typer.echo("    f       " + " ".join(f"{v:>7.3f}" for v in c.faithfulness))
            typer.echo("    compl.  " + " ".join(f"{v:>7.3f}" for v in c.complement_faithfulness))

    use_threads(threads)
    try:
        curve_checkpoint(ckpt, target, ablation, grid, out, rank=rank, sparsity=sparsity, steps=steps, seed=seed,
                         corruption=corruption, n_train=traces, n_test=test_traces, n_haystack=haystack,
                         seg_len=seg_len, protocol=nih, device=device, progress=progress, on_target=show,
                         force=force)  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, what is kept and how to resume
        stopped(ctx, exc)
