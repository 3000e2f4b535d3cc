"""mechlab.viz.report_text: the report's conclusions are written from its numbers:
each case of each sentence, on numbers made for it (the bundled checkpoint's among them)."""

from __future__ import annotations

from types import SimpleNamespace

from mechlab.pipelines.report import ReportConfig
from mechlab.prune import Circuit
from mechlab.viz.report_page import _interval
from mechlab.viz.report_text import (
    caveats,
    cross_findings,
    head_findings,
    null_sentence,
    recall_findings,
)

RULE = {"min_effect": 0.05, "label_at": 2 / 3, "observation_at": 1 / 3}


def offset(e_label, e_obs, score, verdict, verdict_all=None, follows=0.0):
    return {"e_label": e_label, "e_obs": e_obs, "e_obs_all": e_obs, "scale": 1.0, "score": score,
            "verdict": verdict, "score_all": score, "verdict_all": verdict_all or verdict,
            "follows_label": follows}  # fmt: skip


def test_which_offsets_follow_the_label_and_why_neither():
    per = {"1": offset(1.455, 0.0, 1.0, "label", follows=0.945), "2": offset(0.066, 1.089, 0.06, "observation"),
           "3": offset(0.014, 0.489, 0.03, "observation"), "6": offset(0.002, 0.035, 0.05, "neither", "observation")}  # fmt: skip
    lines = recall_findings({"result": {"per_offset": per, "rule": RULE}})
    assert (
        lines[0].startswith("The 1-after prediction follows the <b>label</b>") and "94%" in lines[0]
    )  # 94.5, printed to the percent
    assert lines[1].startswith("The 2-after and 3-after predictions follow the <b>observations</b>")
    assert "6-after the verdict is <b>neither</b>" in lines[2]
    assert (
        "patching all the observations does" in lines[2]
    )  # the single-token patch is too small there
    mixed = recall_findings(
        {"result": {"per_offset": {"2": offset(0.5, 0.5, 0.5, "mixed")}, "rule": RULE}}
    )
    assert "<b>mixed</b>" in mixed[0]


def entry(observed, uniform, degree, p_uniform, p_degree, p_degree_less=1.0, std=0.0):
    return {"jaccard_observed": observed,
            "null_uniform": {"mc_mean": uniform, "mc_std": 0.01, "p_greater": p_uniform, "p_less": 1 - p_uniform},
            "null_degree": {"mc_mean": degree, "mc_std": std, "p_greater": p_degree, "p_less": p_degree_less}}  # fmt: skip


def test_the_overlap_beside_each_null_says_what_it_means():
    within = {"1-after": {"value": 0.753}, "2-after": {"value": 0.852}}
    # an overlap at the degree null (an earlier default's circuits of the bundled checkpoint: 0.157 beside 0.157)
    forced = null_sentence("1-after vs 2-after", entry(0.157, 0.015, 0.157, 0.002, 1.0), within)
    assert "0.157 ± 0.000 (degree-preserving null)" in forced
    assert "the shared edges are the ones the circuits' shapes force" in forced
    assert "agree at 0.753–0.852 (the seed-baseline Jaccard): far more than the two targets do" in forced
    assert "share a cross-target Jaccard of 0.157 (mean edge Jaccard over every pair of seeds)" in forced
    shared = null_sentence("a vs b", entry(0.5, 0.02, 0.2, 0.001, 0.001), {})
    assert "exceeds both nulls" in shared
    avoid = null_sentence("a vs b", entry(0.05, 0.02, 0.2, 0.01, 1.0, p_degree_less=0.01), {})
    assert "avoid each other" in avoid
    chance = null_sentence("a vs b", entry(0.02, 0.02, 0.05, 0.5, 0.9), {})
    assert "no more than random circuits of these sizes" in chance


def test_why_the_cross_evaluation_differs_from_the_circuits_table():
    def c(target, seed, faith):
        return Circuit.from_edges({("m0", "out"): 1.0}, {"target": target, "seed": seed,
                                                         "metrics": {"faithfulness": faith}})  # fmt: skip

    circuits = {"1-after": [c("1-after", 0, 0.967), c("1-after", 1, 0.949)],
                "2-after": [c("2-after", 0, 0.797), c("2-after", 1, 0.874)]}  # fmt: skip
    rows = [{"circuit_target": t, "seed": s, "own": t == on, "evaluated_on": on, "faithfulness": f}
            for t, s, on, f in [("1-after", 0, "1-after", 0.967), ("1-after", 0, "2-after", 0.0),
                                ("1-after", 1, "1-after", 0.95), ("1-after", 1, "2-after", 0.0),
                                ("2-after", 0, "2-after", 0.797), ("2-after", 0, "1-after", 0.0),
                                ("2-after", 1, "2-after", 0.844), ("2-after", 1, "1-after", 0.0)]]  # fmt: skip
    lines = cross_findings(rows, circuits)
    assert "each does its own target's job and not the other's" in lines[0]
    assert "seed 0's 1-after circuit" in lines[-1]
    assert "2-after seed 1: 0.874 there, 0.844 here (own)" in lines[-1]


def test_heads_that_carry_the_label_and_the_circuits_that_hold_them():
    recall = {
        "result": {"label_heads": {"noise": [["a2.h4", 1.07], ["a0.h4", 1.0], ["a2.h0", 0.1]]}}
    }
    one = [Circuit.from_edges({("embed", "a0.h4.q"): 1.0, ("a2.h4", "out"): 1.0}, {}),
           Circuit.from_edges({("embed", "a0.h4.q"): 1.0}, {})]  # fmt: skip
    text = head_findings(recall, {"1-after": one})[0]
    assert "<b>a2.h4</b> (<code>blocks.2.attn.hook_result[4]</code>, 1.07)" in text
    assert "a2.h0" not in text and "one path" in text
    assert "a2.h4 in 1 of 2, a0.h4 in 2 of 2" in text
    assert (
        "several heads"
        in head_findings({"result": {"label_heads": {"noise": [["a0.h1", 0.2]]}}}, {})[0]
    )


def test_intervals_and_seed_caveats():
    assert _interval({"low": 0.737, "high": 0.737, "level": 0.95}, 2) == (
        "no interval (2 seeds per target; an interval needs 3)"
    )
    assert _interval({"low": 0.65, "high": 0.844, "level": 0.95}, 5) == "95% interval [0.650, 0.844]"
    report = SimpleNamespace(config=ReportConfig(seeds=(0, 1), steps=300), circuits={})
    words = caveats(report)
    assert words[0].startswith("No interval (2 seeds per target; an interval needs 3)") and "--seed 2" in words[0]
    assert "256 traces" in words[1] and "300 optimiser steps" in words[2]
    default = caveats(SimpleNamespace(config=ReportConfig(seeds=(0, 1)), circuits={}))
    assert not any("optimiser steps" in w for w in default)  # the default runs prune's own steps


def test_every_link_of_the_page_finds_its_section_of_concepts_md():
    import re
    from pathlib import Path

    from mechlab.viz.report_text import CONCEPTS, concepts_link

    page = Path(__file__).resolve().parents[2] / "docs" / "concepts.md"
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M):  # GitHub's anchors
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    assert set(CONCEPTS.values()) <= anchors, set(CONCEPTS.values()) - anchors
    assert concepts_link("nulls", "null models") == "<a href='#concept-nulls'>null models</a>"  # on the page
