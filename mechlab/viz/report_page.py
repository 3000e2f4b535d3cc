"""The report's page: sections that say how to read them, and conclusions written from the numbers.

:func:`page` turns a report (a :class:`~mechlab.pipelines.report.Report`, read by
attribute) into ``index.html``. Every section opens with a short "how to read this"
(``<p class="how">``), links its terms to their definitions at the page's end (each naming
its section of ``docs/concepts.md``; links within the page, so that it works wherever it is
moved), and ends with what the numbers say, in sentences computed from the report's own
numbers (:func:`~mechlab.viz.report_text.findings`, in :mod:`mechlab.viz.report_text`).
Nothing on the page is written by hand for one checkpoint: the same code words the report
of any recall run.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from mechlab.evals.does_task import DOES_TASK_BELOW, not_done, task_status
from mechlab.models.names import hook_name
from mechlab.prune.circuit import (
    CROSS_TARGET_JACCARD,
    EDGE_JACCARD,
    INTERVAL,
    MIN_SEEDS_FOR_INTERVAL,
    SEED_BASELINE_JACCARD,
    SHOWN_JACCARD,
    interval_text,
)
from mechlab.viz.figures import body_html, page_html
from mechlab.viz.report_text import _f, _table, concepts_link, concepts_source, findings

STYLE = (
    "p.how{background:#f3f7fb;border-left:4px solid #6a9fd4;padding:6px 10px;margin:0.6em 0}"
    "ul.findings li{margin:0.35em 0}p.caveat{color:#444;font-size:0.95em}"
    "section{margin-bottom:2.2em}dl dt{font-weight:bold;margin-top:0.6em}dl dd{margin-left:1.2em}"
    "code{font-size:0.92em}"
    "div.not-done{background:#fdecea;border:2px solid #c0392b;padding:8px 12px;margin:0.8em 0}"
)


def _section(sid: str, title: str, how: str, *body: str) -> str:
    return (f"<section id='{sid}'><h2>{html.escape(title)}</h2><p class='how'><b>How to read this.</b> "
            f"{how}</p>{''.join(body)}</section>")  # fmt: skip


def _list(items: Sequence[str]) -> str:
    return (
        "<ul class='findings'>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else ""
    )


def _fig(figure: Any) -> str:
    return body_html(figure)


def page(report: Any) -> str:
    """The whole ``index.html`` of a report (plotly.js from ``plotly.min.js`` beside it)."""
    found = findings(report)
    figures = dict(report.figures())
    cfg = report.config
    n_seeds = len(cfg.seeds)
    absent = not_done(task_status(report.evals, report.recall, list(report.circuits)))
    warning = "" if not found["task"] else (
        "<div class='not-done' id='not-done'><b>The model does not do the task here.</b><ul>"
        + "".join(f"<li>{w}</li>" for w in found["task"])
        + f"</ul>The rule: the model does a prediction when its median error is below "
        f"{DOES_TASK_BELOW:.2f} of what predicting the mean state scores (1 on this page's scale). "
        f"Train longer, or report a later checkpoint, before reading its circuits "
        f"({concepts_link('task', 'does the model do the task?')}).</div>"
    )  # fmt: skip
    summary = _section(
        "findings", "What this report finds",
        "Each line below is written by mechlab from the numbers further down (nothing is hand-written "
        "for this checkpoint); the sections after it show the numbers, the figures and how to read "
        "them, and the definitions are at the end.",
        _list([*found["task"], *found["recall"][:2], *found["overlap"][:1], *found["heads"][:1]]),
        "".join(f"<p class='caveat'>{c}</p>" for c in found["caveats"]),
    )  # fmt: skip

    nih = report.evals["nih"]["result"]
    rows = [["offset", "median error", "quartiles"]]
    for j, v in nih["offsets"].items():
        rows.append([f"{j}-after", _f(v["median"], 4), f"{_f(v['q1'], 4)} – {_f(v['q3'], 4)}"])
    seg = nih["seg_len"]
    evaluation = _section(
        "evaluation", "1. Evaluation: how well the model predicts",
        f"The model sees {nih['n_haystack']} systems once each (the haystack), then the query label "
        f"reopens one of them; the j-after prediction is the one made j − 1 tokens after that label "
        f"({concepts_link('nih', 'the recall task')}). The table and the first figure give the median "
        "squared error and its quartiles per offset (log scale; the dotted line at 1 is what predicting "
        "the mean scores). The study's evaluation scores 1-, 2-, 3-, 7- and 8-after; with "
        f"{seg}-observation segments only those up to {seg}-after exist, which is why this table stops "
        "there while the recall section below covers every offset. The second figure repeats the "
        "errors under four probes, each changing one thing about the trace.",
        _table(rows), _list(found["evaluation"]),
        _fig(figures["Needle in a haystack"]), _fig(figures["Out-of-distribution probes"]),
    )  # fmt: skip

    crow = [
        ["target", "seed", "edges kept", "edges asked", "faithfulness", "complement faithfulness"]
    ]
    for target, cs in report.circuits.items():
        for c in cs:
            m = c.metadata.get("metrics", {})
            crow.append([target + (" (not done by the model)" if target in absent else ""),
                         str(c.metadata.get("seed")), str(len(c.edges)),
                         str(c.metadata.get("n_edges_asked", "")), _f(m.get("faithfulness")),
                         _f(m.get("complement_faithfulness"))])  # fmt: skip
    circuits = _section(
        "circuits", "2. Circuits: the edges each prediction needs",
        f"Edge pruning keeps the fewest edges between components (embeddings, heads, MLPs, read-out) "
        f"that still reproduce the model's prediction at one target while every other edge carries "
        f"the output of a misdirected trace ({concepts_link('circuits', 'circuits')}). "
        f"{concepts_link('faithfulness', 'Faithfulness')} 1 means the circuit alone does the full "
        "model's job, 0 no better than ablating everything; complement faithfulness is the same with "
        "only the circuit ablated (near 0: nothing outside it does the job). Each seed draws its own "
        "traces and scores on its own held-out ones. In the explorer, choose the target, method and "
        "seed; compare with a second circuit to colour edges shared / only A / only B; filter by score "
        "(the mask) or stability (the fraction of this target's seeds that keep the edge); hover or "
        "click a node or an edge for its scores under both its names, the graph's (a0.h4) and the "
        f"hook's (blocks.0.attn.hook_result[4]; {concepts_link('names', 'one name per component')}).",
        _table(crow), _list(found["circuits"]), _explorer(report),
    )  # fmt: skip

    overlap = _overlap_section(report, found, n_seeds)
    recall = _recall_section(report, found, figures["Label- vs observation-based recall"])
    sections = [warning, summary, evaluation, circuits, overlap, recall,
                _definitions(), _files(report)]  # fmt: skip
    return page_html(f"mechlab report: {report.checkpoint}", [("", "".join(sections))],
                     plotlyjs="directory", style=STYLE)  # fmt: skip


def _explorer(report: Any) -> str:
    """Every circuit in one explorer, opening on the first circuit of the first target
    compared with the first of the second (their overlap)."""
    sizes = [len(cs) for cs in report.circuits.values()]
    return report.explorer().to_div(0, sizes[0] if len(sizes) > 1 else None)


def _interval(ci: dict[str, Any] | None, n_seeds: int) -> str:
    """The interval cell: the words every command uses (:func:`mechlab.prune.circuit.interval_text`)."""
    return html.escape(interval_text(ci, n_seeds))


def _overlap_section(report: Any, found: dict[str, list[str]], n_seeds: int) -> str:
    ov = report.overlap
    if not ov.get("across"):
        return _section("overlap", "3. Do the targets share a circuit?",
                        "With one target there is nothing to compare; give two or more --target.")  # fmt: skip
    rows = [["pair", "statistic", "value", "interval", "uniform null", "degree-preserving null",
             "P(degree null ≥ observed)"]]  # fmt: skip
    for key, e in ov["across"].items():
        d = e["null_degree"]
        rows.append([key, CROSS_TARGET_JACCARD, _f(e["jaccard_observed"]), _interval(e["jaccard"], n_seeds),
                     _f(e["null_uniform"]["mc_mean"]), f"{_f(d['mc_mean'])} ± {_f(d['mc_std'])}",
                     _f(d["p_greater"], 4)])  # fmt: skip
    for target, ci in ov.get("within", {}).items():
        rows.append(
            [
                f"{target}, seed vs seed",
                SEED_BASELINE_JACCARD,
                _f(ci["value"]),
                _interval(ci, n_seeds),
                "",
                "",
                "",
            ]
        )
    excluded = ", ".join(ov.get("excluded_writers", [])) or "none"
    srow = [["pair", "shared, stable", "shared, unstable", "only first, stable", "only first, unstable",
             "only second, stable", "only second, unstable", "stable shared edges"]]  # fmt: skip
    for key, e in ov["across"].items():
        sides = e.get("edges")
        if sides:
            named = ", ".join(f"{w} → {r}" for w, r, *_ in sides["shared_stable"]) or "none"
            srow.append([key, *(str(sides[f"n_{k}"]) for k in ("shared_stable", "shared_unstable", "a_only_stable",
                                                              "a_only_unstable", "b_only_stable", "b_only_unstable")),
                         html.escape(named)])  # fmt: skip
    stable_at = next(
        (e["edges"]["stable_at"] for e in ov["across"].values() if e.get("edges")), None
    )
    stable = "" if len(srow) == 1 else (
        f"<p>Which edges are stable: an edge is stable in a target when at least {stable_at:.0%} of that "
        "target's seeds keep it (its consensus), shared when both targets keep it in some seed. Shared "
        "stable edges are what the two computations have in common beyond the seeds' noise; unstable "
        "ones are the seeds' disagreement.</p>" + _table(srow))  # fmt: skip
    crow = [["circuit", "seed", "scored on", "faithfulness", "complement"]]
    for r in ov.get("cross_evaluation", []):
        crow.append([r["circuit_target"], str(r["seed"]), r["evaluated_on"] + (" (own)" if r["own"] else ""),
                     _f(r["faithfulness"]), _f(r["complement_faithfulness"])])  # fmt: skip
    first = next(iter(report.circuits.values()))[0]
    cross = _section(
        "cross-evaluation", "3b. Does one target's circuit do the other's job?",
        f"{concepts_link('cross', 'Cross-evaluation')} scores every circuit on every target. All rows "
        f"use one set of traces, the held-out traces of seed {first.metadata.get('seed')}'s "
        f"{first.metadata.get('target')} circuit, so that every circuit meets the same inputs; a "
        "circuit's own-target row (own) therefore differs a little from its faithfulness in the "
        "circuits table, which uses its own seed's traces.",
        _table(crow), _list(found["cross"]),
    )  # fmt: skip
    return _section(
        "overlap", "3. Do the targets share a circuit?",
        f"The {EDGE_JACCARD} of two circuits is their shared edges over all their edges; the "
        f"<b>{CROSS_TARGET_JACCARD}</b> of two targets ({concepts_link('overlap', 'overlap statistics')}), "
        "this section's headline, is its mean over every "
        "pair of seeds (one circuit of each target). The circuit explorer above shows instead the "
        f"{SHOWN_JACCARD} of the one pair it compares, which is why its number differs. The "
        f"{CROSS_TARGET_JACCARD} means little alone, so it stands beside two "
        f"{concepts_link('nulls', 'null models')}: random circuits of the same sizes (uniform), and "
        "random circuits in which every writer and reader keeps its number of edges (degree-"
        "preserving; what the circuits' shapes alone force them to share). The seed-vs-seed rows "
        f"are the {SEED_BASELINE_JACCARD} ({concepts_link('stability', 'the seed baseline')}): the mean "
        "edge Jaccard of two prunings of one target with different seeds. Intervals are "
        f"{INTERVAL}s, computed and shown only with {MIN_SEEDS_FOR_INTERVAL} or more "
        f"seeds per target. Edges of writers that cannot matter under the ablation ({excluded}) are "
        "left out of the nulls' edge pool.",
        _table(rows), _list(found["overlap"]), stable,
    ) + cross  # fmt: skip


def _recall_section(report: Any, found: dict[str, list[str]], figure: Any) -> str:
    r = report.recall["result"]
    rows = [["offset", "E_label", "E_obs", "E_obs_all", "score", "verdict", "score_all", "verdict_all",
             "follows_label"]]  # fmt: skip
    for j in sorted(r["per_offset"], key=int):
        p = r["per_offset"][j]
        rows.append([f"{j}-after", _f(p["e_label"]), _f(p["e_obs"]), _f(p["e_obs_all"]), _f(p["score"], 2),
                     f"<b>{p['verdict']}</b>", _f(p["score_all"], 2), p["verdict_all"],
                     _f(p["follows_label"], 2)])  # fmt: skip
    heads = r.get("label_heads", {})
    hrows = [["head", "hook", "noise", "denoise"]]
    fraction = {(c["component"], c["direction"]): c["fraction"] for c in r.get("components", [])
                if c["patch"] == "label" and c["offset"] == 1 and c["head"] >= 0}  # fmt: skip
    listed = dict.fromkeys(
        [h for h, _ in heads.get("noise", [])] + [h for h, _ in heads.get("denoise", [])]
    )
    for h in list(listed)[:6]:
        hrows.append([h, f"<code>{hook_name(h)}</code>", _f(fraction.get((h, "noise")), 2),
                      _f(fraction.get((h, "denoise")), 2)])  # fmt: skip
    rule = r["rule"]
    return _section(
        "recall", "4. Label or observations: what each prediction follows",
        f"{concepts_link('recall', 'Label- vs observation-based recall')}: the label token is patched "
        "from a misdirected twin (its label names another system) and, separately, the first "
        "observation after it from a restart twin (a never-seen system's state). E_label and E_obs are "
        "the mean squared changes each patch makes to the j-after prediction; score = E_label / "
        f"(E_label + E_obs): ≥ {_f(rule['label_at'], 2)} label, ≤ {_f(rule['observation_at'], 2)} "
        f"observation, mixed between, neither when both are below {100 * rule['min_effect']:.0f}% of the "
        "prediction's scale (the figure's dotted lines are these thresholds). score_all patches every "
        "observation instead of the first; follows_label is the fraction of misdirected predictions "
        "closer to the wrongly named system. 1-after is made at the label, before any observation of "
        "the query segment, so its E_obs is 0 by causality. The heads table: the fraction of the "
        "label patch's effect on 1-after that one head carries (noise: its misdirected output into "
        f"the clean run; denoise: the reverse), over {r['n_traces']} traces.",
        _table(rows), _list(found["recall"]), _table(hrows) if len(hrows) > 1 else "",
        _list(found["heads"]), _fig(figure),
    )  # fmt: skip


def _definitions() -> str:
    terms = [
        (
            "task",
            "Does the model do the task?",
            "A target's prediction is done by the model when its median NiH error is below "
            f"{DOES_TASK_BELOW:g} of the mean predictor's (1 on this page's scale: predicting the mean "
            "state). Below that its circuits are interpreted; at or above it they are drawn, marked, "
            "and not read.",
        ),
        (
            "overlap",
            "Overlap statistics",
            "Edge Jaccard: shared edges over the edges of either circuit, for one pair. Cross-target "
            "Jaccard: the mean edge Jaccard over every pair of seeds of two targets (the headline). "
            "Seed-baseline Jaccard: the mean over pairs of different seeds of one target. An interval "
            "needs at least 3 seeds per target.",
        ),
        (
            "nih",
            "The recall task (needle in a haystack)",
            "Several systems are shown once each (the haystack), then one resumes after its open label "
            "(the query); j-after is the prediction j − 1 tokens after the query label, so 1-after is "
            "predicted at the label itself.",
        ),
        (
            "circuits",
            "Circuit",
            "The edges (writer → reader pairs of the residual stream) a search keeps; every other edge "
            "carries its ablated output (by default, the writer's output on the misdirected trace).",
        ),
        (
            "faithfulness",
            "Faithfulness",
            "1 − error(circuit) / error(everything ablated), both against the full model's prediction on "
            "held-out traces: 1, the circuit alone does the job; 0, no better than ablating everything.",
        ),
        (
            "complement",
            "Complement faithfulness",
            "The same with only the circuit's edges ablated and everything else kept: near 0 when "
            "nothing outside the circuit can do the job.",
        ),
        (
            "overlap",
            "Cross-target Jaccard",
            "The mean edge Jaccard (shared edges over all edges of two circuits) over every pair of one "
            "circuit of each target, every seed with every seed. The explorer's number is one pair's "
            "edge Jaccard over the edges shown.",
        ),
        (
            "overlap",
            "Seed-baseline Jaccard",
            "The mean edge Jaccard over every pair of one target's circuits of different seeds. "
            f"Intervals (bootstraps over seeds) only from {MIN_SEEDS_FOR_INTERVAL} seeds per target.",
        ),
        (
            "nulls",
            "Uniform null",
            "The Jaccard of random circuits with the same numbers of edges, drawn uniformly from the "
            "graph's edges: what circuits of these sizes share by chance.",
        ),
        (
            "nulls",
            "Degree-preserving null",
            "The Jaccard of random circuits in which every writer keeps its number of outgoing and every "
            "reader its number of incoming edges (edge swaps): what the circuits' shapes alone force.",
        ),
        (
            "stability",
            "Seed stability",
            "How much two prunings of one target with different seeds (and traces) agree: the baseline a "
            "difference between targets must exceed. In the explorer, an edge's stability is the "
            "fraction of its target's seeds that keep it.",
        ),
        (
            "cross",
            "Cross-evaluation",
            "Each circuit scored on every target, all on one set of held-out traces: does the 1-after "
            "circuit also do the 2-after job?",
        ),
        (
            "recall",
            "Label- vs observation-based recall",
            "Whether a prediction after the query label comes from the label (which system it names) or "
            "from the observations that follow it; decided by patching each separately.",
        ),
        (
            "names",
            "Graph and hook names",
            "a0.h4 (the pruning graph's name) is blocks.0.attn.hook_result[4] (the hook's); m1 is "
            "blocks.1.hook_mlp_out; a0.h4.q, the head's query input, is blocks.0.attn.hook_q[4].",
        ),
    ]
    items, seen = [], set()
    for (
        k,
        t,
        d,
    ) in terms:  # the page's terms link here (#concept-<key>): relative, so the page can move
        anchor = "" if k in seen else f" id='concept-{k}'"
        seen.add(k)
        items.append(
            f"<dt{anchor}>{html.escape(t)}</dt><dd>{d} More: <code>{concepts_source(k)}</code>.</dd>"
        )
    return _section("definitions", "Definitions",
                    "The terms the page links are defined here; each names its section of docs/concepts.md "
                    "in the mechlab repository, which says more and points on.",
                    f"<dl>{''.join(items)}</dl>")  # fmt: skip


def _files(report: Any) -> str:
    t = ", ".join(f"{k} {v:.0f} s" for k, v in report.timings.items())
    cfg = report.config
    settings = (f"targets {', '.join(cfg.targets)}; seeds {', '.join(map(str, cfg.seeds))}; recipe "
                f"{cfg.recipe} (NiH construction {cfg.nih}); {cfg.steps or 'the recipe’s'} pruning steps")  # fmt: skip
    return _section(
        "files",
        "Settings, timings and files",
        "What ran, how long each stage took, and the JSON behind every number of this page "
        "(each file beside this page).",
        f"<p>{html.escape(settings)}.</p><p>Timings: {html.escape(t)}.</p>"
        "<p>JSON: <a href='report.json'>report.json</a> (settings and headline numbers), "
        "<a href='eval/nih.json'>eval/</a>, <a href='circuits/'>circuits/</a> (one file per circuit; "
        "<code>mechlab view circuits/*.json --out view.html</code> opens them in the explorer), "
        "<a href='overlap.json'>overlap.json</a>, <a href='recall.json'>recall.json</a>.</p>",
    )


__all__ = ["STYLE", "page"]
