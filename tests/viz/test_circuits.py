"""Circuit views: every kept edge drawn once, told apart, hoverable; overlap groups counted right."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from mechlab.models.names import hook_name
from mechlab.prune import Circuit
from mechlab.prune.graph import build_graph, transformer_graph, windowed_recurrent_graph
from mechlab.viz.circuits import _curve, circuit_figure, node_positions, overlap_figure


def transformer_circuit(edges, n_layers=3, n_heads=2, scores=None, **meta) -> Circuit:
    graph = transformer_graph(n_layers, n_heads)
    scores = scores or {}
    return Circuit.from_edges({e: scores.get(e, 1.0) for e in edges},
                              {"graph": graph.summary(), **meta})  # fmt: skip


def curves(fig) -> list[np.ndarray]:
    """Every drawn edge curve, as ``[points, 2]`` arrays (line traces, split at None)."""
    out = []
    for trace in fig.data:
        if trace.mode != "lines":
            continue
        xs, ys = list(trace.x), list(trace.y)
        pts = []
        for x, y in zip(xs + [None], ys + [None], strict=True):
            if x is None:
                if pts:
                    out.append(np.array(pts))
                pts = []
            else:
                pts.append((x, y))
    return out


def hover_texts(fig) -> list[str]:
    return [t for trace in fig.data if trace.mode == "markers" and trace.hovertext is not None
            for t in trace.hovertext]  # fmt: skip


EDGES = [("embed", "a0.h0.q"), ("embed", "a0.h0.k"), ("embed", "a0.h0.v"), ("a0.h0", "m0.in"),
         ("m0", "m1.in"), ("m1", "m2.in"), ("m0", "m2.in"), ("m2", "out"), ("a0.h0", "out")]  # fmt: skip


def test_every_kept_edge_is_drawn_once_and_hoverable_with_its_score():
    scores = {e: 0.1 * (i + 1) for i, e in enumerate(EDGES)}
    fig = circuit_figure(transformer_circuit(EDGES, scores=scores))
    assert len(curves(fig)) == len(EDGES)
    texts = hover_texts(fig)
    for (w, r), s in scores.items():
        assert (
            sum(t.startswith(f"{w} → {r}<br>") and t.endswith(f"<br>score {s:.3f}") for t in texts)
            == 1
        )
        # both names of each end: the graph's and the hook's
        assert (
            sum(
                hook_name(w) in t and hook_name(r) in t
                for t in texts
                if t.startswith(f"{w} → {r}<br>")
            )
            == 1
        )


def test_qkv_edges_end_at_three_distinct_ports_of_the_head():
    fig = circuit_figure(transformer_circuit(EDGES))
    ends = {tuple(np.round(c[-1], 6)) for c in curves(fig)}
    pos = node_positions(transformer_graph(3, 2).summary(), {"a0.h0"})["a0.h0"]
    ports = sorted(e for e in ends if abs(e[0] - (pos[0] - 0.16)) < 1e-6)
    assert len(ports) == 3 and len({y for _, y in ports}) == 3


def test_a_skip_edge_does_not_hide_under_the_path_it_skips():
    pos = node_positions(transformer_graph(3, 2).summary(), {"m0", "m1", "m2"})
    skip = _curve(pos["m0"], pos["m2"], ("m0", "m2.in"))
    step = _curve(pos["m0"], pos["m1"], ("m0", "m1.in"))
    assert pos["m0"][1] == pos["m1"][1] == pos["m2"][1]  # collinear nodes
    assert abs(skip[2][1] - pos["m0"][1]) > 0.3  # the skip edge bends away from the line
    assert max(abs(step[1] - pos["m0"][1])) < abs(skip[2][1] - pos["m0"][1])


def test_width_and_opacity_grow_with_the_score():
    low, high = ("m0", "m1.in"), ("m1", "m2.in")
    fig = circuit_figure(transformer_circuit([low, high], scores={low: 0.05, high: 0.99}))
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 2
    weak, strong = sorted(lines, key=lambda t: t.line.width)
    assert weak.opacity < strong.opacity


def test_opacity_follows_the_recorded_consensus_and_hover_says_it():
    rare, common = ("m0", "m1.in"), ("m1", "m2.in")
    circuit = transformer_circuit([rare, common], scores={rare: 0.99, common: 0.99})
    circuit.metadata["consensus"] = {"scores": [["m0", "m1.in", 0.2], ["m1", "m2.in", 1.0]], "n_runs": 5,
                                     "seeds": [0, 1, 2, 3, 4], "sparsities": [0.9], "stable_at": 0.8}  # fmt: skip
    fig = circuit_figure(circuit)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 2 and lines[0].line.width == lines[1].line.width  # same score: same width
    by_opacity = sorted(lines, key=lambda t: t.opacity)
    assert by_opacity[0].opacity < by_opacity[1].opacity
    assert curves(fig)[0].shape == curves(fig)[1].shape
    texts = hover_texts(fig)
    assert any("consensus 0.20 (kept in 1 of 5 runs)" in t for t in texts)
    assert any("consensus 1.00 (kept in 5 of 5 runs)" in t for t in texts)
    assert "consensus over 5 runs" in fig.layout.title.text


def test_overlap_groups_count_shared_and_own_edges():
    rng = random.Random(0)
    graph = transformer_graph(3, 2)
    a_edges = rng.sample(graph.edges, 12)
    b_edges = a_edges[:5] + rng.sample([e for e in graph.edges if e not in a_edges], 9)
    a = transformer_circuit(a_edges, target="1-after")
    b = transformer_circuit(b_edges, target="2-after")
    fig = overlap_figure([a, b], ["A", "B"])
    legend = {t.name for t in fig.data if t.showlegend}
    assert legend == {"shared by all (5)", "only A (7)", "only B (9)"}
    assert len(curves(fig)) == 5 + 7 + 9
    texts = hover_texts(fig)
    w, r = a_edges[0]
    assert sum(t.startswith(f"{w} → {r}<br>") and t.endswith("<br>in: A, B") for t in texts) == 1
    three = overlap_figure([a, b, a])
    assert any(t.name.startswith("in 2 of 3") for t in three.data if t.showlegend)


def test_overlap_refuses_too_few_circuits_or_different_models():
    a = transformer_circuit(EDGES)
    with pytest.raises(ValueError, match="at least two"):
        overlap_figure([a])
    other = Circuit.from_edges(
        {("embed", "out"): 1.0}, {"graph": transformer_graph(2, 2).summary()}
    )
    with pytest.raises(ValueError, match="different graphs"):
        overlap_figure([a, other])
    with pytest.raises(ValueError, match="2 labels for 3"):
        overlap_figure([a, a, a], ["x", "y"])


def test_windowed_recurrent_circuit_draws_rows_and_state_edges():
    windows = (("haystack", 0, 5), ("label", 5, 6), ("continuation", 6, 9))
    graph = windowed_recurrent_graph("lstm", 1, windows)
    state = next(e for e in graph.edges if ".state@" in e[1])
    edges = [state, ("embed@label", "l0.in@label"), ("l0@label", "out@label")]
    c = Circuit.from_edges(dict.fromkeys(edges, 1.0), {"graph": graph.summary()})
    fig = circuit_figure(c)
    assert len(curves(fig)) == 3
    assert list(fig.layout.yaxis.ticktext) == ["haystack", "label", "continuation"]
    assert any(t.name == "→ state" for t in fig.data if t.mode == "lines")


def test_gpt2_small_sized_circuit_stays_a_few_traces():
    graph = transformer_graph(12, 12)
    assert graph.n_edges == 32936
    kept = random.Random(1).sample(graph.edges, 1500)
    scores = {e: random.Random(hash(e)).random() for e in kept}
    fig = circuit_figure(transformer_circuit(kept, 12, 12, scores=scores))
    assert len(curves(fig)) == 1500
    assert len(fig.data) <= 6 * 4 + 6  # kinds x score bands, + hover, nodes, ports


def test_graph_of_a_built_model_places_every_component():
    from mechlab.models import build_model

    graph = build_graph(build_model("tiny"))
    names = {w.name for w in graph.writers} | {"out"}
    pos = node_positions(graph.summary(), names)
    assert names <= set(pos)
    assert len({pos[n] for n in names}) == len(names)  # no two components on one spot
    assert all(
        a != b for a, b in itertools.combinations([pos[n][0] for n in ("embed", "m0", "out")], 2)
    )


def test_cli_view_renders_committed_circuits_and_refuses_bad_input(tmp_path, capsys):
    from pathlib import Path

    from mechlab.cli import main

    committed = sorted(Path("circuits/recall-cpu").glob("*-after_seed0.json"))
    out = tmp_path / "view.html"
    assert main(["view", *map(str, committed), "--out", str(out)]) == 0
    page = out.read_text()
    # one file that opens anywhere: plotly.js inside, once, and the explorer of both circuits
    assert page.count("* plotly.js v") == 1 and page.count("mechlabExplorer('") == 1
    assert "1-after · prune · seed 0" in page and "2-after · prune · seed 0" in page
    assert main(["view", str(committed[0]), "--out", str(tmp_path / "x.png")]) == 2
    fresh = tmp_path / "fresh.html"
    assert (
        main(["view", str(committed[0]), "--label", "a", "--label", "b", "--out", str(fresh)]) == 2
    )
    assert main(["view", str(tmp_path / "missing.json"), "--out", str(fresh)]) == 2
    assert (
        main(["view", str(committed[0]), "--out", str(out)]) == 2
    )  # exists: never replaced without --force
    err = capsys.readouterr().err
    assert (
        "must be a .html or .htm file" in err
        and "one --label per circuit" in err
        and "not found" in err
    )
    assert "exists; pass --force" in err and not fresh.exists()


def test_circuits_across_checkpoints_rows_scores_and_jaccard():
    from mechlab.viz import circuits_across_checkpoints_figure

    early = transformer_circuit(
        EDGES[:3], scores={EDGES[0]: 0.5}, target="1-after", checkpoint_step=10
    )
    late = transformer_circuit(EDGES[2:6], target="1-after", checkpoint_step=20)
    fig = circuits_across_checkpoints_figure([early, late])
    heat = fig.data[0]
    assert len(heat.y) == 6 and list(heat.x) == ["10", "20"]  # every edge kept at any step
    assert list(heat.z[0]) == [0.5, None] and list(heat.z[2]) == [1.0, 1.0]  # blank where not kept
    counts, jaccard = fig.data[1], fig.data[2]
    assert list(counts.y) == [3, 4]
    assert list(jaccard.y) == [pytest.approx(1 / 6), 1.0]
    assert jaccard.yaxis != counts.yaxis and fig.layout[
        jaccard.yaxis.replace("y", "yaxis")
    ].range == (0, 1.05)
    with pytest.raises(ValueError, match="2 steps for 1"):
        circuits_across_checkpoints_figure([early], steps=[1, 2])
    with pytest.raises(ValueError, match="at least one"):
        circuits_across_checkpoints_figure([])


def stability_record(mean: float, n_boot: int = 4) -> dict:
    from mechlab.prune.stability import BootstrapStability

    return BootstrapStability(mean_jaccard=mean, pairwise_jaccard=0.7, jaccards=(mean,) * n_boot,
                              min_jaccard=mean, p5=mean, p95=mean, edge_frequency={("m0", "m1.in"): 1.0},
                              n_boot=n_boot, seed=0, n_edges_reference=1).to_dict()  # fmt: skip


def test_the_circuit_page_says_its_bootstrap_stability_in_words():
    plain = circuit_figure(transformer_circuit([("m0", "m1.in")], target="1-after"))
    assert "bootstrap" not in plain.layout.title.text
    stable = transformer_circuit([("m0", "m1.in")], target="1-after", stability=stability_record(0.85))
    title = circuit_figure(stable).layout.title.text
    assert title.startswith("Circuit for 1-after: 1 edges")
    assert ("bootstrap stability: mean edge Jaccard 0.85 with the circuit over 4 resamples of the "
            "training traces (bar 0.8: met)") in title  # fmt: skip
    unstable = transformer_circuit([("m0", "m1.in")], stability=stability_record(0.5, n_boot=6))
    assert "mean edge Jaccard 0.50 with the circuit over 6 resamples" in circuit_figure(unstable).layout.title.text
    assert "(bar 0.8: not met)" in circuit_figure(unstable).layout.title.text


def test_cli_view_of_two_targets_opens_comparing_the_targets(tmp_path):
    """`mechlab view` of both targets' circuits (as a shell's *.json gives them: every seed of
    1-after, then of 2-after) opens on 1-after seed 0 against 2-after seed 0, not against
    1-after seed 1; circuits of one target open seed against seed."""
    import json
    import re
    from pathlib import Path

    from mechlab.cli import main
    from mechlab.pipelines.circuits import first_comparison
    from mechlab.prune import Circuit

    def opened(files, name):
        out = tmp_path / name
        assert main(["view", *map(str, files), "--out", str(out)]) == 0
        page = out.read_text()
        init = json.loads(re.search(r"mechlabExplorer\('[^']+', (\{[^}]*\})\)", page).group(1))
        shown = json.loads(re.search(r"<script type='application/json'[^>]*>(.*?)</script>", page, re.S).group(1))
        pick = lambda i: None if i is None else (shown["circuits"][i]["target"], shown["circuits"][i]["seed"])  # noqa: E731
        return pick(init["start"]), pick(init["compare"])

    committed = sorted(Path("circuits/recall-cpu").glob("*-after_seed[0-2].json"))
    assert opened(committed, "both.html") == (("1-after", "0"), ("2-after", "0"))
    reordered = [committed[1], committed[0], *committed[2:]]  # seed 1 first: its 2-after seed 1
    assert opened(reordered, "seed1.html") == (("1-after", "1"), ("2-after", "1"))
    one_target = [p for p in committed if p.name.startswith("1-after")]
    assert opened(one_target, "seeds.html") == (("1-after", "0"), ("1-after", "1"))
    assert opened(committed[:1], "one.html") == (("1-after", "0"), None)
    loaded = [Circuit.from_json(p) for p in committed]
    assert first_comparison(loaded) == 3
    loaded[3].metadata["seed"] = 7  # no 2-after circuit of seed 0: the first 2-after one given
    assert first_comparison(loaded[:1] + loaded[4:] + loaded[3:4]) == 1
