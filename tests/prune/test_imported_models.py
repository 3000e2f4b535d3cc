"""Edge pruning on imported models: the masked forward at all-ones and all-zeros masks
against the plain forward, for every architecture, a pruning run on each, and EAP-IG's
completeness on the architectures added for issue 36."""

import pytest
import torch

from mechlab.models import build_model
from mechlab.models.importers import from_pretrained
from mechlab.prune import PruneData, Traces, prune
from mechlab.prune.attribution import attribute
from mechlab.prune.forward import frozen_eval, make_ablation, masked_forward
from mechlab.prune.graph import build_graph
from tests.models.hf_models import CONFIGS, V, hf_model, tokens

torch.set_num_threads(1)
ATTN_ONLY = "attn-only"  # mechlab's own option (the induction model's), no HF counterpart
NAMES = [*sorted(CONFIGS), ATTN_ONLY]
NEW = ["llama-llama3", "llama-yarn", "qwen3", "olmo", "phi3", "gptj"]  # added for issue 36


def model_for(name: str):
    if name == ATTN_ONLY:
        torch.manual_seed(0)
        return build_model("transformer", d_model=16, n_layers=2, n_heads=2, attn_only=True,
                           io="tokens", d_vocab=V, n_ctx=24).eval()  # fmt: skip
    return from_pretrained(hf_model(name))


@pytest.mark.parametrize("name", NAMES)
def test_masked_forward_is_the_clean_run_at_ones_and_the_corrupted_run_at_zeros(name):
    model = model_for(name)
    graph = build_graph(model)
    x, x_corrupt = tokens(seed=1), tokens(seed=2)
    traces = Traces(inputs=x, corrupted=x_corrupt)
    with frozen_eval(model), torch.no_grad():
        clean, corrupt = model(x), model(x_corrupt)
        ablated = make_ablation(model, "interchange", traces, graph=graph)
        for fast in (True, False):
            ones = masked_forward(model, graph, x, ablated, torch.ones(graph.n_edges), fast=fast)
            zeros = masked_forward(model, graph, x, ablated, torch.zeros(graph.n_edges), fast=fast)
            assert (ones - clean).abs().max() < 1e-4, fast
            assert (zeros - corrupt).abs().max() < 1e-4, fast
        assert (clean - corrupt).abs().max() > 1e-2  # the two runs differ
        zero_abl = make_ablation(model, "zero", traces, graph=graph)
        ones = masked_forward(model, graph, x, zero_abl, torch.ones(graph.n_edges))
        assert (ones - clean).abs().max() < 1e-4


@pytest.mark.filterwarnings("ignore:circuit for 'all'")  # 12 steps on random weights: no circuit to find
@pytest.mark.parametrize("name", ["gpt2", "neox", "llama", "mistral", "mamba", ATTN_ONLY, *NEW])
def test_pruning_runs_on_each_architecture(name):
    model = model_for(name)
    train = Traces(inputs=tokens(16, 10, seed=3), corrupted=tokens(16, 10, seed=4))
    test = Traces(inputs=tokens(8, 10, seed=5), corrupted=tokens(8, 10, seed=6))
    graph = build_graph(model)
    circuit = prune(model, PruneData(train, test), "all", sparsity=0.7, steps=12, batch_size=8,
                    progress=False)  # fmt: skip
    meta = circuit.metadata
    assert meta["graph"]["n_edges"] == graph.n_edges
    assert 0 < len(circuit.edges) <= round(0.3 * graph.n_edges) + 1
    assert set(circuit.edges) <= set(graph.edges)
    assert "faithfulness" in meta["metrics"]


@pytest.mark.parametrize("name", NEW)
def test_eap_ig_is_complete_on_the_new_architectures(name):
    """EAP-IG's edge scores sum to the total effect m(0) - m(1) up to the midpoint rule's
    error (qk norms, clip_qkv, scaled and interleaved rotary in the masked forward's path)."""
    model = model_for(name)
    traces = Traces(inputs=tokens(6, 10, seed=3), corrupted=tokens(6, 10, seed=4))
    result = attribute(model, traces, "all", "eap-ig", steps=8)
    assert result.graph.n_edges == build_graph(model).n_edges
    assert result.total_effect > 0
    assert abs(float(result.scores.sum()) - result.total_effect) < 0.02 * result.total_effect
