"""The local-underspecification test (issue 23 item 3): when does label-based recall
appear as the 1-after loss weight w grows?

Reads each run's training log (``metrics.jsonl``: the NiH medians every 250 steps) and its
recall scores per checkpoint (``recall/recall_dynamics.json``, from ``mechlab recall
--checkpoints RUN``), writes ``summary.json`` beside this script and the figure
``examples/figures/underspec-recall.html`` (offline; plotly.min.js beside it).

Run from the repository root::

    # the committed evidence (examples/underspecification/logs/: each run's config.yaml,
    # metrics.jsonl and recall/recall_dynamics.json, no checkpoints)
    python examples/underspecification/analyze.py
    # after training (train_runs.sh) and scoring (mechlab recall --checkpoints RUN --out RUN/recall) under
    # runs/underspec: copy those three files of every run into logs/, then analyse logs/
    python examples/underspecification/analyze.py runs/underspec --collect

A run that has not reached its configured ``steps`` is marked ``partial`` in the summary;
an onset of ``null`` means "not by ``examples_run``". The summary's ``verdicts`` say, for
``follows_0.6``, ``follows_0.9`` and ``nih1_below_0.2``, whether the onset comes earlier as
w grows seed for seed (:func:`verdict`).

Onsets, in examples seen (steps x 64), each the first evaluation at or past the threshold:

- ``nih1_below_0.2``: the 1-after NiH median error (the training log's) <= 0.2;
- ``follows_0.75``: 3/4 of misdirected 1-after predictions land nearer the system the
  label names (0.5 is chance; the recall harness's ``follows_label``);
- ``e_label_0.5``: the label patch moves the 1-after prediction by half the target's scale;
- the transition's width: examples from ``follows_label`` >= 0.6 to >= 0.9, and from a
  1-after error <= 0.3 to <= 0.1.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIGURES = HERE.parent / "figures"
LOGS = HERE / "logs"
EVIDENCE = ("config.yaml", "metrics.jsonl", "recall/recall_dynamics.json")


def first_at(xs: list[float], ys: list[float], test) -> float | None:
    """The first x whose y passes ``test`` (None if none does)."""
    return next((x for x, y in zip(xs, ys, strict=True) if y is not None and test(y)), None)


def read_run(run: Path) -> dict[str, Any]:
    """One run's curves: the training log's NiH medians and the recall scores per checkpoint."""
    evals = [
        r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "eval" in r
    ]
    import yaml

    cfg = (
        yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").exists() else {}
    )
    out: dict[str, Any] = {
        "run": run.name,
        "steps_planned": cfg.get("steps"),
        "steps_logged": evals[-1]["step"] if evals else 0,
        "w": float(re.search(r"w([0-9.]+)-", run.name).group(1)),
        "seed": int(re.search(r"seed([0-9]+)", run.name).group(1)),
        "log_examples": [r["examples"] for r in evals],
        **{f"nih{j}": [r["eval"][f"nih_{j}_after"] for r in evals] for j in (1, 2, 3)},
    }
    dyn_path = run / "recall" / "recall_dynamics.json"
    if dyn_path.exists():
        dyn = json.loads(dyn_path.read_text())
        one = dyn["per_offset"]["1"]
        out.update({"ckpt_examples": dyn["examples"], "e_label": one["e_label"], "follows": one["follows_label"],
                    "scale": one["scale"][0], "ckpt_nih1": dyn["errors"]["clean"]["1"],
                    "ckpt_nih2": dyn["errors"]["clean"]["2"],
                    "e_obs2": dyn["per_offset"]["2"]["e_obs"]})  # fmt: skip
    return out


def onsets(r: dict[str, Any]) -> dict[str, Any]:
    """The onset examples and transition widths of one run (see the module docstring)."""
    x, e1 = r["log_examples"], r["nih1"]
    partial = r["steps_planned"] is None or r["steps_logged"] < r["steps_planned"]
    o: dict[str, Any] = {"run": r["run"], "w": r["w"], "seed": r["seed"], "partial": partial,
                         "steps_logged": r["steps_logged"], "steps_planned": r["steps_planned"],
                         "examples_run": x[-1] if x else 0,
                         "nih1_below_0.3": first_at(x, e1, lambda v: v <= 0.3),
                         "nih1_below_0.2": first_at(x, e1, lambda v: v <= 0.2),
                         "nih1_below_0.1": first_at(x, e1, lambda v: v <= 0.1),
                         "nih2_below_0.2": first_at(x, r["nih2"], lambda v: v <= 0.2),
                         "final_nih1": e1[-1] if e1 else None}  # fmt: skip
    if o["nih1_below_0.3"] is not None and o["nih1_below_0.1"] is not None:
        o["nih1_width_0.3_to_0.1"] = o["nih1_below_0.1"] - o["nih1_below_0.3"]
    if "ckpt_examples" in r:
        # Skip the untrained checkpoints (< 2000 examples), whose output moves with any input.
        pairs = [(xx, f, e) for xx, f, e in zip(r["ckpt_examples"], r["follows"], r["e_label"], strict=True)
                 if xx >= 2000]  # fmt: skip
        cx, fl, el = [p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs]
        o.update({"follows_0.6": first_at(cx, fl, lambda v: v >= 0.6),
                  "follows_0.75": first_at(cx, fl, lambda v: v >= 0.75),
                  "follows_0.9": first_at(cx, fl, lambda v: v >= 0.9),
                  "e_label_0.5": first_at(cx, el, lambda v: v >= 0.5 * r["scale"]),
                  "final_follows": fl[-1] if fl else None})  # fmt: skip
        if o["follows_0.6"] is not None and o["follows_0.9"] is not None:
            o["follows_width_0.6_to_0.9"] = o["follows_0.9"] - o["follows_0.6"]
    return o


ONSETS = ("follows_0.6", "follows_0.9", "nih1_below_0.2")


def _onset(o: dict[str, Any], key: str) -> float:
    """An onset in examples; a run that never got there counts as after its last example."""
    v = o.get(key)
    return float("inf") if v is None else float(v)


def verdict(table: list[dict[str, Any]], key: str = "follows_0.6") -> dict[str, Any]:
    """Does the onset ``key`` come earlier as w grows, seed for seed?

    For each pair of arms (w_lo < w_hi): ``earlier`` when every seed of w_hi reaches the onset
    before every seed of w_lo, ``later`` when every seed of w_hi reaches it after every seed
    of w_lo, ``overlap`` otherwise (a run that never reaches it counts as after its end).
    The hypothesis holds when every pair is ``earlier``, fails when some pair is ``later``,
    and is undecided otherwise, or with fewer than two finished seeds in some arm.
    """
    arms: dict[float, list[float]] = {}
    partial = False
    for o in table:
        if key.startswith("follows") and key not in o:
            continue  # no recall scores for this run
        partial |= bool(o["partial"])
        arms.setdefault(o["w"], []).append(_onset(o, key))
    ws = sorted(arms)
    pairs = []
    for i, lo in enumerate(ws):
        for hi in ws[i + 1 :]:
            a, b = arms[lo], arms[hi]
            order = "earlier" if max(b) < min(a) else "later" if min(b) > max(a) else "overlap"
            pairs.append({"w_lo": lo, "w_hi": hi, "order": order})
    enough = bool(ws) and not partial and all(len(arms[w]) >= 2 for w in ws)
    if enough and pairs and all(p["order"] == "earlier" for p in pairs):
        result = "holds"
    elif enough and any(p["order"] == "later" for p in pairs):
        result = "fails"
    else:
        result = "undecided"
    return {"onset": key, "verdict": result, "seeds_per_arm": {f"{w:g}": len(arms[w]) for w in ws},
            "onsets": {f"{w:g}": [None if v == float("inf") else v for v in arms[w]] for w in ws},
            "pairs": pairs}  # fmt: skip


def figure(runs: list[dict[str, Any]]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    colours = {1.0: "#1f77b4", 4.0: "#ff7f0e", 16.0: "#d62728", 64.0: "#9467bd"}
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=(
        "NiH median error, 1-after (solid) and 2-after (dotted), training log (500 traces, study NiH)",
        "follows_label at 1-after: misdirected predictions nearer the named system (0.5: chance)",
        "E_label at 1-after: how far the label patch moves the prediction (target scale ~1)"))  # fmt: skip
    for r in runs:
        name, c = f"w = {r['w']:g}, seed {r['seed']}", colours.get(r["w"], "grey")
        dash = "solid" if r["seed"] == 0 else "dash"
        group = f"{r['w']:g}-{r['seed']}"
        fig.add_trace(go.Scatter(x=r["log_examples"], y=r["nih1"], name=name, legendgroup=group,
                                 line={"color": c, "dash": dash}), row=1, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(x=r["log_examples"], y=r["nih2"], name=f"{name}, 2-after", legendgroup=group,
                                 showlegend=False, line={"color": c, "dash": "dot", "width": 1}), row=1, col=1)  # fmt: skip
        if "ckpt_examples" in r:
            keep = [i for i, x in enumerate(r["ckpt_examples"]) if x >= 2000]
            xs = [r["ckpt_examples"][i] for i in keep]
            fig.add_trace(go.Scatter(x=xs, y=[r["follows"][i] for i in keep], name=name, legendgroup=group,
                                     showlegend=False, mode="lines+markers", marker={"size": 4},
                                     line={"color": c, "dash": dash}), row=2, col=1)  # fmt: skip
            fig.add_trace(go.Scatter(x=xs, y=[r["e_label"][i] for i in keep], name=name, legendgroup=group,
                                     showlegend=False, mode="lines+markers", marker={"size": 4},
                                     line={"color": c, "dash": dash}), row=3, col=1)  # fmt: skip
    fig.add_hline(y=0.2, line_dash="dot", line_color="grey", row=1, col=1)
    fig.add_hline(y=0.75, line_dash="dot", line_color="grey", row=2, col=1)
    fig.update_yaxes(title_text="squared error", type="log", row=1, col=1)
    fig.update_yaxes(title_text="fraction", row=2, col=1)
    fig.update_yaxes(title_text="E_label", row=3, col=1)
    fig.update_xaxes(title_text="examples seen (steps x 64)", row=3, col=1)
    partial = [f"w = {r['w']:g} seed {r['seed']} ({r['steps_logged']}/{r['steps_planned']} steps)"
               for r in runs if r["steps_planned"] is None or r["steps_logged"] < r["steps_planned"]]  # fmt: skip
    note = f"<br><sup>partial runs: {', '.join(partial)}</sup>" if partial else ""
    fig.update_layout(height=1000, template="plotly_white",
                      title="recall-cpu with the 1-after loss weighted by w: when does label-based recall appear?"
                            + note)  # fmt: skip
    return fig


def collect(runs_dir: Path, logs: Path = LOGS) -> list[Path]:
    """Copy each run's small evidence files (:data:`EVIDENCE`) into ``logs/<run>/``."""
    from mechlab.io import atomic_write_text

    copied = []
    for run in sorted(runs_dir.glob("w*-seed*")):
        for name in EVIDENCE:
            if (run / name).exists():
                copied.append(atomic_write_text(logs / run.name / name, (run / name).read_text()))
    return copied


def main(runs_dir: Path) -> dict[str, Any]:
    import shutil

    from mechlab.io import atomic_write_text

    runs = [
        read_run(p) for p in sorted(runs_dir.glob("w*-seed*")) if (p / "metrics.jsonl").exists()
    ]
    runs.sort(key=lambda r: (r["w"], r["seed"]))
    table = [onsets(r) for r in runs]
    root = HERE.parent.parent
    where = runs_dir.resolve()
    summary = {
        "runs_dir": str(where.relative_to(root) if where.is_relative_to(root) else where),
        "onsets": table,
        "verdicts": [verdict(table, key) for key in ONSETS],
    }
    atomic_write_text(HERE / "summary.json", json.dumps(summary, indent=1) + "\n")
    FIGURES.mkdir(parents=True, exist_ok=True)
    js = FIGURES / "plotly.min.js"
    if not js.exists():
        import plotly

        shutil.copyfile(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", js)
    html = figure(runs).to_html(
        include_plotlyjs="directory", full_html=True, div_id="underspec-recall"
    )
    atomic_write_text(FIGURES / "underspec-recall.html", html)
    for o in table:
        print(json.dumps(o))
    for v in summary["verdicts"]:
        print(json.dumps(v))
    return summary


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--collect"]
    source = Path(args[0]) if args else LOGS
    if "--collect" in sys.argv[1:]:
        if source.resolve() == LOGS.resolve():
            sys.exit(
                "analyze.py: --collect copies from a runs directory into logs/; name it (runs/underspec)"
            )
        collect(source)
        source = LOGS
    main(source)
