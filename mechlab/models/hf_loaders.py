"""Each Hugging Face architecture's weights onto the mechlab model of its config: names
mapped, fused projections split, ``nn.Linear`` / ``Conv1D`` layouts turned into
TransformerLens' per-head layouts (:data:`LOADERS`, by class name).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from mechlab.models.base import MechModel
from mechlab.models.hf_weights import Weights, put
from mechlab.models.mamba import hf_name

__all__ = ["LOADERS"]


def _put_norm(norm: nn.Module, weights: Weights, name: str, offset: float = 0.0) -> None:
    """A LayerNorm's ``weight`` and ``bias``, or an RMSNorm's ``weight``, from ``name.*``;
    ``offset``: the weight stored is ``offset + weight`` in float32 (Gemma's norms scale by
    ``1 + weight``, computed in float32 as Gemma computes it)."""
    value = weights(name + ".weight")
    if offset and value.is_floating_point():
        value = offset + value.float()
    put(norm.w, value, name)
    if hasattr(norm, "b"):
        put(norm.b, weights(name + ".bias"), name)


def _heads(w: Tensor, n: int) -> Tensor:
    """``nn.Linear`` weight ``[n * d_head, d_model]`` -> ``[n, d_model, d_head]``."""
    return w.view(n, -1, w.shape[-1]).transpose(1, 2)


def _out_heads(w: Tensor, n: int) -> Tensor:
    """``nn.Linear`` weight ``[d_model, n * d_head]`` -> ``[n, d_head, d_model]``."""
    return w.view(w.shape[0], n, -1).permute(1, 2, 0)


def _read_out(model: MechModel, weights: Weights, *heads: str) -> None:
    """The read-out from the first of ``heads`` stored (unless tied to the embedding)."""
    if not model.cfg.tie_embeddings:
        head = next((h for h in heads if h in weights), heads[0])
        put(model.read_out.proj.weight, weights(head), head)
    model.read_out.proj.bias.data.zero_()


def _load_gpt2(model: MechModel, w: Weights) -> None:
    H = model.cfg.n_heads
    put(model.read_in.embed.weight, w("transformer.wte.weight"), "wte")
    put(model.W_pos, w("transformer.wpe.weight")[: model.cfg.n_ctx], "wpe")
    for i, block in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        attn, mlp = block.attn, block.mlp
        _put_norm(block.ln1, w, p + "ln_1")
        _put_norm(block.ln2, w, p + "ln_2")
        # Conv1D keeps [in, out]: c_attn is [d_model, 3 * H * d_head] = [W_Q | W_K | W_V]
        for param, weight in zip(
            (attn.W_Q, attn.W_K, attn.W_V), w(p + "attn.c_attn.weight").chunk(3, dim=1), strict=True
        ):
            put(
                param,
                weight.reshape(weight.shape[0], H, -1).transpose(0, 1),
                p + "attn.c_attn.weight",
            )
        for param, bias in zip(attn.biases(), w(p + "attn.c_attn.bias").chunk(3), strict=True):
            put(param, bias.view(H, -1), p + "attn.c_attn.bias")
        put(
            attn.W_O,
            w(p + "attn.c_proj.weight").view(H, -1, model.cfg.d_model),
            p + "attn.c_proj.weight",
        )
        put(attn.b_O, w(p + "attn.c_proj.bias"), p + "attn.c_proj.bias")
        put(mlp.W_in, w(p + "mlp.c_fc.weight"), p + "mlp.c_fc.weight")
        put(mlp.b_in, w(p + "mlp.c_fc.bias"), p + "mlp.c_fc.bias")
        put(mlp.W_out, w(p + "mlp.c_proj.weight"), p + "mlp.c_proj.weight")
        put(mlp.b_out, w(p + "mlp.c_proj.bias"), p + "mlp.c_proj.bias")
    _put_norm(model.ln_final, w, "transformer.ln_f")
    _read_out(model, w, "lm_head.weight")


def _load_neox(model: MechModel, w: Weights) -> None:
    H = model.cfg.n_heads
    put(model.read_in.embed.weight, w("gpt_neox.embed_in.weight"), "embed_in")
    for i, block in enumerate(model.blocks):
        p = f"gpt_neox.layers.{i}."
        attn, mlp = block.attn, block.mlp
        _put_norm(block.ln1, w, p + "input_layernorm")
        _put_norm(block.ln2, w, p + "post_attention_layernorm")
        # query_key_value's outputs are ordered [head, (q, k, v), d_head]
        qkv = w(p + "attention.query_key_value.weight")  # [H * 3 * d_head, d_model]
        qkv = qkv.view(H, 3, -1, qkv.shape[-1])
        for j, param in enumerate((attn.W_Q, attn.W_K, attn.W_V)):
            put(param, qkv[:, j].transpose(1, 2), p + "attention.query_key_value.weight")
        if attn.b_Q is not None:
            b = w(p + "attention.query_key_value.bias").view(H, 3, -1)
            for j, param in enumerate(attn.biases()):
                put(param, b[:, j], p + "attention.query_key_value.bias")
        put(attn.W_O, _out_heads(w(p + "attention.dense.weight"), H), p + "attention.dense.weight")
        if attn.b_O is not None:
            put(attn.b_O, w(p + "attention.dense.bias"), p + "attention.dense.bias")
        put(mlp.W_in, w(p + "mlp.dense_h_to_4h.weight").T, p + "mlp.dense_h_to_4h.weight")
        put(mlp.b_in, w(p + "mlp.dense_h_to_4h.bias"), p + "mlp.dense_h_to_4h.bias")
        put(mlp.W_out, w(p + "mlp.dense_4h_to_h.weight").T, p + "mlp.dense_4h_to_h.weight")
        put(mlp.b_out, w(p + "mlp.dense_4h_to_h.bias"), p + "mlp.dense_4h_to_h.bias")
    _put_norm(model.ln_final, w, "gpt_neox.final_layer_norm")
    _read_out(model, w, "embed_out.weight", "lm_head.weight")  # saved / in memory (transformers 5)


def _load_llama(model: MechModel, w: Weights) -> None:
    """Llama's weights (Qwen2, Mistral, Qwen3, OLMo), and Phi-3's, whose fused ``qkv_proj``
    (``[q | k | v]`` rows) and ``gate_up_proj`` (``[gate | up]`` rows) are split here."""
    H, G = model.cfg.n_heads, model.cfg.n_key_value_heads
    d_head = model.cfg.d_head
    offset = 1.0 if model.cfg.embed_scale is not None else 0.0  # Gemma's norms scale by 1 + w
    put(model.read_in.embed.weight, w("model.embed_tokens.weight"), "embed_tokens")
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        attn, mlp = block.attn, block.mlp
        for norm, name in _block_norms(model.cfg, block):
            if isinstance(getattr(norm, "w", None), nn.Parameter):  # OLMo's norms have no weights
                _put_norm(norm, w, p + name, offset)
        fused = p + "self_attn.qkv_proj.weight"
        if fused in w:  # Phi-3
            qkv = w(fused).split([H * d_head, G * d_head, G * d_head])
            for param, part, n in zip((attn.W_Q, attn.W_K, attn.W_V), qkv, (H, G, G), strict=True):
                put(param, _heads(part, n), fused)
        for param, bias, name, n in (
            (attn.W_Q, attn.b_Q, "q_proj", H), (attn.W_K, attn.b_K, "k_proj", G), (attn.W_V, attn.b_V, "v_proj", G),
        ):  # fmt: skip
            name = f"{p}self_attn.{name}"
            if fused not in w:
                put(param, _heads(w(name + ".weight"), n), name + ".weight")
            if bias is not None:
                put(bias, w(name + ".bias").view(n, -1), name + ".bias")
        if attn.q_norm is not None:  # Qwen3, OLMo 2, Gemma 3
            _put_norm(attn.q_norm, w, p + "self_attn.q_norm", offset)
            _put_norm(attn.k_norm, w, p + "self_attn.k_norm", offset)
        o_proj = p + "self_attn.o_proj"
        put(attn.W_O, _out_heads(w(o_proj + ".weight"), H), o_proj + ".weight")
        if attn.b_O is not None:
            put(attn.b_O, w(o_proj + ".bias"), o_proj + ".bias")
        fused = p + "mlp.gate_up_proj.weight"
        if fused in w:  # Phi-3
            gate, up = w(fused).chunk(2)
            put(mlp.W_gate, gate.T, fused)
            put(mlp.W_in, up.T, fused)
        for param, bias, name in ((mlp.W_gate, mlp.b_gate, "gate"), (mlp.W_in, mlp.b_in, "up")):
            if fused not in w:
                put(param, w(f"{p}mlp.{name}_proj.weight").T, f"{p}mlp.{name}_proj.weight")
            if bias is not None:
                put(bias, w(f"{p}mlp.{name}_proj.bias"), f"{p}mlp.{name}_proj.bias")
        put(mlp.W_out, w(p + "mlp.down_proj.weight").T, p + "mlp.down_proj.weight")
        if mlp.b_out is not None:
            put(mlp.b_out, w(p + "mlp.down_proj.bias"), p + "mlp.down_proj.bias")
    if isinstance(model.ln_final.w, nn.Parameter):
        _put_norm(model.ln_final, w, "model.norm", offset)
    _read_out(model, w, "lm_head.weight")


def _block_norms(cfg: Any, block: nn.Module) -> list[tuple[nn.Module, str]]:
    """A Llama-like block's norms and their Hugging Face names: Llama's two pre-norms,
    OLMo 2's two post-norms, or Gemma's four."""
    if not cfg.post_norms:
        return [(block.ln1, "input_layernorm"), (block.ln2, "post_attention_layernorm")]
    post = [
        (block.ln1_post, "post_attention_layernorm"),
        (block.ln2_post, "post_feedforward_layernorm"),
    ]
    if not cfg.pre_norms:
        return post
    return [(block.ln1, "input_layernorm"), (block.ln2, "pre_feedforward_layernorm"), *post]


def _load_gptj(model: MechModel, w: Weights) -> None:
    """GPT-J's weights; its one LayerNorm ``ln_1`` per block is copied into ``ln1`` and
    ``ln2`` (attention and MLP both read it), and its read-out has a bias."""
    H = model.cfg.n_heads
    put(model.read_in.embed.weight, w("transformer.wte.weight"), "wte")
    for i, block in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        attn, mlp = block.attn, block.mlp
        _put_norm(block.ln1, w, p + "ln_1")
        _put_norm(block.ln2, w, p + "ln_1")
        for param, name in ((attn.W_Q, "q_proj"), (attn.W_K, "k_proj"), (attn.W_V, "v_proj")):
            put(param, _heads(w(f"{p}attn.{name}.weight"), H), f"{p}attn.{name}.weight")
        put(attn.W_O, _out_heads(w(p + "attn.out_proj.weight"), H), p + "attn.out_proj.weight")
        put(mlp.W_in, w(p + "mlp.fc_in.weight").T, p + "mlp.fc_in.weight")
        put(mlp.b_in, w(p + "mlp.fc_in.bias"), p + "mlp.fc_in.bias")
        put(mlp.W_out, w(p + "mlp.fc_out.weight").T, p + "mlp.fc_out.weight")
        put(mlp.b_out, w(p + "mlp.fc_out.bias"), p + "mlp.fc_out.bias")
    _put_norm(model.ln_final, w, "transformer.ln_f")
    _read_out(model, w, "lm_head.weight")
    put(model.read_out.proj.bias, w("lm_head.bias"), "lm_head.bias")


def _load_mamba(model: MechModel, w: Weights) -> None:
    for name, param in model.named_parameters():
        key = hf_name(name)
        if key is None:  # read_out.proj.bias: HF's lm_head has none
            continue
        if key == "lm_head.weight" and key not in w:  # tied: saved once, as the embedding
            key = "backbone.embeddings.weight"
        put(param, w(key), key)
    model.read_out.proj.bias.data.zero_()


LOADERS: dict[str, Callable[[MechModel, Weights], None]] = {
    "GPT2LMHeadModel": _load_gpt2,
    "GPTNeoXForCausalLM": _load_neox,
    "LlamaForCausalLM": _load_llama,
    "Qwen2ForCausalLM": _load_llama,
    "MistralForCausalLM": _load_llama,
    "MambaForCausalLM": _load_mamba,
    "Qwen3ForCausalLM": _load_llama,
    "OlmoForCausalLM": _load_llama,
    "Phi3ForCausalLM": _load_llama,
    "GPTJForCausalLM": _load_gptj,
    "Olmo2ForCausalLM": _load_llama,
    "Gemma2ForCausalLM": _load_llama,
    "Gemma3ForCausalLM": _load_llama,
}
"""Each architecture's loader, by Hugging Face class name: it fills the model's parameters
from the weights (:class:`~mechlab.models.hf_weights.Mismatch` on one that does not fit)."""
