"""The report's wording: its findings, sentences written from its numbers, never by hand.

:func:`findings` words, from a report's own numbers (a
:class:`~mechlab.pipelines.report.Report`, read by attribute: ``config``, ``evals``,
``circuits``, ``overlap``, ``recall``), which offsets follow the label, whether the
targets' circuits overlap more than each null model and what that means, which heads carry
the label, what the cross-evaluation shows, and the caveats (seeds, sample sizes); the same
code words the report of any recall run. Whether the model does each target's prediction
is decided in :mod:`mechlab.evals.does_task`; the page that shows the findings is
:mod:`mechlab.viz.report_page`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from mechlab.evals.does_task import not_done, task_status
from mechlab.models.names import hook_name
from mechlab.prune.circuit import (  # the overlap statistics' names and interval rule, defined once
    CROSS_TARGET_JACCARD,
    MIN_SEEDS_FOR_INTERVAL,
    SEED_BASELINE_JACCARD,
    no_interval,
)
from mechlab.prune.config import PruneConfig

SIGNIFICANT = 0.05  # a null's tail probability below this: "more than the null"

# docs/concepts.md sections the page links (heading anchors, GitHub style)
CONCEPTS = {
    "nih": "the-recall-task",
    "faithfulness": "faithfulness-and-complement-faithfulness",
    "complement": "faithfulness-and-complement-faithfulness",
    "task": "does-the-model-do-the-task",
    "overlap": "overlap-statistics",
    "nulls": "null-models-uniform-and-degree-preserving",
    "stability": "seed-stability-and-intervals",
    "cross": "cross-evaluation",
    "recall": "label--vs-observation-based-recall",
    "names": "one-name-per-component",
    "circuits": "circuits",
}


def concepts_link(key: str, text: str) -> str:
    """A link to the term's definition on the page itself (``#concept-<key>``, at the end:
    :func:`mechlab.viz.report_page.page`), which names its section of
    ``docs/concepts.md`` in the mechlab repository: a relative link, so that the page works
    wherever it is moved or opened (no path of the machine that wrote it)."""
    if key not in CONCEPTS:
        raise KeyError(f"no section of docs/concepts.md for {key!r}")
    return f"<a href='#concept-{key}'>{html.escape(text)}</a>"


def concepts_source(key: str) -> str:
    """Where a term is explained further: its section of ``docs/concepts.md`` in the
    mechlab repository (``docs/concepts.md#the-recall-task``), as the page names it."""
    return f"docs/concepts.md#{CONCEPTS[key]}"


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


def task_warning(target: str, s: dict[str, Any]) -> str:
    """One plain-text line: the model does not do ``target``'s prediction, and why it says so."""
    verdict = f"; its recall verdict at {target} is {s['verdict']}" if s.get("verdict") else ""
    return (
        f"the model does not do the {target} prediction: its median error {_f(s['error'])} is "
        f"{_f(s['ratio'], 2)} of the mean predictor's (the model does a prediction when its error is "
        f"below {_f(s['threshold'], 2)} of it){verdict}. The {target} circuits are circuits of a "
        "model that does not do this prediction: shown, not interpreted."
    )


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
        f"The {a} and {b} circuits share a {CROSS_TARGET_JACCARD} of {_f(obs)} (mean edge Jaccard over "
        "every pair of seeds); random circuits of "
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
            f" Two prunings of one target (other seeds, other traces) agree at {_span(seeds)} (the "
            f"{SEED_BASELINE_JACCARD}): "
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
            f"{no_interval(n)[0].upper()}{no_interval(n)[1:]}: none is shown (a bootstrap over fewer "
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
            f"Each pruning ran {cfg.steps} optimiser steps (mechlab prune runs "
            f"{PruneConfig().steps} by default)."
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
    """Every conclusion of the page, by section (``task``: a warning per target whose
    prediction the model does not do (:func:`task_status`); ``evaluation``, ``circuits``,
    ``overlap``, ``cross``, ``recall``, ``heads``, ``caveats``), as HTML sentences; the
    circuits of a target the model does not do are not interpreted."""
    status = task_status(report.evals, report.recall, list(report.circuits))
    absent = not_done(status)
    warnings = [task_warning(t, status[t]) for t in absent]
    out: dict[str, list[str]] = {"task": [html.escape(w[0].upper() + w[1:]) for w in warnings]}
    out["evaluation"] = _eval_findings(report.evals)
    out["circuits"] = [
        _not_interpreted(t) if t in absent else line
        for t, line in zip(report.circuits, _circuit_findings(report.circuits), strict=True)
    ]
    within = report.overlap.get("within", {})
    out["overlap"] = []
    for k, e in report.overlap.get("across", {}).items():
        missing = [t for t in k.split(" vs ") if t in absent]
        out["overlap"].append(
            _not_interpreted(*missing) if missing else null_sentence(k, e, within)
        )
    rows = [r for r in report.overlap.get("cross_evaluation", [])
            if r["circuit_target"] not in absent and r["evaluated_on"] not in absent]  # fmt: skip
    out["cross"] = cross_findings(rows, report.circuits)
    if len(rows) < len(report.overlap.get("cross_evaluation", [])):
        out["cross"].append(
            _not_interpreted(*absent) + " Their rows are in the table, not read here."
        )
    out["recall"] = recall_findings(report.recall)
    heads = head_findings(report.recall, report.circuits)
    out["heads"] = (
        [_not_interpreted("1-after") + " No head is named."] if "1-after" in absent else heads
    )
    out["caveats"] = caveats(report)
    return out


def _not_interpreted(*targets: str) -> str:
    names = " and ".join(dict.fromkeys(targets))
    return (
        f"<b>Not interpreted</b>: the model does not do the {names} prediction (see the top of "
        f"this page), so the {names} circuits are circuits of a model that does not do the task; "
        "nothing is read into them."
    )


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
