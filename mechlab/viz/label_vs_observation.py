"""Figures of the label- vs observation-based recall analysis (:mod:`mechlab.label_vs_observation`)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

_PROBES = ("clean", "misdirect_incorrect", "sync_rotations", "misdirect_unseen", "misdirect_restart")


def _head_grid(components: list[dict[str, Any]], offset: int = 1) -> tuple[list[str], list[str], list[list]]:
    """Layer x head grid of the label patch's noising fractions at ``offset``."""
    rows = [c for c in components if c["patch"] == "label" and c["direction"] == "noise"
            and c["offset"] == offset and c["head"] >= 0]  # fmt: skip
    if not rows:
        return [], [], []
    n_layers = max(c["layer"] for c in rows) + 1
    n_heads = max(c["head"] for c in rows) + 1
    z: list[list] = [[None] * n_heads for _ in range(n_layers)]
    for c in rows:
        z[c["layer"]][c["head"]] = c["fraction"]
    return [f"h{h}" for h in range(n_heads)], [f"layer {i}" for i in range(n_layers)], z


def recall_figure(report: dict[str, Any]) -> go.Figure:
    """The figure of one recall report (:func:`mechlab.pipelines.recall_checkpoint`'s dict).

    Panels: errors per offset under each probe (median, quartile bars); the label and
    observation patches' effects; the score and ``follows_label`` per offset with the
    verdicts; which heads carry the label patch to the 1-after prediction.

    Args:
        report: ``{"step": ..., "result": RecallReport.to_dict()}``.

    Returns:
        A plotly figure.
    """
    r = report["result"]
    xs = [f"{j}-after" for j in r["offsets"]]
    keys = [str(j) for j in r["offsets"]]
    per = r["per_offset"]
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "Squared error under each probe (median, quartiles)",
        "Patch effect: mean squared change of the prediction",
        "Label vs observation score (1 = follows the label)",
        "Label patch at the query label: fraction carried per head (1-after)",
    ), vertical_spacing=0.14, horizontal_spacing=0.1)  # fmt: skip
    for probe in _PROBES:
        e = r["errors"].get(probe)
        if e is None:
            continue
        med = [e[k]["median"] for k in keys]
        fig.add_trace(go.Bar(
            x=xs, y=med, name=probe, legendgroup="errors",
            error_y={"type": "data", "symmetric": False,
                     "array": [e[k]["q3"] - e[k]["median"] for k in keys],
                     "arrayminus": [e[k]["median"] - e[k]["q1"] for k in keys]},
        ), row=1, col=1)  # fmt: skip
    for key, name in (("e_label", "label patch (token p)"), ("e_obs", "observation patch (token p+1)"),
                      ("e_obs_all", "all observations patched")):  # fmt: skip
        fig.add_trace(go.Bar(x=xs, y=[per[k][key] for k in keys], name=name, legendgroup="effects"), row=1, col=2)
    score = [per[k]["score"] for k in keys]
    fig.add_trace(go.Scatter(
        x=xs, y=score, mode="lines+markers+text", name="score (label / (label + obs))",
        text=[per[k]["verdict"] for k in keys], textposition="top center",
    ), row=2, col=1)  # fmt: skip
    fig.add_trace(go.Scatter(x=xs, y=[per[k]["score_all"] for k in keys], mode="lines+markers",
                             name="score vs all observations", line={"dash": "dash"}), row=2, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[per[k]["follows_label"] for k in keys], mode="lines+markers",
                             name="misdirected: closer to the label's system", line={"dash": "dot"}),
                  row=2, col=1)  # fmt: skip
    rule = r["rule"]
    for y in (rule["label_at"], rule["observation_at"]):
        fig.add_hline(y=y, line_dash="dot", line_color="grey", row=2, col=1)
    heads, layers, z = _head_grid(r.get("components", []))
    if z:
        fig.add_trace(go.Heatmap(x=heads, y=layers, z=z, colorscale="Viridis", zmin=0, zmax=1,
                                 colorbar={"title": "fraction", "x": 1.02, "y": 0.22, "len": 0.45}),
                      row=2, col=2)  # fmt: skip
    fig.update_yaxes(type="log", title_text="squared error", row=1, col=1)
    fig.update_yaxes(title_text="mean squared change", row=1, col=2)
    fig.update_yaxes(range=[-0.05, 1.1], title_text="score / fraction", row=2, col=1)
    fig.update_layout(
        barmode="group", height=850,
        title=f"Label- vs observation-based recall (step {report.get('step')}, "
              f"{r['n_haystack']} haystack systems of {r['seg_len']}, {r['n_traces']} traces)",
    )  # fmt: skip
    return fig


def recall_dynamics_figure(report: dict[str, Any]) -> go.Figure:
    """The scores per offset across a run's checkpoints (:func:`mechlab.pipelines.recall_dynamics`).

    Args:
        report: The dict :func:`mechlab.pipelines.recall_dynamics` returns.

    Returns:
        A plotly figure: score, ``follows_label`` and the clean error vs examples seen.
    """
    ex = report["examples"]
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "Score (1 = follows the label)", "Misdirected: closer to the label's system", "Clean error (median)",
    ))  # fmt: skip
    for j, values in report["per_offset"].items():
        score = [float("nan") if s is None else s for s in values["score"]]
        fig.add_trace(go.Scatter(x=ex, y=score, mode="lines+markers", name=f"{j}-after", legendgroup=j,
                                 text=values["verdict"]), row=1, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(x=ex, y=values["follows_label"], mode="lines+markers", name=f"{j}-after",
                                 legendgroup=j, showlegend=False), row=1, col=2)  # fmt: skip
        fig.add_trace(go.Scatter(x=ex, y=report["errors"]["clean"][j], mode="lines+markers",
                                 name=f"{j}-after", legendgroup=j, showlegend=False), row=1, col=3)
    fig.update_xaxes(type="log", title_text="examples seen")
    fig.update_yaxes(range=[-0.05, 1.05], row=1, col=1)
    fig.update_yaxes(range=[-0.05, 1.05], row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=3)
    fig.update_layout(title="When each mechanism appears: recall scores across training", height=450)
    return fig
