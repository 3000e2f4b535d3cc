"""Issue 23 items 1-2: tables, figures and the step-doubling check of the state-tracking
grids that decide (``state-tracking-z5-L4``, ``state-tracking-s5-L3``).

Run from the repository root::

    # tables (searches.json/csv, trials.json/csv) of every sweep folder, finished or not,
    # and the figures in examples/figures/ (one plotly.min.js beside them, offline)
    python examples/sweeps/decide.py summarize examples/sweeps/state-tracking-z5-L4 \\
        examples/sweeps/state-tracking-s5-L3

    # is N* step-limited? For each chosen search, train the whole grid at its largest
    # failing N (the bracket's lo, or the cap for "not reached") with FACTOR x the steps;
    # N* stays in its bracket if every configuration still fails. (A success at hi stays
    # a success: a trial stops at its first evaluation below epsilon, and the first
    # `steps` steps of the longer run are the same steps.) Resumable: one file per trial
    # under FOLDER/steps-x2/trials/.
    OMP_NUM_THREADS=1 python examples/sweeps/decide.py check-steps examples/sweeps/state-tracking-z5-L4 \\
        [--factor 2] [--models st_transformer_small] [--formats acot] [--which joint|fixed|all]

The figures: per sweep, N* (``<name>-nstar.html``), kappa (``<name>-kappa.html``); over
every sweep, kappa against OOD (``kappa-vs-ood.html``) with Spearman's rank correlation
and a bootstrap interval over configurations (``kappa_vs_ood.json``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIGURES = HERE.parent / "figures"


def _load_summarize():
    """The replay of a partial sweep, from the CPU sweep's summarize.py (one copy)."""
    spec = importlib.util.spec_from_file_location("st_cpu_summarize", HERE / "state-tracking-cpu" / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def replay_all(folder: Path):
    """Every search of ``folder``'s sweep replayed from its store (partial searches ``open``),
    with kappa and OOD; the same as ``summarize.py`` but without its CDN figures."""
    from mechlab.sweep.kappa import kappa, ood_summary
    from mechlab.sweep.runner import SweepResult
    from mechlab.sweep.spec import JOINT, SweepSpec
    from mechlab.sweep.store import TrialStore, trial_key

    replay = _load_summarize().replay
    spec = SweepSpec.from_yaml(folder / "sweep.yaml")
    store = TrialStore(folder / "trials")
    used: dict[str, None] = {}
    searches = {key: replay(spec, store, key, used) for key in spec.search_keys()}
    result = SweepResult(spec=spec, searches=searches)
    for key in spec.main_keys():
        if spec.kappa and key.lengths in JOINT:
            per_length = {k.L: searches[k] for k in spec.kappa_keys(key)}
            value = kappa(per_length, searches[key], key.L)
            if any(r.status == "open" for r in [*per_length.values(), searches[key]]):
                value = replace(value, bound=f"open-{value.bound}")
            result.kappas[key] = value
        ood_specs = spec.trial_specs(key, spec.ood_n_for(key))
        ood_trials = [store.get(s) for s in ood_specs]
        for s, r in zip(ood_specs, ood_trials, strict=True):
            if r is not None:
                used[trial_key(s)] = None
        result.ood[key] = ood_summary([r for r in ood_trials if r is not None])
    result.trials = [store.get_key(k) for k in used]
    return spec, store, result


def _write_figure(fig, name: str) -> Path:
    """An offline HTML page that loads plotly.js from the plotly.min.js beside it."""
    from mechlab.io import atomic_write_text

    FIGURES.mkdir(parents=True, exist_ok=True)
    js = FIGURES / "plotly.min.js"
    if not js.exists():
        import plotly

        shutil.copyfile(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", js)
    fig.update_layout(width=None, height=640, template="plotly_white")
    html = fig.to_html(include_plotlyjs="directory", full_html=True)
    return atomic_write_text(FIGURES / f"{name}.html", html)


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (vx * vy) if vx > 0 and vy > 0 else float("nan")


def bootstrap_spearman(x: list[float], y: list[float], n_boot: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of Spearman's rho over configurations resampled with replacement."""
    rng = random.Random(seed)
    values = []
    for _ in range(n_boot):
        idx = [rng.randrange(len(x)) for _ in x]
        rho = spearman([x[i] for i in idx], [y[i] for i in idx])
        if not math.isnan(rho):
            values.append(rho)
    values.sort()
    return values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def kappa_vs_ood(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The kappa-OOD points (one per model, format and task with a kappa and an OOD value),
    Spearman's rho with its bootstrap interval, per token and per sequence."""
    points = [r for r in rows if r.get("kappa") is not None and r.get("ood_token_acc") is not None]
    out: dict[str, Any] = {"n": len(points), "points": [
        {k: r.get(k) for k in ("sweep", "model", "format", "group", "m", "L", "kappa", "kappa_bound", "kappa_low",
                               "kappa_high", "ood_n", "ood_token_acc", "ood_seq_acc")} for r in points]}  # fmt: skip
    for field in ("ood_token_acc", "ood_seq_acc"):
        x, y = [float(r["kappa"]) for r in points], [float(r[field]) for r in points]
        if len(points) >= 3:
            low, high = bootstrap_spearman(x, y)
            out[field] = {"spearman": spearman(x, y), "ci95": [low, high]}
    return out


def kappa_ood_figure(summary: dict[str, Any]):
    import plotly.graph_objects as go

    fig = go.Figure()
    symbols = {"outcome": "circle", "acot": "diamond", "cot": "square"}
    colours = {"st_transformer_small": "#1f77b4", "st_lstm_small": "#d62728", "st_dense_ssm_small": "#2ca02c",
               "st_mamba_small": "#9467bd"}  # fmt: skip
    marks = {"lower": ">=", "upper": "<=", "exact": ""}
    for p in summary["points"]:
        task = "S5" if p["group"] == "s5" else f"Z{p['m']}"
        high = p["kappa_high"] if p["kappa_high"] is not None else p["kappa"] * 10
        fig.add_trace(go.Scatter(
            x=[p["kappa"]], y=[p["ood_token_acc"]], mode="markers+text",
            text=[f"{marks.get(p['kappa_bound'], '')}{p['kappa']:.2f}"], textposition="top center",
            name=f"{p['model'].replace('st_', '').replace('_small', '')} {p['format']} {task} L={p['L']}",
            marker={"symbol": symbols.get(p["format"], "circle"), "size": 13,
                    "color": colours.get(p["model"], "grey"),
                    "line": {"width": 1, "color": "black"}},
            error_x={"type": "data", "symmetric": False, "array": [high - p["kappa"]],
                     "arrayminus": [p["kappa"] - (p["kappa_low"] or p["kappa"])], "thickness": 1},
            hovertext=[f"kappa {p['kappa']:.3g} ({p['kappa_bound']}; range [{p['kappa_low']}, {p['kappa_high']}]), "
                       f"OOD token {p['ood_token_acc']:.2f}, sequence {p['ood_seq_acc']:.2f}, N = {p['ood_n']}"],
        ))  # fmt: skip
    tok = summary.get("ood_token_acc", {})
    rho = f"Spearman rho = {tok['spearman']:.2f} [95% CI {tok['ci95'][0]:.2f}, {tok['ci95'][1]:.2f}]" if tok else ""
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title=f"OOD accuracy at 2L (per token, chance = 0) against kappa, {summary['n']} configurations; {rho}"
              "<br><sup>error bars: the kappa range the N* brackets allow (an open end drawn at 10x); "
              ">=: lower bound</sup>",
        xaxis_title="kappa = sum_n N*_n / N*_joint (log scale)", xaxis_type="log",
        yaxis_title="OOD token accuracy (chance-normalised)", legend={"font": {"size": 10}},
    )  # fmt: skip
    return fig


def summarize(folders: list[Path]) -> None:
    from mechlab.io import atomic_write_text
    from mechlab.sweep import write_outputs
    from mechlab.sweep.outputs import search_rows
    from mechlab.viz.sweep import kappa_figure, n_star_figure

    all_rows = []
    for folder in folders:
        _, _, result = replay_all(folder)
        write_outputs(result, folder, figures=False)
        rows = search_rows(result)
        for r in rows:
            r["sweep"] = folder.name
        all_rows += rows
        _write_figure(n_star_figure(rows, title=f"N* per model and format, {folder.name} (bracket as error bars)"),
                      f"{folder.name}-nstar")  # fmt: skip
        if any(r.get("kappa") is not None for r in rows):
            _write_figure(kappa_figure(rows, title=f"kappa, {folder.name}"), f"{folder.name}-kappa")
        for r in rows:
            print(f"{folder.name:22s} {r['model']:20s} {r['format']:7s} n={r['n']:5s} N*={r['n_star']} "
                  f"{r['status']} ({r['lo']}, {r['hi']}] cap {r['cap']}"
                  + (f" kappa {r['kappa']:.3g} {r['kappa_bound']} [{r['kappa_low']}, {r['kappa_high']}]"
                     if r.get("kappa") is not None else "")
                  + (f" OOD {r['ood_token_acc']:.2f}/{r['ood_seq_acc']:.2f} at N={r['ood_n']}"
                     if r.get("ood_token_acc") is not None else ""))  # fmt: skip
    summary = kappa_vs_ood(all_rows)
    atomic_write_text(FIGURES / "kappa_vs_ood.json", json.dumps(summary, indent=1) + "\n")
    if summary["n"]:
        _write_figure(kappa_ood_figure(summary), "kappa-vs-ood")
    print(json.dumps({k: v for k, v in summary.items() if k != "points"}))


def check_steps(folder: Path, factor: int, models: set[str] | None, formats: set[str] | None, which: str) -> None:
    """The step-doubling check (see the module docstring); writes FOLDER/steps-xF/check.json."""
    import torch

    from mechlab.io import atomic_write_text
    from mechlab.sweep.runner import succeeded
    from mechlab.sweep.store import TrialStore
    from mechlab.train.trials import run_trials

    torch.set_num_threads(1)
    spec, store, result = replay_all(folder)
    out = folder / f"steps-x{factor}"
    check = TrialStore(out / "trials")
    eps = spec.search.epsilon
    rows = []
    for key, r in result.searches.items():
        if (models and key.model not in models) or (formats and key.format not in formats):
            continue
        if (which == "joint" and key.lengths == "fixed") or (which == "fixed" and key.lengths != "fixed"):
            continue
        if r.status == "open" or r.lo is None:
            continue  # not finished, or nothing failed (N* <= the smallest N tried)
        base = spec.trial_specs(key, r.lo)
        longer = [{**s, "steps": s["steps"] * factor} for s in base]
        missing = [s for s in longer if check.get(s) is None]
        if missing:
            print(f"{key.label}: training {len(missing)} configuration(s) at N = {r.lo} for "
                  f"{spec.steps * factor} steps", flush=True)  # fmt: skip
            for s, res in zip(missing, run_trials(missing), strict=True):
                check.put(s, res)
        before = [store.get(s) for s in base]
        after = [check.get(s) for s in longer]
        still = not any(succeeded(a, eps) for a in after)
        rows.append({
            "search": key.label, "model": key.model, "format": key.format, "lengths": key.lengths, "L": key.L,
            "status": r.status, "lo": r.lo, "hi": r.hi, "steps": spec.steps, "steps_checked": spec.steps * factor,
            "best_val_loss": min(b["val_loss"] for b in before if b is not None),
            "best_val_loss_checked": min(a["val_loss"] for a in after),
            "n_star_stays_in_bracket": still,
        })  # fmt: skip
        print(f"{key.label}: N = {r.lo} best val loss {rows[-1]['best_val_loss']:.3g} at {spec.steps} steps, "
              f"{rows[-1]['best_val_loss_checked']:.3g} at {spec.steps * factor}: "
              f"{'still fails' if still else 'SUCCEEDS: step-limited'}", flush=True)  # fmt: skip
        previous = json.loads((out / "check.json").read_text()) if (out / "check.json").exists() else []
        merged = {p["search"]: p for p in previous} | {x["search"]: x for x in rows}
        atomic_write_text(out / "check.json", json.dumps(list(merged.values()), indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("folders", nargs="+", type=Path)
    c = sub.add_parser("check-steps")
    c.add_argument("folder", type=Path)
    c.add_argument("--factor", type=int, default=2)
    c.add_argument("--models")
    c.add_argument("--formats")
    c.add_argument("--which", choices=("joint", "fixed", "all"), default="all")
    args = parser.parse_args(argv)
    if args.command == "summarize":
        summarize(args.folders)
    else:
        split = lambda v: set(v.split(",")) if v else None  # noqa: E731
        check_steps(args.folder, args.factor, split(args.models), split(args.formats), args.which)
    return 0


if __name__ == "__main__":
    sys.exit(main())
