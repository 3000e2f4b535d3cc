"""Tests of mechlab.models.export: mechlab transformer -> Hugging Face GPT-2 -> TransformerBridge."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2LMHeadModel

from mechlab.models.export import (
    GPT2WithReadInOut,
    to_hf_gpt2,
    to_hf_gpt2_read_in_out,
    to_transformer_bridge,
)
from mechlab.models.transformer import Transformer, TransformerConfig

BATCH, N_POS = 3, 9
TOL = {"atol": 1e-4, "rtol": 1e-4}


def make_model(io: str = "tokens", zero_read_out_bias: bool = False, **fields) -> Transformer:
    """A small model with every parameter moved off its init."""
    torch.manual_seed(0)
    base = {"d_model": 32, "n_heads": 4, "n_layers": 2, "n_ctx": 16, "d_in": 6, "d_out": 3}
    if io == "tokens":
        base.update(io="tokens", d_vocab=13)
    model = Transformer(TransformerConfig(**{**base, **fields})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        if zero_read_out_bias:
            model.read_out.proj.bias.zero_()
    return model


def tokens(model: Transformer) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, model.cfg.d_vocab, (BATCH, N_POS), generator=g)


# --- Hugging Face ----------------------------------------------------------------------


@pytest.mark.parametrize("act_fn", ["gelu_new", "gelu"])
def test_hf_logits_match(act_fn):
    model = make_model(act_fn=act_fn, zero_read_out_bias=True)
    hf = to_hf_gpt2(model)
    assert isinstance(hf, GPT2LMHeadModel)
    assert hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr()  # untied
    x = tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), **TOL)
        # the HF hidden states are mechlab's residual stream
        hidden = hf(x, output_hidden_states=True).hidden_states
        _, cache = model.run_with_cache(x)
    torch.testing.assert_close(hidden[0], cache["blocks.0.hook_resid_pre"], **TOL)
    torch.testing.assert_close(hidden[1], cache["blocks.0.hook_resid_post"], **TOL)


def test_read_out_bias_raises_by_default_and_attaches_on_request():
    model = make_model()
    with pytest.raises(ValueError, match="read_out_bias='attach'"):
        to_hf_gpt2(model)
    with pytest.raises(ValueError, match="read_out_bias must be"):
        to_hf_gpt2(model, read_out_bias="fold")
    hf = to_hf_gpt2(model, read_out_bias="attach")
    torch.testing.assert_close(hf.lm_head.bias, model.read_out.proj.bias)
    x = tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), **TOL)


def test_separate_output_vocabulary():
    model = make_model(d_vocab_out=5, zero_read_out_bias=True)
    hf = to_hf_gpt2(model)
    assert hf.lm_head.weight.shape == (5, 32) and hf.transformer.wte.weight.shape == (13, 32)
    x = tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), **TOL)


def test_export_leaves_the_model_alone_and_copies_weights():
    model = make_model(zero_read_out_bias=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hf = to_hf_gpt2(model)
    with torch.no_grad():
        hf.transformer.h[0].attn.c_attn.weight.add_(1.0)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], atol=0, rtol=0)


def test_save_pretrained_round_trip(tmp_path):
    model = make_model(zero_read_out_bias=True)
    to_hf_gpt2(model).save_pretrained(tmp_path)
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    x = tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x).logits, model(x), **TOL)


def test_continuous_export_matches():
    model = make_model("continuous")
    exported = to_hf_gpt2_read_in_out(model)
    assert isinstance(exported, GPT2WithReadInOut)
    keys = set(exported.state_dict())
    assert {"_read_in.weight", "_read_out.bias", "_backbone.wpe.weight"} <= keys
    x = torch.randn(BATCH, N_POS, 6, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(exported(x), model(x), **TOL)


def test_wrong_mode_or_shape_raises():
    with pytest.raises(ValueError, match="to_hf_gpt2_read_in_out"):
        to_hf_gpt2(make_model("continuous"))
    with pytest.raises(ValueError, match="continuous"):
        to_hf_gpt2_read_in_out(make_model())
    with pytest.raises(ValueError, match="n_heads \\* d_head"):
        to_hf_gpt2(make_model(d_head=5, zero_read_out_bias=True))


# --- TransformerBridge -----------------------------------------------------------------


@pytest.fixture(scope="module")
def bridged():
    model = make_model(d_vocab_out=7)
    return model, to_transformer_bridge(model, read_out_bias="attach")


def test_bridge_logits_match(bridged):
    model, bridge = bridged
    x = tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(bridge(x), model(x), **TOL)


def test_bridge_hooks_match_the_mechlab_cache():
    model = make_model(d_vocab_out=7)
    bridge = to_transformer_bridge(model, read_out_bias="attach")
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    bridge.set_use_attn_result(True)
    x = tokens(model)
    with torch.no_grad():
        logits, bridge_cache = bridge.run_with_cache(x)
        out, cache = model.run_with_cache(x)
    torch.testing.assert_close(logits, out, **TOL)
    shared = set(cache.keys()) & set(bridge_cache.keys())
    # every mechlab hook point has a bridge twin, except the read-out's (unembed.hook_out)
    assert set(cache.keys()) - shared == {"hook_out"}
    torch.testing.assert_close(bridge_cache["unembed.hook_out"], cache["hook_out"], **TOL)
    causal = torch.tril(torch.ones(N_POS, N_POS, dtype=torch.bool))
    for name in sorted(shared):
        ours, theirs = cache[name], bridge_cache[name]
        assert ours.shape == theirs.shape, name
        if name.endswith("hook_attn_scores"):  # -inf above the diagonal in both
            ours, theirs = ours[..., causal], theirs[..., causal]
        torch.testing.assert_close(theirs, ours, **TOL, msg=name)


def test_bridge_with_weight_processing_keeps_the_distribution():
    model = make_model()
    bridge = to_transformer_bridge(model, read_out_bias="attach")
    bridge.enable_compatibility_mode(disable_warnings=True)  # folds LN, centres the unembedding
    x = tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(bridge(x).log_softmax(-1), model(x).log_softmax(-1), **TOL)


def test_bridge_patching_agrees_with_mechlab_patching(bridged):
    model, bridge = bridged
    x = tokens(model)

    def zero_head(act, hook):
        act[:, :, 1] = 0.0
        return act

    with torch.no_grad():
        ours = model.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
        bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
        theirs = bridge.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
    torch.testing.assert_close(theirs, ours, **TOL)
    assert (ours - model(x)).abs().max() > 1e-3


def test_bridge_with_a_local_tokenizer_reads_strings():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = make_model(zero_read_out_bias=True)
    word_level = Tokenizer(models.WordLevel({f"t{i}": i for i in range(13)}, unk_token="t0"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="t0")
    bridge = to_transformer_bridge(model, tokenizer=tokenizer)
    ids = bridge.to_tokens("t3 t1 t4 t1 t5", prepend_bos=False)
    assert ids.tolist() == [[3, 1, 4, 1, 5]]
    with torch.no_grad():
        torch.testing.assert_close(bridge(ids), model(ids), **TOL)


@pytest.mark.parametrize(
    "fields, named",
    [({"normalization": "none"}, "normalization='none'"), ({"act_fn": "relu"}, "act_fn='relu'"),
     ({"causal": False}, "causal=False"), ({"qk_norm": True}, "qk_norm=True"),
     ({"clip_qkv": 2.0}, "clip_qkv=2.0"), ({"normalization": "LNPre"}, "normalization='LNPre'")],
)
def test_models_gpt2_cannot_hold_are_refused_with_one_line(fields, named):
    model = make_model(zero_read_out_bias=True, **fields)
    with pytest.raises(ValueError, match="cannot be exported") as err:
        to_hf_gpt2(model)
    assert named in str(err.value) and "\n" not in str(err.value)
