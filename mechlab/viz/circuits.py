"""Circuit graphs that read at a glance: one circuit, or several on one layout.

Layout: layers left to right (a transformer layer is a column of heads, stacked, then a
column for its MLP; a recurrent layer is one column, with one row per position window),
the embeddings on the left, the read-out on the right. Edges are quadratic Bezier curves
that bend more the more columns they skip, so a skip edge never hides under the path it
skips (``m0 -> m2`` arcs over ``m0 -> m1 -> m2``). A head's q, k and v inputs end at three
ports on the head's left side, coloured q blue, k green, v red. Width and opacity follow
the edge's mask score (opacity follows the edge's consensus instead, where the circuit
records one: how often its runs over seeds and budgets keep it); hovering an edge's midpoint shows its name and score, hovering a
node its kept edges. Only kept edges are drawn, so GPT-2-small-sized graphs (32,936
candidate edges) stay light: edges are drawn in a few traces (one per kind and score
band), not one per edge.

:func:`circuit_figure` draws one circuit; :func:`overlap_figure` draws two or more on one
layout, coloured by which circuits hold each edge (shared, only A, only B, ...).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mechlab.models.names import hook_name
from mechlab.models.registry import graph_kind
from mechlab.prune.circuit import Circuit, jaccard
from mechlab.prune.consensus import consensus_scores
from mechlab.prune.graph import component_of, parse_component, window_of
from mechlab.prune.stability import stability_text
from mechlab.viz.figures import colour_range

_KIND_COLOUR = {
    "q": "#1f77b4", "k": "#2ca02c", "v": "#d62728", "mlp": "#9467bd", "mixer": "#9467bd",
    "out": "#ff7f0e", "state": "#17becf",
}  # fmt: skip
_PORT_DY = {"q": 0.22, "k": 0.0, "v": -0.22}  # q/k/v ports, in head rows
_PORT_DX = -0.16  # ports sit on the head's left side
_SAMPLES = 16  # points per drawn curve
_MEMBERSHIP = {"shared": "#6a3d9a", 0: "#1f77b4", 1: "#ff7f0e", 2: "#2ca02c", 3: "#d62728"}


def _reader_kind(reader: str) -> str:
    """``q``/``k``/``v`` for head inputs, ``state`` for a carried state, else the component kind."""
    base = reader.split("@", 1)[0]
    if base.endswith((".q", ".k", ".v")):
        return base[-1]
    if base.endswith(".state"):
        return "state"
    kind = parse_component(component_of(reader))[0]
    return {"head": "v", "mlp": "mlp", "mixer": "mixer", "out": "out"}[kind]


def node_positions(graph: Mapping[str, Any], names: set[str]) -> dict[str, tuple[float, float]]:
    """``(x, y)`` of every component that can appear in circuits of this graph.

    Args:
        graph: A circuit's ``metadata["graph"]`` (``arch``, ``n_layers``, ``n_heads``,
            ``windows``); missing sizes are read off ``names``.
        names: Component names that must be placed (writers and components of readers).

    Returns:
        Component name -> position.
    """
    parsed = [parse_component(n) for n in names]
    n_layers = int(graph.get("n_layers", 1 + max((p[1] for p in parsed), default=-1)))
    windows = [w[0] for w in graph.get("windows", [])] or sorted(
        {w for n in names if (w := window_of(n))}
    )
    pos: dict[str, tuple[float, float]] = {}
    if windows:
        for row, w in enumerate(windows):
            y = -1.5 * row
            pos[f"embed@{w}"] = (0.0, y)
            for layer in range(n_layers):
                pos[f"l{layer}@{w}"] = (1.0 + layer, y)
            pos[f"out@{w}"] = (1.0 + n_layers, y)
        return pos
    heads = 1 + max((p[2] for p in parsed if p[0] == "head"), default=-1)
    n_heads = max(int(graph.get("n_heads", 0) or 0), heads)
    groups = 1 + max((p[2] for p in parsed if p[0] == "group"), default=-1)
    n_groups = max(int(graph.get("n_key_value_heads", 0) or 0), groups)
    if graph_kind(graph.get("arch", "transformer")) == "transformer" and (
        n_heads or any(p[0] == "mlp" for p in parsed)
    ):
        half = (max(n_heads, 1) - 1) / 2
        pos["embed"], pos["pos"] = (0.0, min(0.5, half)), (0.0, -min(0.5, half))
        for layer in range(n_layers):
            for h in range(n_heads):
                pos[f"a{layer}.h{h}"] = (1.0 + 2 * layer, half - h)
            if n_groups and n_groups < n_heads:  # shared K/V inputs, beside their heads
                size = n_heads // n_groups
                for g in range(n_groups):
                    pos[f"a{layer}.g{g}"] = (0.55 + 2 * layer, half - g * size - (size - 1) / 2)
            pos[f"m{layer}"] = (2.0 + 2 * layer, 0.0)
        pos["out"] = (1.0 + 2 * n_layers, 0.0)
        return pos
    pos["embed"] = (0.0, 0.0)
    for layer in range(n_layers):
        pos[f"l{layer}"] = (1.0 + layer, 0.0)
    pos["out"] = (1.0 + n_layers, 0.0)
    return pos


def _end(reader: str, pos: Mapping[str, tuple[float, float]]) -> tuple[float, float]:
    """Where an edge into ``reader`` ends: a q/k/v port, or the component itself."""
    x, y = pos[component_of(reader)]
    kind = _reader_kind(reader)
    if kind in _PORT_DY:
        return x + _PORT_DX, y + _PORT_DY[kind]
    return x, y


def _control(
    start: tuple[float, float], end: tuple[float, float], edge: tuple[str, str]
) -> tuple[float, float]:
    """The control point of the quadratic Bezier curve of one edge.

    The bend grows with the columns the edge spans; it bows up when the edge rises and
    down when it falls; an edge within one column (a carried state) bows right; a
    level edge bows by a stable hash of its name, so parallel skip edges part ways.
    """
    (x0, y0), (x1, y1) = start, end
    dx, dy = x1 - x0, y1 - y0
    span = abs(dx)
    if span < 1e-9:  # vertical: a state carried into the next window
        return x0 + 0.35, (y0 + y1) / 2
    if abs(dy) > 1e-9:
        sign = 1.0 if dy > 0 else -1.0
    else:
        sign = 1.0 if int(hashlib.md5(repr(edge).encode()).hexdigest(), 16) % 2 else -1.0
    bend = 0.0 if span <= 1.0 + 1e-9 and abs(dy) > 1e-9 else 0.18 * span
    return (x0 + x1) / 2, (y0 + y1) / 2 + sign * bend


def _curve(
    start: tuple[float, float], end: tuple[float, float], edge: tuple[str, str]
) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """Points of the Bezier curve of one edge (:func:`_control`), and its midpoint."""
    (x0, y0), (x1, y1) = start, end
    cx, cy = _control(start, end, edge)
    t = np.linspace(0.0, 1.0, _SAMPLES)[:, None]
    pts = (
        (1 - t) ** 2 * np.array([x0, y0])
        + 2 * (1 - t) * t * np.array([cx, cy])
        + t**2 * np.array([x1, y1])
    )
    mid = 0.25 * np.array([x0, y0]) + 0.5 * np.array([cx, cy]) + 0.25 * np.array([x1, y1])
    return pts[:, 0], pts[:, 1], (float(mid[0]), float(mid[1]))


def _band(score: float) -> int:
    return min(3, max(0, int(score * 4)))  # 4 bands of [0, 1]


def _axis_labels(pos: Mapping[str, tuple[float, float]]) -> tuple[list[float], list[str]]:
    ticks = sorted({x for x, _ in pos.values()})
    labels = []
    for x in ticks:
        kinds = {parse_component(n)[0] for n, (px, _) in pos.items() if px == x}
        layer = max(parse_component(n)[1] for n, (px, _) in pos.items() if px == x)
        if "out" in kinds:
            labels.append("read-out")
        elif kinds <= {"embed", "pos"}:
            labels.append("embeddings")
        else:
            labels.append(
                f"L{layer} "
                + (
                    "heads"
                    if "head" in kinds
                    else "K/V groups"
                    if "group" in kinds
                    else "MLP"
                    if "mlp" in kinds
                    else "layer"
                )
            )
    return ticks, labels


def _draw(
    fig: go.Figure,
    groups: Mapping[tuple[Any, ...], list[tuple[tuple[str, str], float]]],
    pos: Mapping[str, tuple[float, float]],
    colours: Mapping[str, str],
    names: Mapping[str, str],
    hover: Mapping[tuple[str, str], str],
) -> None:
    """One line trace per (group, score band) and one hover trace of all midpoints."""
    mid_x, mid_y, mid_text = [], [], []
    shown: set[str] = set()
    for key, edges in sorted(groups.items()):
        group, band = key[0], key[1]
        shade = key[2] if len(key) > 2 else band  # a third entry: the opacity's own band
        xs: list[float | None] = []
        ys: list[float | None] = []
        for edge, _ in edges:
            x, y, mid = _curve(pos[edge[0]], _end(edge[1], pos), edge)
            xs += [*x.tolist(), None]
            ys += [*y.tolist(), None]
            mid_x.append(mid[0])
            mid_y.append(mid[1])
            mid_text.append(hover[edge])
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", hoverinfo="skip", legendgroup=group, showlegend=group not in shown,
            name=names[group], opacity=(0.35 if len(key) == 2 else 0.15) + (0.65 if len(key) == 2 else 0.85) * (shade + 1) / 4,
            line={"color": colours[group], "width": 1.0 + 0.9 * (band + 1)},
        ))  # fmt: skip
        shown.add(group)
    fig.add_trace(go.Scatter(
        x=mid_x, y=mid_y, mode="markers", hovertext=mid_text, hoverinfo="text", showlegend=False,
        name="edge (hover)",
        marker={"size": 7, "color": "rgba(60,60,60,0.25)"},
    ))  # fmt: skip


PORT_NAMES = {"q": "q port (query input)", "k": "k port (key input)", "v": "v port (value input)"}


def node_labels(pos: Mapping[str, tuple[float, float]], inside: set[str]) -> list[dict[str, Any]]:
    """Layout annotations naming the components in a circuit: right of each node, on a
    white ground, so edges that pass under a label do not cross its text."""
    return [
        {"x": pos[n][0], "y": pos[n][1], "text": n, "showarrow": False, "xanchor": "left",
         "yanchor": "bottom", "xshift": 7, "yshift": 2, "font": {"size": 11, "color": "#222"},
         "bgcolor": "rgba(255,255,255,0.85)", "borderpad": 1, "name": "node label"}
        for n in sorted(inside) if n in pos
    ]  # fmt: skip


def _nodes(
    fig: go.Figure,
    pos: Mapping[str, tuple[float, float]],
    inside: set[str],
    info: Mapping[str, str],
    ports: set[str],
    graph: Mapping[str, Any],
) -> None:
    """Components (named when in a circuit, small and grey otherwise) and q/k/v ports,
    each kind of mark in the legend."""
    for kept in (True, False):
        chosen = [n for n in pos if (n in inside) == kept]
        if not chosen:
            continue
        fig.add_trace(go.Scatter(
            x=[pos[n][0] for n in chosen], y=[pos[n][1] for n in chosen], mode="markers",
            name="component in the circuit" if kept else "component not in the circuit",
            legendgroup="nodes", hovertext=[info.get(n, f"<b>{n}</b><br>{_hook(n, graph)}") for n in chosen],
            hoverinfo="text",
            marker={"size": 16 if kept else 7, "color": "#333" if kept else "#d0d0d0",
                    "symbol": "circle", "line": {"width": 1, "color": "#fff"}},
        ))  # fmt: skip
    for kind in ("q", "k", "v"):
        heads = [n for n in sorted(ports) if n in pos]
        if heads:
            fig.add_trace(go.Scatter(
                x=[pos[h][0] + _PORT_DX for h in heads], y=[pos[h][1] + _PORT_DY[kind] for h in heads],
                mode="markers", hoverinfo="skip", name=PORT_NAMES[kind], legendgroup="ports",
                marker={"size": 6, "color": _KIND_COLOUR[kind], "symbol": "square"},
            ))  # fmt: skip


def edge_text(edge: tuple[str, str], graph: Mapping[str, Any]) -> str:
    """``w → r`` and, below, the hook names of both ends."""
    return f"{edge[0]} → {edge[1]}<br><span style='font-size:10px'>{_hook(edge[0], graph)} → {_hook(edge[1], graph)}</span>"


def _hook(node: str, graph: Mapping[str, Any]) -> str:
    try:
        return hook_name(node, graph)
    except ValueError:
        return ""


def _finish(
    fig: go.Figure,
    pos: Mapping[str, tuple[float, float]],
    title: str,
    inside: set[str] = frozenset(),
) -> go.Figure:
    fig.update_layout(**circuit_layout(pos, title), annotations=node_labels(pos, inside))
    return fig


def circuit_layout(pos: Mapping[str, tuple[float, float]], title: str) -> dict[str, Any]:
    """The layout of a circuit figure on these positions: columns named on the x axis,
    windows on the y axis, the legend below, a height that keeps head rows apart."""
    ticks, labels = _axis_labels(pos)
    ys = [y for _, y in pos.values()]
    rows = {window_of(n): y for n, (_, y) in pos.items() if window_of(n)}
    yaxis: dict[str, Any] = {
        "showgrid": False,
        "zeroline": False,
        "range": [min(ys) - 0.9, max(ys) + 0.9],
    }
    yaxis.update(
        {"tickvals": list(rows.values()), "ticktext": list(rows)}
        if rows
        else {"showticklabels": False}
    )
    height = int(min(1400, max(460, 70 * (max(ys) - min(ys) + 2))))
    return {
        "title": {"text": title}, "hovermode": "closest", "plot_bgcolor": "white", "height": height,
        "margin": {"l": 60, "r": 30, "t": 70, "b": 120},
        "xaxis": {"tickvals": ticks, "ticktext": labels, "showgrid": False, "zeroline": False,
                  "range": [min(ticks) - 0.6, max(ticks) + 0.9]},
        "yaxis": yaxis, "legend": {"orientation": "h", "y": -0.12, "yanchor": "top"},
    }  # fmt: skip


def _placed(circuits: Sequence[Circuit]) -> tuple[dict[str, tuple[float, float]], set[str]]:
    names = {n for c in circuits for n in c.nodes} | {w for c in circuits for w, _ in c.edges}
    names |= {component_of(r) for c in circuits for _, r in c.edges}
    graph = circuits[0].metadata.get("graph", {})
    pos = node_positions(graph, names)
    missing = sorted(n for n in names if n not in pos)
    if missing:
        raise ValueError(f"cannot place {missing[:3]} on the {graph.get('arch', '?')} layout")
    return pos, names


def _node_info(circuits: Sequence[Circuit], labels: Sequence[str]) -> dict[str, str]:
    info: dict[str, list[str]] = {}
    for label, c in zip(labels, circuits, strict=True):
        out_deg: dict[str, int] = {}
        in_deg: dict[str, int] = {}
        for w, r in c.edges:
            out_deg[w] = out_deg.get(w, 0) + 1
            in_deg[component_of(r)] = in_deg.get(component_of(r), 0) + 1
        for n in set(out_deg) | set(in_deg):
            info.setdefault(n, []).append(
                f"{label}: in {in_deg.get(n, 0)}, out {out_deg.get(n, 0)}"
            )
    graph = circuits[0].metadata.get("graph", {})
    return {
        n: f"<b>{n}</b> ({_hook(n, graph)})<br>" + "<br>".join(lines) for n, lines in info.items()
    }


def circuit_figure(circuit: Circuit, title: str | None = None) -> go.Figure:
    """One circuit on its model's layout (see the module docstring).

    Args:
        circuit: The circuit.
        title: Figure title (default: target, edge count, sparsity, ablation).

    Returns:
        A plotly figure (``.show()`` inline in Jupyter; ``mechlab.viz.write_html``).
    """
    pos, _ = _placed([circuit])
    consensus = consensus_scores(circuit)
    runs = circuit.metadata.get("consensus", {}).get("n_runs") if consensus else None
    groups: dict[tuple[str, int] | tuple[str, int, int], list] = {}
    for edge, score in circuit.edges.items():
        key = (_reader_kind(edge[1]), _band(score))
        if consensus is not None:  # opacity follows how often the runs keep the edge
            key = (*key, _band(consensus.get(edge, 0.0)))
        groups.setdefault(key, []).append((edge, score))
    graph = circuit.metadata.get("graph", {})
    hover = {e: f"{edge_text(e, graph)}<br>score {s:.3f}"
                + ("" if consensus is None else
                   f"<br>consensus {consensus.get(e, 0.0):.2f} (kept in {round(consensus.get(e, 0.0) * runs)} "
                   f"of {runs} runs)")
             for e, s in circuit.edges.items()}  # fmt: skip
    names = {k: f"→ {k}" for k in _KIND_COLOUR}
    fig = go.Figure()
    _draw(fig, groups, pos, _KIND_COLOUR, names, hover)
    inside = (
        set(circuit.nodes)
        | {w for w, _ in circuit.edges}
        | {component_of(r) for _, r in circuit.edges}
    )
    heads = {n for n in inside if parse_component(n)[0] == "head"}
    _nodes(fig, pos, inside, _node_info([circuit], ["kept"]), heads, graph)
    if title is None:
        meta = circuit.metadata
        reached = meta.get("sparsity_reached")
        title = (
            f"Circuit for {meta.get('target', '?')}: {circuit.n_edges} edges"
            + (f", sparsity {reached:.4f}" if isinstance(reached, float) else "")
            + (f", ablation {meta['ablation']}" if "ablation" in meta else "")
            + ("" if consensus is None else f"; opacity: consensus over {runs} runs")
        )
        if isinstance(meta.get("stability"), Mapping):  # mechlab prune --stability N
            title += f"<br><sup>{stability_text(meta['stability'], short=True)}</sup>"
    return _finish(fig, pos, title, inside)


def overlap_figure(
    circuits: Sequence[Circuit], labels: Sequence[str] | None = None, title: str | None = None
) -> go.Figure:
    """Two or more circuits of one model on one layout, edges coloured by who holds them.

    Two circuits: ``shared``, ``only A``, ``only B``; more: ``shared by all`` and, for the
    rest, the number of circuits that hold the edge. Hover lists the holders.

    Args:
        circuits: Circuits of the same model (same graph).
        labels: A name per circuit (default: target and seed from the metadata).
        title: Figure title.

    Returns:
        A plotly figure.

    Raises:
        ValueError: Fewer than two circuits, labels of the wrong length, or circuits of
            different graphs.
    """
    if len(circuits) < 2:
        raise ValueError("an overlap view needs at least two circuits")
    if labels is None:
        labels = [
            f"{c.metadata.get('target', '?')} s{c.metadata.get('seed', i)}"
            for i, c in enumerate(circuits)
        ]
    if len(labels) != len(circuits):
        raise ValueError(f"{len(labels)} labels for {len(circuits)} circuits")
    graphs = {repr(sorted(c.metadata.get("graph", {}).items())) for c in circuits}
    if len(graphs) > 1:
        raise ValueError("the circuits come from different graphs; an overlap view needs one model")
    pos, _ = _placed(circuits)
    holders: dict[tuple[str, str], list[int]] = {}
    scores: dict[tuple[str, str], float] = {}
    for i, c in enumerate(circuits):
        for edge, score in c.edges.items():
            holders.setdefault(edge, []).append(i)
            scores[edge] = max(scores.get(edge, 0.0), score)
    n = len(circuits)
    groups: dict[tuple[str, int], list] = {}
    colours: dict[str, str] = {}
    names: dict[str, str] = {}
    for edge, who in holders.items():
        if len(who) == n:
            group = "shared"
        elif n == 2:
            group = f"only {who[0]}"
        else:
            group = f"{len(who)} of {n}"
        groups.setdefault((group, _band(scores[edge])), []).append((edge, scores[edge]))
    counts: dict[str, int] = {}
    for (group, _), edges in groups.items():
        counts[group] = counts.get(group, 0) + len(edges)
    for group in counts:
        if group == "shared":
            colours[group], names[group] = _MEMBERSHIP["shared"], f"shared by all ({counts[group]})"
        elif group.startswith("only "):
            i = int(group.split()[1])
            colours[group], names[group] = _MEMBERSHIP[i % 4], f"only {labels[i]} ({counts[group]})"
        else:
            k = int(group.split()[0])
            shade = int(200 - 150 * (k - 1) / max(1, n - 2))
            colours[group], names[group] = (
                f"rgb({shade},{shade},{shade})",
                f"in {group} ({counts[group]})",
            )
    graph = circuits[0].metadata.get("graph", {})
    hover = {
        e: f"{edge_text(e, graph)}<br>in: " + ", ".join(labels[i] for i in who)
        for e, who in holders.items()
    }
    fig = go.Figure()
    _draw(fig, groups, pos, colours, names, hover)
    inside = {w for w, _ in holders} | {component_of(r) for _, r in holders}
    heads = {m for m in inside if parse_component(m)[0] == "head"}
    _nodes(fig, pos, inside, _node_info(circuits, labels), heads, graph)
    if title is None:
        title = (
            "Overlap: " + " vs ".join(labels) + f" ({counts.get('shared', 0)} edges shared by all)"
        )
    return _finish(fig, pos, title, inside)


def circuits_across_checkpoints_figure(
    circuits: Sequence[Circuit], steps: Sequence[int] | None = None, title: str | None = None
) -> go.Figure:
    """How one target's circuit changes over a run: kept edges by checkpoint.

    Top: a heatmap, one row per edge kept at any checkpoint (in graph order of first
    appearance), one column per checkpoint, coloured by the edge's score (blank where it
    was not kept). Bottom: each checkpoint's edge count and its Jaccard with the last
    checkpoint's circuit.

    Args:
        circuits: Circuits of one model's graph, in training order (e.g. ``mechlab prune``
            run on each ``checkpoints/step_*.pt`` of a run).
        steps: The checkpoints' steps (default: each circuit's ``checkpoint_step``
            metadata, else 0, 1, ...).
        title: Figure title.

    Returns:
        A plotly figure.

    Raises:
        ValueError: No circuits, steps of the wrong length, or circuits of different graphs.
    """
    if not circuits:
        raise ValueError("give at least one circuit")
    if steps is None:
        steps = [int(c.metadata.get("checkpoint_step", i)) for i, c in enumerate(circuits)]
    if len(steps) != len(circuits):
        raise ValueError(f"{len(steps)} steps for {len(circuits)} circuits")
    if len({repr(sorted(c.metadata.get("graph", {}).items())) for c in circuits}) > 1:
        raise ValueError(
            "the circuits come from different graphs; they must share one model's graph"
        )
    rows: list[tuple[str, str]] = []
    for c in circuits:
        rows += [e for e in c.edges if e not in rows]
    z = [[c.edges.get(e) for c in circuits] for e in rows]  # None: not kept
    last = set(circuits[-1].edges)
    similarity = [jaccard(c.edges, last) for c in circuits]
    labels = [str(s) for s in steps]
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.75, 0.25],
        vertical_spacing=0.04,
        specs=[[{}], [{"secondary_y": True}]],
    )  # the Jaccard on its own 0-1 axis
    zmin, zmax, bar = colour_range(z, "score")  # an attribution score may pass 0..1: not clipped
    fig.add_trace(go.Heatmap(
        z=z, x=labels, y=[f"{w} → {r}" for w, r in rows], colorscale="Viridis", zmin=zmin, zmax=zmax,
        colorbar={"title": bar, "len": 0.7, "y": 0.62}, hoverongaps=False,
        hovertemplate="step %{x}<br>%{y}<br>score %{z:.3f}<extra></extra>",
    ), row=1, col=1)  # fmt: skip
    fig.add_trace(go.Scatter(x=labels, y=[len(c.edges) for c in circuits], name="edges kept",
                             mode="lines+markers"), row=2, col=1)  # fmt: skip
    fig.add_trace(go.Scatter(x=labels, y=similarity, name="Jaccard with the last (right axis)",
                             mode="lines+markers", line={"dash": "dash"}), row=2, col=1, secondary_y=True)  # fmt: skip
    fig.update_yaxes(title_text="edges", rangemode="tozero", row=2, col=1, secondary_y=False)
    fig.update_yaxes(
        title_text="Jaccard",
        range=[0, 1.05],
        tickvals=[0, 0.5, 1],
        showgrid=False,
        row=2,
        col=1,
        secondary_y=True,
    )
    target = circuits[-1].metadata.get("target", "?")
    fig.update_layout(
        title=title or f"Circuit for {target} across {len(circuits)} checkpoints",
        height=int(min(1600, max(450, 18 * len(rows) + 250))),
        legend={"x": 1.1, "xanchor": "left", "y": 0.25, "yanchor": "top"},  # beside its panel and axis, under the colour bar
        xaxis2={"title": "checkpoint step", "type": "category"},
    )  # fmt: skip
    return fig
