"""The circuit explorer: circuits of one model, explored in Jupyter or in an offline page.

:func:`circuit_explorer` takes circuits of one model's graph (any targets, methods and
seeds) and returns a :class:`CircuitExplorer`: one plotly figure on the layout of
:mod:`mechlab.viz.circuits` and a little JavaScript around it, so that one can

* switch the circuit shown by target, method and seed;
* compare it with a second circuit: edges coloured shared / only A / only B, with their
  edge Jaccard over the edges shown (:data:`~mechlab.prune.circuit.SHOWN_JACCARD`: this one
  pair, not the cross-target Jaccard, the mean over every pair of seeds);
* filter the edges by score (the pruning mask, or ``|attribution|`` scaled to the
  largest kept) and by stability (the fraction of the circuits of the same target and
  method, one per seed, that keep the edge; a circuit's own consensus over seeds and
  nearby budgets, ``metadata["consensus"]``, or ``metadata["edge_stability"]`` is used
  where it records one);
* hover or click a node or an edge to see its scores (mask score, ``log_alpha``, the
  signed attribution score where the method records one, stability) under both names,
  the pruning graph's (``a0.h4``) and the hook's (``blocks.0.attn.hook_result[4]``,
  :mod:`mechlab.models.names`).

It needs no server and fetches nothing: in Jupyter the explorer is displayed as itself
(``explorer`` as a cell's last line, or ``explorer.show()``; the page sits in an iframe
with plotly.js inside), and :meth:`CircuitExplorer.write` writes it as one HTML file
(plotly.js inlined, or beside it with ``plotlyjs="directory"``). The report embeds it
with :meth:`CircuitExplorer.to_div`.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechlab.circuit_methods import DEFAULT_METHOD
from mechlab.io import atomic_write_text
from mechlab.prune.circuit import SHOWN_JACCARD, Circuit
from mechlab.prune.consensus import consensus_scores
from mechlab.prune.graph import parse_component
from mechlab.prune.stability import stability_text
from mechlab.viz.circuits import (
    _KIND_COLOUR,
    _MEMBERSHIP,
    _PORT_DX,
    _PORT_DY,
    PORT_NAMES,
    _control,
    _end,
    _hook,
    _placed,
    _reader_kind,
    circuit_layout,
)
from mechlab.viz.figures import EXPLORER_STYLE, PAGE_STYLE, plotly_script, write_plotlyjs


def _method(c: Circuit) -> str:
    return str(c.metadata.get("method", DEFAULT_METHOD))


def _edge_stability(circuits: Sequence[Circuit]) -> list[dict[tuple[str, str], tuple[int, int]]]:
    """Per circuit: edge -> (circuits of its target and method that keep it, how many there are)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(circuits):
        groups.setdefault((str(c.metadata.get("target", "?")), _method(c)), []).append(i)
    out: list[dict[tuple[str, str], tuple[int, int]]] = []
    for c in circuits:
        members = groups[(str(c.metadata.get("target", "?")), _method(c))]
        out.append(
            {e: (sum(e in circuits[j].edges for j in members), len(members)) for e in c.edges}
        )
    return out


def _recorded_stability(c: Circuit) -> dict[tuple[str, str], float]:
    """The consensus the circuit records (:mod:`mechlab.prune.consensus`: the fraction of
    its runs over seeds and budgets that keep each edge), else ``metadata["edge_stability"]``
    (rows ``[writer, reader, fraction]``), where recorded."""
    consensus = consensus_scores(c)
    if consensus is not None:
        return consensus
    rows = c.metadata.get("edge_stability")
    if not isinstance(rows, list):
        return {}
    return {
        (str(r[0]), str(r[1])): float(r[2])
        for r in rows
        if isinstance(r, list | tuple) and len(r) == 3
    }


def _payload(circuits: Sequence[Circuit], labels: Sequence[str], title: str) -> dict[str, Any]:
    pos, _ = _placed(circuits)
    graph = circuits[0].metadata.get("graph", {})
    union: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for c in circuits:
        for e in c.edges:
            if e not in seen:
                seen.add(e)
                union.append(e)
    index = {e: i for i, e in enumerate(union)}
    edges = []
    for w, r in union:
        start, end = pos[w], _end(r, pos)
        edges.append({
            "w": w, "r": r, "kind": _reader_kind(r), "hw": _hook(w, graph), "hr": _hook(r, graph),
            "p": [round(v, 4) for v in (*start, *_control(start, end, (w, r)), *end)],
        })  # fmt: skip
    stability = _edge_stability(circuits)
    shown = []
    for c, label, stab in zip(circuits, labels, stability, strict=True):
        attribution = {
            (str(w), str(r)): float(s)
            for w, r, s in c.metadata.get("attribution", {}).get("scores", [])
        }
        recorded = _recorded_stability(c)
        rows = {}
        for e, score in c.edges.items():
            k, n = stab[e]
            rows[index[e]] = {
                "score": round(float(score), 4),
                "stability": round(recorded.get(e, k / n), 4), "kept_by": k, "of": n,
                "log_alpha": None if c.log_alpha is None or e not in c.log_alpha else round(c.log_alpha[e], 3),
                "attribution": None if e not in attribution else float(f"{attribution[e]:.4g}"),
            }  # fmt: skip
        metrics = c.metadata.get("metrics", {})
        shown.append({
            "label": label, "target": str(c.metadata.get("target", "?")), "method": _method(c),
            "seed": str(c.metadata.get("seed", "?")), "edges": rows,
            "faithfulness": metrics.get("faithfulness"),
            "complement": metrics.get("complement_faithfulness"),
            "recorded_stability": bool(recorded),
            "bootstrap": (stability_text(c.metadata["stability"])
                          if isinstance(c.metadata.get("stability"), dict) else None),
        })  # fmt: skip
    nodes = {n: {"x": x, "y": y, "hook": _hook(n, graph), "head": parse_component(n)[0] == "head"}
             for n, (x, y) in pos.items()}  # fmt: skip
    return {
        "title": title, "jaccard_name": SHOWN_JACCARD, "nodes": nodes, "edges": edges, "circuits": shown,
        "layout": circuit_layout(pos, title), "kind_colour": _KIND_COLOUR,
        "membership": {"shared": _MEMBERSHIP["shared"], "a": _MEMBERSHIP[0], "b": _MEMBERSHIP[1]},
        "ports": {"dx": _PORT_DX, "dy": _PORT_DY, "names": PORT_NAMES},
    }  # fmt: skip


class CircuitExplorer:
    """Circuits of one model, explorable (see the module docstring).

    Attributes:
        circuits: The circuits, in the order given.
        labels: A name per circuit.
        title: The figure's title.
    """

    def __init__(self, circuits: Sequence[Circuit], labels: Sequence[str], title: str) -> None:
        self.circuits, self.labels, self.title = list(circuits), list(labels), title
        self._data = _payload(self.circuits, self.labels, title)
        digest = hashlib.sha1(json.dumps(self._data, sort_keys=True).encode()).hexdigest()[:10]
        self.id = f"mx{digest}"

    def data(self) -> dict[str, Any]:
        """The JSON the page draws from: nodes, edges (union of every circuit's), circuits."""
        return self._data

    def to_div(self, start: int = 0, compare: int | None = None) -> str:
        """The explorer as an HTML fragment for a page that has loaded plotly.js.

        Args:
            start: Index of the circuit shown first.
            compare: Index of the circuit compared with it first (None: no comparison).
        """
        n = len(self.circuits)
        if not 0 <= start < n or (compare is not None and not 0 <= compare < n):
            raise ValueError(f"start and compare must index the {n} circuits")
        blob = json.dumps(self._data, ensure_ascii=False).replace("</", "<\\/")
        init = json.dumps({"start": start, "compare": compare})
        return (
            f"<div class='mechlab-explorer' id='{self.id}'>"
            f"<div class='mx-controls'>{_CONTROLS}</div>"
            f"<div class='mx-summary' aria-live='polite'></div>"
            f"<div class='mx-plot'></div>"
            f"<div class='mx-details'>Click a node or an edge for its scores.</div></div>"
            f"<script type='application/json' id='{self.id}-data'>{blob}</script>"
            f"<script>{_SCRIPT}\nmechlabExplorer('{self.id}', {init});</script>"
        )

    def to_html(self, plotlyjs: str = "inline", start: int = 0, compare: int | None = None) -> str:
        """The explorer as a whole page.

        Args:
            plotlyjs: ``"inline"`` (plotly.js inside the page: one file that opens
                anywhere) or ``"directory"`` (``plotly.min.js`` beside the page).
            start: Index of the circuit shown first.
            compare: Index of the circuit compared with it first.
        """
        return (
            "<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(self.title)}</title><style>{PAGE_STYLE}{EXPLORER_STYLE}</style>"
            f"{plotly_script(plotlyjs)}</head><body>"
            f"{self.to_div(start, compare)}</body></html>"
        )

    def write(self, path: str | Path, plotlyjs: str = "inline") -> Path:
        """Write the page (atomically); with ``plotlyjs="directory"`` also ``plotly.min.js``
        beside it (when missing). Returns the page's path."""
        path = Path(path)
        if plotlyjs == "directory":
            write_plotlyjs(path.parent)
        return atomic_write_text(path, self.to_html(plotlyjs))

    def _repr_html_(self) -> str:
        """Jupyter: the page in an iframe (its script runs there, plotly.js inside)."""
        height = int(self._data["layout"]["height"]) + 230
        page = html.escape(self.to_html("inline"), quote=True)
        return (f"<iframe srcdoc=\"{page}\" style='width:100%;height:{height}px;border:0' "
                "sandbox='allow-scripts'></iframe>")  # fmt: skip

    def show(self) -> None:
        """Display in Jupyter (IPython's ``display``)."""
        # lazy: optional: IPython exists only inside Jupyter (the notebooks extra)
        from IPython.display import HTML, display

        display(HTML(self._repr_html_()))


def circuit_explorer(
    circuits: Sequence[Circuit], labels: Sequence[str] | None = None, title: str | None = None
) -> CircuitExplorer:
    """An explorer of circuits of one model (see the module docstring).

    Args:
        circuits: One or more circuits of the same graph (targets, methods, seeds).
        labels: A name per circuit (default: target, method and seed).
        title: Figure title.

    Returns:
        The :class:`CircuitExplorer` (shows itself in Jupyter; ``.write(path)``).

    Raises:
        ValueError: No circuits, labels of the wrong length, or circuits of different graphs.
    """
    circuits = list(circuits)
    if not circuits:
        raise ValueError("give at least one circuit")
    if labels is None:
        labels = [f"{c.metadata.get('target', '?')} · {_method(c)} · seed {c.metadata.get('seed', '?')}"
                  for c in circuits]  # fmt: skip
    if len(labels) != len(circuits):
        raise ValueError(f"{len(labels)} labels for {len(circuits)} circuits")
    if len({repr(sorted(c.metadata.get("graph", {}).items())) for c in circuits}) > 1:
        raise ValueError(
            "the circuits come from different graphs; an explorer shows one model's circuits"
        )
    return CircuitExplorer(
        circuits, labels, title or f"{len(circuits)} circuit(s): hover or click for scores"
    )


_CONTROLS = (
    "<label>target <select class='mx-target'></select></label>"
    "<label>method <select class='mx-method'></select></label>"
    "<label>seed <select class='mx-seed'></select></label>"
    "<label>compare with <select class='mx-compare'></select></label>"
    "<label>score &ge; <input class='mx-score' type='range' min='0' max='1' step='0.05' value='0'>"
    "<span class='mx-score-value'>0.00</span></label>"
    "<label>stability &ge; <input class='mx-stab' type='range' min='0' max='1' step='0.05' value='0'>"
    "<span class='mx-stab-value'>0.00</span></label>"
)

# The page's script: builds the traces of the circuits chosen, with the filters applied,
# and answers clicks. Kept small: every number comes from the JSON payload.
_SCRIPT = r"""
function mechlabExplorer(id, init) {
  const root = document.getElementById(id);
  const D = JSON.parse(document.getElementById(id + '-data').textContent);
  const $ = (c) => root.querySelector(c);
  const plot = $('.mx-plot'), details = $('.mx-details'), summary = $('.mx-summary');
  const C = D.circuits;
  const uniq = (xs) => [...new Set(xs)];
  const fill = (sel, values, chosen, texts) => {
    sel.replaceChildren(...values.map((v, k) => new Option(texts ? texts[k] : v, v)));
    if (chosen !== undefined && values.includes(chosen)) sel.value = chosen;
  };
  const fmt = (v, d = 3) => (v === null || v === undefined) ? "n/a" : (Math.abs(v) < 0.5 * 10 ** -d ? 0 : Number(v)).toFixed(d);
  function pick(t, m, s) {
    return C.findIndex(c => c.target === t && c.method === m && c.seed === s);
  }
  function setA(i) {
    const c = C[i];
    fill($('.mx-target'), uniq(C.map(x => x.target)), c.target);
    fill($('.mx-method'), uniq(C.filter(x => x.target === c.target).map(x => x.method)), c.method);
    fill($('.mx-seed'), uniq(C.filter(x => x.target === c.target && x.method === c.method).map(x => x.seed)), c.seed);
  }
  function currentA() {
    let t = $('.mx-target').value, m = $('.mx-method').value, s = $('.mx-seed').value;
    let i = pick(t, m, s);
    if (i < 0) { i = C.findIndex(c => c.target === t && (c.method === m)); }
    if (i < 0) { i = C.findIndex(c => c.target === t); }
    return i;
  }
  fill($('.mx-compare'), ['none', ...C.map((c, k) => String(k))], 'none', ['none', ...C.map(c => c.label)]);
  setA(init.start);
  if (init.compare !== null) $('.mx-compare').value = String(init.compare);
  function sample(p) {
    const [x0, y0, cx, cy, x1, y1] = p, xs = [], ys = [];
    for (let k = 0; k < 16; k++) {
      const t = k / 15, u = 1 - t;
      xs.push(u * u * x0 + 2 * u * t * cx + t * t * x1);
      ys.push(u * u * y0 + 2 * u * t * cy + t * t * y1);
    }
    return [xs, ys, [0.25 * x0 + 0.5 * cx + 0.25 * x1, 0.25 * y0 + 0.5 * cy + 0.25 * y1]];
  }
  const component = (r) => {
    const [base, w] = r.split('@');
    const b = /\.(q|k|v|in|state)$/.test(base) ? base.replace(/\.[a-z]+$/, '') : base;
    return w ? b + '@' + w : b;
  };
  let state = {};
  function passes(row, minScore, minStab) {
    return !!row && row.score >= minScore - 1e-9 && row.stability >= minStab - 1e-9;
  }
  function draw() {
    const a = currentA();
    const cmp = $('.mx-compare').value;
    const b = cmp === 'none' ? -1 : +cmp;
    const minScore = +$('.mx-score').value, minStab = +$('.mx-stab').value;
    $('.mx-score-value').textContent = minScore.toFixed(2);
    $('.mx-stab-value').textContent = minStab.toFixed(2);
    const A = C[a], B = b >= 0 && b !== a ? C[b] : null;
    const groups = new Map(), mids = {x: [], y: [], text: [], idx: []};
    const inside = new Set();
    let nA = 0, nB = 0, nShared = 0;
    D.edges.forEach((e, i) => {
      const ra = A.edges[i], rb = B ? B.edges[i] : undefined;
      const inA = passes(ra, minScore, minStab), inB = B ? passes(rb, minScore, minStab) : false;
      if (!inA && !inB) return;
      nA += inA ? 1 : 0; nB += inB ? 1 : 0; nShared += inA && inB ? 1 : 0;
      let key, name, colour, width, opacity;
      const score = Math.max(inA ? ra.score : 0, inB ? rb.score : 0);
      const band = Math.min(3, Math.max(0, Math.floor(score * 4)));
      if (B) {
        key = inA && inB ? 'shared' : (inA ? 'a' : 'b');
        name = {shared: 'shared', a: 'only ' + A.label, b: 'only ' + B.label}[key];
        colour = D.membership[key];
      } else {
        key = e.kind; name = '→ ' + e.kind; colour = D.kind_colour[e.kind] || '#555';
      }
      const gk = key + '|' + band;
      if (!groups.has(gk)) groups.set(gk, {key, name, colour, band, x: [], y: []});
      const g = groups.get(gk);
      const [xs, ys, mid] = sample(e.p);
      g.x.push(...xs, null); g.y.push(...ys, null);
      mids.x.push(mid[0]); mids.y.push(mid[1]); mids.idx.push(i);
      let text = `<b>${e.w} → ${e.r}</b><br>${e.hw} → ${e.hr}`;
      if (inA) text += `<br>${A.label}: score ${fmt(ra.score)}, kept by ${ra.kept_by} of ${ra.of}`;
      if (inB) text += `<br>${B.label}: score ${fmt(rb.score)}, kept by ${rb.kept_by} of ${rb.of}`;
      mids.text.push(text);
      inside.add(e.w); inside.add(component(e.r));
    });
    const traces = [], legendShown = new Set();
    [...groups.values()].sort((p, q) => (p.key + p.band).localeCompare(q.key + q.band)).forEach(g => {
      traces.push({type: 'scatter', mode: 'lines', x: g.x, y: g.y, hoverinfo: 'skip', name: g.name,
        legendgroup: g.key, showlegend: !legendShown.has(g.key), opacity: 0.35 + 0.65 * (g.band + 1) / 4,
        line: {color: g.colour, width: 1 + 0.9 * (g.band + 1)}});
      legendShown.add(g.key);
    });
    traces.push({type: 'scatter', mode: 'markers', x: mids.x, y: mids.y, hovertext: mids.text,
      hoverinfo: 'text', customdata: mids.idx.map(i => 'e' + i), name: 'edge (hover, click)',
      showlegend: false, marker: {size: 8, color: 'rgba(60,60,60,0.25)'}});
    const names = Object.keys(D.nodes);
    for (const kept of [true, false]) {
      const chosen = names.filter(n => inside.has(n) === kept);
      if (!chosen.length) continue;
      traces.push({type: 'scatter', mode: 'markers', x: chosen.map(n => D.nodes[n].x), y: chosen.map(n => D.nodes[n].y),
        name: kept ? 'component in the circuit' : 'component not in the circuit', legendgroup: 'nodes',
        customdata: chosen.map(n => 'n' + n), hoverinfo: 'text',
        hovertext: chosen.map(n => `<b>${n}</b><br>${D.nodes[n].hook}`),
        marker: {size: kept ? 16 : 7, color: kept ? '#333' : '#d0d0d0', line: {width: 1, color: '#fff'}}});
    }
    const heads = names.filter(n => inside.has(n) && D.nodes[n].head);
    if (heads.length) for (const k of ['q', 'k', 'v']) {
      traces.push({type: 'scatter', mode: 'markers', hoverinfo: 'skip', name: D.ports.names[k], legendgroup: 'ports',
        x: heads.map(n => D.nodes[n].x + D.ports.dx), y: heads.map(n => D.nodes[n].y + D.ports.dy[k]),
        marker: {size: 6, color: D.kind_colour[k], symbol: 'square'}});
    }
    const layout = JSON.parse(JSON.stringify(D.layout));
    layout.annotations = [...inside].filter(n => D.nodes[n]).sort().map(n => ({x: D.nodes[n].x, y: D.nodes[n].y,
      text: n, showarrow: false, xanchor: 'left', yanchor: 'bottom', xshift: 7, yshift: 2,
      font: {size: 11, color: '#222'}, bgcolor: 'rgba(255,255,255,0.85)', borderpad: 1}));
    layout.title = {text: B ? `${A.label} vs ${B.label}` : A.label};
    const describe = (c, n) => `${c.label}: ${n} edges shown of ${Object.keys(c.edges).length}, faithfulness ${fmt(c.faithfulness)}, complement ${fmt(c.complement)}` + (c.bootstrap ? `, ${c.bootstrap}` : '');
    let text = describe(A, nA);
    if (B) {
      const union = nA + nB - nShared;
      text += ` | ${describe(B, nB)} | shared ${nShared}, ${D.jaccard_name} ${fmt(union ? nShared / union : 0)} (this pair only)`;
    }
    summary.textContent = text;
    state = {a, b: B ? b : -1};
    Plotly.react(plot, traces, layout, {responsive: true, displaylogo: false});
  }
  function explain(key) {
    const A = C[state.a], B = state.b >= 0 ? C[state.b] : null;
    if (key[0] === 'e') {
      const i = +key.slice(1), e = D.edges[i];
      const line = (c) => {
        const r = c.edges[i];
        if (!r) return `${c.label}: not in the circuit`;
        let s = `${c.label}: score ${fmt(r.score)}`;
        if (r.log_alpha !== null) s += `, log_alpha ${fmt(r.log_alpha, 2)}`;
        if (r.attribution !== null) s += `, attribution ${r.attribution}`;
        s += `, stability ${fmt(r.stability, 2)} (kept by ${r.kept_by} of ${r.of} circuits of ${c.target}, ${c.method})`;
        return s;
      };
      details.textContent = `edge ${e.w} → ${e.r}\nhooks ${e.hw} → ${e.hr}\n` + line(A) + (B ? '\n' + line(B) : '');
    } else {
      const n = key.slice(1);
      const count = (c) => {
        let into = 0, out = 0;
        D.edges.forEach((e, i) => { if (c.edges[i]) { if (e.w === n) out++; if (component(e.r) === n) into++; } });
        return `${c.label}: ${into} edges in, ${out} out`;
      };
      details.textContent = `component ${n}\nhook ${D.nodes[n].hook}\n` + count(A) + (B ? '\n' + count(B) : '');
    }
  }
  for (const cls of ['.mx-target', '.mx-method']) $(cls).addEventListener('change', () => {
    const t = $('.mx-target').value, m = $('.mx-method').value;
    let i = C.findIndex(c => c.target === t && c.method === m);
    if (i < 0) i = C.findIndex(c => c.target === t);
    setA(i); draw();
  });
  for (const cls of ['.mx-seed', '.mx-compare']) $(cls).addEventListener('change', draw);
  for (const cls of ['.mx-score', '.mx-stab']) $(cls).addEventListener('input', draw);
  draw();
  plot.on('plotly_click', (ev) => { const p = ev.points && ev.points[0]; if (p && p.customdata) explain(p.customdata); });
  window.mechlabExplorers = window.mechlabExplorers || {};
  window.mechlabExplorers[id] = {
    show(a, b) { setA(a); $('.mx-compare').value = b === null || b === undefined ? 'none' : String(b); draw(); },
    filter(score, stab) { $('.mx-score').value = score; $('.mx-stab').value = stab; draw(); },
    explain, summary: () => summary.textContent, details: () => details.textContent,
  };
}
"""
