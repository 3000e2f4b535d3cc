"""Imports in the checkpoint's own dtype (bfloat16, float16) or the one asked for: logits
against the Hugging Face forward in the same dtype, the cache, patching and attribution
on a bfloat16 model against float32, the dtypes refused, and the peak memory of an import
from a folder (weights read one tensor at a time into parameters allocated once)."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from scipy.stats import spearmanr

from mechlab.models.importers import ImportProblem, from_pretrained
from mechlab.models.transformer import RMSNorm
from mechlab.patching import activation_patch, attribution_patch
from mechlab.prune import PruneData, Traces, prune
from mechlab.prune.attribution import attribute
from tests.models.hf_models import CONFIGS, hf_model, tokens

torch.set_num_threads(1)
# Measured (every architecture of hf_models, 3 prompts of 12 tokens): the relative error
# ||mechlab - HF|| / ||HF|| of the logits is 0.4-0.9% in bfloat16 (OLMo 2, Gemma 2/3:
# 1.4-2.0%), 0.89-1.36x HF's own bfloat16 error against its float32 forward; in float16
# 0.05-0.23%.
REL_TOL = {"bfloat16": 3e-2, "float16": 5e-3}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_bfloat16_folder_imports_in_bfloat16_and_matches_hugging_faces_bfloat16_forward(name, tmp_path):
    hf = hf_model(name)
    x = tokens(3, 12)
    with torch.no_grad():
        ref32 = hf(x).logits
        hf = hf.to(torch.bfloat16)
        ref = hf(x).logits
        hf.save_pretrained(tmp_path)
        model = from_pretrained(tmp_path)  # default: the checkpoint's dtype
        out = model(x)
    assert model.cfg.dtype == torch.bfloat16 and out.dtype == torch.bfloat16
    assert model.read_in.embed.weight.dtype == torch.bfloat16
    err, hf_err = _rel(out, ref), _rel(ref, ref32)
    assert err < REL_TOL["bfloat16"], (err, hf_err)
    assert err < 2 * hf_err, (err, hf_err)  # about the error bfloat16 itself makes in HF's
    # the same folder in float32: the bfloat16 weights exactly, float32 arithmetic
    wide = from_pretrained(tmp_path, dtype="float32")
    assert wide.cfg.dtype == torch.float32
    assert torch.equal(wide.read_in.embed.weight, model.read_in.embed.weight.float())


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen3"])
def test_float16_asked_for_matches_hugging_faces_float16_forward(name):
    hf = hf_model(name)
    x = tokens(3, 12)
    model = from_pretrained(hf, dtype="float16")
    with torch.no_grad():
        ref = hf.to(torch.float16)(x).logits
        out = model(x)
    assert out.dtype == torch.float16
    assert _rel(out, ref) < REL_TOL["float16"]


def test_which_dtype_an_import_takes(tmp_path):
    hf = hf_model("gemma2")
    assert from_pretrained(hf).cfg.dtype == torch.float32  # a model in memory: its own
    bf16 = from_pretrained(hf, dtype=torch.bfloat16)
    norms = [m for m in bf16.modules() if isinstance(m, RMSNorm)]
    assert norms and all(m.w.dtype == torch.float32 for m in norms)  # Gemma's 1 + w
    others = [p for n, p in bf16.named_parameters() if not n.endswith(".w")]
    assert all(p.dtype == torch.bfloat16 for p in others)
    # a folder without dtype in config.json: its safetensors' dtype
    hf.to(torch.float16).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert from_pretrained(tmp_path).cfg.dtype == torch.float16
    assert from_pretrained(tmp_path, dtype="auto").cfg.dtype == torch.float16
    assert from_pretrained(tmp_path, dtype="bf16").cfg.dtype == torch.bfloat16


def test_dtypes_mechlab_cannot_import_or_run_are_refused_in_one_line(monkeypatch):
    hf = hf_model("llama")
    for bad in ("bfloat17", torch.int8, 3):
        with pytest.raises(ImportProblem, match="unknown dtype") as info:
            from_pretrained(hf, dtype=bad)
        assert "\n" not in str(info.value) and "bfloat16" in str(info.value)
    real = torch.matmul

    def no_half(a, b):
        if a.dtype == torch.float16:
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')
        return real(a, b)

    monkeypatch.setattr(torch, "matmul", no_half)
    with pytest.raises(ImportProblem, match="cannot run float16 on the CPU") as info:
        from_pretrained(hf, dtype="float16")
    assert "\n" not in str(info.value) and "dtype='float32'" in str(info.value)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_the_bfloat16_cache_is_the_bfloat16_forward_and_patching_runs_in_it(name):
    model = from_pretrained(hf_model(name), dtype="bfloat16")
    clean, corrupted = tokens(2, 8, seed=1), tokens(2, 8, seed=2)
    last = f"blocks.{len(model.blocks) - 1}.hook_resid_post"
    with torch.no_grad():
        out = model(clean)
        cached, cache = model.run_with_cache(clean)
        # the corrupted run with the clean run's last residual stream patched in
        hooked = model.run_with_hooks(corrupted, fwd_hooks=[(last, lambda a, hook: cache[last])])
    assert torch.equal(cached, out)
    assert all(v.dtype == torch.bfloat16 for v in cache.values())
    assert torch.equal(hooked, out)

    def metric(logits):
        return logits[:, -1, 3].mean() - logits[:, -1, 5].mean()

    hooks = ["blocks.0.hook_resid_post", "blocks.1.hook_attn_out"]
    exact = activation_patch(model, clean, corrupted, metric, hooks=hooks, progress=False)
    approx = attribution_patch(model, clean, corrupted, metric, hooks=hooks, progress=False)
    model32 = from_pretrained(hf_model(name))
    exact32 = activation_patch(model32, clean, corrupted, metric, hooks=hooks, progress=False)
    spread = float(exact32.values.abs().max())
    assert (exact.values - exact32.values).abs().max() < 0.05 * spread
    assert torch.isfinite(approx.values).all()


@pytest.mark.filterwarnings("ignore:circuit for 'all'")  # 12 steps on random weights: no circuit to find
@pytest.mark.parametrize("name", ["llama", "gemma2", "mamba"])
def test_eap_ig_on_bfloat16_ranks_the_edges_as_on_float32_and_pruning_runs(name):
    """EAP-IG's scores on a bfloat16 model (accumulated in float64) against the float32
    model's: the total effect within 1%, Spearman rank correlation >= 0.99 (measured
    0.9994 on Gemma 2, 0.9999 on Llama, 1.0 on Mamba)."""
    hf = hf_model(name)
    m32, m16 = from_pretrained(hf), from_pretrained(hf, dtype="bfloat16")
    traces = Traces(inputs=tokens(6, 10, seed=3), corrupted=tokens(6, 10, seed=4))
    r32 = attribute(m32, traces, "all", "eap-ig", steps=8)
    r16 = attribute(m16, traces, "all", "eap-ig", steps=8)
    assert r16.scores.dtype == torch.float64
    assert abs(r16.total_effect - r32.total_effect) < 0.01 * abs(r32.total_effect)
    assert spearmanr(r32.scores.numpy(), r16.scores.numpy()).statistic > 0.99
    eap = attribute(m16, traces, "all", "eap")
    assert spearmanr(attribute(m32, traces, "all", "eap").scores.numpy(), eap.scores.numpy()).statistic > 0.99
    train = Traces(inputs=tokens(16, 10, seed=3), corrupted=tokens(16, 10, seed=4))
    test = Traces(inputs=tokens(8, 10, seed=5), corrupted=tokens(8, 10, seed=6))
    circuit = prune(m16, PruneData(train, test), "all", sparsity=0.7, steps=12, batch_size=8, progress=False)
    assert 0 < len(circuit.edges) and 0 < circuit.metadata["metrics"]["faithfulness"] <= 1.5


# The import's peak resident memory, in a fresh interpreter: the baseline is its resident
# memory after importing torch, transformers and mechlab and a first tiny import (every
# lazy module loaded); the peak is the process's high-water mark VmHWM after importing the
# big folder, reset to the baseline first (/proc/self/clear_refs; ru_maxrss would count
# the pytest process the child was forked from, as Linux keeps it across exec).
_MEASURE = textwrap.dedent("""
    import gc, json, sys
    import psutil, torch, transformers, safetensors
    import mechlab
    from mechlab.models.importers import from_pretrained

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    from_pretrained(sys.argv[2])
    gc.collect()
    base = psutil.Process().memory_info().rss
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark back to the resident memory now
    assert hwm() <= base + (1 << 20)
    model = from_pretrained(sys.argv[1])
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"base": base, "peak": hwm(), "weights": weights, "dtype": str(model.cfg.dtype)}))
""")
MEMORY_RATIO, MEMORY_SLACK = 1.2, 16 << 20  # at most 1.2x the weights plus 16 MiB


def _llama_folder(folder, d, layers, d_mlp, vocab, heads, kv_heads):
    """A Llama folder of random bfloat16 weights, written tensor by tensor with safetensors
    (no Hugging Face model built)."""
    from safetensors.torch import save_file

    folder.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
              "hidden_size": d, "intermediate_size": d_mlp, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": 64,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "dtype": "bfloat16"}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    gen, g = torch.Generator().manual_seed(0), d // heads * kv_heads
    shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,), "lm_head.weight": (vocab, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                   p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (g, d),
                   p + "self_attn.v_proj.weight": (g, d), p + "self_attn.o_proj.weight": (d, d),
                   p + "mlp.gate_proj.weight": (d_mlp, d), p + "mlp.up_proj.weight": (d_mlp, d),
                   p + "mlp.down_proj.weight": (d, d_mlp)}  # fmt: skip
    state = {k: (0.02 * torch.randn(s, generator=gen)).to(torch.bfloat16) for k, s in shapes.items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() * 2 for t in state.values())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")
def test_an_import_from_a_folder_peaks_at_about_the_size_of_its_weights(tmp_path):
    """A 150 MB bfloat16 Llama: peak resident memory of the import over the baseline at
    most 1.2x the weights plus 16 MiB (measured 1.023-1.024x, 164.9 MiB for 161.0 MiB: the
    parameters, once, and one memory-mapped tensor at a time: a 5.5 MiB MLP matrix, the
    16 MiB embedding and read-out copied 4 MiB at a time)."""
    size = _llama_folder(tmp_path / "big", d=1024, layers=6, d_mlp=2816, vocab=8192, heads=16, kv_heads=4)
    _llama_folder(tmp_path / "tiny", d=32, layers=1, d_mlp=48, vocab=64, heads=4, kv_heads=2)
    assert 140e6 < size < 200e6
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path / "big"), str(tmp_path / "tiny")],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["dtype"] == "torch.bfloat16" and got["weights"] == size + 8192 * 2  # + the zero read-out bias
    grown = got["peak"] - got["base"]
    print(f"import peak {grown / 2**20:.1f} MiB for {size / 2**20:.1f} MiB of weights: {grown / size:.3f}x")
    assert grown <= MEMORY_RATIO * size + MEMORY_SLACK, (grown / size, got)
