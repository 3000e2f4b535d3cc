"""from_pretrained: parity with Hugging Face logits, saved-folder round trips, bridges, bad input."""

import json
import math

import pytest
import torch
from transformer_lens.model_bridge.sources import build_bridge_from_module

from mechlab.models.importers import SUPPORTED, ImportProblem, from_pretrained
from mechlab.models.mamba import Mamba
from mechlab.models.transformer import Transformer, rotary_inv_freq
from tests.models.hf_models import CONFIGS, LONG, ROPE_SCALED, hf_model, tokens

torch.set_num_threads(1)
TOL = 1e-5


def max_diff(model, hf, x) -> float:
    with torch.no_grad():
        return float((model(x) - hf(x).logits).abs().max())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_hugging_face_in_memory_and_after_a_saved_folder_round_trip(name, tmp_path):
    hf = hf_model(name)
    x = tokens()
    model = from_pretrained(hf)
    assert isinstance(model, Mamba if name == "mamba" else Transformer)
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert max_diff(model, hf, x) < TOL
    hf.save_pretrained(tmp_path)
    folder_model = from_pretrained(tmp_path)
    assert max_diff(folder_model, hf, x) < TOL
    for (k, a), (_, b) in zip(model.state_dict().items(), folder_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


# The architectures and rotary scalings added for issue 36; each prompt is as long as the
# config allows: LONG (40) tokens, past original_max_position_embeddings where there is one
# (dynamic: all 48 positions, where Hugging Face's dynamic rescaling would start)
NEW = {"llama-llama3": LONG, "llama-linear": LONG, "llama-yarn": LONG, "llama-dynamic": 48,
       "neox-yarn": LONG, "qwen3": 24, "qwen3-bias-yarn": LONG, "olmo": 24, "phi3": 24, "gptj": 24,
       "olmo2": LONG, "gemma2": LONG, "gemma3": LONG, "phi3-longrope": LONG}  # fmt: skip


def residual_diffs(model, hf, x) -> list[float]:
    """|mechlab - HF| of every residual stream: HF's hidden_states[i] is block i's
    hook_resid_pre, its last one the final norm of the last hook_resid_post; the last
    block's own output (before that norm) is read from its decoder layer."""
    base = hf.base_model
    layers = base.layers if hasattr(base, "layers") else base.h
    seen = []
    handle = layers[-1].register_forward_hook(
        lambda module, args, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            streams = hf(x, output_hidden_states=True).hidden_states
            _, cache = model.run_with_cache(x)
    finally:
        handle.remove()
    last = model.cfg.n_layers - 1
    ours = [cache[f"blocks.{i}.hook_resid_pre"] for i in range(last + 1)]
    with torch.no_grad():
        ours.append(model.ln_final(cache[f"blocks.{last}.hook_resid_post"]))
    assert len(streams) == len(ours) and seen[0].shape == ours[-1].shape
    theirs = [*streams, seen[0]]
    ours.append(cache[f"blocks.{last}.hook_resid_post"])
    return [float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True)]


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_architectures_match_every_residual_stream_on_long_prompts(name, tmp_path):
    hf = hf_model(name)
    x = tokens(n=2, n_pos=NEW[name])
    model = from_pretrained(hf)
    assert max_diff(model, hf, x) < TOL
    assert max(residual_diffs(model, hf, x)) < TOL
    hf.save_pretrained(tmp_path)
    assert max(residual_diffs(from_pretrained(tmp_path), hf, x)) < TOL


@pytest.mark.parametrize("kind", sorted(set(ROPE_SCALED) - {"dynamic"}))
def test_scaled_rotary_frequencies_are_hugging_faces_and_change_the_logits(kind):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = hf_model(f"llama-{kind}")
    model = from_pretrained(hf)
    rotary = model.blocks[0].attn.rotary
    expected, attention_factor = ROPE_INIT_FUNCTIONS[kind](hf.config)
    assert torch.equal(rotary.inv_freq, expected) and rotary.attention_factor == attention_factor
    default = rotary_inv_freq(10, 100.0)
    assert (rotary.inv_freq - default).abs().max() > 0.01  # the scaling bites
    if kind == "llama3":  # base 100, 10 dims: one band kept, one smoothed, three divided by 8
        ratio = default / rotary.inv_freq
        assert ratio[0] == 1 and 1 < ratio[1] < 8 and torch.allclose(ratio[2:], torch.tensor(8.0))
    if kind == "yarn":
        assert attention_factor == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
    x = tokens(n=2, n_pos=LONG)
    unscaled = from_pretrained(hf)
    unscaled.cfg.rotary_scaling = None
    for block in unscaled.blocks:
        block.attn.rotary.inv_freq.copy_(default)
        block.attn.rotary.attention_factor = 1.0
    with torch.no_grad():
        assert (unscaled(x) - model(x)).abs().max() > 1e-3


def test_dynamic_rotary_scaling_is_the_default_up_to_max_position_embeddings():
    hf = hf_model("llama-dynamic")
    model = from_pretrained(hf)
    assert model.cfg.rotary_scaling is None and model.cfg.n_ctx == 48
    assert torch.equal(model.blocks[0].attn.rotary.inv_freq, rotary_inv_freq(10, 100.0))
    with pytest.raises(ValueError, match="48"):
        model(tokens(n=1, n_pos=49))


def test_the_new_architectures_options():
    qwen3 = from_pretrained(hf_model("qwen3"))
    cfg = qwen3.cfg
    assert (cfg.qk_norm, cfg.d_head, cfg.n_key_value_heads) == (True, 10, 2)
    assert not cfg.qkv_bias and not cfg.attn_out_bias
    attn = qwen3.blocks[1].attn
    assert torch.equal(attn.q_norm.w, hf_model("qwen3").model.layers[1].self_attn.q_norm.weight)
    x = tokens()
    _, cache = qwen3.run_with_cache(x)
    q = cache["blocks.1.attn.hook_q"]  # the per-head RMSNorm, written out
    normed = q / (q.pow(2).mean(-1, keepdim=True) + cfg.layer_norm_eps).sqrt() * attn.q_norm.w
    torch.testing.assert_close(cache["blocks.1.attn.hook_q_normed"], normed)
    assert cache["blocks.1.attn.hook_k_normed"].shape == (3, 12, 2, 10)
    assert qwen3.hook_axes("blocks.1.attn.k_norm.hook_scale") == ("batch", "pos", "kv_head", "one")
    assert from_pretrained(hf_model("qwen3-bias-yarn")).cfg.attn_out_bias

    olmo = from_pretrained(hf_model("olmo"))
    cfg = olmo.cfg
    assert (cfg.normalization, cfg.clip_qkv, cfg.layer_norm_eps) == ("LNPre", 0.25, 1e-5)
    assert "blocks.0.ln1.w" not in olmo.state_dict()  # no weights: constant buffers
    _, cache = olmo.run_with_cache(x)
    assert cache["blocks.1.attn.hook_q"].abs().max() == 0.25  # the clamp bites
    unclipped = from_pretrained(hf_model("olmo"))
    for block in unclipped.blocks:
        block.attn.clip_qkv = None
    with torch.no_grad():
        assert (unclipped(x) - olmo(x)).abs().max() > 1e-3

    phi3 = from_pretrained(hf_model("phi3")).cfg
    assert (phi3.d_head, phi3.rotary_dim, phi3.n_key_value_heads, phi3.qkv_bias) == (9, 6, 2, False)
    gptj = from_pretrained(hf_model("gptj"))
    cfg = gptj.cfg
    assert (cfg.rotary_adjacent_pairs, cfg.rotary_dim, cfg.d_head) == (True, 4, 9)
    assert cfg.parallel_attn_mlp
    assert (cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias) == (False, False, True)
    assert torch.equal(gptj.read_out.proj.bias, hf_model("gptj").lm_head.bias)
    assert torch.equal(gptj.blocks[0].ln1.w, gptj.blocks[0].ln2.w)  # one LayerNorm, copied


def test_olmo2s_post_norms_and_query_key_norms_over_the_whole_projection():
    hf = hf_model("olmo2")
    model = from_pretrained(hf)
    cfg = model.cfg
    assert (cfg.pre_norms, cfg.post_norms, cfg.qk_norm, cfg.qk_norm_over) == (False, True, True, "all")
    x = tokens()
    _, cache = model.run_with_cache(x)
    attn, block = model.blocks[1].attn, model.blocks[1]
    q = cache["blocks.1.attn.hook_q"]  # [batch, pos, 4, 10]: one RMSNorm over all 40 dims
    flat = q.flatten(-2)
    normed = flat / (flat.pow(2).mean(-1, keepdim=True) + cfg.layer_norm_eps).sqrt() * attn.q_norm.w
    torch.testing.assert_close(cache["blocks.1.attn.hook_q_normed"], normed.view(q.shape))
    assert torch.equal(attn.k_norm.w, hf.model.layers[1].self_attn.k_norm.weight)  # [2 * 10]
    torch.testing.assert_close(cache["blocks.1.ln1.hook_normalized"], cache["blocks.1.hook_resid_pre"])
    attn_sum = cache["blocks.1.attn.hook_result"].sum(2)  # the heads, before the post norm
    torch.testing.assert_close(cache["blocks.1.hook_attn_out"], block.ln1_post(attn_sum))
    rms = (attn_sum.pow(2).mean(-1, keepdim=True) + cfg.layer_norm_eps).sqrt()
    torch.testing.assert_close(cache["blocks.1.ln1_post.hook_scale"], rms)
    torch.testing.assert_close(
        cache["blocks.1.hook_resid_post"], cache["blocks.1.hook_resid_mid"] + cache["blocks.1.hook_mlp_out"]
    )


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_gemmas_options_each_bite(name):
    """Each Gemma option changes the output, so the parity test checks it: the window (a
    prompt of 40 tokens, a window of 5), the soft-capping, query_pre_attn_scalar, the
    embedding scale and the (1 + w) norms."""
    hf = hf_model(name)
    model = from_pretrained(hf)
    cfg = model.cfg
    assert cfg.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert (cfg.sliding_window, cfg.attn_scale, cfg.embed_scale) == (5, 7**0.5, 32**0.5)
    assert cfg.pre_norms and cfg.post_norms and cfg.tie_embeddings and cfg.act_fn == "gelu_new"
    layer = hf.model.layers[0]
    assert torch.equal(model.blocks[0].ln2.w, 1 + layer.pre_feedforward_layernorm.weight)
    assert torch.equal(model.blocks[0].ln2_post.w, 1 + layer.post_feedforward_layernorm.weight)
    x = tokens(n=2, n_pos=LONG)
    out, cache = model.run_with_cache(x)
    torch.testing.assert_close(cache["hook_embed"], model.read_in.embed(x) * 32**0.5)
    for i, sliding in enumerate((True, False, True)):  # keys 5 or more positions back: 0 weight
        far = cache[f"blocks.{i}.attn.hook_pattern"].tril(-5)
        assert (far.abs().max() == 0) == sliding and far.abs().max() < 1
    with torch.no_grad():
        raw_logits = model.read_out.proj(model.ln_final(cache["blocks.2.hook_resid_post"]))
    assert raw_logits.abs().max() > 0.6 > 0.5 == cfg.final_softcap  # the final cap bites
    torch.testing.assert_close(out, 0.5 * torch.tanh(raw_logits / 0.5))
    if name == "gemma2":
        q, k = cache["blocks.1.attn.hook_rot_q"], cache["blocks.1.attn.hook_rot_k"]
        raw = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, dim=2)) / 7**0.5
        assert cfg.attn_softcap == 0.5 and (raw.abs() > 0.5).float().mean() > 0.3  # it bites
        assert cache["blocks.1.attn.hook_attn_scores"].nan_to_num(neginf=0).abs().max() < 0.5
    else:  # two rotary bases: 10 on the local layers, 100 scaled linearly by 2.5 on the global one
        assert cfg.attn_softcap is None  # (Hugging Face's Gemma 3 does not apply it)
        assert torch.equal(model.blocks[0].attn.rotary.inv_freq, rotary_inv_freq(10, 10.0))
        assert torch.equal(model.blocks[1].attn.rotary.inv_freq, rotary_inv_freq(10, 100.0) / 2.5)
        assert torch.equal(model.blocks[1].attn.q_norm.w, 1 + hf.model.layers[1].self_attn.q_norm.weight)
    changed = {
        "sliding_window": lambda m: [setattr(b.attn, "window", None) for b in m.blocks],
        "attn_scale": lambda m: [setattr(b.attn, "scale", 10**0.5) for b in m.blocks],
        "embed_scale": lambda m: setattr(m.read_in, "scale", None),
        "final_softcap": lambda m: setattr(m.read_out, "softcap", None),
        **({"attn_softcap": lambda m: [setattr(b.attn, "softcap", None) for b in m.blocks]}
           if name == "gemma2" else {}),
    }  # fmt: skip
    for option, change in changed.items():
        other = from_pretrained(hf)
        change(other)
        with torch.no_grad():
            assert (other(x) - out).abs().max() > 1e-3, option
            if option == "sliding_window":  # within the window, the window changes nothing
                assert (other(x[:, :5]) - out[:, :5]).abs().max() < 1e-6


def test_gemma_settings_mechlab_does_not_reproduce_are_refused():
    hf = hf_model("gemma3")
    hf.config.rope_parameters["sliding_attention"] = {"rope_type": "linear", "rope_theta": 10.0, "factor": 2.0}
    with pytest.raises(ImportProblem, match="scales its sliding-window layers' rotary embedding "
                       r"\(rope_type='linear'\); mechlab supports rope_type 'default' there"):  # fmt: skip
        from_pretrained(hf)
    hf = hf_model("gemma2")
    hf.config.use_bidirectional_attention = True
    with pytest.raises(ImportProblem, match="use_bidirectional_attention=True; mechlab imports causal"):
        from_pretrained(hf)
    hf = hf_model("gemma2")
    hf.config.layer_types = ["sliding_attention", "chunked_attention", "full_attention"]
    with pytest.raises(ImportProblem, match="layer_types must be None or a list of n_layers=3 names"):
        from_pretrained(hf)


def test_phi3s_sliding_window_caps_n_ctx_and_its_long_context_rotary_imports_from_an_old_config(tmp_path):
    import transformers

    hf = hf_model("phi3")
    hf.save_pretrained(tmp_path)
    hf.config.sliding_window = 16
    assert from_pretrained(hf).cfg.n_ctx == 16
    config = json.loads((tmp_path / "config.json").read_text())
    del config["rope_parameters"]  # Phi-3-128k's scaling as its config.json says it: "su", i.e. longrope
    config["rope_scaling"] = {"type": "su", "short_factor": [1.0, 1.5, 3.0], "long_factor": [2.0, 5.0, 7.0],
                              "original_max_position_embeddings": 12, "partial_rotary_factor": 0.7}  # fmt: skip
    config["rope_theta"] = 100.0
    # the config's own original_max_position_embeddings wins over the scaling's (as in Hugging
    # Face): 12 with both, then 20 at the top: a 16-token prompt takes the long, then the short set
    for top, length in ((12, 12), (20, 20)):
        config["original_max_position_embeddings"] = top
        (tmp_path / "config.json").write_text(json.dumps(config))
        model = from_pretrained(tmp_path)
        assert model.cfg.rotary_scaling["rope_type"] == "longrope"
        assert model.cfg.rotary_scaling["original_max_position_embeddings"] == length
        reloaded = transformers.Phi3ForCausalLM.from_pretrained(tmp_path).eval()
        for n_pos in (10, 16, 22):
            assert max_diff(model, reloaded, tokens(n_pos=n_pos)) < TOL
    config["rope_scaling"]["long_factor"] = [2.0, 5.0]  # one factor short
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="long_factor"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("n_pos", [5, 16, 17, LONG, 48])
def test_phi3_longrope_matches_hugging_face_below_at_and_past_its_original_length(n_pos, tmp_path):
    """LongRoPE (Phi-3's long-context checkpoints): the short factors up to
    original_max_position_embeddings = 16 tokens, the long ones past it; every residual
    stream and the logits within 1e-5 of Hugging Face's float32 forward (measured <= 4.2e-7),
    in memory and from a folder. The two sets give logits far apart, so each prompt tells
    which set was used."""
    hf = hf_model("phi3-longrope")
    x = tokens(n=2, n_pos=n_pos)
    model = from_pretrained(hf)
    scaling = model.cfg.rotary_scaling
    assert scaling["rope_type"] == "longrope" and scaling["original_max_position_embeddings"] == 16
    assert scaling["attention_factor"] == pytest.approx((1 + math.log(48 / 16) / math.log(16)) ** 0.5)
    assert max_diff(model, hf, x) < TOL
    assert max(residual_diffs(model, hf, x)) < TOL
    hf.save_pretrained(tmp_path)
    assert max_diff(from_pretrained(tmp_path), hf, x) < TOL
    # the other set of frequencies is far off: the parity says which set each length takes
    rotary = model.blocks[0].attn.rotary
    rotary.long_after = 10**9 if n_pos > 16 else 0
    with torch.no_grad():
        assert max_diff(model, hf, x) > 1e3 * TOL


def test_longrope_frequencies_are_hugging_faces():
    import transformers

    from tests.models.hf_models import LONGROPE

    config = transformers.Phi3Config(hidden_size=36, num_attention_heads=4, max_position_embeddings=48,
                                     original_max_position_embeddings=16, rope_parameters=dict(LONGROPE))  # fmt: skip
    compute = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["longrope"]
    ours = from_pretrained(transformers.Phi3ForCausalLM(config)).cfg.rotary_scaling
    for long, seq_len in ((False, 16), (True, 17)):
        theirs, factor = compute(config, seq_len=seq_len)
        assert torch.equal(rotary_inv_freq(6, 100.0, ours, long=long), theirs)
        assert ours["attention_factor"] == factor


def test_what_each_architecture_becomes():
    pythia = from_pretrained(hf_model("neox")).cfg
    assert (pythia.positional, pythia.rotary_dim, pythia.d_head) == ("rotary", 4, 16)  # a quarter
    assert pythia.parallel_attn_mlp and pythia.act_fn == "gelu" and not pythia.tie_embeddings
    llama = from_pretrained(hf_model("llama")).cfg
    assert (llama.normalization, llama.gated_mlp, llama.act_fn) == ("RMS", True, "silu")
    assert (llama.n_heads, llama.n_key_value_heads, llama.qkv_bias, llama.mlp_bias) == (4, 2, False, False)
    qwen = from_pretrained(hf_model("qwen2")).cfg
    assert (qwen.qkv_bias, qwen.attn_out_bias, qwen.mlp_bias) == (True, False, False)
    mistral = from_pretrained(hf_model("mistral")).cfg
    assert mistral.n_ctx == 16 and mistral.d_head == 6  # capped at the sliding window
    gpt2 = from_pretrained(hf_model("gpt2"))
    assert gpt2.cfg.tie_embeddings and gpt2.read_out.proj.weight is gpt2.read_in.embed.weight
    assert gpt2.cfg.positional == "learned" and gpt2.W_pos.shape == (24, 32)
    assert from_pretrained(hf_model("gpt2"), n_ctx=10).W_pos.shape == (10, 32)


def test_pytorch_bin_and_sharded_folders(tmp_path):
    hf = hf_model("llama")
    x = tokens()
    hf.config.save_pretrained(tmp_path / "bin")  # an older checkpoint: weights in a torch file
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    assert max_diff(from_pretrained(tmp_path / "bin"), hf, x) < TOL
    hf.save_pretrained(tmp_path / "shards", max_shard_size="20KB")
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    assert max_diff(from_pretrained(str(tmp_path / "shards")), hf, x) < TOL


BRIDGED = [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"), ("llama-llama3", "LlamaForCausalLM"),
           ("qwen3", "Qwen3ForCausalLM"), ("olmo", "OlmoForCausalLM"), ("phi3", "Phi3ForCausalLM"),
           ("gptj", "GPTJForCausalLM"), ("olmo2", "Olmo2ForCausalLM"), ("gemma2", "Gemma2ForCausalLM"),
           ("gemma3", "Gemma3ForCausalLM")]  # fmt: skip


@pytest.mark.filterwarnings("ignore:Phi3ArchitectureAdapter does not support fold_ln")  # processed
@pytest.mark.filterwarnings("ignore:Olmo2ArchitectureAdapter does not support fold_ln")
@pytest.mark.parametrize("name,hf_class", BRIDGED)
def test_transformer_bridge(name, hf_class):
    hf = hf_model(name)
    x = tokens()
    with torch.no_grad():
        expected = hf(x).logits
    bridge = build_bridge_from_module(hf, hf_class, hf_config=hf.config, model_name="test")
    bridge.enable_compatibility_mode(no_processing=True)
    with torch.no_grad():
        assert (from_pretrained(bridge)(x) - expected).abs().max() < TOL
    processed = build_bridge_from_module(hf_model(name), hf_class, hf_config=hf.config, model_name="t")
    processed.enable_compatibility_mode()
    with pytest.raises(ImportProblem, match="processed by enable_compatibility_mode"):
        from_pretrained(processed)


# --- bad input ---------------------------------------------------------------------------


def test_unsupported_architectures_get_one_line_listing_the_supported_ones(tmp_path):
    with pytest.raises(ImportProblem, match="cannot import a Linear: mechlab imports GPT2LMHeadModel, "
                       "GPTNeoXForCausalLM, .*MambaForCausalLM, .*GPTJForCausalLM, .*Gemma3ForCausalLM, TransformerBridge") as info:  # fmt: skip
        from_pretrained(torch.nn.Linear(2, 2))
    assert "\n" not in str(info.value)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
    with pytest.raises(ImportProblem, match="BertForMaskedLM.*mechlab imports"):
        from_pretrained(tmp_path)
    with pytest.raises(TypeError, match="folder path"):
        from_pretrained(3)
    assert "TransformerBridge" in SUPPORTED


def test_folders_without_config_or_weights_are_refused(tmp_path):
    with pytest.raises(ImportProblem, match="not a folder"):
        from_pretrained(tmp_path / "missing")
    with pytest.raises(ImportProblem, match="no config.json"):
        from_pretrained(tmp_path)
    hf_model("gpt2").config.save_pretrained(tmp_path)
    with pytest.raises(ImportProblem, match="no weights .*save_pretrained"):
        from_pretrained(tmp_path)


def test_a_model_over_the_size_limit_is_refused_before_any_weight_is_read(tmp_path, monkeypatch):
    config = hf_model("llama").config
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 8192, 28672, 80
    config.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")  # never opened
    with pytest.raises(ValueError, match="would allocate about .*MECHLAB_MAX_ELEMENTS"):
        from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="more than the limit"):
        from_pretrained(hf_model("gpt2"), max_elements=1000)
    monkeypatch.setenv("MECHLAB_MAX_ELEMENTS", "1000")
    with pytest.raises(ValueError, match="more than the limit"):
        from_pretrained(hf_model("mamba"))


def test_settings_mechlab_cannot_reproduce_are_refused(tmp_path):
    hf = hf_model("llama")
    hf.config.rope_parameters = {"rope_type": "proportional", "rope_theta": 1e4}
    with pytest.raises(ImportProblem, match="rope_type='proportional'; mechlab supports rope_type default, "
                       "linear, llama3, dynamic, yarn, longrope$"):  # fmt: skip
        from_pretrained(hf)
    hf.config.rope_parameters = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4,
                                 "long_factor": [1.0, 2.0, -1.0, 3.0], "original_max_position_embeddings": 8}  # fmt: skip
    with pytest.raises(ImportProblem, match="long_factor must be a list of finite numbers|long_factor'. must be a list"):
        from_pretrained(hf)
    hf.config.rope_parameters = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 0.0}
    with pytest.raises(ImportProblem, match=r"rotary_scaling\['factor'\] must be a positive"):
        from_pretrained(hf)
    hf.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}
    with pytest.raises(ImportProblem, match=r"\['low_freq_factor'\] must be a positive"):
        from_pretrained(hf)
    hf = hf_model("olmo")
    hf.config.clip_qkv = -1.0
    with pytest.raises(ImportProblem, match="clip_qkv=-1.0; mechlab needs a positive bound"):
        from_pretrained(hf)
    hf = hf_model("gptj")
    hf.config.rotary_dim = 5
    with pytest.raises(ImportProblem, match="rotary_dim=5 .* even number in 2..d_head"):
        from_pretrained(hf)
    hf.save_pretrained(tmp_path / "gptj")
    config = json.loads((tmp_path / "gptj" / "config.json").read_text())
    config["rotary_dim"] = "4"
    (tmp_path / "gptj" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ImportProblem, match="rotary_dim must be an integer in 1..2147483647 or"):
        from_pretrained(tmp_path / "gptj")
    with pytest.raises(ImportProblem, match="n_ctx must be an integer in 1..24"):
        from_pretrained(hf_model("gpt2"), n_ctx=25)
    hf = hf_model("gpt2")
    hf.config.scale_attn_by_inverse_layer_idx = True
    with pytest.raises(ImportProblem, match="scale_attn_by_inverse_layer_idx"):
        from_pretrained(hf)
    hf = hf_model("gpt2")
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "llama3", "factor": "8"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ImportProblem, match="rope_parameters.factor must be a finite number"):
        from_pretrained(tmp_path)
    del config["rope_parameters"]
    config["n_embd"] = 48  # weights no longer fit
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ImportProblem, match="shape"):
        from_pretrained(tmp_path)


SAVED = ["gpt2", "llama-biases-tied", "neox", "llama-llama3", "qwen3", "olmo", "gptj", "olmo2", "gemma3"]


@pytest.mark.parametrize("name", SAVED)
def test_an_imported_model_saves_and_loads_as_a_mechlab_checkpoint(name, tmp_path):
    from mechlab.checkpoint import load_checkpoint, save_checkpoint

    model = from_pretrained(hf_model(name))
    save_checkpoint(model, tmp_path / "imported.pt")
    loaded = load_checkpoint(tmp_path / "imported.pt").model.eval()
    x = tokens()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert loaded.cfg == model.cfg
    if model.cfg.tie_embeddings:
        assert loaded.read_out.proj.weight is loaded.read_in.embed.weight


@pytest.mark.parametrize("name", ["llama", "qwen3", "olmo", "gptj", "olmo2", "gemma2", "gemma3"])
def test_the_size_estimate_made_before_allocating_is_the_models_size(name):
    """check_size estimates from the config alone; with post-norms, no pre-norms or norms over
    every head it still counts every parameter and buffer the import allocates."""
    from mechlab.models.registry import estimate_elements

    model = from_pretrained(hf_model(name))
    actual = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    assert estimate_elements(model.cfg) == actual


def test_every_name_importers_had_is_still_imported_from_it_as_its_parts_define_it():
    """The importer's parts (hf_config, hf_rope, hf_weights, hf_loaders, hf_files) define the
    names; importers re-exports each as the same object, from where users import them."""
    from mechlab.models import hf_config, hf_files, hf_rope, hf_weights, importers

    had = {"ARCHITECTURES", "DTYPES", "MAMBA_N_CTX", "ROPE_TYPES", "SUPPORTED", "ImportProblem",
           "Weights", "check_folder", "check_runs", "from_pretrained", "import_dtype",
           "mechlab_config", "weight_files"}  # fmt: skip
    assert set(importers.__all__) == had
    for part in (hf_config, hf_rope, hf_weights, hf_files):
        for name in had & set(vars(part)):
            assert getattr(importers, name) is getattr(part, name), name
    assert importers.SUPPORTED == (*importers.ARCHITECTURES, "TransformerBridge")
