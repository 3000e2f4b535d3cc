"""Starting vs continuing a translation over training steps
(:func:`mechlab.pipelines.translation.translation_across_training`'s ``across.json``)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLORS = {"symbolic": "#d62728", "semantic": "#1f77b4"}
DASH = {"start": "solid", "continue": "dash"}


def translation_figure(summary: dict[str, Any]) -> go.Figure:
    """Start and continue accuracy over steps for both label kinds, with bootstrap bands,
    each curve's emergence step (a diamond on the threshold, its interval as error bars),
    below the start-continue gap and, when the summary has misdirected prompts, the share
    of them whose start and continuation follow the label; the verdict in the title.

    Args:
        summary: ``across.json``'s content (``steps``, ``threshold``, ``curves``, ``gap``,
            ``emergence``, ``verdict``).

    Returns:
        The figure.

    Raises:
        ValueError: A summary without steps.
    """
    steps = summary["steps"]
    if not steps:
        raise ValueError("the summary has no steps")
    threshold = summary["threshold"]
    misdirection = summary.get("misdirection") or {}
    rows = 3 if misdirection else 2
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        row_heights=[0.5, 0.25, 0.25][:rows] if misdirection else [0.7, 0.3],
                        subplot_titles=("accuracy of the answer's token", "start minus continue",
                                        "misdirected: follows the label")[:rows])  # fmt: skip
    for kind, curves in summary["curves"].items():
        for pos, curve in curves.items():
            name = f"{kind} {pos}"
            fig.add_trace(go.Scatter(
                x=steps, y=[p["mean"] for p in curve], mode="lines+markers", name=name, legendgroup=name,
                line={"color": COLORS.get(kind), "dash": DASH.get(pos)},
                error_y={"type": "data", "symmetric": False, "array": [p["high"] - p["mean"] for p in curve],
                         "arrayminus": [p["mean"] - p["low"] for p in curve], "thickness": 1},
            ), row=1, col=1)  # fmt: skip
            e = summary["emergence"][kind][pos]
            if e["step"] is not None:
                plus = None if e["high"] is None else e["high"] - e["step"]
                minus = None if e["low"] is None else e["step"] - e["low"]
                fig.add_trace(go.Scatter(
                    x=[e["step"]], y=[threshold], mode="markers", legendgroup=name, showlegend=False,
                    marker={"symbol": "diamond", "size": 11, "color": COLORS.get(kind)},
                    error_x={"type": "data", "symmetric": False, "array": [plus or 0], "arrayminus": [minus or 0]},
                    hovertext=f"{name} emerges at step {e['step']} [{e['low']}, {e['high']}]", hoverinfo="text",
                ), row=1, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(x=steps, y=summary["gap"][kind], mode="lines+markers", name=f"{kind} gap",
                                 line={"color": COLORS.get(kind)}), row=2, col=1)  # fmt: skip
    for kind, positions in misdirection.items():
        for pos, curve in positions.items():
            fig.add_trace(go.Scatter(
                x=steps, y=[p["mean"] for p in curve], mode="lines+markers", name=f"misdirected {kind} {pos}",
                line={"color": COLORS.get(kind), "dash": DASH.get(pos)},
                error_y={"type": "data", "symmetric": False, "array": [p["high"] - p["mean"] for p in curve],
                         "arrayminus": [p["mean"] - p["low"] for p in curve], "thickness": 1},
            ), row=3, col=1)  # fmt: skip
    if misdirection:
        fig.update_yaxes(range=[-0.02, 1.02], row=3, col=1)
    fig.add_hline(y=threshold, line={"dash": "dot", "color": "grey"}, row=1, col=1)
    fig.add_hline(y=0, line={"color": "grey", "width": 1}, row=2, col=1)
    fig.update_xaxes(title_text="training step", row=rows, col=1)
    fig.update_yaxes(range=[-0.02, 1.02], row=1, col=1)
    fig.update_layout(title={"text": f"Starting vs continuing a translation<br><sup>{summary['verdict']}</sup>"},
                      template="plotly_white", height=650 + 200 * (rows - 2))  # fmt: skip
    return fig
