"""Figure of faithfulness curves across edge budgets (:mod:`mechlab.prune.curves`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import plotly.colors
import plotly.graph_objects as go

from mechlab.viz.figures import legend_below, readable_log_axes

if TYPE_CHECKING:
    from mechlab.prune.curves import FaithfulnessCurve

_COLOURS = {"interchange": "#1f77b4", "mean": "#2ca02c", "zero": "#d62728"}
_OTHER = plotly.colors.qualitative.D3  # ten colours: one per curve of several targets


def faithfulness_curves_figure(
    curves: Mapping[str, FaithfulnessCurve] | Sequence[FaithfulnessCurve],
    title: str | None = None,
) -> go.Figure:
    """Faithfulness (solid) and complement faithfulness (dashed) against the edge budget.

    The x axis is the budget in percent of the graph's edges, logarithmic, so the 0 %
    anchor is left out (its values are 0 and 1 by construction); one colour per curve
    (per ablation when all share a target), CPR and CMD in the legend, the edge count in
    the hover text.

    Args:
        curves: Curves (e.g. the dict :func:`mechlab.prune.curves.sweep` returns).
        title: Figure title (default: the target(s) and the edge count).

    Returns:
        The plotly figure.
    """
    items = list(curves.values()) if isinstance(curves, Mapping) else list(curves)
    if not items:
        raise ValueError("no curve to plot; give at least one FaithfulnessCurve")
    several_targets = len({c.target for c in items}) > 1
    fig = go.Figure()
    for i, c in enumerate(items):
        colour = (
            _COLOURS.get(c.ablation, _OTHER[i % len(_OTHER)])
            if not several_targets
            else _OTHER[i % len(_OTHER)]
        )
        name = f"{c.target} {c.ablation}" if several_targets else c.ablation
        x = [100 * b for b in c.budgets[1:]]
        hover = [f"{b:g}% of edges: {k} kept" for b, k in zip(x, c.n_kept[1:], strict=True)]
        fig.add_trace(go.Scatter(
            x=x, y=c.faithfulness[1:], mode="lines+markers", legendgroup=name,
            name=f"{name}: circuit (CPR {c.cpr:.3f}, CMD {c.cmd:.3f})", hovertext=hover,
            line={"color": colour},
        ))  # fmt: skip
        fig.add_trace(go.Scatter(
            x=x, y=c.complement_faithfulness[1:], mode="lines+markers", legendgroup=name,
            name=f"{name}: complement (CPR {c.cpr_complement:.3f}, CMD {c.cmd_complement:.3f})",
            hovertext=hover, line={"color": colour, "dash": "dash"}, marker={"symbol": "x"},
        ))  # fmt: skip
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", annotation_text="full model")
    fig.add_hline(y=0.0, line_dash="dot", line_color="grey", annotation_text="all edges ablated")
    if title is None:
        targets = ", ".join(dict.fromkeys(c.target for c in items))
        title = f"Faithfulness across edge budgets: {targets} ({items[0].n_edges} edges)"
    fig.update_layout(
        title=title, xaxis_title="edge budget (% of edges, log scale)", xaxis_type="log",
        yaxis_title="faithfulness  1 - d(C, full) / d(empty, full)", hovermode="x unified",
    )  # fmt: skip
    return legend_below(readable_log_axes(fig))
