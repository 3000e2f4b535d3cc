"""Ground-truth circuits of compiled Tracr programs, and the masked forward on their layout."""

import pytest
import torch

pytest.importorskip("tracr", reason="Tracr is not installed: pip install -e '.[tracr]'")
pytest.importorskip("haiku", reason="dm-haiku is not installed: pip install -e '.[tracr]'")

from mechlab.models.tracr import compile_program, load_tracr  # noqa: E402
from mechlab.models.transformer import Transformer, TransformerConfig  # noqa: E402
from mechlab.prune.forward import make_ablation, masked_forward  # noqa: E402
from mechlab.prune.graph import build_graph  # noqa: E402
from mechlab.prune.tracr import (  # noqa: E402
    ablation_edges,
    edge_recovery,
    tracr_prune_data,
    weight_edges,
)
from mechlab.traces import Traces  # noqa: E402

torch.set_num_threads(1)

# Worked out by hand from the RASP programs (see docs/pruning.md):
# xproportion = numerical Aggregate(Select(indices, indices, LEQ), map(tokens == "x")):
# MLP 0 computes the map from the token, head a1.h0 averages it over earlier positions.
XPROPORTION = [("embed", "m0.in"), ("m0", "a1.h0.v"), ("a1.h0", "out")]
# hist = SelectorWidth(Select(tokens, tokens, EQ)): the head's q and k read the tokens,
# MLP 0 turns the attention to BOS into a count, the read-out reads the MLP.
HIST = [("embed", "a0.h0.q"), ("embed", "a0.h0.k"), ("a0.h0", "m0.in"), ("m0", "out")]


@pytest.fixture(scope="module")
def loaded():
    out = {}
    for name in ("xproportion", "hist", "reverse"):
        model, info = load_tracr(compile_program(name))
        out[name] = (model, info, tracr_prune_data(name, info, n_train=32, n_test=32))
    return out


def test_weight_edges_of_xproportion_by_hand(loaded):
    model, _, _ = loaded["xproportion"]
    # the selector Select(indices, indices, LEQ) reads positions and BOS (embed) in q and k
    expected = XPROPORTION + [(w, f"a1.h0.{k}") for w in ("embed", "pos") for k in "qk"]
    assert set(weight_edges(model)) == set(expected)


@pytest.mark.parametrize("name, expected", [("xproportion", XPROPORTION), ("hist", HIST)])
def test_ablation_ground_truth_by_hand(loaded, name, expected):
    model, _, data = loaded[name]
    truth = ablation_edges(model, data.train)
    assert set(truth) == set(expected)
    assert set(truth) <= set(weight_edges(model))


@pytest.mark.parametrize("name", ["xproportion", "hist", "reverse"])
def test_ground_truth_alone_reproduces_the_model(loaded, name):
    """Keeping only the ablation ground truth gives the full output; dropping any of it does not."""
    model, _, data = loaded[name]
    graph = build_graph(model)
    traces = data.test
    truth = ablation_edges(model, data.train)
    ablated = make_ablation(model, "interchange", traces)
    keep = torch.zeros(graph.n_edges)
    keep[[graph.edge_index[e] for e in truth]] = 1.0
    pos = traces.observed
    with torch.no_grad():
        full = model(traces.inputs)[pos]
        circuit = masked_forward(model, graph, traces.inputs, ablated, keep)[pos]
        torch.testing.assert_close(circuit, full, atol=1e-4, rtol=0)
        for edge in truth:
            fewer = keep.clone()
            fewer[graph.edge_index[edge]] = 0.0
            out = masked_forward(model, graph, traces.inputs, ablated, fewer)[pos]
            assert (out - full).abs().max() > 1e-2, edge


def test_reverse_ground_truth_is_the_flip_head(loaded):
    model, _, data = loaded["reverse"]
    truth = ablation_edges(model, data.train)
    last = model.cfg.n_layers - 1  # the flip head Aggregate(Select(indices, opp_idx, EQ), tokens)
    assert set(truth) == {("embed", f"a{last}.h0.v"), (f"a{last}.h0", "out")}
    # length and opp_idx are the same in the clean and the corrupted run (same length)
    assert len(weight_edges(model)) > len(truth)


def test_edge_recovery_by_hand():
    r = edge_recovery([("a", "x"), ("b", "x"), ("c", "y")], [("a", "x"), ("c", "y"), ("d", "z")])
    assert (r["precision"], r["recall"], r["n_common"], r["exact"]) == (2 / 3, 2 / 3, 2.0, 0.0)
    assert edge_recovery([], [("a", "x")])["recall"] == 0.0
    assert edge_recovery([("a", "x")], [("a", "x")])["exact"] == 1.0


def test_bad_data_and_model():
    model, info = load_tracr(compile_program("hist"))
    with pytest.raises(ValueError, match="n_train must be a positive integer"):
        tracr_prune_data("hist", info, n_train=0)
    ln_model = Transformer(TransformerConfig(d_model=8, n_layers=1, n_heads=2))
    with pytest.raises(ValueError, match="normalization='none'"):
        weight_edges(ln_model)


@pytest.mark.parametrize("causal", [True, False])
def test_masked_forward_invariants_no_ln_relu(causal):
    """All masks on: the model's output; all off: its output on the corrupted input."""
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=12, n_layers=2, n_heads=2, io="tokens", d_vocab=7, n_ctx=6,
                            act_fn="relu", normalization="none", causal=causal)  # fmt: skip
    model = Transformer(cfg).double().eval()
    graph = build_graph(model)
    x, corrupted = torch.randint(7, (3, 6)), torch.randint(7, (3, 6))
    traces = Traces(inputs=x, corrupted=corrupted)
    ablated = make_ablation(model, "interchange", traces)
    with torch.no_grad():
        on = masked_forward(model, graph, x, ablated, torch.ones(graph.n_edges))
        off = masked_forward(model, graph, x, ablated, torch.zeros(graph.n_edges))
        torch.testing.assert_close(on, model(x), atol=1e-10, rtol=0)
        torch.testing.assert_close(off, model(corrupted), atol=1e-10, rtol=0)


def _recover(name: str, seed: int) -> dict:
    """Prune a compiled program at the defaults (the normalised loss: compiled programs'
    outputs have arbitrary scales, and the old raw-loss default recovered xproportion 2/3
    and sort_unique 1/3, docs/pruning.md), told only the ground truth's size."""
    from mechlab.prune.engine import prune
    from mechlab.prune.graph import countable_edges

    model, info = load_tracr(compile_program(name))
    data = tracr_prune_data(name, info, n_train=64, n_test=128)
    truth = ablation_edges(model, data.train)
    n = int(countable_edges(build_graph(model), "interchange").sum())
    circuit = prune(model, data, "all", sparsity=1 - len(truth) / n, seed=seed, progress=False)
    return edge_recovery(list(circuit.edges), truth)


@pytest.mark.parametrize("name", ["hist", "xproportion"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_search_recovers_the_program_exactly(name, seed):
    result = _recover(name, seed)
    assert result["exact"] and result["precision"] == 1.0 and result["recall"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reverse", "sort_unique"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_search_recovers_slow_programs_exactly(name, seed):
    assert _recover(name, seed)["exact"]
