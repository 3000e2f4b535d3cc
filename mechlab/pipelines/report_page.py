"""The report's page: sections that say how to read them, and conclusions written from the numbers.

:func:`page` turns a :class:`~mechlab.pipelines.report.Report` into ``index.html``. Every
section opens with a short "how to read this" (``<p class="how">``), links its terms to
``docs/concepts.md``, and ends with what the numbers say, in sentences computed here from
the report's own numbers (:func:`findings`): which offsets follow the label, whether
the targets' circuits overlap more than each null model and what that means, which
heads carry the label, and the caveats (seeds, sample sizes). Nothing on the page is
written by hand for one checkpoint: the same code words the report of any recall run.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MIN_SEEDS_FOR_INTERVAL = 3  # a bootstrap over two circuits has two distinct values: no interval
SIGNIFICANT = 0.05  # a null's tail probability below this: "more than the null"

# docs/concepts.md sections the page links (heading anchors, GitHub style)
CONCEPTS = {
    "nih": "the-recall-task",
    "faithfulness": "faithfulness-and-complement-faithfulness",
    "complement": "faithfulness-and-complement-faithfulness",
    "nulls": "null-models-uniform-and-degree-preserving",
    "stability": "seed-stability-and-intervals",
    "cross": "cross-evaluation",
    "recall": "label--vs-observation-based-recall",
    "names": "one-name-per-component",
    "circuits": "circuits",
}


def concepts_link(key: str, text: str) -> str:
    """A link to a section of ``docs/concepts.md`` (the repository's copy, where mechlab
    runs from a clone; otherwise the page names the file and section)."""
    anchor = CONCEPTS[key]
    docs = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"
    label = html.escape(text)
    if docs.is_file():
        return f"<a href='{docs.as_uri()}#{anchor}'>{label}</a>"
    return f"{label} (docs/concepts.md, “{anchor.replace('-', ' ')}”)"


def _f(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x + 0.0:.{digits}f}".replace("-0." + "0" * digits, "0." + "0" * digits)  # no "-0.000"


def _table(rows: Sequence[Sequence[str]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table class='{cls}'><tr>{head}</tr>{body}</table>"


def _span(values: Sequence[float]) -> str:
    """``0.95`` or ``0.95-0.98`` (smallest to largest)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return _f(lo) if abs(hi - lo) < 5e-4 else f"{_f(lo)}–{_f(hi)}"


def _offsets(keys: Sequence[str]) -> str:
    names = [f"{k}-after" for k in keys]
    if len(names) <= 2:
        return " and ".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def _runs(per: dict[str, dict[str, Any]], key: str = "verdict") -> list[tuple[str, list[str]]]:
    """Consecutive offsets with one verdict: ``[("label", ["1"]), ("observation", ["2", "3"]), ...]``."""
    runs: list[tuple[str, list[str]]] = []
    for j in sorted(per, key=int):
        v = per[j][key]
        if runs and runs[-1][0] == v:
            runs[-1][1].append(j)
        else:
            runs.append((v, [j]))
    return runs


# ---------------------------------------------------------------------------------------
# Conclusions from the numbers
# ---------------------------------------------------------------------------------------


def recall_findings(recall: dict[str, Any]) -> list[str]:
    """Which offsets follow the label, which the observations, and why "neither" where it is."""
    r = recall["result"]
    per = r["per_offset"]
    out = []
    for verdict, keys in _runs(per):
        first = per[keys[0]]
        if verdict == "label":
            out.append(
                f"The {_offsets(keys)} prediction{'s follow' if len(keys) > 1 else ' follows'} the "
                f"<b>label</b>: patching the query label moves it by {_f(first['e_label'])}, the first "
                f"observation by {_f(first['e_obs'])} (score {_f(first['score'], 2)}; ≥ "
                f"{_f(r['rule']['label_at'], 2)} means label), and {100 * first['follows_label']:.0f}% of "
                "misdirected predictions land closer to the system the wrong label names."
            )
        elif verdict == "observation":
            scores = ", ".join(_f(per[k]["score"], 2) for k in keys)
            out.append(
                f"The {_offsets(keys)} prediction{'s follow' if len(keys) > 1 else ' follows'} the "
                f"<b>observations</b>: the first observation moves {'them' if len(keys) > 1 else 'it'} "
                f"far more than the label does (score {scores}; ≤ {_f(r['rule']['observation_at'], 2)} "
                f"means observation); {100 * first['follows_label']:.0f}% of misdirected {keys[0]}-after "
                "predictions follow the wrong label."
            )
        elif verdict == "mixed":
            out.append(
                f"At {_offsets(keys)} the prediction is <b>mixed</b>: both the label and the first "
                f"observation move it (score {_f(first['score'], 2)}, between "
                f"{_f(r['rule']['observation_at'], 2)} and {_f(r['rule']['label_at'], 2)})."
            )
        else:
            alls = {per[k]["verdict_all"] for k in keys}
            why = (
                f"neither the label nor the first observation moves the prediction by "
                f"{100 * r['rule']['min_effect']:.0f}% of its scale"
            )
            if alls == {"observation"}:
                why += (
                    "; patching all the observations does (verdict_all: observation): by then the "
                    "later observations carry the system, so one patched observation matters little"
                )
            out.append(f"At {_offsets(keys)} the verdict is <b>neither</b>: {why}.")
    return out


def head_findings(recall: dict[str, Any], circuits: dict[str, list[Any]]) -> list[str]:
    """The heads that carry the label patch to the 1-after prediction, and whether the
    1-after circuits hold them."""
    from mechlab.models.names import hook_name

    heads = recall["result"].get("label_heads", {}).get("noise", [])
    strong = [(h, f) for h, f in heads if f >= 0.5]
    if not heads:
        return ["The per-head patching was not run (--no-components), so no head is named."]
    if not strong:
        top = ", ".join(f"{h} ({_f(f, 2)})" for h, f in heads[:3])
        return [f"No single head carries half of the label patch's effect on 1-after (largest: {top}): "
                "the label reaches the prediction through several heads at once."]  # fmt: skip
    names = " and ".join(f"<b>{h}</b> (<code>{hook_name(h)}</code>, {_f(f, 2)})" for h, f in strong)
    text = (
        f"{'Heads' if len(strong) > 1 else 'Head'} {names} "
        f"{'each carry' if len(strong) > 1 else 'carries'} most of the label patch's effect on the "
        "1-after prediction (the fraction of the whole effect that patching this one head's "
        "misdirected output reproduces)."
    )
    if len({h.split(".")[0] for h, _ in strong}) > 1 and len(strong) > 1:
        text += " Heads of different layers that each carry nearly all of it lie on one path, one after the other."
    one = circuits.get("1-after", [])
    if one:
        held = []
        for h, _ in strong:
            k = sum(h in c.nodes for c in one)
            held.append(f"{h} in {k} of {len(one)}")
        text += f" The 1-after circuits hold them: {', '.join(held)}."
    return [text]


def null_sentence(key: str, entry: dict[str, Any], within: dict[str, dict[str, Any]]) -> str:
    """What the across-target Jaccard means beside its two null models and the seed baseline."""
    obs = entry["jaccard_observed"]
    uni, deg = entry["null_uniform"], entry["null_degree"]
    above_u, above_d = uni["p_greater"] < SIGNIFICANT, deg["p_greater"] < SIGNIFICANT
    below_d = deg["p_less"] < SIGNIFICANT
    a, b = key.split(" vs ")
    head = (
        f"The {a} and {b} circuits share a Jaccard of {_f(obs)} of their edges; random circuits of "
        f"the same sizes would share {_f(uni['mc_mean'])} (uniform null), random circuits with the "
        f"same number of edges at every writer and reader {_f(deg['mc_mean'])} ± {_f(deg['mc_std'])} "
        "(degree-preserving null)."
    )
    if above_u and above_d:
        meaning = (
            " The overlap exceeds both nulls: the circuits share structure beyond what their sizes "
            "and their shapes force, so part of the computation is common to both targets."
        )
    elif above_u and below_d:
        meaning = (
            " More than chance among circuits of these sizes, but less than circuits of these shapes "
            "would share: beyond the edges their shapes force, the two circuits avoid each other."
        )
    elif above_u:
        meaning = (
            " That is more than random circuits of these sizes share, but no more than random circuits "
            "of the same shape (the same writers and readers, as often): the shared edges are the ones "
            "the circuits' shapes force (where the label enters, the path to the read-out), and beyond "
            "them the two circuits are no more alike than chance."
        )
    elif uni["p_less"] < SIGNIFICANT:
        meaning = " That is less than even random circuits of these sizes share: the circuits avoid each other."
    else:
        meaning = " That is no more than random circuits of these sizes share: nothing links the two circuits."
    seeds = [within[t]["value"] for t in (a, b) if t in within]
    if seeds:
        meaning += (
            f" Two prunings of one target (other seeds, other traces) agree at {_span(seeds)}: "
            + ("far more than the two targets do, so the targets' circuits differ beyond pruning noise."
               if obs < min(seeds) else "no more than the two targets do, so the difference may be pruning noise.")
        )  # fmt: skip
    return head + meaning


def cross_findings(rows: Sequence[dict[str, Any]], circuits: dict[str, list[Any]]) -> list[str]:
    """Each target's circuits on their own target and on the others'; why the own-target
    numbers differ from the circuits table."""
    if not rows:
        return []
    out = []
    targets = list(dict.fromkeys(r["circuit_target"] for r in rows))
    for t in targets:
        own = [r["faithfulness"] for r in rows if r["circuit_target"] == t and r["own"]]
        other = [r["faithfulness"] for r in rows if r["circuit_target"] == t and not r["own"]]
        sentence = f"The {t} circuits score {_span(own)} on {t}"
        if other:
            sentence += f" and {_span(other)} on the other target" + (
                ": each does its own target's job and not the other's." if max(other) < 0.5 * min(own)
                else ": they also do part of the other target's job."
            )  # fmt: skip
        out.append(sentence + ("" if other else "."))
    first = next(iter(circuits.values()))[0]
    seed0 = first.metadata.get("seed")
    gaps = []
    for r in rows:
        if not r["own"]:
            continue
        match = [
            c for c in circuits.get(r["circuit_target"], []) if c.metadata.get("seed") == r["seed"]
        ]
        f = match[0].metadata.get("metrics", {}).get("faithfulness") if match else None
        if f is not None and r["seed"] != seed0:
            gaps.append(
                (abs(f - r["faithfulness"]), r["circuit_target"], r["seed"], f, r["faithfulness"])
            )
    if gaps:
        _, t, s, f, g = max(gaps)
        out.append(
            f"Every circuit here is scored on the held-out traces of seed {seed0}'s {first.metadata.get('target')} "
            "circuit (one set of traces, so that circuits and targets compare on the same inputs); the "
            "circuits table scores each circuit on its own seed's held-out traces. Hence "
            f"{t} seed {s}: {_f(f)} there, {_f(g)} here (own) — the spread of a faithfulness across trace draws."
        )
    return out


def caveats(report: Any) -> list[str]:
    """What the numbers rest on: seeds, traces, steps, warnings."""
    cfg = report.config
    n = len(cfg.seeds)
    out = []
    if n < MIN_SEEDS_FOR_INTERVAL:
        out.append(
            f"{n} seed{'s' if n > 1 else ''} per target: no interval is shown (a bootstrap over fewer "
            f"than {MIN_SEEDS_FOR_INTERVAL} circuits has too few distinct resamples to bound anything); "
            "rerun with --seed 0 --seed 1 --seed 2 (or more) for intervals."
        )
    else:
        out.append(
            f"{n} seeds per target: the intervals are percentile bootstraps over {n} circuits per target, "
            "rough with so few; more seeds narrow them."
        )
    out.append(
        f"Sample sizes: evaluation medians over {cfg.eval_traces} traces; each pruning trained on "
        f"{cfg.prune_traces} traces and scored on {2 * cfg.prune_traces} held-out ones; the recall "
        f"verdicts rest on {cfg.recall_traces} traces; null models {cfg.n_null} samples, bootstrap "
        f"{cfg.n_boot} resamples."
    )
    if cfg.steps is not None:
        out.append(
            f"Each pruning ran {cfg.steps} optimiser steps (mechlab prune runs 200 by default)."
        )
    warned = [
        line
        for found in report.circuits.values()
        for c in found
        for line in c.metadata.get("warnings", [])
    ]
    if warned:
        out.append("Pruning warned: " + "; ".join(html.escape(w) for w in warned))
    limited = [
        f"{c.metadata.get('target')} seed {c.metadata.get('seed')}" for found in report.circuits.values()
        for c in found if c.metadata.get("sparsity_limited_by_open_edges")
    ]  # fmt: skip
    if limited:
        n_all = sum(len(found) for found in report.circuits.values())
        which = (
            f"all {n_all} circuits"
            if len(limited) == n_all
            else f"{len(limited)} of {n_all} circuits ({', '.join(limited)})"
        )
        out.append(
            f"{which[0].upper()}{which[1:]} kept fewer edges than the sparsity allows (see the circuits "
            "table): the search closed the others. That is not an error: a circuit is what the masks "
            "kept, and its faithfulness says whether that is enough."
        )
    return out


def findings(report: Any) -> dict[str, list[str]]:
    """Every conclusion of the page, by section (``evaluation``, ``circuits``, ``overlap``,
    ``cross``, ``recall``, ``heads``, ``caveats``), as HTML sentences."""
    out: dict[str, list[str]] = {"evaluation": _eval_findings(report.evals)}
    out["circuits"] = _circuit_findings(report.circuits)
    within = report.overlap.get("within", {})
    out["overlap"] = [
        null_sentence(k, e, within) for k, e in report.overlap.get("across", {}).items()
    ]
    out["cross"] = cross_findings(report.overlap.get("cross_evaluation", []), report.circuits)
    out["recall"] = recall_findings(report.recall)
    out["heads"] = head_findings(report.recall, report.circuits)
    out["caveats"] = caveats(report)
    return out


def _eval_findings(evals: dict[str, Any]) -> list[str]:
    nih = evals["nih"]["result"]
    offsets = nih["offsets"]
    out = [
        "Median squared error (summed over the state's dimensions; 1 is what predicting the mean "
        "state scores): " + ", ".join(f"{j}-after {_f(v['median'])}" for j, v in offsets.items())
        + f", on {nih['n_haystack']} haystack systems of {nih['seg_len']} observations."
    ]  # fmt: skip
    probes = evals.get("ood", {}).get("result", {}).get("probes", {})
    mis = probes.get("misdirect_incorrect")
    clean = probes.get("clean", offsets)
    if mis:
        parts = [
            f"{j}-after {_f(clean[j]['median'])} → {_f(mis[j]['median'])}"
            for j in mis
            if j in clean
        ]
        out.append(
            "A misdirecting label (the query label names another haystack system) changes the error: "
            + ", ".join(parts) + ". A large jump at one offset and none at the next is the first sign "
            "that the first prediction reads the label and the later ones do not."
        )  # fmt: skip
    return out


def _circuit_findings(circuits: dict[str, list[Any]]) -> list[str]:
    out = []
    for target, found in circuits.items():
        faith = [c.metadata.get("metrics", {}).get("faithfulness") for c in found]
        comp = [c.metadata.get("metrics", {}).get("complement_faithfulness") for c in found]
        edges = [len(c.edges) for c in found]
        ok = [f for f in faith if f is not None]
        verdict = (
            "the kept edges alone do the model's job" if ok and min(ok) >= 0.8
            else "the kept edges do part of the model's job" if ok and min(ok) >= 0.3
            else "the kept edges do little of the model's job: the search may have failed"
        )  # fmt: skip
        out.append(
            f"{target}: {', '.join(map(str, edges))} edges, faithfulness {_span(faith)} ({verdict}); "
            f"complement faithfulness {_span(comp)} (near 0: nothing outside the circuit does the job)."
        )
    return out


# ---------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------

STYLE = (
    "p.how{background:#f3f7fb;border-left:4px solid #6a9fd4;padding:6px 10px;margin:0.6em 0}"
    "ul.findings li{margin:0.35em 0}p.caveat{color:#444;font-size:0.95em}"
    "section{margin-bottom:2.2em}dl dt{font-weight:bold;margin-top:0.6em}dl dd{margin-left:1.2em}"
    "code{font-size:0.92em}"
)


def _section(sid: str, title: str, how: str, *body: str) -> str:
    return (f"<section id='{sid}'><h2>{html.escape(title)}</h2><p class='how'><b>How to read this.</b> "
            f"{how}</p>{''.join(body)}</section>")  # fmt: skip


def _list(items: Sequence[str]) -> str:
    return (
        "<ul class='findings'>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else ""
    )


def _fig(figure: Any) -> str:
    from mechlab.viz.figures import body_html

    return body_html(figure)


def page(report: Any) -> str:
    """The whole ``index.html`` of a report (plotly.js from ``plotly.min.js`` beside it)."""
    from mechlab.viz.figures import page_html

    found = findings(report)
    figures = dict(report.figures())
    cfg = report.config
    n_seeds = len(cfg.seeds)
    summary = _section(
        "findings", "What this report finds",
        "Each line below is written by mechlab from the numbers further down (nothing is hand-written "
        "for this checkpoint); the sections after it show the numbers, the figures and how to read "
        "them, and the definitions are at the end.",
        _list([*found["recall"][:2], *found["overlap"][:1], *found["heads"][:1]]),
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
            crow.append([target, str(c.metadata.get("seed")), str(len(c.edges)),
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
    sections = [summary, evaluation, circuits, overlap, recall,
                _definitions(), _files(report)]  # fmt: skip
    return page_html(f"mechlab report: {report.checkpoint}", [("", "".join(sections))],
                     plotlyjs="directory", style=STYLE)  # fmt: skip


def _explorer(report: Any) -> str:
    """Every circuit in one explorer, opening on the first circuit of the first target
    compared with the first of the second (their overlap)."""
    sizes = [len(cs) for cs in report.circuits.values()]
    return report.explorer().to_div(0, sizes[0] if len(sizes) > 1 else None)


def _interval(ci: dict[str, Any] | None, n_seeds: int) -> str:
    if ci is None or n_seeds < MIN_SEEDS_FOR_INTERVAL:
        return f"{n_seeds} seed{'s' if n_seeds > 1 else ''}: no interval"
    return f"[{_f(ci['low'])}, {_f(ci['high'])}]"


def _overlap_section(report: Any, found: dict[str, list[str]], n_seeds: int) -> str:
    ov = report.overlap
    if not ov.get("across"):
        return _section("overlap", "3. Do the targets share a circuit?",
                        "With one target there is nothing to compare; give two or more --target.")  # fmt: skip
    rows = [["pair", "edge Jaccard", "95% interval", "uniform null", "degree-preserving null",
             "P(degree null ≥ observed)"]]  # fmt: skip
    for key, e in ov["across"].items():
        d = e["null_degree"]
        rows.append([key, _f(e["jaccard_observed"]), _interval(e["jaccard"], n_seeds),
                     _f(e["null_uniform"]["mc_mean"]), f"{_f(d['mc_mean'])} ± {_f(d['mc_std'])}",
                     _f(d["p_greater"], 4)])  # fmt: skip
    for target, ci in ov.get("within", {}).items():
        rows.append(
            [f"{target}, seed vs seed", _f(ci["value"]), _interval(ci, n_seeds), "", "", ""]
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
        "The edge Jaccard is the shared edges over all edges of the two circuits, averaged over every "
        "pair of seeds (one of each target). It means little alone, so it stands beside two "
        f"{concepts_link('nulls', 'null models')}: random circuits of the same sizes (uniform), and "
        "random circuits in which every writer and reader keeps its number of edges (degree-"
        "preserving; what the circuits' shapes alone force them to share). The seed-vs-seed rows "
        f"are the {concepts_link('stability', 'seed baseline')}: how much two prunings of one target "
        f"agree. Intervals are bootstraps over seeds, shown with {MIN_SEEDS_FOR_INTERVAL} or more "
        f"seeds per target. Edges of writers that cannot matter under the ablation ({excluded}) are "
        "left out of the nulls' edge pool.",
        _table(rows), _list(found["overlap"]), stable,
    ) + cross  # fmt: skip


def _recall_section(report: Any, found: dict[str, list[str]], figure: Any) -> str:
    from mechlab.models.names import hook_name

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
    items = "".join(f"<dt>{concepts_link(k, t)}</dt><dd>{d}</dd>" for k, t, d in terms)
    return _section("definitions", "Definitions",
                    "Each term links its section of docs/concepts.md, which says more and points on.",
                    f"<dl>{items}</dl>")  # fmt: skip


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
