"""Edge pruning on imported models: the masked forward at all-ones and all-zeros masks
against the plain forward, for every architecture, a pruning run on each, EAP-IG's
completeness on the architectures added for issue 36, and what a head's edge is where a
norm follows the attention (OLMo 2, Gemma 2/3)."""

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
NEW = ["llama-llama3", "llama-yarn", "qwen3", "olmo", "phi3", "gptj", "olmo2", "gemma2", "gemma3"]  # issue 36


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
    error (qk norms, clip_qkv, scaled and interleaved rotary, post-sublayer norms, windows
    and soft-capping in the masked forward's path)."""
    model = model_for(name)
    traces = Traces(inputs=tokens(6, 10, seed=3), corrupted=tokens(6, 10, seed=4))
    # Gemma's soft-capped read-out curves more along the path: the midpoint rule's error is
    # 2.9% of the effect at 8 steps on gemma3, 0.08% at 16 (and at 32: float32's floor)
    result = attribute(model, traces, "all", "eap-ig", steps=16 if name.startswith("gemma") else 8)
    assert result.graph.n_edges == build_graph(model).n_edges
    assert result.total_effect > 0
    assert abs(float(result.scores.sum()) - result.total_effect) < 0.02 * result.total_effect


@pytest.mark.parametrize("name", ["olmo2", "gemma2"])
def test_a_heads_edges_carry_its_share_of_the_post_normed_attention_output(name):
    """Closing every edge out of head a0.h1 is, in the model's own forward (hooks), block 0's
    normed attention output with that head's share w * result_h / s swapped for its share in
    the corrupted run (s: the RMS of the layer's summed heads, in each run); closing only one
    of its edges changes only that reader's input."""
    model = model_for(name)
    graph = build_graph(model)
    x, x_corrupt = tokens(seed=1), tokens(seed=2)
    post = model.blocks[0].ln1_post

    def share(cache):
        result = cache["blocks.0.attn.hook_result"][:, :, 1]  # [batch, pos, d]
        return result / cache["blocks.0.ln1_post.hook_scale"] * post.w

    with torch.no_grad():
        clean, corrupt = model.run_with_cache(x)[1], model.run_with_cache(x_corrupt)[1]
        swapped = model.run_with_hooks(x, fwd_hooks=[(
            "blocks.0.hook_attn_out", lambda act, hook: act - share(clean) + share(corrupt))])  # fmt: skip
        ablated = make_ablation(model, "interchange", Traces(inputs=x, corrupted=x_corrupt), graph=graph)
        z = torch.tensor([0.0 if writer == "a0.h1" else 1.0 for writer, _ in graph.edges])
        with frozen_eval(model):
            for fast in (True, False):
                masked = masked_forward(model, graph, x, ablated, z, fast=fast)
                assert (masked - swapped).abs().max() < 1e-5, fast
        assert (swapped - clean["hook_out"]).abs().max() > 1e-3  # the head matters
        only = torch.tensor([0.0 if edge == ("a0.h1", "out") else 1.0 for edge in graph.edges])
        resid = clean[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"] - share(clean) + share(corrupt)
        with frozen_eval(model):
            masked = masked_forward(model, graph, x, ablated, only)
        assert (masked - model.read_out(model.ln_final(resid))).abs().max() < 1e-5


def test_post_norm_graphs_refuse_what_a_heads_share_cannot_express():
    for fields in ({"normalization": "LN"}, {"attn_out_bias": True}):
        model = build_model("transformer", d_model=16, n_layers=2, n_heads=2, io="tokens", d_vocab=V,
                            n_ctx=24, post_norms=True, **{"normalization": "RMS", "attn_out_bias": False,
                                                          **fields})  # fmt: skip
        with pytest.raises(ValueError, match="^edge graphs of norms after the sublayers need RMSNorms "
                           "without an attention output bias .*; this model has normalization") as info:  # fmt: skip
            build_graph(model)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["olmo2", "gemma2", "gemma3"])
def test_every_attribution_method_runs_on_the_post_norm_architectures(name):
    """EAP, EAP-IG (on the edges and on the inputs) and exact ablation score every edge; the
    exact scores equal a loop of single-edge masked forwards (these rotary models take it)."""
    from mechlab.prune.objective import build_objective, exact_loop_scores

    model = model_for(name)
    traces = Traces(inputs=tokens(4, 8, seed=3), corrupted=tokens(4, 8, seed=4))
    n_edges = build_graph(model).n_edges
    for method in ("eap", "eap-ig", "eap-ig-inputs", "exact"):
        scores = attribute(model, traces, "all", method, steps=4).scores
        assert scores.shape == (n_edges,) and torch.isfinite(scores).all() and scores.abs().max() > 0, method
    with frozen_eval(model):
        loop = exact_loop_scores(build_objective(model, traces, "all"), 4, False, "exact")
    torch.testing.assert_close(scores, loop, atol=1e-9, rtol=1e-7)
