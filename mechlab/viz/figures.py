"""Figures of the recall evaluations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from mechlab.io import atomic_write_text


def write_html(fig: go.Figure, path: str | Path) -> Path:
    """Write a self-contained offline HTML page (plotly.js embedded), atomically."""
    return atomic_write_text(path, fig.to_html(include_plotlyjs=True, full_html=True))


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
    import importlib.util
    import warnings

    import plotly.io as pio

    names = ["plotly_mimetype", "notebook"]
    if static:
        if importlib.util.find_spec("kaleido") is None:
            warnings.warn("kaleido is not installed: figures are saved without a static PNG "
                          "(pip install kaleido)", stacklevel=2)  # fmt: skip
        else:
            names.append("png")
    pio.renderers.default = "+".join(names)
    return pio.renderers.default


_PAGE_STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "th{background:#f4f4f4}td:first-child{text-align:left}"
)


def page_html(title: str, sections: list[tuple[str, go.Figure | str]]) -> str:
    """One self-contained HTML page: plotly.js once, then each section's heading and body.

    Args:
        title: The page's heading.
        sections: ``(heading, figure or HTML string)`` pairs, in order; an empty heading
            adds none.

    Returns:
        The page (works offline: nothing is fetched).
    """
    import html

    from plotly.offline import get_plotlyjs

    parts = [f"<h1>{html.escape(title)}</h1>"]
    for heading, body in sections:
        if heading:
            parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append(body if isinstance(body, str) else body.to_html(full_html=False, include_plotlyjs=False))
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_PAGE_STYLE}</style><script type='text/javascript'>{get_plotlyjs()}</script>"
        f"</head><body>{''.join(parts)}</body></html>"
    )


def _nih_figure(offsets: dict[str, dict[str, float]], title: str) -> go.Figure:
    xs = list(offsets)
    med = [offsets[j]["median"] for j in xs]
    fig = go.Figure(go.Bar(
        x=[f"{j}-after" for j in xs], y=med,
        error_y={"type": "data", "symmetric": False,
                 "array": [offsets[j]["q3"] - offsets[j]["median"] for j in xs],
                 "arrayminus": [offsets[j]["median"] - offsets[j]["q1"] for j in xs]},
        name="median (quartiles)",
    ))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="zero predictor (mean)")
    fig.update_layout(title=title, yaxis_title="squared error (summed over dims)", yaxis_type="log")
    return fig


def figure_for_suite(report: dict[str, Any]) -> go.Figure:
    """The figure of one ``mechlab eval`` report (the dict :func:`mechlab.pipelines.run_suite` returns)."""
    suite, r = report["suite"], report["result"]
    step = report.get("step")
    if suite == "nih":
        return _nih_figure(r["offsets"], f"Needle in a haystack: {r['n_haystack']} systems (step {step})")
    if suite == "ood":
        fig = go.Figure()
        for probe, offsets in r["probes"].items():
            xs = list(offsets)
            fig.add_trace(go.Bar(name=probe, x=[f"{j}-after" for j in xs], y=[offsets[j]["median"] for j in xs]))
        fig.add_hline(y=1.0, line_dash="dot", annotation_text="zero predictor (mean)")
        fig.update_layout(barmode="group", title=f"Out-of-distribution probes (step {step}), medians",
                          yaxis_title="squared error", yaxis_type="log")
        return fig
    if suite == "uninterleaved":
        xs = list(range(1, len(r["model_median"]) + 1))
        fig = go.Figure([
            go.Scatter(x=xs, y=r["model_median"], name="model (median)"),
            go.Scatter(x=xs, y=r["lstsq_median"], name="least squares (median)", line={"dash": "dash"}),
        ])
        fig.update_layout(title=f"Uninterleaved: one system (step {step})", xaxis_title="observation",
                          yaxis_title="squared error", yaxis_type="log")
        return fig
    if suite == "dynamics":
        fig = go.Figure()
        ex = r["examples"]
        for j, med in r["offsets"].items():
            fig.add_trace(go.Scatter(x=ex, y=med, mode="lines+markers", name=f"{j}-after"))
        fig.add_hline(y=1.0, line_dash="dot", annotation_text="zero predictor (mean)")
        fig.update_layout(title="Training dynamics: NiH error vs examples seen (medians)",
                          xaxis_title="examples seen", xaxis_type="log", yaxis_title="squared error",
                          yaxis_type="log")
        return fig
    raise ValueError(f"no figure for suite {suite!r}")
