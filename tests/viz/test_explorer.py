"""The circuit explorer's data: every circuit's edges with their scores, stability counted
over the seeds of one target and method, both names of every component; one page that
works as a file and in Jupyter. (Its controls and clicks: tests/test_browser.py.)"""

from __future__ import annotations

import html
import json
import re

import pytest

from mechlab.models.names import hook_name
from mechlab.prune import Circuit
from mechlab.prune.graph import transformer_graph
from mechlab.viz import circuit_explorer

GRAPH = transformer_graph(2, 2).summary()
E1, E2, E3 = ("embed", "a0.h0.q"), ("a0.h0", "m0.in"), ("m0", "out")


def circuit(edges, seed, target="1-after", **meta):
    scores = {e: 0.5 + 0.1 * i for i, e in enumerate(edges)}
    return Circuit.from_edges(scores, {"graph": GRAPH, "target": target, "seed": seed, **meta},
                              log_alpha={e: 2.0 for e in edges})  # fmt: skip


def test_every_circuit_every_edge_and_the_stability_over_its_seeds():
    seeds = [circuit([E1, E2, E3], 0), circuit([E1, E2], 1), circuit([E1], 2)]
    other = circuit([E1, E3], 0, target="2-after")
    data = circuit_explorer([*seeds, other]).data()
    assert [c["label"] for c in data["circuits"]] == [
        "1-after · prune · seed 0", "1-after · prune · seed 1", "1-after · prune · seed 2", "2-after · prune · seed 0",
    ]  # fmt: skip
    edges = [(e["w"], e["r"]) for e in data["edges"]]
    assert edges == [E1, E2, E3]  # the union, each once
    rows = data["circuits"][0]["edges"]
    by_edge = {edges[i]: row for i, row in rows.items()}
    assert (by_edge[E1]["kept_by"], by_edge[E1]["of"], by_edge[E1]["stability"]) == (3, 3, 1.0)
    assert (by_edge[E2]["kept_by"], by_edge[E2]["stability"]) == (2, pytest.approx(2 / 3, abs=1e-4))
    assert (by_edge[E3]["kept_by"], by_edge[E3]["stability"]) == (1, pytest.approx(1 / 3, abs=1e-4))
    assert by_edge[E2]["score"] == pytest.approx(0.6) and by_edge[E2]["log_alpha"] == 2.0
    assert {r["of"] for r in data["circuits"][3]["edges"].values()} == {1}  # its own target and method
    for e in data["edges"]:  # both names of both ends
        assert (e["hw"], e["hr"]) == (hook_name(e["w"], GRAPH), hook_name(e["r"], GRAPH))
    assert data["nodes"]["a0.h0"]["hook"] == "blocks.0.attn.hook_result[0]"


def test_attribution_circuits_show_their_signed_scores_and_are_their_own_method():
    pruned = circuit([E1, E2], 0)
    eap = circuit([E1], 0, method="eap", attribution={"scores": [[*E1, -0.25], [*E2, 0.125]]})
    data = circuit_explorer([pruned, eap]).data()
    row = data["circuits"][1]["edges"][0]  # edge 0 of the union: E1
    assert row["attribution"] == -0.25 and row["of"] == 1
    assert data["circuits"][1]["method"] == "eap"
    recorded = circuit([E1, E2], 1, edge_stability=[[*E1, 0.9], [*E2, 0.4]])
    rows = circuit_explorer([pruned, recorded]).data()["circuits"][1]["edges"]
    assert sorted(r["stability"] for r in rows.values()) == [0.4, 0.9]  # the circuit's own record


def test_one_page_as_a_file_and_in_jupyter(tmp_path):
    a, b = circuit([E1, E2], 0), circuit([E2, E3], 0, target="2-after")
    explorer = circuit_explorer([a, b], ["A </script><b>x", "B"])
    div = explorer.to_div(0, 1)
    blob = re.search(r"<script type='application/json' id='[^']+'>(.*?)</script>", div, flags=re.S)[1]
    assert json.loads(blob)["circuits"][0]["label"] == "A </script><b>x"  # escaped, not closing the script
    page = explorer.write(tmp_path / "view.html", plotlyjs="directory")
    assert (tmp_path / "plotly.min.js").is_file() and "src='plotly.min.js'" in page.read_text()
    inline = explorer.to_html()
    assert inline.count("* plotly.js v") == 1
    frame = explorer._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and html.escape("mechlabExplorer('") in frame


def test_refuses_what_it_cannot_show():
    a = circuit([E1], 0)
    with pytest.raises(ValueError, match="at least one"):
        circuit_explorer([])
    with pytest.raises(ValueError, match="2 labels for 1"):
        circuit_explorer([a], ["x", "y"])
    other = Circuit.from_edges({E1: 1.0}, {"graph": transformer_graph(3, 2).summary()})
    with pytest.raises(ValueError, match="different graphs"):
        circuit_explorer([a, other])
    with pytest.raises(ValueError, match="index the 1 circuits"):
        circuit_explorer([a]).to_div(0, 3)


def test_a_circuit_with_bootstrap_stability_says_it_in_the_summary():
    from mechlab.prune.stability import BootstrapStability

    record = BootstrapStability(mean_jaccard=0.75, pairwise_jaccard=0.6, jaccards=(0.7, 0.8), min_jaccard=0.7,
                                p5=0.705, p95=0.795, edge_frequency={E1: 1.0}, n_boot=2, seed=0,
                                n_edges_reference=1).to_dict()  # fmt: skip
    explorer = circuit_explorer([circuit([E1], 0, stability=record), circuit([E1, E2], 1)])
    with_it, without = explorer.data()["circuits"]
    assert with_it["bootstrap"] == (
        "bootstrap stability: mean edge Jaccard 0.75 with the circuit over 2 resamples of the training "
        "traces, 5-95% 0.70-0.80, min 0.70; replicates agree among themselves at 0.60; bar 0.8: not met"
    )
    assert without["bootstrap"] is None
    page = explorer.to_html()
    assert "(c.bootstrap ? `, ${c.bootstrap}` : '')" in page and "mean edge Jaccard 0.75" in page
