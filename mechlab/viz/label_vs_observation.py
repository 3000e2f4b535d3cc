"""Figures of the label- vs observation-based recall analysis (:mod:`mechlab.label_vs_observation`)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mechlab.viz.figures import colour_range, readable_log_axes

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


_PANELS = (
    "Squared error under each probe (median, quartiles)",
    "Patch effect: mean squared change of the prediction",
    "Score: 1 = follows the label, 0 = the observations (verdict under each offset)",
    "Label patch: fraction carried per head (1-after)",
)


def _legend(row_top: float) -> dict[str, Any]:
    """A legend beside its own panel, top-aligned with it."""
    return {"x": 1.02, "xanchor": "left", "y": row_top, "yanchor": "top", "tracegroupgap": 2,
            "font": {"size": 11}}  # fmt: skip


def recall_figure(report: dict[str, Any]) -> go.Figure:
    """The figure of one recall report (:func:`mechlab.pipelines.recall_checkpoint`'s dict).

    Four panels, one above the other (so that they hold at 800 px), each with its legend
    beside it: errors per offset under each probe (median, quartile bars); the label and
    observation patches' effects; the score and ``follows_label`` per offset, the verdict
    under each offset's name and the verdict thresholds (1/3, 2/3) as dotted lines; which
    heads carry the label patch to the 1-after prediction (every layer and head labelled).

    Args:
        report: ``{"step": ..., "result": RecallReport.to_dict()}``.

    Returns:
        A plotly figure.
    """
    r = report["result"]
    xs = [f"{j}-after" for j in r["offsets"]]
    keys = [str(j) for j in r["offsets"]]
    per = r["per_offset"]
    heads, layers, z = _head_grid(r.get("components", []))
    n_rows = 4 if z else 3
    fig = make_subplots(rows=n_rows, cols=1, subplot_titles=_PANELS[:n_rows], vertical_spacing=0.07)
    for probe in _PROBES:
        e = r["errors"].get(probe)
        if e is None:
            continue
        med = [e[k]["median"] for k in keys]
        fig.add_trace(go.Bar(
            x=xs, y=med, name=probe, legend="legend",
            error_y={"type": "data", "symmetric": False,
                     "array": [e[k]["q3"] - e[k]["median"] for k in keys],
                     "arrayminus": [e[k]["median"] - e[k]["q1"] for k in keys]},
        ), row=1, col=1)  # fmt: skip
    for key, name in (("e_label", "label patch (token p)"), ("e_obs", "observation patch (token p+1)"),
                      ("e_obs_all", "all observations patched")):  # fmt: skip
        fig.add_trace(go.Bar(x=xs, y=[per[k][key] for k in keys], name=name, legend="legend2"), row=2, col=1)
    score = [per[k]["score"] for k in keys]
    verdicts = [per[k]["verdict"] for k in keys]
    fig.add_trace(go.Scatter(
        x=xs, y=score, mode="lines+markers", name="score: label / (label + obs)", legend="legend3",
        hovertext=[f"{x}: {v}" for x, v in zip(xs, verdicts, strict=True)], hoverinfo="text+y",
    ), row=3, col=1)  # fmt: skip
    fig.add_trace(go.Scatter(x=xs, y=[per[k]["score_all"] for k in keys], mode="lines+markers",
                             name="score vs all observations", line={"dash": "dash"}, legend="legend3"),
                  row=3, col=1)  # fmt: skip
    fig.add_trace(go.Scatter(x=xs, y=[per[k]["follows_label"] for k in keys], mode="lines+markers",
                             name="misdirected: closer to the label's system", line={"dash": "dot"},
                             legend="legend3"), row=3, col=1)  # fmt: skip
    rule = r["rule"]
    for y, name in ((rule["label_at"], f"≥ {rule['label_at']:.2f}: label"),
                    (rule["observation_at"], f"≤ {rule['observation_at']:.2f}: observation")):  # fmt: skip
        fig.add_trace(go.Scatter(
            x=[xs[0], xs[-1]], y=[y, y], mode="lines", name=f"verdict threshold {name}", legend="legend3",
            line={"dash": "dot", "color": "grey", "width": 1}, hoverinfo="skip",
        ), row=3, col=1)  # fmt: skip
    fig.update_xaxes(tickvals=xs, ticktext=[f"{x}<br><b>{v}</b>" for x, v in zip(xs, verdicts, strict=True)],
                     row=3, col=1)  # fmt: skip
    if z:
        zmin, zmax, bar = colour_range(z, "fraction")  # a head can carry more than the whole patch (> 1)
        fig.add_trace(go.Heatmap(
            x=heads, y=layers, z=z, colorscale="Viridis", zmin=zmin, zmax=zmax, xgap=1, ygap=1,
            colorbar={"title": {"text": bar}, "yanchor": "bottom", "thickness": 14},
            hovertemplate="%{y} %{x}: %{z:.2f}<extra></extra>",
        ), row=4, col=1)  # fmt: skip
        fig.update_yaxes(tickmode="array", tickvals=layers, ticktext=layers, autorange="reversed", row=4, col=1)
        fig.update_xaxes(tickmode="array", tickvals=heads, ticktext=heads, row=4, col=1)
    fig.update_yaxes(type="log", title_text="squared error", row=1, col=1)
    fig.update_yaxes(title_text="mean sq. change", row=2, col=1)
    fig.update_yaxes(range=[-0.05, 1.1], title_text="score / fraction", row=3, col=1)
    tops = [fig.layout[f"yaxis{'' if i == 1 else i}"].domain[1] for i in range(1, n_rows + 1)]
    if z:  # the colour bar beside its panel, no taller than it
        low, high = fig.layout.yaxis4.domain
        fig.update_traces(colorbar={"y": low, "len": 0.85 * (high - low)}, selector={"type": "heatmap"})
    fig.update_layout(
        barmode="group", height=330 * n_rows + 120, margin={"t": 110, "r": 30},
        title={"text": f"Label- vs observation-based recall<br><sup>step {report.get('step')}, "
                       f"{r['n_haystack']} haystack systems of {r['seg_len']}, {r['n_traces']} traces</sup>"},
        legend=_legend(tops[0]), legend2=_legend(tops[1]), legend3=_legend(tops[2]),
    )  # fmt: skip
    return readable_log_axes(fig)


def recall_dynamics_figure(report: dict[str, Any]) -> go.Figure:
    """The scores per offset across a run's checkpoints (:func:`mechlab.pipelines.recall_dynamics`).

    Args:
        report: The dict :func:`mechlab.pipelines.recall_dynamics` returns.

    Returns:
        A plotly figure: score, ``follows_label`` and the clean error vs examples seen.
    """
    ex = report["examples"]
    # one panel above the other, sharing the x axis, so that the titles hold at 800 px
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=(
        "Score (1 = follows the label)", "Misdirected: closer to the label's system", "Clean error (median)",
    ))  # fmt: skip
    for j, values in report["per_offset"].items():
        score = [float("nan") if s is None else s for s in values["score"]]
        fig.add_trace(go.Scatter(x=ex, y=score, mode="lines+markers", name=f"{j}-after", legendgroup=j,
                                 text=values["verdict"]), row=1, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(x=ex, y=values["follows_label"], mode="lines+markers", name=f"{j}-after",
                                 legendgroup=j, showlegend=False), row=2, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(x=ex, y=report["errors"]["clean"][j], mode="lines+markers",
                                 name=f"{j}-after", legendgroup=j, showlegend=False), row=3, col=1)
    fig.update_xaxes(type="log")
    fig.update_xaxes(title_text="examples seen", row=3, col=1)
    fig.update_yaxes(range=[-0.05, 1.05], row=1, col=1)
    fig.update_yaxes(range=[-0.05, 1.05], row=2, col=1)
    fig.update_yaxes(type="log", row=3, col=1)
    fig.update_layout(title="When each mechanism appears: recall scores across training", height=900,
                      legend={"title": {"text": "offset"}})  # fmt: skip
    return readable_log_axes(fig)
