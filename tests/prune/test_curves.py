"""Tests of mechlab.prune.curves (faithfulness curves, CPR/CMD), its figure and `mechlab curve`.

The planted transformer has exactly one circuit, read-in -> head (1, 0) value -> read-out
plus read-in -> read-out (every other writer's output is the same under any ablation), so
its curve is known: 0 before the budget that holds all three edges, 1 from it on. Partial
circuits are checked against the model run with TransformerLens hooks.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest
import torch

from mechlab.cli import main
from mechlab.models.transformer import Transformer, TransformerConfig
from mechlab.prune.curves import (
    MIB_BUDGETS,
    FaithfulnessCurve,
    budget_counts,
    check_budgets,
    curve_areas,
    faithfulness_curve,
    read_curves,
    sweep,
    top_k_mask,
    write_curves,
)
from mechlab.prune.graph import build_graph
from mechlab.traces import PruneData, Traces
from mechlab.viz import faithfulness_curves_figure

torch.set_num_threads(1)

CIRCUIT = [("embed", "out"), ("embed", "a1.h0.v"), ("a1.h0", "out")]
MIB_X = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]


def planted_transformer(seed: int = 0) -> Transformer:
    """Random read-in (dims 0-3), read-out (dims 4-5 and the read-in's dims) and head (1, 0)
    value/output weights; every other parameter zero (uniform attention, silent writers)."""
    cfg = TransformerConfig(d_model=8, n_layers=2, n_heads=2, d_head=4, d_mlp=8, d_in=3, d_out=2,
                            n_ctx=8)  # fmt: skip
    model = Transformer(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in [model.ln_final] + [b.ln1 for b in model.blocks] + [b.ln2 for b in model.blocks]:
            ln.w.fill_(1.0)
        model.read_in.proj.weight[:4] = torch.randn(4, 3, generator=g)
        attn = model.blocks[1].attn
        attn.W_V[0] = torch.randn(8, 4, generator=g)
        attn.W_O[0, :, 4:6] = torch.randn(4, 2, generator=g)
        model.read_out.proj.weight.copy_(torch.randn(2, 8, generator=g))
    return model.eval()


def traces(seed: int, n: int = 24, n_pos: int = 5) -> Traces:
    g = torch.Generator().manual_seed(seed)
    return Traces(torch.randn(n, n_pos, 3, generator=g), torch.randn(n, n_pos, 3, generator=g))


def planted_scores(graph, first: list) -> torch.Tensor:
    """Scores ranking ``first`` (in order) above every other edge (in reverse edge order)."""
    scores = -torch.arange(graph.n_edges, dtype=torch.float64)
    for rank, edge in enumerate(first):
        scores[graph.edge_index[edge]] = 100.0 - rank
    return scores


def ablated_values(model, t: Traces, ablation: str) -> dict[str, torch.Tensor]:
    """What an ablated edge delivers from the read-in and from head (1, 0), by hand."""
    names = ["hook_embed", "blocks.1.attn.hook_result"]
    if ablation == "zero":
        _, cache = model.run_with_cache(t.inputs, names_filter=names)
        return {n: torch.zeros_like(cache[n]) for n in names}
    source = t.corrupted if ablation == "interchange" else t.inputs
    _, cache = model.run_with_cache(source, names_filter=names)
    if ablation == "mean":
        return {n: cache[n].mean(0, keepdim=True).expand_as(cache[n]) for n in names}
    return {n: cache[n] for n in names}


def hooked_output(model, t: Traces, embed: torch.Tensor | None, head: torch.Tensor | None):
    """The model on the clean inputs with the read-in and/or head (1, 0)'s output replaced."""
    hooks = []
    if embed is not None:
        hooks.append(("hook_embed", lambda act, hook: embed))

    def set_head(act, hook):
        act = act.clone()
        act[:, :, 0] = head[:, :, 0]
        return act

    if head is not None:
        hooks.append(("blocks.1.attn.hook_result", set_head))
    with torch.no_grad():
        return model.run_with_hooks(t.inputs, fwd_hooks=hooks)


def hand_faithfulness(model, t: Traces, ablation: str, kept: set) -> float:
    """``1 - mean d(C, full) / mean d(empty, full)`` over every position, from hooked runs."""
    abl = ablated_values(model, t, ablation)
    _, clean = model.run_with_cache(t.inputs, names_filter=["blocks.1.attn.hook_result"])
    with torch.no_grad():
        full = model(t.inputs)
    empty = hooked_output(model, t, abl["hook_embed"], abl["blocks.1.attn.hook_result"])
    if kept == {("embed", "out")}:  # clean read-in at the read-out, ablated head output
        out = hooked_output(model, t, None, abl["blocks.1.attn.hook_result"])
    elif kept == {("embed", "a1.h0.v"), ("a1.h0", "out")}:  # ablated read-in, clean head
        out = hooked_output(model, t, abl["hook_embed"], clean["blocks.1.attn.hook_result"])
    else:
        raise AssertionError(kept)
    d = lambda y: (y - full).pow(2).sum(-1).double().mean()  # noqa: E731
    return float(1 - d(out) / d(empty))


# ---------------------------------------------------------------------------------------
# Budgets and areas
# ---------------------------------------------------------------------------------------


def test_budgets_sorted_deduplicated_with_anchor_and_floored_counts():
    assert check_budgets([0.5, 0.01, 0.5]) == [0.01, 0.5, 1.0]
    assert check_budgets(MIB_BUDGETS) == MIB_X
    assert budget_counts(MIB_X, 554) == [0, 1, 2, 5, 11, 27, 55, 110, 277, 554]
    assert budget_counts(MIB_X, 61) == [0, 0, 0, 0, 1, 3, 6, 12, 30, 61]
    assert budget_counts([0.29, 0.57], 100) == [29, 57]  # no float round-off (0.29 * 100 < 29)


@pytest.mark.parametrize(
    "bad", [[0.0], [-0.1], [1.5], [float("nan")], [float("inf")], [], ["0.1"], [True]]
)
def test_bad_budgets_raise_one_line(bad):
    with pytest.raises(ValueError) as info:
        check_budgets(bad)
    assert "\n" not in str(info.value)


def test_areas_are_trapezoids_on_a_linear_budget_axis():
    # f = 0.2, 0.6, 1.0 at 0.1, 0.5, 1: CPR = 0.4 * 0.4 + 0.5 * 0.8, CMD = 0.4 * 0.6 + 0.5 * 0.2
    cpr, cmd = curve_areas([0.1, 0.5, 1.0], [0.2, 0.6, 1.0])
    assert cpr == pytest.approx(0.56) and cmd == pytest.approx(0.34)
    # a step from 0 to 1 between 5% and 10% of the edges on MIB's grid
    step = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    cpr, cmd = curve_areas(MIB_X, step)
    assert cpr == pytest.approx(0.05 * 0.5 + 0.9)  # trapezoid, not a left Riemann sum (0.95)
    assert cmd == pytest.approx(0.049 + 0.025)
    # overshoot counts in CMD as much as shortfall; CPR + CMD = range when 0 <= f <= 1
    assert curve_areas([0.5, 1.0], [1.5, 1.0]) == pytest.approx((0.625, 0.125))
    assert sum(curve_areas(MIB_X, [0.3] * 10)) == pytest.approx(0.999)
    with pytest.raises(ValueError, match="increase"):
        curve_areas([0.5, 0.1], [1, 1])


def test_top_k_circuits_are_nested():
    scores = torch.tensor([0.3, -1.0, 2.0, 0.3, 5.0, -7.0])
    masks = [top_k_mask(scores, k) for k in range(7)]
    assert masks[2].tolist() == [False, False, True, False, True, False]
    assert masks[3].tolist() == [True, False, True, False, True, False]  # tie: lower index first
    for small, big in zip(masks, masks[1:], strict=False):
        assert bool((small <= big).all()) and int(big.sum()) == int(small.sum()) + 1


# ---------------------------------------------------------------------------------------
# Curves of the planted model
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("ablation", ["interchange", "mean", "zero"])
def test_planted_circuit_curve_is_a_step_at_the_budget_that_holds_it(ablation):
    model = planted_transformer()
    graph = build_graph(model)
    # 61 edges; the 15 from the position table (q, k, v of 4 heads, 2 MLPs, out) cannot
    # matter under interchange or mean ablation and are left out of the budgets
    n = 61 if ablation == "zero" else 46
    silent = [("a0.h1", "out"), ("m1", "out"), ("m0", "a1.h1.v")]  # writers that never change
    scores = planted_scores(
        graph, [("pos", "out"), *silent, *CIRCUIT]
    )  # pos first: inert or silent
    if ablation == "zero":
        silent = [("pos", "out"), *silent[:2]]  # keep the circuit at ranks 4-6
        scores = planted_scores(graph, [*silent, *CIRCUIT])
    budgets = [1 / n, 3 / n, 6 / n, 0.5]  # k = 1, 3, 6, floor(n / 2)
    curve = faithfulness_curve(model, traces(1), "all", ablation, scores, budgets, progress=False)
    assert curve.n_countable == n and curve.n_edges == 61
    assert curve.n_kept == [0, 1, 3, 6, n // 2, n]
    expected = [0, 0, 0, 1, 1, 1]
    assert curve.faithfulness == pytest.approx(expected, abs=1e-5)
    assert curve.complement_faithfulness == pytest.approx([1 - e for e in expected], abs=1e-5)
    assert curve.ablated_vs_full > 1e-2  # the step is not trivially true
    # trapezoids over x = 1/n, 3/n, 6/n, 1/2, 1 of f = 0, 0, 1, 1, 1 and of |1 - f|
    assert curve.cpr == pytest.approx(1 - 4.5 / n, abs=1e-5)
    assert curve.cmd == pytest.approx(3.5 / n, abs=1e-5)
    assert curve.cpr_complement == pytest.approx(3.5 / n, abs=1e-5)
    assert curve.cmd_complement == pytest.approx(1 - 4.5 / n, abs=1e-5)


@pytest.mark.parametrize("ablation", ["interchange", "mean", "zero"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_partial_circuits_match_hooked_runs(ablation, seed):
    model = planted_transformer(seed)
    graph = build_graph(model)
    t = traces(10 + seed)
    n = 61 if ablation == "zero" else 46  # edges that can matter (see the step test)
    # the first ranked edge(s) alone, then the whole circuit
    for first in ([("embed", "out")], [("a1.h0", "out"), ("embed", "a1.h0.v")]):
        order = first + [e for e in CIRCUIT if e not in first]
        budgets = [len(first) / n, 3 / n]
        curve = faithfulness_curve(model, t, "all", ablation, planted_scores(graph, order),
                                   budgets, progress=False)  # fmt: skip
        hand = hand_faithfulness(model, t, ablation, set(first))
        assert min(abs(hand), abs(1 - hand)) > 0.02  # partial (may be < 0), not a trivial 0 or 1
        assert curve.faithfulness[1] == pytest.approx(hand, abs=1e-5)
        assert curve.faithfulness[2] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("ablation", ["interchange", "mean", "zero"])
def test_head_edge_alone_is_worth_nothing_and_its_complement_matches_hooks(ablation):
    """a1.h0 -> out without the read-in feeding the head carries the head's ablated output
    (interchange, zero); its complement (every other edge) is the read-in at the read-out
    beside an ablated head."""
    model = planted_transformer()
    graph = build_graph(model)
    t = traces(3)
    scores = planted_scores(graph, [("a1.h0", "out")])
    curve = faithfulness_curve(model, t, "all", ablation, scores, [0.025], progress=False)
    assert curve.n_kept == [0, 1, 61 if ablation == "zero" else 46]
    if ablation != "mean":  # under mean ablation head(mean input) != mean head output
        assert curve.faithfulness[1] == pytest.approx(0.0, abs=1e-6)
    hand = hand_faithfulness(model, t, ablation, {("embed", "out")})
    assert min(abs(hand), abs(1 - hand)) > 0.02
    assert curve.complement_faithfulness[1] == pytest.approx(hand, abs=1e-5)


def test_token_model_curve_uses_kl_and_its_anchors_hold():
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=16, n_layers=2, n_heads=2, io="tokens", d_vocab=11, n_ctx=8)
    model = Transformer(cfg).eval()
    g = torch.Generator().manual_seed(0)
    t = Traces(
        torch.randint(0, 11, (16, 6), generator=g), torch.randint(0, 11, (16, 6), generator=g)
    )
    scores = torch.randn(build_graph(model).n_edges, generator=g)
    curve = faithfulness_curve(model, t, "all", "interchange", scores, [0.1, 0.5], progress=False)
    assert curve.divergence == "kl"
    assert curve.faithfulness[0] == 0.0 and curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-5)
    assert curve.complement_faithfulness[0] == pytest.approx(1.0, abs=1e-5)
    assert curve.complement_faithfulness[-1] == pytest.approx(0.0, abs=1e-6)


def test_the_bar_counts_the_batches_of_the_full_model_and_of_each_budget(capsys):
    model = planted_transformer()
    scores = planted_scores(build_graph(model), CIRCUIT)
    quiet = faithfulness_curve(model, traces(1), "all", "zero", scores, [0.1, 0.5], progress=False)
    assert capsys.readouterr().err == ""  # no bar unless asked
    shown = faithfulness_curve(model, traces(1), "all", "zero", scores, [0.1, 0.5], batch_size=10)
    assert shown.faithfulness == quiet.faithfulness  # the bar changes nothing
    err = capsys.readouterr().err
    assert "curve all, zero: the full model, then 2 budgets: 100%|██████████| 9/9" in err, err  # 3 x 24 traces / 10


def test_bad_input_raises_one_line_before_any_work():
    model = planted_transformer()
    scores = torch.zeros(61)
    t = traces(1)
    cases = [
        dict(ablation="resample", scores=scores, budgets=MIB_BUDGETS, target="all"),
        dict(ablation="mean", scores=scores, budgets=[0.1, 2.0], target="all"),
        dict(ablation="mean", scores=torch.zeros(60), budgets=MIB_BUDGETS, target="all"),
        dict(ablation="mean", scores=torch.full((61,), float("nan")), budgets=[0.1], target="all"),
        dict(ablation="mean", scores=scores, budgets=[0.1], target="nope"),
    ]
    for case in cases:
        with pytest.raises(ValueError) as info:
            faithfulness_curve(model, t, progress=False, **{
                "target": case["target"], "ablation": case["ablation"], "scores": case["scores"],
                "budgets": case["budgets"],
            })  # fmt: skip
        assert "\n" not in str(info.value)
    data = PruneData(t, traces(2))
    with pytest.raises(ValueError, match="ranking"):
        sweep(model, data, "all", ranking="greedy", progress=False)
    with pytest.raises(ValueError, match="ablation"):
        sweep(model, data, "all", ablations=["interchange", "resample"], progress=False)


def test_silent_ablation_is_an_error():
    model = planted_transformer()
    t = traces(1)
    same = Traces(t.inputs, t.inputs.clone())  # corrupted == clean: nothing to recover
    with pytest.raises(ValueError, match="undefined"):
        faithfulness_curve(
            model, same, "all", "interchange", torch.zeros(61), [0.1], progress=False
        )


# ---------------------------------------------------------------------------------------
# Sweep (pruning), files, figure
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swept():
    model = planted_transformer()
    data = PruneData(traces(5, n=32), traces(6, n=32))
    kwargs = dict(steps=150, lr=0.2, batch_size=32, progress=False)
    return (
        sweep(model, data, "all", ["interchange"], [0.07, 0.1, 0.5], sparsity=1 - 3 / 46, **kwargs),
        sweep(model, data, "all", ["zero"], [0.05, 0.5], ranking="reprune", **kwargs),
    )  # fmt: skip


def test_sweep_ranks_by_the_pruning_runs_log_alpha(swept):
    by_alpha, by_reprune = swept
    curve = by_alpha["interchange"]
    assert curve.n_kept == [0, 3, 4, 23, 46]  # nested top-k of the 46 edges that can matter
    assert curve.ranking == "log_alpha" and len(curve.metadata["pruning_runs"]) == 1
    assert curve.faithfulness[1:] == pytest.approx([1, 1, 1, 1], abs=1e-4)  # planted edges first
    assert curve.complement_faithfulness[1:] == pytest.approx([0, 0, 0, 0], abs=1e-4)
    curve = by_reprune["zero"]
    assert curve.ranking == "reprune" and len(curve.metadata["pruning_runs"]) == 2
    assert curve.n_kept[0] == 0 and curve.n_kept[1] <= 3 and curve.n_kept[2] <= 30  # at most k
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-5)
    assert curve.complement_faithfulness[-1] == pytest.approx(0.0, abs=1e-6)


def test_json_round_trip_and_figure(swept, tmp_path):
    curves = {**swept[0], **swept[1]}
    path = write_curves(curves, tmp_path / "c.json", info={"checkpoint": "x.pt"})
    raw = json.loads(path.read_text())
    assert raw["info"] == {"checkpoint": "x.pt"}
    assert raw["curves"][0]["cpr"] == pytest.approx(curves["interchange"].cpr)
    back = read_curves(path)
    assert [c.to_dict() for c in back] == [c.to_dict() for c in curves.values()]
    fig = faithfulness_curves_figure(curves)
    assert isinstance(fig, go.Figure) and fig.layout.xaxis.type == "log"
    assert len(fig.data) == 4  # circuit and complement per ablation
    assert list(fig.data[0].x) == pytest.approx([7, 10, 50, 100])
    assert list(fig.data[2].x) == pytest.approx([5, 50, 100])
    with pytest.raises(ValueError):
        FaithfulnessCurve.from_dict({**raw["curves"][0], "n_kept": [0]})


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budgets", "0.1,1.5"], "(0, 1]"),
        (["--budgets", "0.1,x"], "budget"),
        (["--ablation", "resample"], "ablation"),
        (["--target", "0-after"], "target"),
        (["--rank", "greedy"], "rank"),
        (["--nih", "paper"], "protocol"),
    ],
)
def test_cli_bad_input_exit_2(capsys, args, message):
    code = main(["curve", "--ckpt", "examples/checkpoints/recall-cpu/last.pt", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_cli_missing_checkpoint_exit_2(capsys, tmp_path):
    code = main(["curve", "--ckpt", str(tmp_path / "none.pt")])
    assert code == 2 and "not found" in capsys.readouterr().err
