"""The `mechlab` command: a thin skin over the library (parse, call, print).

Every command turns bad input into one line on stderr and exit status 2,
without a traceback. Set ``MECHLAB_DEBUG=1`` to see the traceback instead.
Before any command runs, every ``--device`` is checked
(:func:`mechlab.devices.check_device`) and an empty path option (``--out ""``,
which would mean the current folder) is refused. Warnings are printed as one
line each (``mechlab: warning: ...``).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import click
import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: wraps to the terminal's width, readable at 80 columns
    help="mechlab: train small sequence models, look inside them, find their circuits.",
)
bench_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Speed and memory benchmarks (ratios, medians).")  # fmt: skip
app.add_typer(bench_app, name="bench")


# typer >= 0.2x ships its own copy of click (typer._click) whose exceptions are not
# click's; catch both.
try:
    from typer._click import exceptions as _typer_click
except ImportError:  # older typer uses click itself
    _typer_click = click.exceptions
_EXIT = (click.exceptions.Exit, typer.Exit)
_ABORT = (click.exceptions.Abort, typer.Abort)
_CLICK_ERROR = (click.exceptions.ClickException, _typer_click.ClickException)


class UsageProblem(ValueError):
    """Bad input from the command line: reported as one line, exit status 2."""


def _use_threads(threads: int | None) -> int:
    """Set torch's CPU threads when given; returns how many run (torch loads here). The
    count is printed when the command ends (:func:`main`)."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


_THREADED = ("eval", "prune", "recall", "curve", "report")  # commands that say their thread count


def _echo_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _model_config(name: str) -> str | dict:
    """A model name as given, or the model a training preset (``recall-cpu``) trains."""
    from mechlab.models import presets
    from mechlab.train.config import available_presets, resolve_config

    if name in presets() or name not in available_presets():
        return name
    from mechlab.train.task import make_task

    cfg = resolve_config(preset=name)
    return {**cfg.model, **make_task(cfg.task, cfg.task_cfg).model_fields()}


@app.command()
def info(
    ckpt: Path | None = typer.Option(None, help="Checkpoint (.pt or .safetensors) to describe."),
    model: str | None = typer.Option(
        None, help="Or: an architecture, model preset or training preset to build fresh (e.g. tiny, lstm, recall-cpu)."
    ),
) -> None:
    """Print architecture, parameter count, training step and every hook with its shape."""
    from mechlab.checkpoint import load_checkpoint
    from mechlab.models import build_model

    if (ckpt is None) == (model is None):
        raise UsageProblem("give exactly one of --ckpt PATH or --model NAME")
    if ckpt is not None:
        loaded = load_checkpoint(ckpt)
        net, step, source = loaded.model, loaded.step, str(ckpt)
    else:
        net, step, source = build_model(_model_config(model)), 0, f"fresh {model}"
    cfg = net.cfg
    n_params = sum(p.numel() for p in net.parameters())
    typer.echo(f"source:       {source}")
    typer.echo(f"architecture: {cfg.arch} ({cfg.io}, d_model={cfg.d_model}, n_layers={cfg.n_layers})")
    typer.echo(f"parameters:   {n_params:,}")
    typer.echo(f"step:         {step}")
    shapes = net.hook_shapes(batch=1)
    typer.echo(f"hooks ({len(shapes)}), shapes for batch 1 and {min(cfg.n_ctx, 8)} positions:")
    _echo_table([(f"  {name}", str(list(shape))) for name, shape in shapes.items()])


@app.command()
def train(
    task: str | None = typer.Option(None, help="Task: lds (interleaved linear systems; the default) or state_tracking (Z_m / S_5; see docs/state_tracking.md)."),
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
) -> None:
    """Train a model on a task; checkpoints at log-spaced steps plus last.pt."""
    import yaml

    from mechlab.train import TrainingStopped, resolve_config
    from mechlab.train import train as run_training

    if resume is not None:
        if out is not None and out != resume:
            raise UsageProblem("give the run directory once: --resume DIR (without a different --out)")
        saved = resume / "config.yaml"
        if not saved.is_file():
            raise UsageProblem(f"nothing to resume: {str(saved)!r} does not exist")
        cfg = resolve_config(config_file=saved, overrides=set_, steps=steps, device=device,
                             grad_accum=grad_accum, loss_reduction=loss_reduction)
        out = resume
    else:
        if out is None:
            raise UsageProblem("give --out DIR for the run (or --resume DIR to continue one)")
        cfg = resolve_config(preset=preset, config_file=config, overrides=set_, task=task, steps=steps, device=device,
                             grad_accum=grad_accum, loss_reduction=loss_reduction)
    typer.echo(f"training {cfg.model} on {cfg.task} for {cfg.steps} steps -> {out}")
    typer.echo(yaml.safe_dump({"task_cfg": cfg.task_cfg}, default_flow_style=True).strip())
    try:
        result = run_training(cfg, out, resume=resume is not None, progress=progress)
    except TrainingStopped as exc:
        typer.echo(f"mechlab: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"done: step {result.step}, loss {result.final_loss:.5f}, checkpoint {result.last_checkpoint}")
    for key, value in result.final_eval.items():
        typer.echo(f"  {key}: {value:.4f}")


@app.command("eval")
def eval_(
    ckpt: Path = typer.Option(..., help="Checkpoint of a run trained on the lds task."),
    suite: list[str] = typer.Option(["nih"], help="uninterleaved, nih, ood, dynamics (repeatable) or all."),
    out: Path | None = typer.Option(None, help="Directory for <suite>.json and <suite>.html (default: beside the checkpoint, eval/)."),
    traces: int = typer.Option(1000, min=1, help="Traces per evaluation."),
    haystack: int | None = typer.Option(None, min=1, help="Haystack systems (default: the run's eval setting)."),
    seg_len: int | None = typer.Option(None, min=1, help="Observations per haystack segment."),
    seed: int = typer.Option(0),
    protocol: str = typer.Option("study", help="NiH construction: study (the default: oldest system queried, misdirection to the next) or uniform (query and misdirection drawn uniformly)."),
    trials: int | None = typer.Option(None, min=1, help="nih/ood: initial-state trials per example; --traces is then the number of examples (the study: --traces 50 --trials 1000), median per example then across examples."),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
) -> None:
    """Evaluate a checkpoint: JSON numbers plus plotly HTML figures."""
    import json

    from mechlab.evals import SUITES, run_suite
    from mechlab.io import atomic_write_text
    from mechlab.tasks.lds_evals import nih_protocol
    from mechlab.viz import figure_for_suite, write_html

    suites = list(SUITES) if suite == ["all"] else suite
    for name in suites:
        if name not in SUITES:
            raise UsageProblem(f"unknown suite {name!r}; choose from {list(SUITES)} or all")
    if not ckpt.exists():
        raise UsageProblem(f"checkpoint {str(ckpt)!r} not found")
    nih_protocol(protocol)
    _use_threads(threads)
    out = out or ckpt.resolve().parent / "eval"  # created by the first write, not before
    for name in suites:
        report = run_suite(ckpt, name, n_traces=traces, n_haystack=haystack, seg_len=seg_len, seed=seed,
                           protocol=protocol, trials=trials if name in ("nih", "ood") else None)
        json_path = atomic_write_text(out / f"{name}.json", json.dumps(report, indent=1))
        write_html(figure_for_suite(report), out / f"{name}.html")
        typer.echo(f"{name}: {json_path}, {out / (name + '.html')}")
        _print_report(report)


def _print_report(report: dict) -> None:
    r = report["result"]
    if report["suite"] == "nih":
        for j, s in r["offsets"].items():
            typer.echo(f"  {j}-after: median {s['median']:.4f} (q1 {s['q1']:.4f}, q3 {s['q3']:.4f})")
    elif report["suite"] == "ood":
        for probe, offsets in r["probes"].items():
            typer.echo(f"  {probe:20s} " + "  ".join(f"{j}-after {s['median']:.3f}" for j, s in offsets.items()))
    elif report["suite"] == "uninterleaved":
        m, ls = r["model_median"], r["lstsq_median"]
        for j in (1, 2, 3, 6, 7, 10, 50, len(m)):
            if j <= len(m):
                typer.echo(f"  obs {j:3d}: model {m[j - 1]:.4f}  least-squares {ls[j - 1]:.2e}")
    elif report["suite"] == "dynamics":
        for i, ex in enumerate(r["examples"]):
            typer.echo(f"  {ex:>10,} examples: " + "  ".join(f"{j}-after {v[i]:.3f}" for j, v in r["offsets"].items()))


@app.command()
def report(
    ckpt: Path = typer.Option(..., help="Checkpoint of a run trained on the lds task."),
    out: Path = typer.Option(..., help="Directory for index.html and the JSON behind it."),
    target: list[str] = typer.Option(["1-after", "2-after"], help="Pruning target (repeatable)."),
    seed: list[int] = typer.Option([0, 1], help="Pruning seeds per target (repeatable; two or more give the seed baseline)."),
    eval_traces: int = typer.Option(500, min=1, help="NiH traces of the evaluation."),
    prune_traces: int = typer.Option(256, min=1, help="Training traces of each pruning run (held-out: twice as many)."),
    recall_traces: int = typer.Option(256, min=1, help="NiH traces of the recall verdicts."),
    components: bool = typer.Option(True, help="Patch each head / layer in the recall analysis."),
    protocol: str = typer.Option("default", help="Pruning protocol: default, uniform or study (see mechlab prune --help)."),
    steps: int = typer.Option(300, min=1, help="Optimiser steps of each pruning run (mechlab prune: 500)."),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    device: str = typer.Option("cpu"),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """The main job: evaluate, prune each target, compare the circuits, explain recall; one index.html."""

    from mechlab.report import ReportConfig, make_report

    if str(out) in ("", "."):
        raise UsageProblem("give --out a folder of its own (the report writes several files)")
    cfg = ReportConfig(targets=tuple(target), seeds=tuple(seed), eval_traces=eval_traces,
                       prune_traces=prune_traces, recall_traces=recall_traces,
                       components=components, protocol=protocol, steps=steps)  # fmt: skip
    _use_threads(threads)
    result = make_report(ckpt, cfg, device=device, progress=progress,
                         log=lambda line: typer.echo(line, err=True))  # fmt: skip
    page = result.write(out)
    s = result.summary()
    typer.echo("NiH median: " + ", ".join(f"{k} {v:.4f}" for k, v in s["nih_median"].items()))
    typer.echo("recall: " + ", ".join(f"{k} {v}" for k, v in s["verdict"].items()))
    for name, c in s["circuits"].items():
        faith = ", ".join(_fmt(f) for f in c["faithfulness"])
        typer.echo(f"circuit {name}: edges {c['edges']}, faithfulness {faith}")
    for key, o in s["overlap"].items():
        typer.echo(f"{key}: Jaccard {o['jaccard']:.3f} (null uniform {o['null_uniform']:.3f}, "
                   f"degree {o['null_degree']:.3f}); within seeds "
                   + ", ".join(f"{t} {v:.3f}" for t, v in s["within"].items()))  # fmt: skip
    typer.echo(f"report: {page}")


@app.command()
def recall(
    ckpt: Path | None = typer.Option(None, help="Checkpoint of a run trained on the lds task."),
    checkpoints: Path | None = typer.Option(None, help="Run directory: the same scores across its checkpoints/step_*.pt."),
    out: Path | None = typer.Option(None, help="Directory for recall.json/.html and recall_dynamics.json/.html (default: beside the checkpoint, recall/)."),
    traces: int = typer.Option(256, min=1, help="NiH traces."),
    haystack: int | None = typer.Option(None, min=1, help="Haystack systems (default: the run's eval setting)."),
    seg_len: int | None = typer.Option(None, min=1, help="Observations per haystack segment."),
    offset: list[int] = typer.Option([], help="Offset j of j-after (repeatable; default every one of 1..seg_len)."),
    seed: int = typer.Option(0),
    components: bool = typer.Option(True, help="Also patch each head / layer at the patched position (--ckpt)."),
    protocol: str = typer.Option("study", help="NiH construction: study (the default: oldest system queried, misdirection to the next) or uniform."),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    device: str = typer.Option("cpu"),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Does each prediction after the query label follow the label or the observations? JSON + HTML."""
    import json

    from mechlab.io import atomic_write_text
    from mechlab.recall import recall_checkpoint, recall_dynamics
    from mechlab.viz import recall_dynamics_figure, recall_figure, write_html

    if ckpt is None and checkpoints is None:
        raise UsageProblem("give --ckpt PATH (a checkpoint), --checkpoints DIR (a run directory), or both")
    if ckpt is not None and not ckpt.is_file():
        raise UsageProblem(f"checkpoint {str(ckpt)!r} not found")
    if checkpoints is not None and not checkpoints.is_dir():
        raise UsageProblem(f"run directory {str(checkpoints)!r} not found")
    _use_threads(threads)
    out = out or (ckpt.resolve().parent if ckpt is not None else checkpoints.resolve()) / "recall"
    kwargs = {"n_traces": traces, "n_haystack": haystack, "seg_len": seg_len, "seed": seed,
              "protocol": protocol, "offsets": tuple(offset) or None, "device": device}
    # Everything is computed before anything is written: bad input leaves no file behind.
    files: dict[str, tuple[dict, object]] = {}
    if ckpt is not None:
        report = recall_checkpoint(ckpt, components=components, progress=progress, **kwargs)
        files["recall"] = (report, recall_figure(report))
    if checkpoints is not None:
        dyn = recall_dynamics(checkpoints, progress=progress, **kwargs)
        files["recall_dynamics"] = (dyn, recall_dynamics_figure(dyn))
    for stem, (data, fig) in files.items():
        json_path = atomic_write_text(out / f"{stem}.json", json.dumps(data, indent=1))
        html_path = write_html(fig, out / f"{stem}.html")
        typer.echo(f"{stem}: {json_path}, {html_path}")
    if ckpt is not None:
        _print_recall(files["recall"][0]["result"])
    if checkpoints is not None:
        _print_recall_dynamics(files["recall_dynamics"][0])


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _print_recall(r: dict) -> None:
    rows = [("offset", "E_label", "E_obs", "E_obs_all", "score", "verdict", "score_all", "verdict_all",
             "follows_label", "clean", "misdirected")]
    for j, v in r["per_offset"].items():
        rows.append((f"{j}-after", f"{v['e_label']:.4f}", f"{v['e_obs']:.4f}", f"{v['e_obs_all']:.4f}",
                     _fmt(v["score"]), v["verdict"], _fmt(v["score_all"]), v["verdict_all"],
                     f"{v['follows_label']:.3f}", f"{r['errors']['clean'][j]['median']:.4f}",
                     f"{r['errors']['misdirect_incorrect'][j]['median']:.4f}"))
    _echo_table(rows)
    for direction, heads in r["label_heads"].items():
        if heads:
            typer.echo(f"heads carrying the label to 1-after ({direction}): "
                       + ", ".join(f"{h} {f:.2f}" for h, f in heads))


def _print_recall_dynamics(d: dict) -> None:
    typer.echo("per offset: score verdict (follows_label)")
    rows = [("step", "examples", *(f"{j}-after" for j in d["per_offset"]))]
    for i, (step, ex) in enumerate(zip(d["steps"], d["examples"], strict=True)):
        rows.append((str(step), f"{ex:,}", *(f"{_fmt(v['score'][i])} {v['verdict'][i]} ({v['follows_label'][i]:.2f})"
                                             for v in d["per_offset"].values())))
    _echo_table(rows)


@app.command()
def prune(
    ctx: typer.Context,
    ckpt: Path = typer.Option(..., help="Checkpoint of a run trained on the lds task (or state_tracking: see --length)."),
    target: list[str] = typer.Option(["1-after"], help="k-after (e.g. 1-after, 2-after) or all; repeatable (state tracking: final, changed or all)."),
    sparsity: float = typer.Option(0.95, help="Fraction of edges removed, in (0, 1)."),
    ablation: str = typer.Option("interchange", help="interchange, mean or zero."),
    corruption: str = typer.Option("misdirect_incorrect", help="Corrupted traces of an interchange ablation: misdirect_incorrect (query label swapped with another haystack system's), another probe, or shuffle (state tracking: random, the default there, or x<k>)."),
    loss: str = typer.Option("model", help="model (match the full model) or truth (match the ground truth)."),
    node_sparsity: float | None = typer.Option(None, help="Also mask writer nodes, at this sparsity."),
    steps: int = typer.Option(500, min=1, help="Optimiser steps."),
    lr: float = typer.Option(0.1, help="Adam learning rate of the masks."),
    lambda_lr: float = typer.Option(1.0, help="Peak Adam learning rate of the Lagrange multipliers (maximised; warm-up, then linear decay)."),
    seed: list[int] = typer.Option([0], help="Pruning and data seed (seed k draws its own traces); repeat for a seed-stability estimate."),
    traces: int = typer.Option(256, min=1, help="Training traces."),
    test_traces: int = typer.Option(512, min=1, help="Held-out traces for the metrics."),
    haystack: int | None = typer.Option(None, min=1, help="Haystack systems (default: the run's eval setting)."),
    seg_len: int | None = typer.Option(None, min=1, help="Observations per haystack segment."),
    length: int | None = typer.Option(None, help="State-tracking checkpoints: elements per sequence (default the run's L; targets final, changed, all; corruption random or x<k>)."),
    out: Path | None = typer.Option(None, help="Directory for <target>_seed<k>.json/.html (default: beside the checkpoint, circuits/; state tracking: <target>_n<length>_seed<k>)."),
    device: str = typer.Option("cpu"),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    protocol: str = typer.Option("default", help="default: mechlab's settings (sparsity 0.95) on the study's NiH (oldest system queried, misdirection to the next); uniform: the same on uniformly drawn NiH; study: the study's settings (sparsity 0.99, node sparsity 0.8, loss truth x 1000, 3000 steps) on its NiH. Options given explicitly override it."),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    normalize_loss: bool | None = typer.Option(None, "--normalize-loss/--raw-loss", help="Divide each target's loss by its fully ablated loss (default: raw; with --share, normalising weighs targets of different loss scales equally)."),
    share: list[str] = typer.Option([], help="Prune the targets jointly at this sharing weight (a number >= 0, or tied: one circuit for all); repeatable; include 0 for the cost of sharing. Writes joint/ under --out."),
) -> None:
    """Find circuits by edge pruning on needle-in-a-haystack traces (state tracking: traces that
    change one element): JSON + offline HTML per circuit."""
    import warnings

    from mechlab.pipelines import PRUNE_PROTOCOLS, check_prune_targets, prune_checkpoint
    from mechlab.prune import overlap, seed_stability

    if protocol not in PRUNE_PROTOCOLS:
        raise UsageProblem(f"unknown protocol {protocol!r}; choose one of {list(PRUNE_PROTOCOLS)}")
    # A protocol's setting applies unless the option was given on the command line.
    settings = {"sparsity": sparsity, "loss": loss, "node_sparsity": node_sparsity, "steps": steps,
                "normalize_loss": normalize_loss}
    for key in PRUNE_PROTOCOLS[protocol]:
        source = ctx.get_parameter_source(key)  # typer may bundle its own click: compare names
        if key in settings and getattr(source, "name", None) == "DEFAULT":
            settings[key] = None
    if not ckpt.exists():
        raise UsageProblem(f"checkpoint {str(ckpt)!r} not found")
    check_prune_targets(ckpt, target, n_haystack=haystack, seg_len=seg_len, length=length,
                        corruption=corruption, protocol=PRUNE_PROTOCOLS[protocol]["nih"])  # all, before any work
    if share:
        shares = _parse_shares(share, target)
        _use_threads(threads)
        _joint_prune(ckpt, target, shares, seed, out, settings, protocol=protocol, n_train=traces,
                     n_test=test_traces, n_haystack=haystack, seg_len=seg_len, corruption=corruption,
                     device=device, ablation=ablation, lr=lr, lambda_lr=lambda_lr, progress=progress)  # fmt: skip
        return
    _use_threads(threads)
    out = out or ckpt.resolve().parent / "circuits"  # created by the first write, not before
    found: dict[str, list] = {}
    for name in target:
        for s in seed:
            with warnings.catch_warnings():  # printed below, as one line on stderr
                warnings.filterwarnings("ignore", message="circuit for", category=UserWarning)
                circuit = prune_checkpoint(
                    ckpt, name, n_train=traces, n_test=test_traces, n_haystack=haystack,
                    seg_len=seg_len, corruption=corruption, device=device, ablation=ablation,
                    lr=lr, lambda_lr=lambda_lr, seed=s, progress=progress, protocol=protocol,
                    length=length, **settings,
                )
            found.setdefault(name, []).append(circuit)
            stem = f"{circuit.metadata['target']}_seed{s}"  # the target's name (state tracking: with _n<length>)
            circuit.to_json(out / f"{stem}.json")
            circuit.write_html(out / f"{stem}.html")
            m, meta = circuit.metadata["metrics"], circuit.metadata
            typer.echo(f"{stem}: {circuit.n_edges} edges, {circuit.n_nodes} nodes, sparsity asked "
                       f"{meta['sparsity_asked']:.4f} reached {meta['sparsity_reached']:.4f} -> {out / stem}.json/.html")
            typer.echo(f"  faithfulness {m['faithfulness']:.3f} (mse to full {m['circuit_vs_full']:.4f}, all ablated {m['ablated_vs_full']:.4f})")
            typer.echo(f"  error vs truth: circuit {m['error_circuit']:.4f}  full {m['error_full']:.4f}  "
                       f"all ablated {m['error_ablated']:.4f}  complement {m['error_complement']:.4f}")
            if meta["n_edges_excluded_inert"]:
                typer.echo(f"  sparsity over {meta['n_edges_countable']} edges: {meta['n_edges_excluded_inert']} edges of "
                           f"{', '.join(meta['inert_writers'])} excluded (they cannot matter under {meta['ablation']} ablation)")
            if meta.get("n_edges_excluded_unreachable"):
                typer.echo(f"  sparsity over {meta['n_edges_countable']} edges: {meta['n_edges_excluded_unreachable']} edges "
                           f"excluded (they reach no read-out of the target windows: {', '.join(meta['target_windows'])})")
            if meta["sparsity_limited_by_open_edges"]:
                typer.echo(f"mechlab: {stem}: only {meta['n_open_edges']} edges are open: kept {circuit.n_edges} "
                           f"of the {meta['n_edges_asked']} the sparsity asks", err=True)
            for line in meta["warnings"]:
                typer.echo(f"mechlab: warning: {stem}: {line}", err=True)
    names = list(found)
    for a, b in zip(names, names[1:], strict=False):
        o = overlap(found[a][0], found[b][0])
        if o.n_edges_a == 0 or o.n_edges_b == 0:
            typer.echo(f"overlap {a} vs {b}: not defined, a circuit is empty "
                       f"({o.n_edges_a} and {o.n_edges_b} edges)")  # fmt: skip
            continue
        typer.echo(f"overlap {a} vs {b}: {o.n_shared_edges} shared edges, Jaccard {o.jaccard:.3f}, "
                   f"overlap coefficient {o.overlap_coefficient:.3f}")
    if len(seed) >= 2:
        typer.echo(seed_stability(found).summary())


def _parse_shares(values: list[str], targets: list[str]) -> list[float]:
    """``--share`` values as floats (``tied``: inf), checked before any work."""
    import math

    from mechlab.prune.joint import check_shares

    if len(targets) < 2:
        raise UsageProblem(f"--share prunes targets jointly: give two or more --target, got {targets}")
    parsed: list[float | str] = []
    for v in values:
        try:
            parsed.append(float(v) if v.strip().lower() not in ("tied", "inf") else math.inf)
        except ValueError:
            raise UsageProblem(f"--share must be a number >= 0 or tied, got {v!r}") from None
    return check_shares(parsed)


def _joint_prune(ckpt: Path, targets: list[str], shares: list[float], seeds: list[int], out: Path | None,
                 settings: dict, **kwargs) -> None:
    """``mechlab prune --share``: the share sweep, its circuits and its table."""
    import json
    import warnings

    from mechlab.io import atomic_write_text
    from mechlab.pipelines import joint_prune_checkpoint

    out = (out or ckpt.resolve().parent / "circuits") / "joint"
    with warnings.catch_warnings():  # each circuit's warnings are printed below, one line each
        warnings.filterwarnings("ignore", message="circuit for", category=UserWarning)
        sweep = joint_prune_checkpoint(ckpt, targets, shares, seeds, out_dir=out, **settings, **kwargs)
    for result in sweep.results:  # the JSON files were written as each result was found
        label = "tied" if result.share == float("inf") else f"{result.share:g}"
        for name, circuit in result.circuits.items():
            stem = f"share-{label}/{name}_seed{circuit.metadata['seed']}"
            circuit.write_html(out / f"{stem}.html")
            for line in circuit.metadata["warnings"]:
                typer.echo(f"mechlab: warning: joint {stem}: {line}", err=True)
    written = atomic_write_text(out / "joint.json", json.dumps(sweep.to_dict(), indent=1))
    typer.echo(sweep.table())
    typer.echo(f"wrote {written} and the circuits under {out}/share-*/")


def _load_circuits(paths: list[Path]) -> list:
    """Every circuit file, each checked (one line naming the file or the field) before any work."""
    from mechlab.prune import Circuit

    loaded = []
    for path in paths:
        if not path.is_file():
            raise UsageProblem(f"circuit {str(path)!r} not found")
        loaded.append(Circuit.from_json(path))
    return loaded


@app.command()
def view(
    circuits: list[Path] = typer.Argument(..., help="Circuit JSON files (from mechlab prune)."),
    out: Path = typer.Option(..., help="HTML file to write (self-contained, works offline)."),
    label: list[str] = typer.Option([], help="A name per circuit (default: target and seed)."),
) -> None:
    """Render circuits: one file draws its graph; two or more add the overlap view on one layout."""
    from mechlab.io import atomic_write_text
    from mechlab.viz import circuit_figure, overlap_figure
    from mechlab.viz.figures import page_html

    if label and len(label) != len(circuits):
        raise UsageProblem(f"give one --label per circuit: {len(label)} labels for {len(circuits)} circuits")
    if out.suffix.lower() not in (".html", ".htm"):
        raise UsageProblem(f"--out must be an .html file, got {str(out)!r}")
    loaded = _load_circuits(circuits)
    names = label or [f"{c.metadata.get('target', p.stem)} (seed {c.metadata.get('seed', '?')})"
                      for c, p in zip(loaded, circuits, strict=True)]  # fmt: skip
    sections = []
    if len(loaded) >= 2:
        sections.append(("Overlap", overlap_figure(loaded, names)))
    sections += [(name, circuit_figure(c)) for name, c in zip(names, loaded, strict=True)]
    title = "Circuit" if len(loaded) == 1 else f"{len(loaded)} circuits"
    page = atomic_write_text(out, page_html(title, sections))
    typer.echo(f"wrote {page}")


@app.command("overlap")
def overlap_(
    circuits: list[Path] = typer.Argument(..., help="Circuit JSON files (from mechlab prune)."),
    ckpt: Path | None = typer.Option(None, help="Checkpoint the circuits come from: adds cross-evaluation (each circuit scored on every target)."),
    boot: int = typer.Option(2000, min=1, help="Bootstrap resamples (each target's circuits resampled with replacement)."),
    null_samples: int = typer.Option(1000, "--null", min=1, help="Monte Carlo samples of each null model."),
    level: float = typer.Option(0.95, help="Coverage of the bootstrap intervals, in (0, 1)."),
    exclude_writer: list[str] = typer.Option([], help="Leave this writer's edges out of the null models' edge pool (e.g. pos); repeatable."),
    seed: int = typer.Option(0, help="Seed of the bootstrap and the null models."),
    json_out: Path | None = typer.Option(None, "--json", help="Write everything as JSON here."),
    device: str = typer.Option("cpu"),
    mixed_checkpoints: bool = typer.Option(False, "--mixed-checkpoints", help="Compare circuits found on different checkpoints (refused otherwise; edge names match across checkpoints of one shape, their meaning need not)."),
) -> None:
    """Overlap of circuits: pairwise table, Jaccard with bootstrap intervals over seeds,
    uniform and degree-preserving null models, cross-evaluation with --ckpt."""
    import json

    from mechlab.io import atomic_write_text
    from mechlab.pipelines import checkpoint_prune_data
    from mechlab.prune import overlap, seed_stability
    from mechlab.prune.stats import cross_evaluate, graph_edges, overlap_report

    if len(circuits) < 2:
        raise UsageProblem("give at least two circuit files")
    if not 0 < level < 1:
        raise UsageProblem(f"--level must be in (0, 1), got {level}")
    loaded = _load_circuits(circuits)
    _check_one_checkpoint(loaded, circuits, ckpt, mixed_checkpoints)
    rows = [("a", "b", "edges a", "edges b", "shared", "jaccard", "overlap coef", "shared nodes")]
    pairs = []
    for i in range(len(loaded)):
        for j in range(i + 1, len(loaded)):
            o = overlap(loaded[i], loaded[j])
            pairs.append({"a": str(circuits[i]), "b": str(circuits[j]), **o.to_dict()})
            rows.append((circuits[i].name, circuits[j].name, str(o.n_edges_a), str(o.n_edges_b),
                         str(o.n_shared_edges), f"{o.jaccard:.3f}", f"{o.overlap_coefficient:.3f}",
                         str(len(o.shared_nodes))))
    _echo_table(rows)
    by_target: dict[str, list] = {}
    for c in loaded:
        by_target.setdefault(str(c.metadata.get("target", "?")), []).append(c)
    multi = {t: g for t, g in by_target.items() if len(g) >= 2}
    if multi:
        typer.echo(seed_stability(multi).summary())
    edges = [e for e in graph_edges(loaded[0]) if e[0] not in set(exclude_writer)]
    report = overlap_report(loaded, edges, n_boot=boot, n_null=null_samples, level=level, seed=seed)
    pct = f"{100 * level:g}%"
    for name, ci in report["within"].items():
        typer.echo(f"within {name}: Jaccard {ci['value']:.3f} [{pct} CI {ci['low']:.3f}, {ci['high']:.3f}]")
    for key, entry in report["across"].items():
        typer.echo(f"{key}:")
        for stat in ("jaccard", "overlap_coefficient"):
            ci = entry[stat]
            if ci is not None:
                typer.echo(f"  {stat}: {ci['value']:.3f} [{pct} CI {ci['low']:.3f}, {ci['high']:.3f}] "
                           f"({ci['n_boot']} resamples of each target's circuits)")
        for kind in ("uniform", "degree"):
            nm = entry[f"null_{kind}"]
            exact = "" if nm["expected_exact"] is None else f", exact {nm['expected_exact']:.3f}"
            typer.echo(f"  null ({kind}, {nm['n_universe']} edges): Jaccard {nm['mc_mean']:.3f} +- "
                       f"{nm['mc_std']:.3f}{exact}; observed at percentile {100 * nm['percentile']:.1f}, "
                       f"P(null >= obs) {nm['p_greater']:.4f}, P(null <= obs) {nm['p_less']:.4f}")
    result = {"circuits": [str(p) for p in circuits], "pairs": pairs, **report,
              "excluded_writers": list(exclude_writer)}  # fmt: skip
    if ckpt is not None:
        if not ckpt.exists():
            raise UsageProblem(f"checkpoint {str(ckpt)!r} not found")
        info = loaded[0].metadata.get("data", {})
        checkpoint, data = checkpoint_prune_data(
            ckpt, n_train=int(info.get("n_train", 256)), n_test=int(info.get("n_test", 512)),
            n_haystack=info.get("n_haystack"), seg_len=info.get("seg_len"),
            corruption=info.get("corruption", "misdirect_incorrect"),
            data_seed=int(info.get("data_seed", 0)),
            protocol=info.get("nih_protocol", "uniform"),  # circuits that predate it were uniform
            device=device,
        )  # fmt: skip
        model = checkpoint.model
        cross = cross_evaluate(model, data, loaded)
        result["cross_evaluation"] = cross
        table = [("circuit", "seed", "evaluated on", "faithfulness", "complement faithfulness")]
        for r in cross:
            table.append((r["circuit_target"], str(r["seed"]), r["evaluated_on"] + (" (own)" if r["own"] else ""),
                          f"{r['faithfulness']:.3f}", f"{r['complement_faithfulness']:.3f}"))
        typer.echo("cross-evaluation (held-out traces):")
        _echo_table(table)
    if json_out is not None:
        atomic_write_text(json_out, json.dumps(result, indent=1, allow_nan=True))
        typer.echo(f"wrote {json_out}")


def _check_one_checkpoint(loaded: list, paths: list[Path], ckpt: Path | None, mixed: bool) -> None:
    """Refuse (or, with --mixed-checkpoints, warn about) circuits of different checkpoints."""
    from mechlab.checkpoint import file_sha256
    from mechlab.prune.circuit_file import checkpoint_groups, describe_groups

    groups = checkpoint_groups([c.metadata for c in loaded], [p.name for p in paths])
    problems = []
    if len(groups) > 1:
        problems.append(f"the circuits come from different checkpoints ({describe_groups(groups)})")
    if ckpt is not None and ckpt.is_file():
        sha = file_sha256(ckpt)
        others = [name for key, names in groups.items() if key != sha for name in names]
        if others:
            problems.append(f"{', '.join(others)} were not found on --ckpt {ckpt} ({sha[:12]})")
    if not problems:
        return
    if not mixed:
        raise UsageProblem("; ".join(problems) + "; compare circuits of one checkpoint, or pass "
                           "--mixed-checkpoints to compare them anyway")
    typer.echo(f"mechlab: warning: {'; '.join(problems)}: edge names match, their meaning need not", err=True)
    warnings.filterwarnings("ignore", message="comparing circuits of different checkpoints")  # said once


@app.command("curve")
def curve(
    ckpt: Path = typer.Option(..., help="Checkpoint of a run trained on the lds task."),
    target: list[str] = typer.Option(["1-after"], help="k-after (e.g. 1-after, 2-after) or all; repeatable."),
    ablation: list[str] = typer.Option(["interchange"], help="interchange, mean, zero (repeatable) or all."),
    budgets: str = typer.Option(",".join(f"{b:g}" for b in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)),
                                help="Comma-separated edge budgets in (0, 1] (default MIB's 0.1%..50%; 100% is always added)."),
    rank: str = typer.Option("log_alpha", help="log_alpha (one pruning run ranks the edges) or reprune (one run per budget, slower)."),
    sparsity: float = typer.Option(0.95, help="Sparsity of the pruning run whose log_alpha ranks the edges."),
    steps: int = typer.Option(500, min=1, help="Optimiser steps of each pruning run."),
    seed: int = typer.Option(0, help="Pruning seed."),
    corruption: str = typer.Option("misdirect_incorrect", help="Corrupted traces of an interchange ablation."),
    traces: int = typer.Option(256, min=1, help="Training traces (pruning; the mean ablation's reference)."),
    test_traces: int = typer.Option(512, min=1, help="Held-out traces the curve is scored on."),
    haystack: int | None = typer.Option(None, min=1, help="Haystack systems (default: the run's eval setting)."),
    seg_len: int | None = typer.Option(None, min=1, help="Observations per haystack segment."),
    protocol: str = typer.Option("study", help="NiH construction: study (the default: oldest system queried, misdirection to the next) or uniform."),
    out: Path | None = typer.Option(None, help="Directory for curve_<target>.json/.html (default: beside the checkpoint, curves/)."),
    threads: int | None = typer.Option(None, min=1, help="Torch CPU threads (default: torch's)."),
    device: str = typer.Option("cpu"),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Faithfulness and complement faithfulness across edge budgets (MIB's CPR, CMD): JSON + HTML per target."""
    import time

    import torch

    from mechlab.pipelines import checkpoint_prune_data
    from mechlab.prune.curves import RANKINGS, check_budgets, sweep, write_curves
    from mechlab.prune.data import check_target
    from mechlab.prune.forward import ABLATIONS
    from mechlab.viz import faithfulness_curves_figure, write_html

    try:
        grid = check_budgets([float(b) for b in budgets.split(",") if b.strip()])
    except ValueError as exc:
        raise UsageProblem(f"--budgets {budgets!r}: {exc}") from None
    ablations = list(ABLATIONS) if ablation == ["all"] else ablation
    for name in ablations:
        if name not in ABLATIONS:
            raise UsageProblem(f"unknown ablation {name!r}; choose from {', '.join(ABLATIONS)} or all")
    if rank not in RANKINGS:
        raise UsageProblem(f"unknown --rank {rank!r}; choose {' or '.join(RANKINGS)}")
    if not ckpt.is_file():
        raise UsageProblem(f"checkpoint {str(ckpt)!r} not found")
    _use_threads(threads)
    loaded, data = checkpoint_prune_data(
        ckpt, n_train=traces, n_test=test_traces, n_haystack=haystack, seg_len=seg_len,
        corruption=corruption, protocol=protocol, device=device,
    )  # fmt: skip
    for name in target:  # every target checked before any pruning
        check_target(name, data.train)
    out = out or ckpt.resolve().parent / "curves"
    for name in target:
        started = time.perf_counter()
        curves = sweep(
            loaded.model, data, name, ablations, grid, ranking=rank, sparsity=sparsity, seed=seed,
            steps=steps, progress=progress, checkpoint_sha256=loaded.sha256,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        info = {"checkpoint": str(ckpt), "checkpoint_sha256": loaded.sha256, "target": name,
                "rank": rank, "sparsity": sparsity, "steps": steps, "seed": seed, "protocol": protocol,
                "threads": torch.get_num_threads(), "seconds": seconds}
        json_path = write_curves(curves, out / f"curve_{name}.json", info=info)
        html_path = write_html(faithfulness_curves_figure(curves), out / f"curve_{name}.html")
        typer.echo(f"{name}: {json_path}, {html_path} ({seconds:.0f} s)")
        for c in curves.values():
            typer.echo(f"  {c.summary()}")
            typer.echo("    budget  " + " ".join(f"{100 * b:>6g}%" for b in c.budgets))
            typer.echo("    edges   " + " ".join(f"{k:>7d}" for k in c.n_kept))
            typer.echo("    f       " + " ".join(f"{v:>7.3f}" for v in c.faithfulness))
            typer.echo("    compl.  " + " ".join(f"{v:>7.3f}" for v in c.complement_faithfulness))


def _csv_list(text: str, kind: type = str) -> list:
    """Comma-separated values of a list option, each converted by ``kind``."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        return [kind(t) for t in items]
    except ValueError:
        raise UsageProblem(f"{text!r} is not a comma-separated list of {kind.__name__} values") from None


@app.command("sweep")
def sweep_(
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
) -> None:
    """N* searches (and kappa, OOD) over models, formats and tasks; trials on Ray, persisted, resumable."""
    from mechlab.sweep import SweepSpec, run_sweep, write_outputs
    from mechlab.sweep.executors import check_address
    from mechlab.sweep.runner import UNITS

    settings: dict = {}
    if config is not None:
        import yaml

        if not config.is_file():
            raise UsageProblem(f"sweep config {str(config)!r} not found")
        settings = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        if not isinstance(settings, dict):
            raise UsageProblem(f"{config}: a sweep config is a mapping of settings")
    lists = {"models": (models, str), "formats": (formats, str), "lengths": (lengths, str), "ms": (m, int),
             "Ls": (L, int), "lrs": (lrs, float), "seeds": (seeds, int)}  # fmt: skip
    for name, (text, kind) in lists.items():
        if text is not None:
            settings[name] = _csv_list(text, kind)
    search = dict(settings.pop("search", None) or {})
    flags = {"group": group, "kappa": kappa, "ood": ood, "ood_n": ood_n, "steps": steps, "batch_size": batch_size,
             "eval_every": eval_every, "n_val": n_val, "data_seed": data_seed, "device": device}  # fmt: skip
    settings.update({k: v for k, v in flags.items() if v is not None})
    knobs = {"epsilon": epsilon, "multiplier": multiplier, "n_min": n_min, "n_max": n_max,
             "max_steps": max_search_steps, "resolution": resolution, "start": start}  # fmt: skip
    search.update({k: v for k, v in knobs.items() if v is not None})
    if units not in UNITS:
        raise UsageProblem(f"unknown --units {units!r}; choose {' or '.join(UNITS)}")
    if local and address is not None:
        raise UsageProblem("give --local or --address, not both")
    spec = SweepSpec.from_dict({**settings, "search": search})
    if not local:
        check_address(address)
    keys = spec.search_keys()
    typer.echo(f"sweep: {len(keys)} N* searches, grid {len(spec.lrs)} lr x {len(spec.seeds)} seeds, "
               f"{spec.steps} steps per trial -> {out}" + (" (local, no Ray)" if local else ""))  # fmt: skip
    result = run_sweep(spec, out, trial=trial, units=units, local=local, address=address, num_cpus=cpus,
                       cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial, max_retries=max_retries,
                       progress=progress)  # fmt: skip
    paths = write_outputs(result, out)
    rows = [("model", "format", "task", "lengths", "L", "N*", "status", "bracket (lo, hi]", "kappa", "OOD tok/seq")]
    for key, r in result.searches.items():
        k = result.kappas.get(key)
        o = result.ood.get(key)
        mark = {"lower": ">=", "upper": "<=", "exact": ""}.get(k.bound, "") if k else ""
        rows.append((key.model, key.format, "S5" if key.group == "s5" else f"Z{key.m}", key.lengths, str(key.L),
                     "-" if r.n_star is None else str(r.n_star), r.status, f"({r.lo}, {r.hi}]",
                     "-" if k is None or k.value is None else f"{mark}{k.value:.3g}",
                     "-" if o is None else f"{o.token_acc:.2f}/{o.seq_acc:.2f}"))  # fmt: skip
    _echo_table(rows)
    typer.echo(f"trials: {result.ran} run, {result.reused} reused from {out / 'trials'}")
    typer.echo("wrote " + ", ".join(p.name for p in paths.values()))


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
    from mechlab.bench.prune import bench_prune
    from mechlab.models import build_model
    from mechlab.models.transformer import PRESETS
    from mechlab.prune import build_graph

    names = [p.strip() for p in presets.split(",") if p.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise UsageProblem(f"unknown preset {unknown[0]!r}; choose from {sorted(PRESETS)}")
    if reference is not None:
        from mechlab.bench.reference import check_reference

        check_reference(reference)
    n_threads = _use_threads(threads)
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
        _echo_table(rows)
        return
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
    _echo_table(rows)


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
    _echo_table(rows)


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
    _echo_table(rows)


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
    from mechlab.bench.ensemble import BENCH_TASK, bench_ensemble
    from mechlab.tasks.state_tracking import StateTrackingConfig
    from mechlab.train.config import parse_override

    task = dict(BENCH_TASK)
    for text in set_:
        keys, value = parse_override(text)
        task[".".join(keys)] = value
    StateTrackingConfig.from_dict({**task, "n_train": n_train})  # bad fields fail before any run
    names = [p.strip() for p in presets.split(",") if p.strip()]
    from mechlab.models.registry import presets as model_presets

    unknown = [p for p in names if p not in model_presets()]
    if unknown or not names:
        raise UsageProblem(f"unknown model preset {unknown[0] if unknown else ''!r}; choose from {sorted(model_presets())}")
    typer.echo(f"timing {repeats} runs of 15 trials x 2 contenders per preset (+1 warm-up run each) ...")
    result = bench_ensemble(names, task=task, n_train=n_train, steps=steps, repeats=repeats, threads=threads,
                            device=device)  # fmt: skip
    typer.echo(result.format_table())


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


# Options naming a file or folder: an empty value would silently mean the current folder.
_PATH_OPTIONS = ("--out", "--json", "--ckpt", "--checkpoints", "--config", "--resume")


def _option_values(args: list[str], name: str) -> list[str]:
    """The values given to option ``name`` (``--name V`` or ``--name=V``), up to ``--``."""
    values = []
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == name and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(name + "="):
            values.append(arg[len(name) + 1 :])
    return values


def _check_arguments(args: list[str]) -> None:
    """What every command shares, checked before any of them runs: devices and path options."""
    for name in _PATH_OPTIONS:
        if any(not value.strip() for value in _option_values(args, name)):
            raise UsageProblem(f"{name} is empty; give a path (use {name} . for the current folder)")
    devices = _option_values(args, "--device")
    if devices:  # (torch is imported only when a device is named)
        from mechlab.devices import check_device

        for value in devices:
            check_device(value)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    typer.echo(f"mechlab: warning: {_one_line(Exception(str(message)))}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input)."""
    # Idle OpenMP threads sleep instead of spinning. Set before torch loads (the commands
    # import it lazily): on a shared machine spinning threads made a 2-thread step 10x
    # slower than a 1-thread one (docs/benchmarks.md, "Threads").
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        args = list(sys.argv[1:] if argv is None else argv)
        if "--help" not in args:
            _check_arguments(args)
        # Filters a command sets and the one-line display end with the command.
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            # In non-standalone mode a command's `raise typer.Exit(n)` comes back as the result.
            result = app(args=argv, prog_name="mechlab", standalone_mode=False)
        command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
        if command in _THREADED and "torch" in sys.modules and result in (None, 0):
            import torch

            policy = os.environ.get("OMP_WAIT_POLICY", "default")
            typer.echo(f"torch threads: {torch.get_num_threads()} (--threads N to change; "
                       f"OMP_WAIT_POLICY={policy})", err=True)  # fmt: skip
    except _EXIT as exc:
        return exc.exit_code
    except _ABORT:
        typer.echo("mechlab: aborted", err=True)
        return 130
    except _CLICK_ERROR as exc:
        typer.echo(f"mechlab: error: {_one_line(Exception(exc.format_message()))}", err=True)
        return 2
    except (ValueError, OSError, KeyError) as exc:
        if os.environ.get("MECHLAB_DEBUG"):
            raise
        typer.echo(f"mechlab: error: {_one_line(exc)}", err=True)
        return 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
