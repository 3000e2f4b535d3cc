"""Figures of a state-tracking sweep (:mod:`mechlab.sweep`): N* against L, kappa bars,
OOD accuracy against kappa. Each takes the search rows
(:func:`mechlab.sweep.outputs.search_rows`, or ``searches.json``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from mechlab.viz.figures import legend_below, readable_log_axes

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f")
_DASH = {"outcome": "solid", "cot": "dash", "acot": "dot"}

Rows = Sequence[Mapping[str, Any]]


def _task(row: Mapping[str, Any]) -> str:
    return "S5" if row["group"] == "s5" else f"Z{row['m']}"


def _colour(models: list[str], model: str) -> str:
    return _COLOURS[models.index(model) % len(_COLOURS)]


def n_star_figure(rows: Rows, title: str | None = None) -> go.Figure:
    """N* against L (log scale), one line per model, format, task and length
    distribution. The error bar spans the search's bracket (lo, hi]; a search that did
    not reach N* is drawn as an open triangle at its largest failing N (a lower bound).

    Args:
        rows: Search rows (``model``, ``format``, ``lengths``, ``group``, ``m``, ``L``,
            ``n_star``, ``lo``, ``hi``, ``status``).
        title: Figure title.

    Returns:
        The plotly figure.
    """
    if not rows:
        raise ValueError("no search rows to plot")
    models = list(dict.fromkeys(r["model"] for r in rows))
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["format"], _task(r), r["lengths"]), []).append(r)
    fig = go.Figure()
    for (model, fmt, task, lengths), items in groups.items():
        items = sorted(items, key=lambda r: r["L"])
        name = f"{model} {fmt} {task} {lengths}"
        found = [r for r in items if r["n_star"] is not None]
        colour = _colour(models, model)
        fig.add_trace(go.Scatter(
            x=[r["L"] for r in found], y=[r["n_star"] for r in found], mode="lines+markers", name=name,
            legendgroup=name, line={"color": colour, "dash": _DASH.get(fmt, "solid")},
            error_y={"type": "data", "symmetric": False, "array": [0] * len(found),
                     "arrayminus": [r["n_star"] - (r["lo"] or 0) for r in found], "thickness": 1},
            hovertext=[f"N* = {r['n_star']} ({r['status']}), bracket ({r['lo']}, {r['hi']}]" for r in found],
        ))  # fmt: skip
        open_ = [r for r in items if r["n_star"] is None and r["lo"] is not None]
        if open_:
            fig.add_trace(go.Scatter(
                x=[r["L"] for r in open_], y=[r["lo"] for r in open_], mode="markers", legendgroup=name,
                name=f"{name}: not reached (> lo)", marker={"symbol": "triangle-up-open", "size": 11,
                                                            "color": colour},
                hovertext=[f"not reached: fails up to N = {r['lo']} (cap {r['cap']})" for r in open_],
            ))  # fmt: skip
    fig.update_layout(
        title=title or "N*: smallest training set at which a grid run reaches validation loss < epsilon",
        xaxis_title="L (longest length; for fixed, the length)", yaxis_title="N* (log scale)",
        yaxis_type="log",
    )  # fmt: skip
    return legend_below(readable_log_axes(fig))


def kappa_figure(rows: Rows, title: str | None = None) -> go.Figure:
    """kappa per model and format (bars, grouped by task and L), with the range the
    search brackets allow as error bars; a bound is marked in the bar's text
    (``>=`` lower, ``<=`` upper). The dotted line is kappa = 1.

    Args:
        rows: Search rows with ``kappa``, ``kappa_bound``, ``kappa_low``, ``kappa_high``.
        title: Figure title.

    Returns:
        The plotly figure.
    """
    rows = [r for r in rows if r.get("kappa") is not None]
    fig = go.Figure()
    models = list(dict.fromkeys(r["model"] for r in rows))
    series: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        series.setdefault((r["model"], r["format"]), []).append(r)
    marks = {"exact": "", "lower": ">= ", "upper": "<= "}
    for (model, fmt), items in series.items():
        x = [f"{_task(r)} L={r['L']} {r['lengths']}" for r in items]
        y = [r["kappa"] for r in items]
        plus = [(r["kappa_high"] - r["kappa"]) if r.get("kappa_high") is not None else 0 for r in items]
        minus = [(r["kappa"] - r["kappa_low"]) if r.get("kappa_low") is not None else 0 for r in items]
        fig.add_trace(go.Bar(
            x=x, y=y, name=f"{model} {fmt}", marker={"color": _colour(models, model)},
            marker_pattern_shape={"outcome": "", "cot": "/", "acot": "."}.get(fmt, ""),
            text=[f"{marks.get(r['kappa_bound'], '')}{r['kappa']:.2f}" for r in items],
            error_y={"type": "data", "symmetric": False, "array": plus, "arrayminus": minus},
        ))  # fmt: skip
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", annotation_text="kappa = 1")
    fig.update_layout(
        title=title or "kappa = sum_n N*_n / N*_joint (> 1: lengths share; < 1: interfere)",
        barmode="group", yaxis_title="kappa", yaxis_type="log",
    )  # fmt: skip
    return legend_below(readable_log_axes(fig))


def ood_kappa_figure(rows: Rows, title: str | None = None) -> go.Figure:
    """OOD accuracy at 2L (chance-normalised) against kappa, one point per model,
    format and task: filled circles per token, crosses per sequence.

    Args:
        rows: Search rows with ``kappa`` and ``ood_token_acc``/``ood_seq_acc``.
        title: Figure title.

    Returns:
        The plotly figure.
    """
    rows = [r for r in rows if r.get("kappa") is not None and r.get("ood_token_acc") is not None]
    fig = go.Figure()
    models = list(dict.fromkeys(r["model"] for r in rows))
    for model in models:
        items = [r for r in rows if r["model"] == model]
        hover = [f"{r['format']} {_task(r)} L={r['L']} {r['lengths']}: kappa {r['kappa']:.2f} "
                 f"({r['kappa_bound']}), N = {r['ood_n']}" for r in items]  # fmt: skip
        for field, symbol, label in (("ood_token_acc", "circle", "per token"), ("ood_seq_acc", "x", "per sequence")):
            fig.add_trace(go.Scatter(
                x=[r["kappa"] for r in items], y=[r[field] for r in items], mode="markers",
                name=f"{model} ({label})", hovertext=hover,
                marker={"symbol": symbol, "size": 10, "color": _colour(models, model)},
            ))  # fmt: skip
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(
        title=title or "OOD accuracy at 2L (chance = 0) against kappa",
        xaxis_title="kappa (log scale)", xaxis_type="log", yaxis_title="OOD accuracy (chance-normalised)",
       
    )  # fmt: skip
    return legend_below(readable_log_axes(fig))
