"""Figures of the recall evaluations."""

from __future__ import annotations

import hashlib
import html
import importlib.util
import math
import re
import warnings
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from mechlab.io import atomic_write_text

PLOTLYJS = "plotly.min.js"  # the file name plotly's include_plotlyjs="directory" refers to
PLOTLYJS_MODES = ("inline", "directory")

# The CSS of mechlab's pages (the report, mechlab view) and of a circuit explorer in them.
PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em;line-height:1.45}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "th{background:#f4f4f4}td:first-child{text-align:left}"
)
EXPLORER_STYLE = (
    ".mechlab-explorer{border:1px solid #ddd;padding:8px;margin:0.5em 0 1.5em}"
    ".mx-controls{display:flex;flex-wrap:wrap;gap:6px 14px;align-items:center;font-size:14px}"
    ".mx-controls label{white-space:nowrap}"
    ".mx-summary{font-size:14px;margin:6px 0;color:#333}"
    ".mx-details{font-size:13px;background:#f8f8f8;border:1px solid #e4e4e4;padding:6px;"
    "min-height:3em;font-family:monospace;white-space:pre-wrap}"
)


def _check_mode(plotlyjs: str) -> None:
    if plotlyjs not in PLOTLYJS_MODES:
        raise ValueError(f"plotlyjs must be one of {PLOTLYJS_MODES}, got {plotlyjs!r}")


def plotly_script(plotlyjs: str = "inline") -> str:
    """The ``<script>`` that loads plotly.js: inlined (``"inline"``, 4.8 MB) or the
    ``plotly.min.js`` beside the page (``"directory"``; offline too)."""
    _check_mode(plotlyjs)
    if plotlyjs == "directory":
        return f"<script charset='utf-8' src='{PLOTLYJS}'></script>"
    return f"<script type='text/javascript'>{get_plotlyjs()}</script>"


def write_plotlyjs(folder: str | Path, writer: Any = None) -> Path:
    """Write plotly.js as ``folder/plotly.min.js`` unless that file already holds it.

    Every page of a folder written with ``plotlyjs="directory"`` loads this one copy, so
    a folder of figures carries plotly.js once instead of once per page (4.8 MB each).

    Args:
        folder: The folder of the pages.
        writer: ``writer(path, text)`` writes the file (default: an atomic write).

    Returns:
        The file's path.
    """
    path = Path(folder) / PLOTLYJS
    text = get_plotlyjs()
    if path.is_file() and path.stat().st_size == len(text.encode()) and path.read_text() == text:
        return path
    return (writer or atomic_write_text)(path, text)


def legend_below(fig: go.Figure, plot_height: int = 380, row_height: int = 26) -> go.Figure:
    """Put the legend under the x axis title, one row per entry, and make the figure tall
    enough to hold it, so that a long legend neither covers the axis title nor squeezes
    the plot (at 800 px each entry takes a row; wider, several share one).

    Args:
        fig: The figure (changed in place).
        plot_height: Pixels for the title, the plot and its axes.
        row_height: Pixels per legend entry.

    Returns:
        ``fig``.
    """
    entries = sum(1 for t in fig.data if t.showlegend is not False and t.name)
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.25, "x": 0},
                      height=plot_height + row_height * entries)  # fmt: skip
    return fig


_MANTISSAS = ((1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0), (1.0, 2.0, 5.0), (1.0,))


def _tick_text(v: float) -> str:
    """A log tick's label: ``0.002``, ``50``, ``5000``; ``1e-5``, ``2e6`` outside 0.001..9999."""
    if 1e-3 <= v < 1e4:
        return f"{v:.4g}"
    mantissa, exponent = f"{v:.1e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def _axis_values(fig: go.Figure, ref: str) -> list[float]:
    """The positive numbers drawn on the axis ``ref`` (``"x"``, ``"y2"``): trace values,
    their error bars, and lines (``add_hline``) in its data coordinates."""
    letter = ref[0]
    values: list[float] = []

    def add(items: Any) -> None:
        for v in items if items is not None else ():
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
                values.append(float(v))

    for trace in fig.data:
        if (getattr(trace, f"{letter}axis", None) or letter) != ref or not hasattr(trace, letter):
            continue
        data = getattr(trace, letter)
        data = list(data) if data is not None else []
        add(data)
        error = getattr(trace, f"error_{letter}", None)
        if error is not None and error.array is not None and len(error.array) == len(data):
            minus = error.array if error.symmetric is not False or error.arrayminus is None else error.arrayminus
            for v, plus, less in zip(data, error.array, minus, strict=False):
                if isinstance(v, int | float) and plus is not None and less is not None:
                    add([v + plus, v - less])
    for shape in fig.layout.shapes or ():
        if getattr(shape, f"{letter}ref") == ref:
            add([getattr(shape, f"{letter}0"), getattr(shape, f"{letter}1")])
    return values


def readable_log_axes(fig: go.Figure) -> go.Figure:
    """Give every log axis of ``fig`` ticks one can read at 800 to 1600 px: labelled
    ticks at 1, 1.5, 2, 3, ... within a decade, at 1-2-5 across up to 3.5 decades, at the
    powers of ten beyond (every k-th past 10 decades), with short labels (``0.002``,
    ``1e-5``), instead of plotly's default of a label at every digit 2..9 of each decade,
    which overlap. Axes with ticks set already are left alone. Returns ``fig``.
    """
    for name in [k for k in fig.layout.to_plotly_json() if re.fullmatch(r"[xy]axis\d*", k)]:
        axis = fig.layout[name]
        if axis.type != "log" or axis.tickvals is not None or axis.dtick is not None:
            continue
        values = _axis_values(fig, name[0] + name[5:])
        if axis.range is not None and None not in axis.range:
            values = [10.0 ** axis.range[0], 10.0 ** axis.range[1]]
        if not values:
            continue
        low, high = math.log10(min(values)), math.log10(max(values))
        decades = high - low
        mantissas = _MANTISSAS[0 if decades < 1 else 1 if decades <= 3.5 else 2]
        step = max(1, math.ceil(decades / 10))
        ticks = [m * 10.0**e for e in range(math.floor(low) - 1, math.ceil(high) + 2)
                 if (e - math.floor(low)) % step == 0 for m in mantissas]  # fmt: skip
        pad = 0.1 * max(decades, 0.3)  # plotly's autorange pads the data a little
        ticks = [t for t in ticks if low - pad <= math.log10(t) <= high + pad]
        if len(ticks) < 2:
            continue
        axis.update(tickmode="array", tickvals=[float(f"{t:.6g}") for t in ticks],
                    ticktext=[_tick_text(float(f"{t:.6g}")) for t in ticks])  # fmt: skip
    return fig


def colour_range(z: Any, title: str, low: float = 0.0, high: float = 1.0) -> tuple[float, float, str]:
    """A heatmap's colour range and colour bar title: ``low``..``high`` (the values' usual
    range, e.g. a fraction's 0..1), widened to the data where the data goes past it, so
    that no value is clipped to the end colour; the title then says how far (``fraction
    (up to 1.07)``).

    Args:
        z: The heatmap's values (nested lists; None and NaN are gaps).
        title: The colour bar's title.
        low: The lower end of the usual range.
        high: The upper end.

    Returns:
        ``(zmin, zmax, title)``.
    """
    def flat(items: Any) -> list[float]:
        if isinstance(items, list | tuple):
            return [v for item in items for v in flat(item)]
        return [float(items)] if isinstance(items, int | float) and math.isfinite(items) else []

    values = flat(z)
    zmin, zmax = min([low, *values]), max([high, *values])
    past = []
    if zmin < low:
        past.append(f"from {zmin:.3g}")
    if zmax > high:
        past.append(f"up to {zmax:.3g}")
    return zmin, zmax, title + (f"<br>({', '.join(past)})" if past else "")


def figure_html(fig: go.Figure, plotlyjs: str = "inline") -> str:
    """One figure as a whole offline page (plotly.js inlined, or beside the page); the
    page's element id comes from the figure, so the same figure writes the same bytes (a
    rerun leaves its pages as they are)."""
    _check_mode(plotlyjs)
    div_id = "fig-" + hashlib.sha256(fig.to_json().encode()).hexdigest()[:16]
    return fig.to_html(
        include_plotlyjs=True if plotlyjs == "inline" else "directory",
        full_html=True,
        div_id=div_id,
    )


def write_html(fig: go.Figure, path: str | Path, plotlyjs: str = "inline") -> Path:
    """Write an offline HTML page of one figure, atomically.

    Args:
        fig: The figure.
        path: The ``.html`` file.
        plotlyjs: ``"inline"`` (plotly.js inside the page: one file that opens anywhere)
            or ``"directory"`` (``plotly.min.js`` written once beside the pages of a folder).
    """
    if plotlyjs == "directory":
        write_plotlyjs(Path(path).parent)
    return atomic_write_text(path, figure_html(fig, plotlyjs))


def notebook_renderers(static: bool = True) -> str:
    """Make inline figures survive a saved notebook, and return the renderer in use.

    Each figure is stored as plotly's own mimetype (interactive in JupyterLab and VS Code),
    as HTML with plotly.js inlined once per notebook (nbconvert, classic Notebook) and,
    with ``static`` and kaleido installed (``pip install kaleido``; it drives a local
    Chrome or Chromium), as a PNG that GitHub and plain viewers show.

    Args:
        static: Also store a PNG of every figure.

    Returns:
        The plotly renderer string now in ``plotly.io.renderers.default``.
    """
    names = ["plotly_mimetype", "notebook"]
    if static:
        if importlib.util.find_spec("kaleido") is None:
            warnings.warn("kaleido is not installed: figures are saved without a static PNG "
                          "(pip install kaleido)", stacklevel=2)  # fmt: skip
        else:
            names.append("png")
    pio.renderers.default = "+".join(names)
    return pio.renderers.default


def page_html(
    title: str, sections: list[tuple[str, Any]], plotlyjs: str = "inline", style: str = ""
) -> str:
    """One offline HTML page: plotly.js once, then each section's heading and body.

    Args:
        title: The page's heading.
        sections: ``(heading, body)`` pairs, in order: a body is a figure, an HTML
            string, or an object with ``to_div()`` (a :class:`~mechlab.viz.explorer.CircuitExplorer`);
            an empty heading adds none.
        plotlyjs: ``"inline"`` (inside the page) or ``"directory"`` (``plotly.min.js``
            beside it: :func:`write_plotlyjs`).
        style: More CSS.

    Returns:
        The page (works offline: nothing is fetched).
    """
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for heading, body in sections:
        if heading:
            parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append(body_html(body))
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{PAGE_STYLE}{EXPLORER_STYLE}{style}</style>{plotly_script(plotlyjs)}"
        f"</head><body>{''.join(parts)}</body></html>"
    )


def body_html(body: Any) -> str:
    """A section's body as HTML: a string as it is, an explorer's div, a figure's div."""
    if isinstance(body, str):
        return body
    if hasattr(body, "to_div"):
        return body.to_div()
    return body.to_html(full_html=False, include_plotlyjs=False, config={"responsive": True})


def _nih_figure(offsets: dict[str, dict[str, float]], title: str) -> go.Figure:
    xs = list(offsets)
    med = [offsets[j]["median"] for j in xs]
    fig = go.Figure(
        go.Bar(
            x=[f"{j}-after" for j in xs],
            y=med,
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [offsets[j]["q3"] - offsets[j]["median"] for j in xs],
                "arrayminus": [offsets[j]["median"] - offsets[j]["q1"] for j in xs],
            },
            name="median (quartiles)",
        )
    )
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="zero predictor (mean)")
    fig.update_layout(title=title, yaxis_title="squared error (summed over dims)", yaxis_type="log")
    return readable_log_axes(fig)


def figure_for_suite(report: dict[str, Any]) -> go.Figure:
    """The figure of one ``mechlab eval`` report (the dict :func:`mechlab.pipelines.run_suite` returns)."""
    suite, r = report["suite"], report["result"]
    step = report.get("step")
    if suite == "nih":
        return _nih_figure(
            r["offsets"], f"Needle in a haystack: {r['n_haystack']} systems (step {step})"
        )
    if suite == "ood":
        fig = go.Figure()
        for probe, offsets in r["probes"].items():
            xs = list(offsets)
            fig.add_trace(
                go.Bar(
                    name=probe, x=[f"{j}-after" for j in xs], y=[offsets[j]["median"] for j in xs]
                )
            )
        fig.add_hline(y=1.0, line_dash="dot", annotation_text="zero predictor (mean)")
        fig.update_layout(
            barmode="group",
            title=f"Out-of-distribution probes (step {step}), medians",
            yaxis_title="squared error",
            yaxis_type="log",
        )
        return readable_log_axes(fig)
    if suite == "uninterleaved":
        xs = list(range(1, len(r["model_median"]) + 1))
        fig = go.Figure(
            [
                go.Scatter(x=xs, y=r["model_median"], name="model (median)"),
                go.Scatter(
                    x=xs, y=r["lstsq_median"], name="least squares (median)", line={"dash": "dash"}
                ),
            ]
        )
        fig.update_layout(
            title=f"Uninterleaved: one system (step {step})",
            xaxis_title="observation",
            yaxis_title="squared error",
            yaxis_type="log",
        )
        return readable_log_axes(fig)
    if suite == "dynamics":
        fig = go.Figure()
        ex = r["examples"]
        for j, med in r["offsets"].items():
            fig.add_trace(go.Scatter(x=ex, y=med, mode="lines+markers", name=f"{j}-after"))
        fig.add_hline(y=1.0, line_dash="dot", annotation_text="zero predictor (mean)")
        fig.update_layout(
            title="Training dynamics: NiH error vs examples seen (medians)",
            xaxis_title="examples seen",
            xaxis_type="log",
            yaxis_title="squared error",
            yaxis_type="log",
        )
        return readable_log_axes(fig)
    raise ValueError(f"no figure for suite {suite!r}")
