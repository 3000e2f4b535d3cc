"""Hooks, the cache, nnsight, patching and probes on every imported family."""

import pytest
import torch
from nnsight import NNsight

from mechlab.models.importers import from_pretrained
from mechlab.patching import activation_patch
from mechlab.probes import collect_activations
from tests.models.hf_models import hf_model, tokens

torch.set_num_threads(1)
# learned / rotary+parallel / RMS+SwiGLU+GQA / SSM / query-key norms / weightless LN+clip /
# interleaved rotary on a shared LayerNorm / post-sublayer norms (OLMo 2), with pre-norms,
# soft-capping and sliding windows (Gemma 2/3)
FAMILIES = ("gpt2", "neox", "llama", "mamba", "qwen3", "olmo", "gptj", "olmo2", "gemma2", "gemma3")


@pytest.fixture(scope="module", params=FAMILIES)
def imported(request):
    return request.param, from_pretrained(hf_model(request.param))


def test_cache_holds_every_hook_and_agrees_with_the_output(imported):
    name, model = imported
    x = tokens()
    out, cache = model.run_with_cache(x)
    assert set(cache.keys()) == set(model.hook_dict)
    torch.testing.assert_close(cache["hook_out"], out)
    last = model.cfg.n_layers - 1
    torch.testing.assert_close(model.read_out(model.ln_final(cache[f"blocks.{last}.hook_resid_post"])), out)
    if name == "llama":  # grouped key/value heads: 2 key heads serve 4 query heads
        assert cache["blocks.0.attn.hook_k"].shape[2] == 2 and cache["blocks.0.attn.hook_q"].shape[2] == 4
        assert model.hook_axes("blocks.0.attn.hook_rot_k")[2] == "kv_head"
    if name in ("gpt2", "neox", "llama", "olmo2", "gemma2"):  # attention output = the heads'
        b_O = model.blocks[1].attn.b_O  # results summed (+ b_O), through the post norm if any
        summed = cache["blocks.1.attn.hook_result"].sum(2) + (0 if b_O is None else b_O)
        if model.blocks[1].ln1_post is not None:
            summed = model.blocks[1].ln1_post(summed)
            normalized = cache["blocks.1.attn.hook_result"].sum(2) / cache["blocks.1.ln1_post.hook_scale"]
            torch.testing.assert_close(cache["blocks.1.ln1_post.hook_normalized"], normalized)
        torch.testing.assert_close(summed, cache["blocks.1.hook_attn_out"])
        pattern = cache["blocks.0.attn.hook_pattern"]
        assert torch.allclose(pattern.sum(-1), torch.ones(()))
        assert pattern.triu(1).abs().max() == 0  # causal


def test_a_hook_edit_changes_the_output_and_nnsight_sees_the_same_activations(imported):
    name, model = imported
    x = tokens()
    hook = "blocks.0.hook_resid_post"
    _, cache = model.run_with_cache(x)
    nm = NNsight(model)
    with nm.trace(x):
        resid = nm.blocks[0].hook_resid_post.output.save()
        out = nm.output.save()
    torch.testing.assert_close(resid, cache[hook])
    torch.testing.assert_close(out, cache["hook_out"])
    zeroed = model.run_with_hooks(x, fwd_hooks=[(hook, lambda act, hook: act * 0)])
    assert (zeroed - cache["hook_out"]).abs().max() > 1e-3


def test_activation_patching_of_the_whole_stream_restores_the_clean_run(imported):
    name, model = imported
    clean, corrupted = tokens(seed=1), tokens(seed=2)

    def metric(out):
        return out[:, -1, 3].mean()

    result = activation_patch(
        model, clean, corrupted, metric, hooks="blocks.0.hook_resid_pre", positions="all", progress=False
    )
    assert result.values[0, 0] == pytest.approx(result.clean_metric, abs=1e-5)
    assert abs(result.clean_metric - result.corrupted_metric) > 1e-4
    if name == "llama":  # per key/value head
        per_head = activation_patch(
            model, clean, corrupted, metric, hooks="blocks.1.attn.hook_v", positions="all", progress=False
        )
        assert per_head.labels == ["blocks.1.attn.hook_v[0]", "blocks.1.attn.hook_v[1]"]


def test_probes_collect_activations(imported):
    name, model = imported
    hook = "blocks.1.hook_resid_mid" if name == "gpt2" else "blocks.1.hook_resid_post"
    acts = collect_activations(model, tokens(n=5), hook, positions=[2, 4], progress=False)
    assert acts[hook].shape == (5, 2, model.cfg.d_model)
    _, cache = model.run_with_cache(tokens(n=5))
    torch.testing.assert_close(acts[hook], cache[hook][:, [2, 4]])
