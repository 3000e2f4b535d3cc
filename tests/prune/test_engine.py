"""Tests of mechlab.prune.engine: the masked forward pass (invariants, single edges, node
masks, gradients), planted circuits recovered by pruning, determinism, the sparsity
reached, errors, and the benchmark helper."""

from __future__ import annotations

import math

import pytest
import torch

from mechlab.models import build_model
from mechlab.models.transformer import Transformer, TransformerConfig
from mechlab.prune import engine
from mechlab.prune.engine import (
    faithfulness_warning,
    prune,
    prune_seeds,
)
from mechlab.prune.evaluate import evaluate_masks
from mechlab.prune.forward import make_ablation, masked_forward, writer_outputs
from mechlab.prune.graph import build_graph, countable_edges
from mechlab.traces import PruneData, Traces

FAMILIES = {
    "transformer": {"n_heads": 2},
    "lstm": {},
    "dense_ssm": {"d_state": 4},
    "mamba": {"d_state": 4},
}


def small_model(arch: str, n_layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    fields = {"d_model": 16, "n_layers": n_layers, "d_in": 5, "d_out": 3, "n_ctx": 16}
    return build_model(arch, **fields, **FAMILIES[arch]).eval()


def inputs(batch: int, n_pos: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, n_pos, d, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------
# Masked forward
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_all_ones_and_all_zeros_invariants(arch):
    model = small_model(arch, n_layers=3)
    graph = build_graph(model)
    x, x_corrupt = inputs(4, 9, 5, 1), inputs(4, 9, 5, 2)
    ablated = writer_outputs(model, x_corrupt)
    with torch.no_grad():
        clean, corrupt = model(x), model(x_corrupt)
        ones = masked_forward(model, graph, x, ablated, torch.ones(graph.n_edges))
        zeros = masked_forward(model, graph, x, ablated, torch.zeros(graph.n_edges))
        node_zeros = masked_forward(
            model, graph, x, ablated, torch.ones(graph.n_edges), torch.zeros(graph.n_writers)
        )
    assert (ones - clean).abs().max() <= 1e-5
    assert (zeros - corrupt).abs().max() <= 1e-5
    assert (node_zeros - corrupt).abs().max() <= 1e-5  # every writer ablated through its node
    assert (clean - corrupt).abs().max() > 1e-2  # the invariants are not trivially true


@pytest.mark.parametrize("arch", ["transformer", "mamba"])
def test_invariants_for_token_models(arch):
    torch.manual_seed(0)
    model = build_model(
        arch, d_model=16, n_layers=2, io="tokens", d_vocab=11, n_ctx=16, **FAMILIES[arch]
    ).eval()
    graph = build_graph(model)
    g = torch.Generator().manual_seed(0)
    x, x_corrupt = (
        torch.randint(0, 11, (3, 7), generator=g),
        torch.randint(0, 11, (3, 7), generator=g),
    )
    ablated = writer_outputs(model, x_corrupt)
    with torch.no_grad():
        ones = masked_forward(model, graph, x, ablated, torch.ones(graph.n_edges))
        zeros = masked_forward(model, graph, x, ablated, torch.zeros(graph.n_edges))
        assert (ones - model(x)).abs().max() <= 1e-5
        assert (zeros - model(x_corrupt)).abs().max() <= 1e-5
    data = PruneData(Traces(x, x_corrupt, x.roll(-1, 1)), Traces(x, x_corrupt, x.roll(-1, 1)))
    circuit = prune(model, data, "all", 0.5, steps=3, progress=False)  # KL to the full model
    assert circuit.metadata["metrics"]["divergence"] == "kl"
    assert "error_circuit" in circuit.metadata["metrics"]  # cross-entropy against the truth


def test_mean_and_zero_ablation_with_all_edges_ablated():
    model = small_model("transformer")
    graph = build_graph(model)
    x, reference = inputs(3, 7, 5, 1), inputs(50, 7, 5, 3)
    traces = Traces(inputs=x)
    _, cache = model.run_with_cache(reference)
    mean_resid = cache["blocks.1.hook_resid_post"].mean(0)  # [pos, d]
    with torch.no_grad():
        mean_abl = make_ablation(model, "mean", traces, reference=reference)
        out = masked_forward(model, graph, x, mean_abl, torch.zeros(graph.n_edges))
        expected = model.read_out(model.ln_final(mean_resid)).expand_as(out)
        assert (out - expected).abs().max() <= 1e-5
        zero_abl = make_ablation(model, "zero", traces)
        out = masked_forward(model, graph, x, zero_abl, torch.zeros(graph.n_edges))
        b_O = sum(block.attn.b_O for block in model.blocks)  # biases stay as constants
        expected = model.read_out(model.ln_final(b_O.expand(3, 7, -1)))
        assert (out - expected).abs().max() <= 1e-5


def test_single_edges_against_hand_patching():
    """Ablating one edge changes exactly what that reader sees, computed from the caches."""
    model = small_model("transformer")
    graph = build_graph(model)
    x, x_corrupt = inputs(2, 6, 5, 1), inputs(2, 6, 5, 2)
    ablated = writer_outputs(model, x_corrupt)
    _, cache = model.run_with_cache(x)
    # edge embed -> out: the read-out sees resid_post - embed + embed~
    z = torch.ones(graph.n_edges)
    z[graph.edge_index[("embed", "out")]] = 0.0
    with torch.no_grad():
        out = masked_forward(model, graph, x, ablated, z)
    resid = cache["blocks.1.hook_resid_post"] - cache["hook_embed"] + ablated[0]
    assert (out - model.read_out(model.ln_final(resid))).abs().max() <= 1e-5
    # edge a0.h1 -> out at half strength
    z = torch.ones(graph.n_edges)
    z[graph.edge_index[("a0.h1", "out")]] = 0.5
    with torch.no_grad():
        out = masked_forward(model, graph, x, ablated, z)
    w = graph.writer_index["a0.h1"]
    head = cache["blocks.0.attn.hook_result"][:, :, 1]
    resid = cache["blocks.1.hook_resid_post"] - 0.5 * (head - ablated[w])
    assert (out - model.read_out(model.ln_final(resid))).abs().max() <= 1e-5
    # a node mask of 0 on a writer == all its outgoing edges at 0
    node = torch.ones(graph.n_writers)
    node[w] = 0.0
    z = torch.ones(graph.n_edges)
    for i, (writer, _) in enumerate(graph.edges):
        if writer == "a0.h1":
            z[i] = 0.0
    with torch.no_grad():
        by_node = masked_forward(model, graph, x, ablated, torch.ones(graph.n_edges), node)
        by_edges = masked_forward(model, graph, x, ablated, z)
    assert (by_node - by_edges).abs().max() <= 1e-6


def test_value_edge_only_changes_that_head():
    """Ablating embed -> a1.h0.v leaves the output unchanged if head a1.h0 writes nothing."""
    model = small_model("transformer")
    with torch.no_grad():
        model.blocks[1].attn.W_O[0].zero_()
    graph = build_graph(model)
    x, x_corrupt = inputs(2, 6, 5, 1), inputs(2, 6, 5, 2)
    ablated = writer_outputs(model, x_corrupt)
    z = torch.ones(graph.n_edges)
    z[graph.edge_index[("embed", "a1.h0.v")]] = 0.0
    with torch.no_grad():
        assert (masked_forward(model, graph, x, ablated, z) - model(x)).abs().max() <= 1e-5
        z[graph.edge_index[("embed", "a1.h1.v")]] = 0.0
        assert (masked_forward(model, graph, x, ablated, z) - model(x)).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_mask_gradient_matches_finite_differences(arch):
    model = small_model(arch).double()
    graph = build_graph(model)
    x, x_corrupt = inputs(2, 5, 5, 1).double(), inputs(2, 5, 5, 2).double()
    ablated = writer_outputs(model, x_corrupt)
    z0 = torch.rand(graph.n_edges, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    if arch == "transformer":  # a few edges of every kind keep the check fast
        picks = [graph.edge_index[e] for e in [("embed", "a1.h0.q"), ("a0.h1", "a1.h1.k"),
                 ("pos", "a0.h0.v"), ("a1.h1", "m1.in"), ("m0", "out"), ("m1", "out")]]  # fmt: skip
    else:
        picks = list(range(graph.n_edges))

    def f(sub: torch.Tensor) -> torch.Tensor:
        z = z0.clone()
        z[picks] = sub
        return masked_forward(model, graph, x, ablated, z).pow(2).sum()

    for p in model.parameters():
        p.requires_grad_(False)
    sub = z0[picks].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (sub,), eps=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------
# Planted circuits
# ---------------------------------------------------------------------------------------


def unit_vectors(batch: int, n_pos: int, seed: int) -> torch.Tensor:
    angle = 2 * math.pi * torch.rand(batch, n_pos, generator=torch.Generator().manual_seed(seed))
    return torch.stack([angle.cos(), angle.sin()], dim=-1)


def constant_norm_read_in(model, scale: float = 1.0) -> None:
    """``x -> scale [x0, x1, -x0, -x1, 0, ...]``: zero mean and, for unit ``x``, a constant
    norm, so replacing one unit input by another does not change any norm's scale."""
    W = torch.zeros(model.cfg.d_model, 2)
    W[0, 0], W[1, 1], W[2, 0], W[3, 1] = scale, scale, -scale, -scale
    model.read_in.proj.weight.copy_(W)
    model.read_in.proj.bias.zero_()


def planted_transformer() -> Transformer:
    """Only read-in -> head (1, 0) value -> read-out matters.

    Layer 0 and every MLP write exactly zero; all W_Q, W_K are 0 (uniform attention, so
    q/k inputs are irrelevant); head (1, 1) has W_O = 0; head (1, 0) copies dims 0-1 of its
    value input to dims 4-5 (and minus them to 6-7); the read-out reads dims 4-5 only.
    The read-in writes at a small scale (LayerNorm undoes it for the value input), so the
    read-out's norm hardly feels a partly ablated read-in -> read-out edge either.
    """
    cfg = TransformerConfig(d_model=8, n_layers=2, n_heads=2, d_head=4, d_mlp=8, d_in=2, d_out=2,
                            n_ctx=8, layer_norm_eps=1e-12)  # fmt: skip
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in [model.ln_final] + [b.ln1 for b in model.blocks] + [b.ln2 for b in model.blocks]:
            ln.w.fill_(1.0)
        constant_norm_read_in(model, scale=0.01)
        attn = model.blocks[1].attn
        attn.W_V[0, 0, 0], attn.W_V[0, 1, 1] = 1.0, 1.0
        attn.W_O[0, 0, 4], attn.W_O[0, 1, 5] = 1.0, 1.0
        attn.W_O[0, 0, 6], attn.W_O[0, 1, 7] = -1.0, -1.0
        model.read_out.proj.weight[0, 4], model.read_out.proj.weight[1, 5] = 1.0, 1.0
    return model.eval()


def planted_data(n_pos: int = 6) -> PruneData:
    train = Traces(inputs=unit_vectors(32, n_pos, 1), corrupted=unit_vectors(32, n_pos, 2))
    test = Traces(inputs=unit_vectors(64, n_pos, 3), corrupted=unit_vectors(64, n_pos, 4))
    return PruneData(train, test)


def test_node_masks_prune_the_dead_writers():
    model = planted_transformer()
    data = planted_data()
    graph = build_graph(model)
    n_countable = int(countable_edges(graph, "interchange").sum())
    circuit = prune(
        model, data, "all", 1 - 2 / n_countable, node_sparsity=1 - 2 / graph.n_writers,
        steps=200, batch_size=32, progress=False,
    )  # fmt: skip
    assert set(circuit.edges) == {("embed", "a1.h0.v"), ("a1.h0", "out")}
    assert circuit.metadata["node_sparsity_reached"] == pytest.approx(1 - 2 / graph.n_writers)
    assert 0 < circuit.metadata["node_threshold_mask"] <= 1


# ---------------------------------------------------------------------------------------
# Determinism, sparsity reached, model state, errors
# ---------------------------------------------------------------------------------------


def random_data(model, n_pos: int = 8, seed: int = 0) -> PruneData:
    d = model.cfg.d_in
    return PruneData(
        Traces(inputs(32, n_pos, d, seed), inputs(32, n_pos, d, seed + 1), inputs(32, n_pos, model.cfg.d_out, seed + 2)),
        Traces(inputs(16, n_pos, d, seed + 3), inputs(16, n_pos, d, seed + 4), inputs(16, n_pos, model.cfg.d_out, seed + 5)),
    )  # fmt: skip


def test_same_seed_same_circuit_and_state_restored():
    model = small_model("transformer")
    model.train()
    data = random_data(model)
    a = prune(model, data, "all", 0.8, steps=30, seed=3, batch_size=16, progress=False)
    assert model.training and all(p.requires_grad for p in model.parameters())
    b = prune(model, data, "all", 0.8, steps=30, seed=3, batch_size=16, progress=False)
    assert a.edges == b.edges and a.log_alpha == b.log_alpha
    assert a.metadata["metrics"] == b.metadata["metrics"]
    c = prune(model, data, "all", 0.8, steps=30, seed=4, batch_size=16, progress=False)
    assert c.log_alpha != a.log_alpha


@pytest.mark.parametrize("sparsity", [0.5, 0.9, 0.97])
def test_sparsity_reached_within_half_a_percent(sparsity):
    model = small_model("transformer", n_layers=2)  # 61 edges is too coarse: use 4 heads
    torch.manual_seed(0)
    model = build_model(
        "transformer", d_model=16, n_layers=3, n_heads=4, d_in=5, d_out=3, n_ctx=16
    ).eval()
    n_edges = int(countable_edges(build_graph(model), "interchange").sum())
    assert n_edges > 200
    asked = round(n_edges * (1 - sparsity))
    # the default: the budget, or fewer when no further edge lowers the loss, and it says so
    circuit = prune(
        model, random_data(model), "all", sparsity, steps=20, batch_size=16, progress=False
    )
    meta = circuit.metadata
    assert meta["n_edges_asked"] == asked and circuit.n_edges <= asked
    assert meta["sparsity_reached"] == 1 - circuit.n_edges / n_edges
    if circuit.n_edges < asked:
        assert meta["selection"]["fill_stopped"] in ("no effect", "no candidate")
        assert all(v < meta["min_effect"] for *_, v in meta["selection"]["rejected"])
    # Edge Pruning's Lagrangian, edges ranked by mask: the count asked
    ranked = prune(model, random_data(model), "all", sparsity, steps=20, batch_size=16,
                   progress=False, constraint="lagrangian", select="rank", normalize_loss=False)  # fmt: skip
    assert abs(ranked.metadata["sparsity_reached"] - sparsity) <= 0.005
    assert ranked.n_edges == asked


def test_truth_loss_and_mean_ablation_run():
    model = small_model("lstm")
    circuit = prune(
        model,
        random_data(model),
        "all",
        0.5,
        steps=5,
        loss="truth",
        ablation="mean",
        progress=False,
    )
    m = circuit.metadata
    assert m["loss"] == "truth" and m["ablation"] == "mean"
    assert {"error_circuit", "error_full", "error_complement", "faithfulness"} <= set(m["metrics"])


def test_bad_arguments_raise_value_errors():
    model = small_model("transformer")
    data = random_data(model)
    for bad in (0, 0.0, 1, 1.0, 1.5, -0.1, float("nan"), "0.9", True):
        with pytest.raises(ValueError, match="sparsity"):
            prune(model, data, "all", bad, steps=1, progress=False)
    with pytest.raises(ValueError, match="unknown target"):
        prune(model, data, "3-before", 0.5, steps=1, progress=False)
    with pytest.raises(ValueError, match="query label"):  # k-after needs NiH traces
        prune(model, data, "1-after", 0.5, steps=1, progress=False)
    with pytest.raises(ValueError, match="ablation"):
        prune(model, data, "all", 0.5, ablation="resample", steps=1, progress=False)
    with pytest.raises(ValueError, match="loss"):
        prune(model, data, "all", 0.5, loss="kl", steps=1, progress=False)
    no_corrupt = PruneData(Traces(data.train.inputs), Traces(data.test.inputs))
    with pytest.raises(ValueError, match="corrupted"):
        prune(model, no_corrupt, "all", 0.5, steps=1, progress=False)
    with pytest.raises(ValueError, match="steps"):
        prune(model, data, "all", 0.5, steps=0, progress=False)
    for name, bad in (("lr", 0.0), ("lr", -1.0), ("lr", float("nan")), ("lr", float("inf")),
                      ("lambda_lr", 0.0), ("lambda_lr", float("inf")), ("loss_scale", 0.0),
                      ("batch_size", 0), ("batch_size", 2.5)):  # fmt: skip
        with pytest.raises(ValueError, match=name):
            prune(model, data, "all", 0.5, steps=1, progress=False, **{name: bad})


# ---------------------------------------------------------------------------------------
# Honest circuits: open edges only, inert writers, sparsities that keep nothing, warnings
# ---------------------------------------------------------------------------------------


def test_pos_edges_are_excluded_under_interchange_and_mean_only():
    model = small_model("transformer")  # L = 2, H = 2
    graph = build_graph(model)
    n_pos_edges = 2 * (3 * 2 + 1) + 1  # q, k, v of every head and the MLP input per layer, out
    for ablation, excluded in (("interchange", n_pos_edges), ("mean", n_pos_edges), ("zero", 0)):
        countable = countable_edges(graph, ablation)
        assert graph.n_edges - int(countable.sum()) == excluded
        assert all(graph.edges[i][0] == "pos" for i in (~countable).nonzero().flatten())
    data = random_data(model)
    circuit = prune(model, data, "all", 0.5, steps=20, batch_size=16, progress=False)
    meta = circuit.metadata
    assert meta["n_edges_excluded_inert"] == n_pos_edges and meta["inert_writers"] == ["pos"]
    assert meta["n_edges_countable"] == graph.n_edges - n_pos_edges
    assert not any(w == "pos" for w, _ in circuit.edges)
    assert all(score > 0 for score in circuit.edges.values())  # open edges only
    assert 0 < meta["edge_threshold_mask"] <= 1
    assert meta["edge_threshold_mask"] == pytest.approx(min(circuit.edges.values()))
    assert meta["n_edges_kept"] == min(meta["n_edges_asked"], meta["n_open_edges"])
    zero = prune(model, data, "all", 0.5, ablation="zero", steps=2, progress=False)
    assert zero.metadata["n_edges_excluded_inert"] == 0


def test_a_sparsity_that_keeps_no_edge_is_refused_before_any_work(monkeypatch):
    model = small_model("lstm", n_layers=1)  # 3 edges
    data = random_data(model)

    def no_work(*args, **kwargs):
        raise AssertionError("optimisation started")

    monkeypatch.setattr(engine, "optimise_masks", no_work)
    with pytest.raises(ValueError, match=r"keeps no edge .* 3 countable edges") as info:
        prune(model, data, "all", 0.95, progress=False)
    assert "\n" not in str(info.value) and "0.8333" in str(info.value)
    with pytest.raises(AssertionError, match="optimisation started"):
        prune(model, data, "all", 0.8, progress=False)  # keeps round(0.6) = 1 edge: accepted


def test_faithfulness_warning(monkeypatch):
    assert faithfulness_warning({"faithfulness": 0.5, "complement_faithfulness": 0.2}) is None
    low = faithfulness_warning({"target": "all", "faithfulness": 0.05, "complement_faithfulness": 0.2})
    assert "faithfulness 0.050 < 0.1" in low
    high = faithfulness_warning({"faithfulness": 0.5, "complement_faithfulness": 0.95})
    assert "complement faithfulness 0.950 > 0.9" in high
    model = small_model("lstm")
    metrics = {"target": "all", "faithfulness": 0.01, "complement_faithfulness": 0.97}
    monkeypatch.setattr(engine, "evaluate_masks", lambda *a, **k: dict(metrics))
    with pytest.warns(UserWarning, match="faithfulness 0.010 < 0.1 and complement"):
        circuit = prune(model, random_data(model), "all", 0.5, steps=2, progress=False)
    assert len(circuit.metadata["warnings"]) == 1


@pytest.mark.filterwarnings("ignore:circuit for .* the search likely failed")  # a deliberately short search
def test_loss_scale_acts_under_the_lagrangian_and_is_recorded():
    # (under the default budget it cannot act: tests/prune/test_search.py)
    model = small_model("transformer")
    data = random_data(model)
    kw = {"steps": 10, "batch_size": 16, "progress": False, "constraint": "lagrangian"}
    a = prune(model, data, "all", 0.8, **kw)
    b = prune(model, data, "all", 0.8, loss_scale=1000.0, **kw)
    assert b.metadata["loss_scale"] == 1000.0
    assert a.log_alpha != b.log_alpha


def test_prune_seeds_varies_data_and_optimiser_seeds():
    model = small_model("lstm")
    drawn = []

    def data_for(seed: int) -> PruneData:
        drawn.append(seed)
        return random_data(model, seed=10 * seed)

    found = prune_seeds(model, data_for, ["all"], [0, 1], sparsity=0.5, steps=2, progress=False)
    assert drawn == [0, 1]
    assert [(c.metadata["seed"], c.metadata["data_seed"]) for c in found["all"]] == [(0, 0), (1, 1)]
    with pytest.raises(ValueError, match="lr"):
        prune_seeds(model, data_for, ["all"], [0], lr=0.0)


def test_normalized_loss_divides_by_the_fully_ablated_loss():
    model = small_model("transformer")
    data = random_data(model)
    circuit = prune(model, data, "all", 0.8, steps=2, progress=False)  # the default: normalised
    graph = build_graph(model)
    by_hand = evaluate_masks(model, graph, data.train, "all", "interchange",
                             torch.zeros(graph.n_edges, dtype=torch.bool))["ablated_vs_full"]  # fmt: skip
    meta = circuit.metadata
    assert meta["loss_normalized_by"] == pytest.approx(by_hand, rel=1e-5)
    assert meta["loss_normalized"] and meta["normalize_loss"] and meta["loss_scale"] == 1.0
    raw = prune(model, data, "all", 0.8, steps=2, normalize_loss=False, loss_scale=1000.0, progress=False)
    assert raw.metadata["loss_normalized_by"] == 1.0 and not raw.metadata["loss_normalized"]
    assert raw.metadata["loss_scale"] == 1000.0
    with pytest.raises(ValueError, match="normalize_loss"):
        prune(model, data, "all", 0.8, steps=2, normalize_loss="yes", progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("target, best_attribution", [("1-after", 0.978), ("2-after", 0.967)])
def test_the_default_on_the_bundled_checkpoint_fills_its_budget_and_beats_attribution(target, best_attribution):
    """At the defaults the circuit has the 25 edges asked (or names those without effect)
    and is at least as faithful on held-out traces as the best attribution method's at the
    same size (exact single-edge ablation, docs/pruning.md "Methods side by side"); 70-90 s
    per target on one thread at load 1-2 (~10 min at load 9)."""
    from mechlab.pipelines import checkpoint_prune_data

    torch.set_num_threads(1)
    ckpt, data = checkpoint_prune_data("examples/checkpoints/recall-cpu/last.pt", data_seed=0)
    circuit = prune(ckpt.model, data, target, 0.95, seed=0, progress=False)
    meta = circuit.metadata
    assert circuit.n_edges == meta["n_edges_asked"] == 25 or meta["edges_without_effect"]
    assert meta["metrics"]["faithfulness"] >= best_attribution
