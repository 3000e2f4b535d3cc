"""from_pretrained: parity with Hugging Face logits, saved-folder round trips, bridges, bad input."""

import json

import pytest
import torch
from transformer_lens.model_bridge.sources import build_bridge_from_module

from mechlab.models.importers import SUPPORTED, ImportProblem, from_pretrained
from mechlab.models.mamba import Mamba
from mechlab.models.transformer import Transformer
from tests.models.hf_models import CONFIGS, hf_model, tokens

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


@pytest.mark.parametrize("name,hf_class", [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM")])
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
                       "GPTNeoXForCausalLM, .*MambaForCausalLM, TransformerBridge") as info:
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
    hf.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ImportProblem, match="rope_type='linear'.*default rotary"):
        from_pretrained(hf)
    with pytest.raises(ImportProblem, match="n_ctx must be an integer in 1..24"):
        from_pretrained(hf_model("gpt2"), n_ctx=25)
    hf = hf_model("gpt2")
    hf.config.scale_attn_by_inverse_layer_idx = True
    with pytest.raises(ImportProblem, match="scale_attn_by_inverse_layer_idx"):
        from_pretrained(hf)
    hf = hf_model("gpt2")
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["n_embd"] = 48  # weights no longer fit
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ImportProblem, match="shape"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("name", ["gpt2", "llama-biases-tied", "neox"])
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
