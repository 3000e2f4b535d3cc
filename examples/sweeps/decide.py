"""Issue 23 items 1-2: tables, figures and the step-doubling check of the state-tracking
grids (``state-tracking-z5-L4`` and ``state-tracking-s5-L4`` at 4000 steps, the latter's dense SSM ACoT at 16000; the 800-step
``state-tracking-cpu`` and its 3000- and 6000-step transformer folders).

Run from the repository root::

    # tables (searches.json/csv, trials.json/csv) of every sweep folder, finished or not,
    # and the figures in examples/figures/ (one plotly.min.js beside them, offline); the
    # kappa-OOD correlation is over every folder named (this is how the committed ones
    # were made; the same store writes the same bytes; --force: the stores are committed)
    S=examples/sweeps/state-tracking-cpu
    python examples/sweeps/decide.py summarize --force examples/sweeps/state-tracking-z5-L4 \\
        $S $S/transformer-3000-steps $S/transformer-cot-6000-steps examples/sweeps/state-tracking-s5-L4 \\
        examples/sweeps/state-tracking-s5-L4/dense-ssm-acot-16000-steps

An open search's bracket is the replay's, tightened by every complete grid in the store
(:func:`store_bracket`: an earlier pass from another ``start`` counts); kappas of open
searches are drawn but not ranked (:func:`kappa_vs_ood`).

    # is N* step-limited? For each chosen finished search, train the whole grid at its
    # largest failing N (the bracket's lo, or the cap for "not reached") with FACTOR x the
    # steps (open searches are skipped: their lo may be far below N*);
    # N* stays in its bracket if every configuration still fails. (A success at hi stays
    # a success: a trial stops at its first evaluation below epsilon, and the first
    # `steps` steps of the longer run are the same steps.) Resumable: one file per trial
    # under FOLDER/steps-x2/trials/. FACTOR 1 retrains each grid at lo as it ran: the same
    # losses (a check that the store reproduces) and each length's loss (best_by_length_checked,
    # from the best configuration), which trials before 2026-12-02 did not record.
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
MIN_BOOTSTRAP = 5  # finished configurations below which no bootstrap interval is given


def _load_summarize():
    """The replay of a partial sweep, from the CPU sweep's summarize.py (one copy)."""
    spec = importlib.util.spec_from_file_location(
        "st_cpu_summarize", HERE / "state-tracking-cpu" / "summarize.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stored_ns(folder: Path) -> list[int]:
    """Every training-set size some trial of ``folder``'s store was run at."""
    return sorted({int(json.loads(p.read_text(encoding="utf-8"))["spec"]["n_train"])
                   for p in (folder / "trials").glob("*.json")})  # fmt: skip


def store_bracket(spec, store, key, result, ns: list[int], used: dict[str, None]):
    """An open search's bracket tightened by every grid the store holds for ``key``.

    The replay follows the search's own path (``start`` and the multiplier), so a grid run
    on another path (an earlier ``start``, a hand-run N) is not in its bracket. Here ``hi``
    is the smallest N at which some configuration succeeded and ``lo`` the largest N below
    it at which every configuration ran and failed. A finished search is returned as is;
    an open one stays ``open`` (its search has not finished), with the store's points
    appended to its history.
    """
    from mechlab.sweep.runner import succeeded
    from mechlab.sweep.store import trial_key

    if result.status != "open":
        return result
    eps = spec.search.epsilon
    wins, fails = [], []
    for n in ns:
        if n > result.cap:
            continue
        specs = spec.trial_specs(key, n)
        trials = [store.get(s) for s in specs]
        if any(t is not None and succeeded(t, eps) for t in trials):
            wins.append(n)
        elif all(t is not None for t in trials):
            fails.append(n)
        else:
            continue
        for s, t in zip(specs, trials, strict=True):
            if t is not None:
                used[trial_key(s)] = None
    hi = min([*wins, *([result.hi] if result.hi is not None else [])], default=None)
    lo = max([n for n in [*fails, *([result.lo] if result.lo is not None else [])] if hi is None or n < hi],
             default=None)  # fmt: skip
    if (lo, hi) == (result.lo, result.hi):
        return result
    seen = {n for n, _ in result.history}
    history = [*result.history, *[(n, n in wins) for n in sorted({*wins, *fails} - seen)]]
    ratio = hi / lo if hi is not None and lo is not None else None
    return replace(result, n_star=hi, lo=lo, hi=hi, ratio=ratio, history=history)


def replay_all(folder: Path):
    """Every search of ``folder``'s sweep replayed from its store (partial searches ``open``,
    their brackets tightened by :func:`store_bracket`), with kappa and OOD; the same as
    ``summarize.py`` but without its CDN figures."""
    from mechlab.sweep.spec import SweepSpec
    from mechlab.sweep.store import TrialStore

    module = _load_summarize()
    spec = SweepSpec.from_yaml(folder / "sweep.yaml")
    store = TrialStore(folder / "trials")
    used: dict[str, None] = {}
    ns = stored_ns(folder)
    searches = {key: store_bracket(spec, store, key, module.replay(spec, store, key, used), ns, used)
                for key in spec.search_keys()}  # fmt: skip
    return spec, store, module.assemble(spec, store, searches, used)


def _write_figure(fig, name: str) -> Path:
    """An offline HTML page that loads plotly.js from the plotly.min.js beside it."""
    from mechlab.io import atomic_write_text

    FIGURES.mkdir(parents=True, exist_ok=True)
    js = FIGURES / "plotly.min.js"
    if not js.exists():
        import plotly

        shutil.copyfile(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", js)
    fig.update_layout(width=None, height=640, template="plotly_white")
    # A fixed div id (plotly draws a random one), so the same store writes the same bytes.
    html = fig.to_html(include_plotlyjs="directory", full_html=True, div_id=name)
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


def bootstrap_spearman(
    x: list[float], y: list[float], n_boot: int = 4000, seed: int = 0
) -> tuple[float | None, float | None]:
    """95% percentile interval of Spearman's rho over configurations resampled with replacement.

    Resamples in which x or y is constant have no rho and are dropped; ``(None, None)`` when
    fewer than half the resamples have one (e.g. every kappa equal), since an interval over
    the few left would say more than the data do.
    """
    rng = random.Random(seed)
    values = []
    for _ in range(n_boot):
        idx = [rng.randrange(len(x)) for _ in x]
        rho = spearman([x[i] for i in idx], [y[i] for i in idx])
        if not math.isnan(rho):
            values.append(rho)
    if len(values) < n_boot / 2:
        return None, None
    values.sort()
    return values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def kappa_vs_ood(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The kappa-OOD points (one per model, format and task with a kappa and an OOD value),
    Spearman's rho with its bootstrap interval, per token and per sequence.

    Only kappas of finished searches enter the correlation (``in_rank``): an ``open-*``
    kappa comes from brackets a search has not finished narrowing (a stand-in of 1 for a
    length with no failure yet), so its value says nothing about the configuration. The
    open ones stay in ``points`` for the figure. ``n`` counts the correlated points; rho is
    ``None`` with fewer than 3 of them or when no rank varies, and its interval ``None``
    with fewer than :data:`MIN_BOOTSTRAP` (3 points have only 10 distinct resamples).
    """
    points = [r for r in rows if r.get("kappa") is not None and r.get("ood_token_acc") is not None]
    keep = ("sweep", "model", "format", "group", "m", "L", "kappa", "kappa_bound", "kappa_low", "kappa_high",
            "ood_n", "ood_token_acc", "ood_seq_acc")  # fmt: skip
    out: dict[str, Any] = {"points": [
        {**{k: r.get(k) for k in keep}, "in_rank": not str(r.get("kappa_bound")).startswith("open")}
        for r in points]}  # fmt: skip
    ranked = [p for p in out["points"] if p["in_rank"]]
    out["n"] = len(ranked)
    out["n_open"] = len(points) - len(ranked)
    for field in ("ood_token_acc", "ood_seq_acc"):
        x, y = [float(r["kappa"]) for r in ranked], [float(r[field]) for r in ranked]
        rho = spearman(x, y) if len(ranked) >= 3 else float("nan")
        low, high = (
            bootstrap_spearman(x, y)
            if not math.isnan(rho) and len(ranked) >= MIN_BOOTSTRAP
            else (None, None)
        )
        out[field] = {"spearman": None if math.isnan(rho) else rho, "ci95": [low, high]}
    return out


def kappa_ood_figure(summary: dict[str, Any]):
    import plotly.graph_objects as go

    fig = go.Figure()
    symbols = {"outcome": "circle", "acot": "diamond", "cot": "square"}
    colours = {"st_transformer_small": "#1f77b4", "st_lstm_small": "#d62728", "st_dense_ssm_small": "#2ca02c",
               "st_mamba_small": "#9467bd"}  # fmt: skip
    marks = {"lower": ">=", "upper": "<=", "exact": ""}
    for i, p in enumerate(summary["points"]):
        task = "S5" if p["group"] == "s5" else f"Z{p['m']}"
        high = p["kappa_high"] if p["kappa_high"] is not None else p["kappa"] * 10
        fig.add_trace(go.Scatter(
            x=[p["kappa"]], y=[p["ood_token_acc"]], mode="markers+text",
            text=[f"{marks.get(p['kappa_bound'], '')}{p['kappa']:.2f}" if p.get("in_rank", True) else "open"],
            textposition="top center" if i % 2 == 0 else "bottom center",  # neighbours' labels apart
            name=f"{p['model'].replace('st_', '').replace('_small', '')} {p['format']} {task} L={p['L']}"
                 f" ({p['sweep']})" + ("" if p.get("in_rank", True) else ", open"),
            marker={"symbol": symbols.get(p["format"], "circle"), "size": 13,
                    "color": colours.get(p["model"], "grey"), "opacity": 1.0 if p.get("in_rank", True) else 0.35,
                    "line": {"width": 1, "color": "black"}},
            error_x={"type": "data", "symmetric": False, "array": [high - p["kappa"]],
                     "arrayminus": [p["kappa"] - (p["kappa_low"] or p["kappa"])], "thickness": 1},
            hovertext=[f"kappa {p['kappa']:.3g} ({p['kappa_bound']}; range [{p['kappa_low']}, {p['kappa_high']}]), "
                       f"OOD token {p['ood_token_acc']:.2f}, sequence {p['ood_seq_acc']:.2f}, N = {p['ood_n']}"],
        ))  # fmt: skip
    tok = summary.get("ood_token_acc", {})
    if tok.get("spearman") is None:
        rho = "Spearman rho: not defined (fewer than 3 finished kappas, or no rank varies)"
    elif tok["ci95"][0] is None:
        rho = f"Spearman rho = {tok['spearman']:.2f} (no bootstrap interval)"
    else:
        rho = f"Spearman rho = {tok['spearman']:.2f} [95% CI {tok['ci95'][0]:.2f}, {tok['ci95'][1]:.2f}]"
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title=f"OOD accuracy at 2L (per token, chance = 0) against kappa, {summary['n']} finished configurations; "
              f"{rho}<br><sup>error bars: the kappa range the N* brackets allow (an open end drawn at 10x); "
              ">=: lower bound; faint: a search still open (not in the correlation)</sup>",
        xaxis_title="kappa = sum_n N*_n / N*_joint (log scale)", xaxis_type="log",
        yaxis_title="OOD token accuracy (chance-normalised)", legend={"font": {"size": 10}},
    )  # fmt: skip
    return fig


def summarize(folders: list[Path], force: bool = False) -> None:
    """Each store's tables (rewritten in place: ``force`` for a store git tracks), its
    figures in examples/figures, and kappa against OOD over all of them."""
    from mechlab.io import atomic_write_text
    from mechlab.pipelines import outputs, write_outputs
    from mechlab.sweep.outputs import search_rows
    from mechlab.viz.sweep import kappa_figure, n_star_figure

    all_rows = []
    for folder in folders:
        _, _, result = replay_all(folder)
        with outputs.OutputFolder(folder, "sweep", force=force) as out:
            write_outputs(result, out, figures=False)
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
    if summary["points"]:
        _write_figure(kappa_ood_figure(summary), "kappa-vs-ood")
    print(json.dumps({k: v for k, v in summary.items() if k != "points"}))


def check_steps(
    folder: Path, factor: int, models: set[str] | None, formats: set[str] | None, which: str
) -> None:
    """The step-doubling check (see the module docstring); writes FOLDER/steps-xF/check.json."""
    import torch

    from mechlab.io import atomic_write_text
    from mechlab.sweep.runner import succeeded
    from mechlab.sweep.store import TrialStore
    from mechlab.train.dispatch import run_trials

    torch.set_num_threads(1)
    spec, store, result = replay_all(folder)
    out = folder / f"steps-x{factor}"
    check = TrialStore(out / "trials")
    eps = spec.search.epsilon
    rows = []
    for key, r in result.searches.items():
        if (models and key.model not in models) or (formats and key.format not in formats):
            continue
        if (which == "joint" and key.lengths == "fixed") or (
            which == "fixed" and key.lengths != "fixed"
        ):
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
        by_length = min(after, key=lambda a: a["val_loss"]).get("val_loss_by_length")
        if by_length is not None:  # which length kept the best checked configuration above epsilon
            rows[-1]["best_by_length_checked"] = by_length
        print(f"{key.label}: N = {r.lo} best val loss {rows[-1]['best_val_loss']:.3g} at {spec.steps} steps, "
              f"{rows[-1]['best_val_loss_checked']:.3g} at {spec.steps * factor}: "
              f"{'still fails' if still else 'SUCCEEDS: step-limited'}", flush=True)  # fmt: skip
        previous = (
            json.loads((out / "check.json").read_text()) if (out / "check.json").exists() else []
        )
        merged = {p["search"]: p for p in previous} | {x["search"]: x for x in rows}
        atomic_write_text(out / "check.json", json.dumps(list(merged.values()), indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("folders", nargs="+", type=Path)
    s.add_argument("--force", action="store_true", help="rewrite the tables of stores git tracks")
    c = sub.add_parser("check-steps")
    c.add_argument("folder", type=Path)
    c.add_argument("--factor", type=int, default=2)
    c.add_argument("--models")
    c.add_argument("--formats")
    c.add_argument("--which", choices=("joint", "fixed", "all"), default="all")
    args = parser.parse_args(argv)
    if args.command == "summarize":
        summarize(args.folders, force=args.force)
    else:
        if args.factor < 1:
            print(f"decide.py: error: --factor {args.factor}: give a whole factor >= 1 of the steps "
                  "(1 retrains the grid at lo as it ran)", file=sys.stderr)  # fmt: skip
            return 2
        split = lambda v: set(v.split(",")) if v else None  # noqa: E731
        check_steps(args.folder, args.factor, split(args.models), split(args.formats), args.which)
    return 0


if __name__ == "__main__":
    sys.exit(main())
