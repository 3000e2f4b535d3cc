"""Circuits through training beside the behaviour (issue 23 item 4): when does each run's
final circuit form, against when its label-based recall appears?

Reads every ``across.json`` written by ``mechlab prune --checkpoints RUN`` under
``examples/underspecification/through-training/<run>/`` and ``circuits/recall-cpu/
through-training*/`` (the bundled run), and each run's recall scores per checkpoint
(``logs/<run>/recall/recall_dynamics.json``; the bundled run's
``examples/checkpoints/recall-cpu/recall/recall_dynamics.json``). Writes
``through_training.json`` beside this script and the figure
``examples/figures/underspec-circuits.html`` (offline; plotly.min.js beside it).

Per run, method and target: ``jaccard_0.5_at`` / ``jaccard_0.9_at``, the first checkpoint
(examples seen) whose circuit has Jaccard >= 0.5 / 0.9 with the last checkpoint's, and
beside them the behaviour's onsets at 1-after (``follows_label`` >= 0.6 and >= 0.9, from
checkpoints past 2000 examples, as in ``analyze.py``). Run from the repository root::

    python examples/underspecification/circuits.py
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FIGURES = HERE.parent / "figures"
BUNDLED_RECALL = ROOT / "examples" / "checkpoints" / "recall-cpu" / "recall" / "recall_dynamics.json"


def first_at(xs: list[float], ys: list[float], threshold: float) -> float | None:
    """The first x whose y is at or past ``threshold`` (None if none is)."""
    return next((x for x, y in zip(xs, ys, strict=True) if y is not None and y >= threshold), None)


def sources(here: Path = HERE, root: Path = ROOT) -> list[dict[str, Any]]:
    """Every through-training folder with the run's label and its recall scores' path."""
    found = []
    for across in sorted((here / "through-training").glob("*/across.json")):
        run = across.parent.name
        found.append({"run": run, "across": across,
                      "recall": here / "logs" / run / "recall" / "recall_dynamics.json"})  # fmt: skip
    for across in sorted((root / "circuits" / "recall-cpu").glob("through-training*/across.json")):
        found.append({"run": "bundled recall-cpu (w = 1, seed 0)", "across": across,
                      "recall": root / BUNDLED_RECALL.relative_to(ROOT)})  # fmt: skip
    return found


def read_source(src: dict[str, Any]) -> dict[str, Any]:
    """One folder's circuits (per target: examples, Jaccard with the last) and behaviour."""
    across = json.loads(Path(src["across"]).read_text())
    names = next(iter(across["settings"]["circuits"].values()))
    # `1-after_exact_seed0` (an attribution method's tag), `1-after_seed0` (edge pruning)
    method = re.match(r"[^_]+(?:_(.+))?_seed\d+$", next(iter(names))).group(1) or "prune"
    out: dict[str, Any] = {"run": src["run"], "method": method, "every": across["every"],
                           "folder": Path(src["across"]).parent.name, "targets": {}}  # fmt: skip
    for target, t in across["targets"].items():
        xs = [c["examples"] for c in t["checkpoints"]]
        jac = [c["jaccard_with_last"] for c in t["checkpoints"]]
        out["targets"][target] = {"examples": xs, "jaccard_with_last": jac,
                                  "faithfulness": [c["faithfulness"] for c in t["checkpoints"]],
                                  "jaccard_0.5_at": first_at(xs, jac, 0.5),
                                  "jaccard_0.9_at": first_at(xs, jac, 0.9)}  # fmt: skip
    recall = Path(src["recall"])
    if recall.exists():
        dyn = json.loads(recall.read_text())
        keep = [i for i, x in enumerate(dyn["examples"]) if x >= 2000]  # untrained: chance
        xs = [dyn["examples"][i] for i in keep]
        fl = [dyn["per_offset"]["1"]["follows_label"][i] for i in keep]
        out.update({"recall_examples": xs, "follows": fl,
                    "follows_0.6": first_at(xs, fl, 0.6), "follows_0.9": first_at(xs, fl, 0.9)})  # fmt: skip
    return out


def figure(rows: list[dict[str, Any]]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    by_w = {"1": "#1f77b4", "4": "#ff7f0e", "16": "#d62728"}  # analyze.py's colours

    def colour_of(run: str) -> str:
        m = re.match(r"w([0-9.]+)-seed", run)
        return by_w.get(m.group(1), "#9467bd") if m else "#2ca02c"

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07, subplot_titles=(
        "behaviour: follows_label at 1-after (0.5: chance)",
        "1-after circuit: Jaccard with the last checkpoint's circuit",
        "2-after circuit: Jaccard with the last checkpoint's circuit"))  # fmt: skip
    for r in rows:
        colour = colour_of(r["run"])
        dash = "solid" if r["method"] == "exact" else "dash"
        name = f"{r['run']}, {r['method']}"
        if "follows" in r and r is next(x for x in rows if x["run"] == r["run"]):
            fig.add_trace(go.Scatter(x=r["recall_examples"], y=r["follows"], name=f"{r['run']} behaviour",
                                     mode="lines+markers", marker={"size": 4}, legendgroup=r["run"],
                                     line={"color": colour, "dash": "dot"}), row=1, col=1)  # fmt: skip
        for row, target in ((2, "1-after"), (3, "2-after")):
            t = r["targets"].get(target)
            if t is None:
                continue
            fig.add_trace(go.Scatter(x=t["examples"], y=t["jaccard_with_last"], name=name,
                                     showlegend=row == 2, legendgroup=r["run"], mode="lines+markers",
                                     marker={"size": 5}, line={"color": colour, "dash": dash},
                                     customdata=t["faithfulness"],
                                     hovertemplate="%{x:.3s} examples<br>Jaccard %{y:.2f}<br>"
                                                   "faithfulness %{customdata:.3f}"),
                          row=row, col=1)  # fmt: skip
    fig.add_hline(y=0.6, line_dash="dot", line_color="grey", row=1, col=1)
    for row in (1, 2, 3):
        fig.update_yaxes(range=[0, 1.02], title_text="follows_label" if row == 1 else "Jaccard", row=row, col=1)
    fig.update_xaxes(title_text="examples seen (steps x 64)", row=3, col=1)
    fig.update_layout(height=1000, template="plotly_white", legend={"groupclick": "togglegroup"},
                      title="Circuits through training: when does the last checkpoint's circuit form, "
                            "against label recall?<br><sup>solid: exact ablation, dashed: edge pruning; "
                            "25 edges, seed 0's traces; dotted: follows_label</sup>")  # fmt: skip
    return fig


def main(here: Path = HERE, root: Path = ROOT, figures: Path = FIGURES) -> dict[str, Any]:
    from mechlab.io import atomic_write_text

    rows = [read_source(s) for s in sources(here, root)]
    keep = ("run", "method", "folder", "every", "follows_0.6", "follows_0.9")
    summary = {"runs": [{**{k: r.get(k) for k in keep},
                         "targets": {t: {k: v[k] for k in ("jaccard_0.5_at", "jaccard_0.9_at")}
                                     for t, v in r["targets"].items()}} for r in rows]}  # fmt: skip
    atomic_write_text(here / "through_training.json", json.dumps(summary, indent=1) + "\n")
    figures.mkdir(parents=True, exist_ok=True)
    js = figures / "plotly.min.js"
    if not js.exists():
        import plotly

        shutil.copyfile(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", js)
    html = figure(rows).to_html(include_plotlyjs="directory", full_html=True, div_id="underspec-circuits")
    atomic_write_text(figures / "underspec-circuits.html", html)
    for r in summary["runs"]:
        print(json.dumps(r))
    return summary


if __name__ == "__main__":
    main()
