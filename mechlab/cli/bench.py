"""``mechlab bench ...``: the measurements of :mod:`mechlab.bench`, as tables.

Every command prints how it was measured (machine, torch build, threads, load; a run
under load is marked provisional) above its tables, and with ``--json PATH`` writes the
same record as JSON (:mod:`mechlab.bench.record`), which ``python -m mechlab.bench.tables``
renders into docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

from mechlab.bench.commands import (
    check_model_presets,
    check_transformer_presets,
    ensemble_task,
    prune_table,
    reference_table,
)
from mechlab.bench.lm import LMBenchConfig, bench_lm, lm_table, raw_runs
from mechlab.bench.record import Recorder
from mechlab.bench.startup import bench_startup
from mechlab.circuit_methods import method_names
from mechlab.cli.app import UsageProblem, bench_app, stopped, use_threads
from mechlab.limits import check_elements, check_threads
from mechlab.pipelines import outputs

JSON_HELP = "Also write the run's record (settings, machine, load, tables, raw times) here as JSON."
FORCE_HELP = "Overwrite the --json file if it exists (never a checkpoint or an input)."


def _check_output(path: Path | None, force: bool, inputs: Sequence[Path | str | None] = (), option: str = "--json") -> None:
    """Refuse, before anything runs, an output file the policy refuses
    (:func:`mechlab.pipelines.outputs.check_output_file`): one that exists (without
    ``force``), a checkpoint, one of the ``inputs``, a folder, a device node or a pipe."""
    if path is None:
        return
    try:
        outputs.check_output_file(path, force=force, inputs=[p for p in inputs if p is not None], option=option)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def _recorded(bench: str, settings: dict[str, Any], device: str, json_path: Path | None, force: bool,
              measure: Callable[[], tuple[list, dict]], inputs: Sequence[Path | str | None] = ()) -> None:  # fmt: skip
    """Run ``measure`` under a load recorder, print the record, write it to ``json_path``
    (under the output policy: checked before anything runs, and again as it is written)."""
    _check_output(json_path, force, inputs)
    with Recorder(bench, settings, device) as recorder:
        tables, data = measure()
        record = recorder.record(tables, data)
    typer.echo(record.text())
    if json_path is not None:
        _check_output(json_path, force, inputs)  # what appeared meanwhile is refused too
        outputs.write_text(json_path, record.to_json())
        typer.echo(f"record written to {json_path}")


def _check_batch(batch: int, n_pos: int) -> None:
    """Refuse a batch whose inputs alone are above the size limit, before any model is built."""
    check_elements("the benchmark's input batch", {"batch": batch, "positions": n_pos}, lower="--batch or --pos")


@bench_app.command("prune")
def bench_prune_(
    presets: str = typer.Option("tiny,small,medium", help="Comma-separated model presets: transformers (also big, gpt2_small_shape) or recurrent (mamba_130m_shape)."),
    batch: int = typer.Option(16, min=1),
    n_pos: int = typer.Option(64, "--pos", min=2, help="Sequence length."),
    repeats: int = typer.Option(5, min=1),
    device: str = typer.Option("cpu"),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Measure peak memory (naive stacking needs GBs on big)."),
    straightforward: bool = typer.Option(False, help="Also time the straightforward autograd path (fast=False)."),
    reference: Path | None = typer.Option(None, help="A checkout of princeton-nlp/Edge-Pruning: time its GPT-2 pruning step beside ours."),
    reference_python: str | None = typer.Option(None, help="Python that runs the reference (needs transformers 4.x; default: this one)."),
    json_path: Path | None = typer.Option(None, "--json", help=JSON_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """One pruning step vs a plain forward+backward; peak memory vs naive per-layer stacking."""
    _check_batch(batch, n_pos)
    names = [p.strip() for p in presets.split(",") if p.strip()]
    (check_transformer_presets if reference is not None else check_model_presets)(names)
    if reference is not None:
        # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
        from mechlab.bench.reference import check_reference

        check_reference(reference)
    n_threads = use_threads(threads)
    settings = {"presets": names, "batch": batch, "n_pos": n_pos, "repeats": repeats, "device": device,
                "threads": n_threads, "memory": memory, "straightforward": straightforward,
                "reference": None if reference is None else str(reference)}  # fmt: skip

    def measure() -> tuple[list, dict]:
        if reference is not None:
            return [reference_table(reference, names, batch=batch, n_pos=n_pos, repeats=repeats,
                                    python=reference_python)], {}  # fmt: skip
        return [prune_table(names, batch=batch, n_pos=n_pos, repeats=repeats, device=device, memory=memory,
                            straightforward=straightforward)], {}  # fmt: skip

    _recorded("prune-reference" if reference is not None else "prune", settings, device, json_path, force, measure,
              inputs=[reference])  # fmt: skip


@bench_app.command("startup")
def bench_startup_(
    repeats: int = typer.Option(5, min=1, help="Runs of each command line (after a warm-up run)."),
    json_path: Path | None = typer.Option(None, "--json", help=JSON_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """How long mechlab takes to answer: --help of every command and import mechlab, fresh processes."""
    _recorded("startup", {"repeats": repeats}, "cpu", json_path, force,
              lambda: ([bench_startup(repeats=repeats).table()], {}))  # fmt: skip


@bench_app.command("hooks")
def bench_hooks(
    families: str = typer.Option("transformer,lstm,dense_ssm,mamba", help="Comma-separated families."),
    batch: int = typer.Option(64, min=1),
    n_pos: int = typer.Option(251, "--pos", min=2, help="Sequence length."),
    repeats: int = typer.Option(7, min=1, help="Timed runs of each contender."),
    device: str = typer.Option("cpu"),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    json_path: Path | None = typer.Option(None, "--json", help=JSON_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Plain forward vs run_with_cache (all hooks) vs nnsight saving the same activations."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.bench.hooks import BENCH_MODELS, bench_family, hooks_table

    _check_batch(batch, n_pos)
    names = [f.strip() for f in families.split(",") if f.strip()]
    unknown = [f for f in names if f not in BENCH_MODELS]
    if unknown:
        raise UsageProblem(f"unknown family {unknown[0]!r}; choose from {sorted(BENCH_MODELS)}")
    n_threads = use_threads(threads)
    settings = {"families": names, "batch": batch, "n_pos": n_pos, "repeats": repeats, "device": device,
                "threads": n_threads}  # fmt: skip

    def measure() -> tuple[list, dict]:
        rows = [bench_family(f, batch=batch, n_pos=n_pos, repeats=repeats, device=device) for f in names]
        table = hooks_table(rows)
        table.title = f"batch {batch} x {n_pos} positions, {repeats} timed runs each, interleaved, no grad"
        return [table], {"timings": {r.family: {k: t.to_dict() for k, t in r.timings.items()} for r in rows}}

    _recorded("hooks", settings, device, json_path, force, measure)


@bench_app.command("scan")
def bench_scan_(
    families: str = typer.Option("mamba,dense_ssm", help="Comma-separated families: mamba, dense_ssm."),
    batch: int = typer.Option(64, min=1),
    n_pos: int = typer.Option(251, "--pos", min=2, help="Sequence length."),
    repeats: int = typer.Option(5, min=1, help="Timed runs of each contender."),
    chunk: int = typer.Option(16, min=1, help="Positions per chunk of the chunked scan."),
    device: str = typer.Option("cpu"),
    threads: int = typer.Option(1, min=1, help="Torch CPU threads."),
    json_path: Path | None = typer.Option(None, "--json", help=JSON_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """The chunked scans vs the per-step loops: forward, forward+backward, and their differences."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.bench.scan import SCAN_FAMILIES, bench_scan, scan_table

    _check_batch(batch, n_pos)
    names = [f.strip() for f in families.split(",") if f.strip()]
    unknown = [f for f in names if f not in SCAN_FAMILIES]
    if unknown:
        raise UsageProblem(f"unknown family {unknown[0]!r}; choose from {list(SCAN_FAMILIES)}")
    use_threads(threads)
    settings = {"families": names, "batch": batch, "n_pos": n_pos, "repeats": repeats, "chunk": chunk,
                "device": device, "threads": threads}  # fmt: skip

    def measure() -> tuple[list, dict]:
        rows = [bench_scan(f, batch=batch, n_pos=n_pos, repeats=repeats, chunk=chunk, device=device) for f in names]
        table = scan_table(rows)
        table.title = f"batch {batch} x {n_pos} positions, chunk {chunk}, {repeats} timed runs each, interleaved"
        return [table], {}

    _recorded("scan", settings, device, json_path, force, measure)


@bench_app.command("train")
def bench_train(
    preset: str = typer.Option("tiny", help="Training preset: tiny, small, medium, big, recall-cpu."),
    batch: int | None = typer.Option(None, min=1, help="Batch size (default: the preset's; 256 keeps tiny on CPU to minutes)."),
    steps: int = typer.Option(1, min=1, help="Optimiser steps per timed window."),
    repeats: int = typer.Option(5, min=1, help="Timed windows of each contender."),
    device: str = typer.Option("cpu"),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    set_: list[str] = typer.Option([], "--set", help="Override a training setting: key=value (model.d_model=32)."),
    json_path: Path | None = typer.Option(None, "--json", help=JSON_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Trainer.train_step vs a minimal PyTorch loop: same model, weights, data; examples/s and ratios."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.bench.train import bench_train as run_bench

    n_threads = use_threads(threads)
    typer.echo(f"timing {repeats} windows of {steps} step(s) x 5 contenders (+1 warm-up window each) ...")
    settings = {"preset": preset, "batch": batch, "steps": steps, "repeats": repeats, "device": device,
                "threads": n_threads, "set": list(set_)}  # fmt: skip

    def measure() -> tuple[list, dict]:
        result = run_bench(preset=preset, batch=batch, steps=steps, repeats=repeats, device=device,
                           threads=threads, overrides=set_)  # fmt: skip
        return [result.table()], {"ratio": result.ratio, "cpu_ratio": result.cpu_ratio,
                                  "ratio_with_data": result.ratio_with_data, "data_share": result.data_share}

    _recorded("train", settings, device, json_path, force, measure)


@bench_app.command("ensemble")
def bench_ensemble_(
    presets: str = typer.Option("st_transformer_small,st_lstm_small,st_dense_ssm_small", help="Comma-separated model presets."),
    steps: int = typer.Option(50, min=1, help="Optimiser steps of every trial."),
    n_train: int = typer.Option(2000, min=1, help="Training sequences of every trial."),
    repeats: int = typer.Option(3, min=1, help="Timed runs of each contender."),
    threads: int = typer.Option(1, min=1, help="Torch CPU threads."),
    device: str = typer.Option("cpu"),
    set_: list[str] = typer.Option([], "--set", help="A state-tracking task field: key=value (m=2, format=cot)."),
    json_path: Path | None = typer.Option(None, "--json", help=JSON_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """The study's 15 trials (3 lr x 5 seeds) one after another vs as one batched ensemble."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.bench.ensemble import bench_ensemble

    task = ensemble_task(set_, n_train)  # bad fields fail before any run
    names = [p.strip() for p in presets.split(",") if p.strip()]
    check_model_presets(names)
    use_threads(threads)
    typer.echo(f"timing {repeats} runs of 15 trials x 2 contenders per preset (+1 warm-up run each) ...")
    settings = {"presets": names, "steps": steps, "n_train": n_train, "repeats": repeats, "threads": threads,
                "device": device, "task": task}  # fmt: skip

    def measure() -> tuple[list, dict]:
        result = bench_ensemble(names, task=task, n_train=n_train, steps=steps, repeats=repeats, threads=threads,
                                device=device)  # fmt: skip
        return [result.table()], {"settings": result.settings}

    _recorded("ensemble", settings, device, json_path, force, measure)


@bench_app.command("methods")
def bench_methods_(
    ctx: typer.Context,
    ckpt: Path = typer.Option(Path("examples/checkpoints/recall-cpu/last.pt"), help="Checkpoint of the lds task whose targets are scored (its NiH traces)."),
    targets: str = typer.Option("1-after,2-after", help="Comma-separated targets of the checkpoint."),
    methods: str = typer.Option(",".join(method_names()), help="Comma-separated methods (mechlab prune --method)."),
    planted: str = typer.Option("tests.prune.planted_cases:cases", help="Planted generator MODULE:FUNCTION (a function of the seeds returning mechlab.bench.methods.PlantedCase items; run from the repository root for the test suite's), or none."),
    seeds: str = typer.Option("0,1", help="Comma-separated seeds of the planted cases, or none."),
    tracr_seeds: str = typer.Option("0,1,2", help="Comma-separated seeds of the Tracr cases, or none."),
    tracr_programs: str = typer.Option("xproportion,hist,reverse,sort_unique", help="Comma-separated Tracr programs (needs the tracr extra)."),
    sparsity: float = typer.Option(0.95, help="The budget of every method's circuit on the checkpoint, a fraction of the countable edges."),
    traces: int = typer.Option(256, min=1, help="Training traces (scored or pruned on)."),
    test_traces: int = typer.Option(512, min=1, help="Held-out traces (every circuit and curve is scored on them)."),
    prune_steps: int | None = typer.Option(None, min=1, help="Optimiser steps of the prune method (default: prune's)."),
    threads: int = typer.Option(1, min=1, help="Torch CPU threads."),
    device: str = typer.Option("cpu"),
    out: Path | None = typer.Option(None, help="Write the table and its settings as JSON here."),
    force: bool = typer.Option(False, help="Overwrite --out if it exists (never a checkpoint or an input)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    stability_boots: int = typer.Option(5, min=0, help="Bootstrap resamples of the training traces per method and target: the stability column, the mean edge Jaccard of the method's circuits on them with its own circuit (bar 0.8; not counted in the method's seconds). 0: off; else at least 2."),
    redundant: str = typer.Option("tests.prune.planted_cases:redundant_budget_cases", help="Redundant planted generator MODULE:FUNCTION (a function of the seeds returning (PlantedCase, {budget name: edges}, faithfulness goal) items; the default is used where it exists), or none: a 'redundant found (<budget>)' column per budget."),
    redundant_seeds: str = typer.Option("0,1", help="Comma-separated seeds of the redundant cases, or none."),
) -> None:
    """Circuit-finding methods side by side, the MIB way (the table of docs/pruning.md): CPR/CMD
    and the circuit at --sparsity on each target, seconds and peak memory, stability over
    resampled traces, exact recoveries on planted models and Tracr programs, and redundant
    planted cases found within their budgets."""
    # lazy: mechlab --help and the CLI's checks run without torch; this import loads torch
    from mechlab.bench.methods import (
        DEFAULT_REDUNDANT,
        bench_methods,
        planted_cases,
        redundant_cases,
        tracr_cases,
    )
    from mechlab.pipelines import (
        check_method,
        check_prune_targets,
        checkpoint_prune_data,
        outputs,
        stops,
    )

    names = [m.strip() for m in methods.split(",") if m.strip()]
    target_names = [t.strip() for t in targets.split(",") if t.strip()]
    if not names or not target_names:
        raise UsageProblem("--methods and --targets must each name at least one")
    for m in names:
        check_method(m, {})
    if not 0 < sparsity < 1:
        raise UsageProblem(f"--sparsity must be in (0, 1), got {sparsity}")
    if stability_boots == 1:
        raise UsageProblem("--stability-boots must be 0 (off) or at least 2 (a spread needs two resamples)")
    _check_output(out, force, [ckpt], option="--out")
    planted_seeds, tracr_seed_list = _seeds("--seeds", seeds), _seeds("--tracr-seeds", tracr_seeds)
    use_threads(threads)
    try:
        with stops.written_at_end(out):  # --out is written at the end only
            cases = planted_cases(planted, planted_seeds)
            default_redundant = getattr(ctx.get_parameter_source("redundant"), "name", None) == "DEFAULT"
            redundant_list = redundant_cases(redundant, _seeds("--redundant-seeds", redundant_seeds),
                                             missing_ok=default_redundant and redundant == DEFAULT_REDUNDANT)  # fmt: skip
            programs = [p.strip() for p in tracr_programs.split(",") if p.strip()]
            tracr = tracr_cases(programs, seeds=tracr_seed_list) if tracr_seed_list and programs else []
            opened, data = checkpoint_prune_data(ckpt, n_train=traces, n_test=test_traces, device=device)
            check_prune_targets(opened, target_names)
            kwargs = {"prune": {"steps": prune_steps}} if prune_steps is not None else None
            table = bench_methods(opened.model, data, target_names, names,
                                  planted=cases, tracr=tracr, sparsity=sparsity, method_kwargs=kwargs,
                                  progress=progress, stability_boots=stability_boots, redundant=redundant_list)  # fmt: skip
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, nothing written
        stopped(ctx, exc)
    info = table.info
    info.update(checkpoint=str(ckpt), checkpoint_sha256=opened.sha256, n_train=traces, n_test=test_traces,
                command=_command(ctx))  # fmt: skip
    typer.echo(table.to_markdown())
    typer.echo(f"\nload average {info['loadavg_start']} -> {info['loadavg_end']}, "
               f"{info['torch_threads']} thread(s), {info['seconds']:.0f} s")  # fmt: skip
    for kind, rows in (("planted", table.planted), ("tracr", table.tracr)):
        for method, rec in rows.items():
            if rec.misses:
                typer.echo(f"{kind} {method} missed: {', '.join(rec.misses)}")
    for method, red in table.redundant.items():
        missed = [f"{c['case']} ({c['budget']}, {c['n_edges']} edges)" for c in red.cases if not c["found"]]
        if missed:
            typer.echo(f"redundant {method} not found: {', '.join(missed)}")
    if out is not None:
        _check_output(out, force, [ckpt], option="--out")  # what appeared meanwhile is refused too
        typer.echo(f"wrote {outputs.write_json(out, table.to_dict(), default=str)}")


def _seeds(option: str, text: str) -> list[int]:
    """Comma-separated seeds (``none``: no seeds)."""
    if text.strip().lower() == "none":
        return []
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageProblem(f"{option} {text!r}: not comma-separated integers or none") from None


def _command(ctx: typer.Context) -> str:
    """The command line of the options given (what regenerates the table)."""
    given = [name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", None) != "DEFAULT"]
    parts = ["mechlab", "bench", "methods"]
    for name in given:
        value, flag = ctx.params[name], "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else f"--no-{name.replace('_', '-')}")
        else:
            parts += [flag, str(value)]
    return " ".join(parts)


@bench_app.command("lm")
def bench_lm_(
    shapes: str = typer.Option("llama-3.2-1b,gemma-2-2b", help="Comma-separated shapes: llama-3.2-1b, gemma-2-2b (the real configs, random bfloat16 weights), llama-tiny, gemma-tiny (the same designs, small)."),
    n_pos: int = typer.Option(128, "--pos", min=2, help="Tokens of the prompt (and of the corrupted one EAP-IG is run on)."),
    threads: int = typer.Option(2, min=1, help="Torch CPU threads of every tool's process."),
    steps: int = typer.Option(10, min=1, help="EAP-IG's integration points (on the Llama shapes)."),
    tools: str = typer.Option("bridge,nnsight", help="Comma-separated tools beside mechlab: bridge (TransformerLens' TransformerBridge), nnsight; or none."),
    timeout: float = typer.Option(3600.0, min=1, help="Seconds any one tool's process may run before it is reported as not finishing."),
    json_path: Path | None = typer.Option(None, "--json", help=JSON_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Import, cache and attribute billion-parameter models (Llama-3.2-1B and Gemma-2-2B shapes,
    random weights), each tool in its own process: seconds and peak memory beside TransformerLens'
    bridge and nnsight."""
    names = tuple(s.strip() for s in shapes.split(",") if s.strip())
    others = () if tools.strip().lower() == "none" else tuple(t.strip() for t in tools.split(",") if t.strip())
    try:
        cfg = LMBenchConfig(shapes=names, n_pos=n_pos, threads=check_threads(threads), steps=steps, tools=others,
                            timeout=timeout)  # fmt: skip
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    _check_output(json_path, force)
    use_threads(threads)
    settings = {"shapes": list(names), "n_pos": n_pos, "threads": threads, "steps": steps, "tools": list(others),
                "timeout": timeout}  # fmt: skip

    def measure() -> tuple[list, dict]:
        results = bench_lm(cfg, log=lambda line: typer.echo(line, err=True))
        return [lm_table(results, cfg)], {"runs": raw_runs(results)}

    _recorded("lm", settings, "cpu", json_path, force, measure)
