"""The figures' axes and colour scales, on results committed in the repository: log axes
labelled so that one can read them at 800 to 1600 px, colour scales that show the data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import plotly.graph_objects as go
import pytest

from mechlab.viz.figures import readable_log_axes

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "examples" / "checkpoints" / "recall-cpu"


def read(path: Path):
    return json.loads(path.read_text())


def log_figures() -> list[tuple[str, go.Figure]]:
    """Every figure of mechlab.viz that has a log axis, drawn from committed results."""
    from mechlab.prune.curves import read_curves
    from mechlab.viz import (
        faithfulness_curves_figure,
        figure_for_suite,
        recall_dynamics_figure,
        recall_figure,
    )
    from mechlab.viz.sweep import kappa_figure, n_star_figure, ood_kappa_figure

    curves = ROOT / "circuits" / "recall-cpu" / "curves"
    searches = read(ROOT / "examples" / "sweeps" / "state-tracking-cpu" / "searches.json")
    figures = [(f"eval {s}", figure_for_suite(read(RUN / "eval" / f"{s}.json")))
               for s in ("nih", "ood", "uninterleaved", "dynamics")]  # fmt: skip
    figures += [
        ("recall", recall_figure(read(RUN / "recall" / "recall.json"))),
        ("recall dynamics", recall_dynamics_figure(read(RUN / "recall" / "recall_dynamics.json"))),
        ("curves", faithfulness_curves_figure(read_curves(curves / "curve_1-after.json")
                                              + read_curves(curves / "curve_2-after.json"))),
        ("N*", n_star_figure(searches)),
        ("kappa", kappa_figure(searches)),
        ("OOD kappa", ood_kappa_figure(searches)),
    ]  # fmt: skip
    return figures


def log_axes(fig: go.Figure) -> list[tuple[str, object]]:
    layout = fig.layout.to_plotly_json()
    return [(k, fig.layout[k]) for k in layout if k[:5] in ("xaxis", "yaxis") and fig.layout[k].type == "log"]


def test_every_log_axis_has_few_short_labels_that_cover_its_data():
    """Plotly labels every digit 2..9 of a log axis's decades where they fit badly: at 800 px
    the minor labels of the NiH, recall and curve figures overlapped. Every log axis now has
    labelled ticks chosen from its data (1-2-5 or powers of ten), few and short enough for
    800 px, and the same at 1600 px."""
    checked = 0
    for name, fig in log_figures():
        for key, axis in log_axes(fig):
            checked += 1
            assert axis.tickvals is not None and len(axis.tickvals) >= 2, (name, key)
            ticks, labels = list(axis.tickvals), list(axis.ticktext)
            assert ticks == sorted(ticks) and len(set(labels)) == len(labels), (name, key, labels)
            assert len(ticks) <= 12 and all(len(t) <= 6 for t in labels), (name, key, labels)
            logs = [math.log10(t) for t in ticks]
            span = logs[-1] - logs[0]
            # at 800 px an x axis has ~600 px, a panel's y axis ~250: neighbours at least a label apart
            pixels = 600 if key.startswith("x") else 250
            gaps = [(b - a) / span * pixels for a, b in zip(logs, logs[1:], strict=False)]
            need = 8 * max(len(t) for t in labels) if key.startswith("x") else 16
            assert min(gaps) >= need or len(ticks) <= 3, (name, key, labels, min(gaps))
    assert checked >= 12


@pytest.mark.parametrize(
    "low, high, labels",
    [
        (0.3, 0.9, ["0.3", "0.4", "0.5", "0.6", "0.8", "1"]),
        (0.01, 1.2, ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1"]),
        (1e-6, 1e3, ["1e-6", "1e-5", "1e-4", "0.001", "0.01", "0.1", "1", "10", "100", "1000"]),
        (1e-12, 1e6, ["1e-12", "1e-10", "1e-8", "1e-6", "1e-4", "0.01", "1", "100", "1e4", "1e6"]),
    ],
)
def test_log_ticks_step_by_the_range(low, high, labels):
    fig = go.Figure(go.Scatter(x=[1, 2], y=[low, high]))
    fig.update_layout(yaxis_type="log")
    assert list(readable_log_axes(fig).layout.yaxis.ticktext) == labels
    fig.update_layout(xaxis_type="log")  # x = [1, 2]: under a decade
    assert list(readable_log_axes(fig).layout.xaxis.ticktext) == ["1", "1.5", "2"]
    set_by_hand = go.Figure(go.Scatter(x=[1, 2], y=[low, high]))
    set_by_hand.update_layout(yaxis_type="log", yaxis_dtick=1)
    assert readable_log_axes(set_by_hand).layout.yaxis.tickvals is None  # left alone


def test_heatmaps_show_values_above_one_and_say_so():
    """The recall figure's head heatmap clipped the committed checkpoint's fraction 1.07 (a
    head carrying more than the whole label patch) to the colour of 1: the scale now reaches
    the data, and the colour bar's title says how far past 0..1 it goes."""
    from mechlab.prune import Circuit
    from mechlab.viz import circuits_across_checkpoints_figure, recall_figure
    from mechlab.viz.figures import colour_range

    report = read(RUN / "recall" / "recall.json")
    fractions = [c["fraction"] for c in report["result"]["components"]
                 if c["patch"] == "label" and c["direction"] == "noise" and c["offset"] == 1 and c["head"] >= 0]  # fmt: skip
    assert max(fractions) > 1  # the committed results have one
    heatmap = next(t for t in recall_figure(report).data if t.type == "heatmap")
    assert (heatmap.zmin, heatmap.zmax) == (0, max(fractions))
    assert heatmap.colorbar.title.text == f"fraction<br>(up to {max(fractions):.3g})"

    assert colour_range([[0.2, None], [0.9, float("nan")]], "score") == (0, 1, "score")  # within: 0..1
    assert colour_range([[-0.5, 2.0]], "f") == (-0.5, 2.0, "f<br>(from -0.5, up to 2)")
    circuit = Circuit.from_json(ROOT / "circuits" / "recall-cpu" / "1-after_seed0.json")
    edge = next(iter(circuit.edges))
    louder = Circuit.from_dict({**circuit.to_dict()})
    louder.edges[edge] = 3.0  # an attribution score past 1
    heatmap = next(t for t in circuits_across_checkpoints_figure([circuit, louder], steps=[1, 2]).data
                   if t.type == "heatmap")  # fmt: skip
    assert heatmap.zmax == 3.0 and "up to 3" in heatmap.colorbar.title.text
