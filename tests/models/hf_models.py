"""Small random Hugging Face models of every architecture mechlab imports (shared by tests)."""

from __future__ import annotations

import torch
import transformers as T

V = 61  # vocabulary
N_POS = 24
_IDS = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None}
_LLAMA = {"vocab_size": V, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 4, "max_position_embeddings": N_POS, **_IDS}  # fmt: skip

CONFIGS = {
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(
        vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=N_POS, **_IDS)),
    "gpt2-untied": lambda: T.GPT2LMHeadModel(T.GPT2Config(
        vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=N_POS, n_inner=40,
        activation_function="gelu", tie_word_embeddings=False, **_IDS)),
    # Pythia's layout: rotary on a quarter of each head, parallel residual, untied
    "neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=N_POS, **_IDS)),
    "neox-sequential": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=N_POS, use_parallel_residual=False,
        rotary_pct=1.0, **_IDS)),
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**_LLAMA, num_key_value_heads=2)),
    "llama-biases-tied": lambda: T.LlamaForCausalLM(T.LlamaConfig(
        **_LLAMA, num_key_value_heads=1, attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**_LLAMA, num_key_value_heads=2)),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(
        **_LLAMA, num_key_value_heads=2, sliding_window=16, head_dim=6)),
    "mamba": lambda: T.MambaForCausalLM(T.MambaConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=2, state_size=4, **_IDS)),
}
# Scaled rotary embeddings (Llama 3.x and others) and the architectures added with them, on
# configs chosen to be hard: heads of 9 or 10 dimensions, grouped key/value heads, partial
# rotary, base 100 so that Llama 3's three frequency bands all occur, prompts of LONG tokens,
# longer than original_max_position_embeddings.
LONG = 40
_SCALED = {**_LLAMA, "num_key_value_heads": 2, "head_dim": 10, "max_position_embeddings": 48}
ROPE_SCALED = {
    "llama3": {"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "linear": {"rope_type": "linear", "rope_theta": 100.0, "factor": 2.5},
    "yarn": {"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "original_max_position_embeddings": 12},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 100.0, "factor": 2.0},
}  # fmt: skip
LONGROPE = {"rope_type": "longrope", "rope_theta": 100.0, "partial_rotary_factor": 0.7,
            "short_factor": [1.0, 1.3, 2.1], "long_factor": [1.5, 4.0, 9.0], "original_max_position_embeddings": 16}  # fmt: skip
CONFIGS |= {
    f"llama-{kind}": lambda kind=kind: T.LlamaForCausalLM(
        T.LlamaConfig(**_SCALED, rope_parameters=dict(ROPE_SCALED[kind]))
    )
    for kind in ROPE_SCALED
}
CONFIGS |= {
    # per-head query/key RMSNorm, head_dim 10 (not 32 / 4), 2 key/value heads
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**_LLAMA, num_key_value_heads=2, head_dim=10)),
    "qwen3-bias-yarn": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(
        **_SCALED, attention_bias=True, tie_word_embeddings=True, rope_parameters=dict(ROPE_SCALED["yarn"]))),
    # weightless LayerNorms, clip_qkv that bites (about a third of the projections clamped)
    "olmo": lambda: T.OlmoForCausalLM(T.OlmoConfig(**_LLAMA, num_key_value_heads=2, clip_qkv=0.25)),
    # fused qkv_proj and gate_up_proj, 9-dimensional heads, 6 of them rotated, 2 key/value heads
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(
        **{**_LLAMA, "hidden_size": 36}, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.7})),
    # Phi-3's LongRoPE on 6 of 9 dimensions: three factors per set, each different, the long ones
    # for prompts past 16 tokens; attention_factor from max_position_embeddings / 16 = 3
    "phi3-longrope": lambda: T.Phi3ForCausalLM(T.Phi3Config(
        **{**_LLAMA, "hidden_size": 36, "max_position_embeddings": 48}, num_key_value_heads=2,
        original_max_position_embeddings=16, rope_parameters=dict(LONGROPE))),
    # YaRN on a quarter of each 20-dimensional head (Pythia's layout), untruncated ramp
    "neox-yarn": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
        vocab_size=V, hidden_size=40, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=48, rope_parameters={
            "rope_type": "yarn", "rope_theta": 100.0, "partial_rotary_factor": 0.5, "factor": 4.0,
            "original_max_position_embeddings": 12, "beta_fast": 8.0, "truncate": False}, **_IDS)),
    # parallel attention and MLP on one LayerNorm, interleaved rotary on 4 of 9 dims, lm_head bias
    "gptj": lambda: T.GPTJForCausalLM(T.GPTJConfig(
        vocab_size=V, n_embd=36, n_layer=2, n_head=4, n_positions=N_POS, rotary_dim=4, n_inner=40, **_IDS)),
}  # fmt: skip

# Norms after the sublayers (OLMo 2, Gemma 2/3), on hard configs: 10-dimensional heads that
# are not d_model / n_heads (Gemma), 2 key/value heads, a sliding window of 5 under LONG-token
# prompts, query_pre_attn_scalar 7 (not d_head), soft-capping that bites (caps below the
# scores' and logits' largest values), Gemma 3's two rotary bases with a linear scaling on
# its global layers.
_GEMMA = {**_LLAMA, "num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 10,
          "max_position_embeddings": 48, "query_pre_attn_scalar": 7, "sliding_window": 5}  # fmt: skip
CONFIGS |= {
    "olmo2": lambda: T.Olmo2ForCausalLM(T.Olmo2Config(
        **{**_LLAMA, "hidden_size": 40, "max_position_embeddings": 48}, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0})),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(
        **_GEMMA, attn_logit_softcapping=0.5, final_logit_softcapping=0.5,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0})),
    "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(
        **_GEMMA, attn_logit_softcapping=0.6, final_logit_softcapping=0.5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 100.0, "factor": 2.5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}})),
}  # fmt: skip
# weights scaled after the perturbation, so that Gemma 2's attention cap bites (most scores
# of random weights are far below any cap)
_BOOSTED = {"gemma2": ("q_proj", 6.0)}


def hf_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A random ``name`` model in eval mode, every weight (biases, norms) perturbed so none
    is 0 or 1 by construction."""
    torch.manual_seed(seed)
    model = CONFIGS[name]().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        if name in _BOOSTED:
            part, factor = _BOOSTED[name]
            for key, p in model.named_parameters():
                if part in key:
                    p.mul_(factor)
    return model


def tokens(n: int = 3, n_pos: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (n, n_pos), generator=torch.Generator().manual_seed(seed))
