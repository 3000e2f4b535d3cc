"""Which Hugging Face architecture a model is (a ``save_pretrained`` folder's
``config.json``, a model in memory, a TransformerLens ``TransformerBridge``), and the
mechlab config its Hugging Face config becomes (:func:`mechlab_config`; what each
architecture becomes: :mod:`mechlab.models.importers`).
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import transformers
from torch import nn

from mechlab.models.hf_files import (
    RESAVE,
    WEIGHT_FILES,
    ImportProblem,
    brief,
    check_config_values,
    read_config,
    shown,
    weight_files,
)
from mechlab.models.hf_rope import rotary_settings
from mechlab.models.mamba import mamba_config_from_hf
from mechlab.models.transformer_config import TransformerConfig

__all__ = [
    "ARCHITECTURES",
    "MAMBA_N_CTX",
    "SUPPORTED",
    "bridge_model",
    "check_folder",
    "checked_folder",
    "mechlab_config",
    "module_architecture",
]

# Hugging Face class -> (transformers config class, base-model prefix of its weights)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "GPT2LMHeadModel": ("GPT2Config", "transformer"),
    "GPTNeoXForCausalLM": ("GPTNeoXConfig", "gpt_neox"),
    "LlamaForCausalLM": ("LlamaConfig", "model"),
    "Qwen2ForCausalLM": ("Qwen2Config", "model"),
    "MistralForCausalLM": ("MistralConfig", "model"),
    "MambaForCausalLM": ("MambaConfig", "backbone"),
    "Qwen3ForCausalLM": ("Qwen3Config", "model"),
    "OlmoForCausalLM": ("OlmoConfig", "model"),
    "Phi3ForCausalLM": ("Phi3Config", "model"),
    "GPTJForCausalLM": ("GPTJConfig", "transformer"),
    "Olmo2ForCausalLM": ("Olmo2Config", "model"),
    "Gemma2ForCausalLM": ("Gemma2Config", "model"),
    "Gemma3ForCausalLM": ("Gemma3TextConfig", "model"),
}
_LLAMA_LIKE = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM",
               "OlmoForCausalLM", "Phi3ForCausalLM", "Olmo2ForCausalLM", "Gemma2ForCausalLM",
               "Gemma3ForCausalLM")  # fmt: skip
_GEMMA = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
SUPPORTED = (*ARCHITECTURES, "TransformerBridge")
"""What :func:`~mechlab.models.importers.from_pretrained` imports."""
# config.json without "architectures": its model_type -> the class
_MODEL_TYPES = {
    "gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM", "mamba": "MambaForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "olmo": "OlmoForCausalLM", "phi3": "Phi3ForCausalLM", "gptj": "GPTJForCausalLM",
    "olmo2": "Olmo2ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
}  # fmt: skip
# Hugging Face activation names -> mechlab's act_fn
_ACTIVATIONS = {
    "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new",
    "gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu",
}  # fmt: skip
MAMBA_N_CTX = 2048  # Mamba has no position limit; mechlab's check_length uses this by default


def _unsupported(what: str) -> ImportProblem:
    return ImportProblem(f"cannot import {what}: mechlab imports {', '.join(SUPPORTED)}")


def _act(hf_act: str, arch: str) -> str:
    if hf_act not in _ACTIVATIONS:
        raise ImportProblem(
            f"this {arch} uses activation {hf_act!r}; mechlab supports {sorted(_ACTIVATIONS)}"
        )
    return _ACTIVATIONS[hf_act]


def _n_ctx(limit: int, n_ctx: int | None, arch: str) -> int:
    if n_ctx is None:
        return int(limit)
    if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or not 0 < n_ctx <= limit:
        raise ImportProblem(
            f"n_ctx must be an integer in 1..{limit} for this {arch}, got {n_ctx!r}"
        )
    return n_ctx


def _gpt2_config(hf: Any, n_ctx: int | None) -> dict[str, Any]:
    if not getattr(hf, "scale_attn_weights", True) or getattr(
        hf, "scale_attn_by_inverse_layer_idx", False
    ):
        raise ImportProblem(
            "this GPT-2 scales attention unlike GPT-2 (scale_attn_weights=False or "
            "scale_attn_by_inverse_layer_idx=True); mechlab divides scores by sqrt(d_head)"
        )
    return dict(
        d_model=hf.n_embd, n_layers=hf.n_layer, n_heads=hf.n_head, d_mlp=hf.n_inner or 4 * hf.n_embd,
        act_fn=_act(hf.activation_function, "GPT-2"), layer_norm_eps=hf.layer_norm_epsilon,
        d_vocab=hf.vocab_size, n_ctx=_n_ctx(hf.n_positions, n_ctx, "GPT-2"),
        tie_embeddings=bool(getattr(hf, "tie_word_embeddings", True)),
    )  # fmt: skip


def _neox_config(hf: Any, n_ctx: int | None) -> dict[str, Any]:
    theta, factor, scaling = rotary_settings(hf, "GPT-NeoX")
    d_head = hf.hidden_size // hf.num_attention_heads
    rotary_dim = int(d_head * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ImportProblem(
            f"this GPT-NeoX rotates {rotary_dim} of {d_head} head dimensions; mechlab needs an "
            "even number, at least 2"
        )
    bias = bool(getattr(hf, "attention_bias", True))
    return dict(
        d_model=hf.hidden_size, n_layers=hf.num_hidden_layers, n_heads=hf.num_attention_heads,
        d_mlp=hf.intermediate_size, act_fn=_act(hf.hidden_act, "GPT-NeoX"),
        layer_norm_eps=hf.layer_norm_eps, d_vocab=hf.vocab_size,
        n_ctx=_n_ctx(hf.max_position_embeddings, n_ctx, "GPT-NeoX"), positional="rotary",
        rotary_dim=rotary_dim, rotary_base=theta, rotary_scaling=scaling,
        parallel_attn_mlp=bool(hf.use_parallel_residual),
        qkv_bias=bias, attn_out_bias=bias, tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
    )  # fmt: skip


def _window_limit(hf: Any, arch: str) -> int:
    """``max_position_embeddings``, capped by a sliding attention window where it is on
    (within the window, sliding attention is causal attention)."""
    limit = hf.max_position_embeddings
    window = getattr(hf, "sliding_window", None)
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        layer_types = getattr(hf, "layer_types", None) or []
        sliding = "sliding_attention" in layer_types or (
            not layer_types and getattr(hf, "use_sliding_window", False)
        )
        window = window if sliding else None
    return min(limit, int(window)) if window else limit


def _llama_config(hf: Any, n_ctx: int | None, arch: str) -> dict[str, Any]:
    """Llama's layout, and the architectures that share it (Qwen2, Mistral, Qwen3, OLMo,
    Phi-3), each with its own options."""
    if arch == "Gemma3ForCausalLM":
        theta, factor, scaling = rotary_settings(
            hf, arch, dict(hf.rope_parameters["full_attention"])
        )
    else:
        theta, factor, scaling = rotary_settings(hf, arch)
    d_head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    if arch == "Qwen2ForCausalLM":
        qkv_bias, out_bias, mlp_bias = True, False, False
    elif arch == "Phi3ForCausalLM":
        qkv_bias = out_bias = mlp_bias = False
    else:
        qkv_bias = out_bias = bool(getattr(hf, "attention_bias", False))
        mlp_bias = bool(getattr(hf, "mlp_bias", False))
    gemma = arch in _GEMMA
    act = hf.hidden_activation if gemma else hf.hidden_act
    limit = hf.max_position_embeddings if gemma else _window_limit(hf, arch)
    fields = dict(
        d_model=hf.hidden_size, n_layers=hf.num_hidden_layers, n_heads=hf.num_attention_heads,
        d_head=d_head, n_key_value_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        d_mlp=hf.intermediate_size, act_fn=_act(act, arch), normalization="RMS",
        layer_norm_eps=getattr(hf, "rms_norm_eps", 1e-5), d_vocab=hf.vocab_size,
        n_ctx=_n_ctx(limit, n_ctx, arch), positional="rotary",
        rotary_dim=int(d_head * factor), rotary_base=theta, rotary_scaling=scaling, gated_mlp=True,
        qkv_bias=qkv_bias, attn_out_bias=out_bias, mlp_bias=mlp_bias,
        tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
    )  # fmt: skip
    if arch == "Qwen3ForCausalLM":
        fields["qk_norm"] = True
    if arch == "OlmoForCausalLM":  # weightless LayerNorms, eps fixed at 1e-5 (OlmoLayerNorm)
        fields |= dict(normalization="LNPre", layer_norm_eps=1e-5, clip_qkv=_clip(hf))
    if arch == "Olmo2ForCausalLM":  # norms after the sublayers only, q/k norms over every head
        fields |= dict(pre_norms=False, post_norms=True, qk_norm=True, qk_norm_over="all")
    if gemma:
        fields |= _gemma_fields(hf, arch)
    return fields


def _gemma_fields(hf: Any, arch: str) -> dict[str, Any]:
    """Gemma 2/3's options: pre- and post-norms, the embedding times sqrt(d_model), the
    scores over sqrt(query_pre_attn_scalar), soft-capping, sliding-window layers (Gemma 3:
    query/key norms and the local layers' own rotary base)."""
    if getattr(hf, "use_bidirectional_attention", False):
        raise ImportProblem(
            f"this {arch} has use_bidirectional_attention=True; mechlab imports causal Gemma models"
        )
    types = list(getattr(hf, "layer_types", None) or [])
    sliding = "sliding_attention" in types
    fields = dict(
        post_norms=True, embed_scale=math.sqrt(hf.hidden_size),
        attn_scale=math.sqrt(hf.query_pre_attn_scalar), attn_softcap=hf.attn_logit_softcapping,
        final_softcap=hf.final_logit_softcapping, layer_types=types or None,
        sliding_window=int(hf.sliding_window) if sliding else None,
    )  # fmt: skip
    if arch == "Gemma3ForCausalLM":  # (Hugging Face's Gemma 3 never applies attn_logit_softcapping)
        fields |= dict(qk_norm=True, attn_softcap=None)
        local = dict(hf.rope_parameters.get("sliding_attention") or {})
        kind = local.get("rope_type", "default")
        if kind != "default":
            raise ImportProblem(
                f"this Gemma 3 scales its sliding-window layers' rotary embedding "
                f"(rope_type={kind!r}); mechlab supports rope_type 'default' there"
            )
        if sliding:
            fields["rotary_base_local"] = float(local.get("rope_theta", 10000.0))
    return fields


def _clip(hf: Any) -> float | None:
    clip = getattr(hf, "clip_qkv", None)
    if clip is not None and not clip > 0:
        raise ImportProblem(
            f"this OLMo has clip_qkv={clip!r}; mechlab needs a positive bound or none"
        )
    return None if clip is None else float(clip)


def _gptj_config(hf: Any, n_ctx: int | None) -> dict[str, Any]:
    d_head = hf.n_embd // hf.n_head
    rotary_dim = hf.rotary_dim
    if rotary_dim is None or not 2 <= rotary_dim <= d_head or rotary_dim % 2:
        raise ImportProblem(
            f"this GPT-J rotates rotary_dim={rotary_dim!r} dimensions of its {d_head}-dimensional "
            "heads; mechlab needs an even number in 2..d_head"
        )
    return dict(
        d_model=hf.n_embd, n_layers=hf.n_layer, n_heads=hf.n_head, d_mlp=hf.n_inner or 4 * hf.n_embd,
        act_fn=_act(hf.activation_function, "GPT-J"), layer_norm_eps=hf.layer_norm_epsilon,
        d_vocab=hf.vocab_size, n_ctx=_n_ctx(hf.n_positions, n_ctx, "GPT-J"), positional="rotary",
        rotary_dim=int(rotary_dim), rotary_adjacent_pairs=True, parallel_attn_mlp=True,
        qkv_bias=False, attn_out_bias=False, tie_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
    )  # fmt: skip


def mechlab_config(
    arch: str, hf_config: Any, n_ctx: int | None = None, *, source: str | None = None
):
    """The mechlab config equivalent to a Hugging Face config.

    Args:
        arch: The Hugging Face class name (a key of :data:`ARCHITECTURES`).
        hf_config: Its ``transformers`` config.
        n_ctx: Longest sequence the mechlab model accepts (default: the checkpoint's
            ``max_position_embeddings``, capped by a sliding window; Mamba: 2048).
        source: Where the config came from, for messages (default: its class name).

    Returns:
        A :class:`~mechlab.models.transformer.TransformerConfig` or
        :class:`~mechlab.models.mamba.MambaConfig` in tokens mode.

    Raises:
        ImportProblem: An architecture or setting mechlab cannot reproduce, or a value of the
            wrong type or range (named).
    """
    where = source or f"the {type(hf_config).__name__}"
    advice = "fix config.json or " + RESAVE if source else "fix the model's config"
    check_config_values(arch, hf_config, where, advice)
    try:
        return _mechlab_config(arch, hf_config, n_ctx)
    except ImportProblem:
        raise
    except (AttributeError, TypeError, ValueError, ArithmeticError) as exc:
        raise ImportProblem(
            f"{where} is not a valid {arch} config ({brief(exc)}); {advice}"
        ) from None


def _mechlab_config(arch: str, hf_config: Any, n_ctx: int | None):
    if arch == "MambaForCausalLM":
        limit = _n_ctx(10**9, n_ctx, "Mamba") if n_ctx is not None else MAMBA_N_CTX
        try:
            return mamba_config_from_hf(hf_config, n_ctx=limit)
        except ValueError as exc:
            raise ImportProblem(f"cannot import this Mamba: {exc}") from None

    if arch == "GPT2LMHeadModel":
        fields = _gpt2_config(hf_config, n_ctx)
    elif arch == "GPTNeoXForCausalLM":
        fields = _neox_config(hf_config, n_ctx)
    elif arch == "GPTJForCausalLM":
        fields = _gptj_config(hf_config, n_ctx)
    elif arch in _LLAMA_LIKE:
        fields = _llama_config(hf_config, n_ctx, arch)
    else:
        raise _unsupported(repr(arch))
    try:
        return TransformerConfig(io="tokens", **fields)
    except ValueError as exc:
        raise ImportProblem(f"cannot import this {arch}: {exc}") from None


def _folder_architecture(folder: Path) -> tuple[str, Any, str]:
    """The class name and ``transformers`` config of a ``save_pretrained`` folder, and the
    config file's name for messages."""
    raw = read_config(folder)
    source = f"config file {str(folder / 'config.json')!r}"
    advice = "fix config.json or " + RESAVE
    names = raw.get("architectures")
    if names is not None and not (
        isinstance(names, list) and all(isinstance(n, str) for n in names)
    ):
        raise ImportProblem(
            f"{source}: architectures must be a list of class names, got {shown(names)}; {advice}"
        )
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ImportProblem(
            f"{source}: model_type must be a string, got {shown(model_type)}; {advice}"
        )
    arch = names[0] if names else _MODEL_TYPES.get(model_type or "")
    if arch not in ARCHITECTURES:
        raise _unsupported(f"{str(folder)!r} ({arch or model_type or 'no architecture named'})")
    check_config_values(arch, raw, source, advice)

    config_class = getattr(transformers, ARCHITECTURES[arch][0])
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its notes on a config are not the user's to read
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return arch, config_class.from_dict(raw), source
    except Exception as exc:  # noqa: BLE001 - transformers' own checks raise many kinds
        raise ImportProblem(
            f"{source} is not a valid {arch} config ({brief(exc)}); {advice}"
        ) from None
    finally:
        transformers.logging.set_verbosity(verbosity)


def check_folder(folder: str | os.PathLike) -> str:
    """Check a ``save_pretrained`` folder as :func:`from_pretrained` does before reading any
    weight: its ``config.json`` (every value the import reads), its weight index and where
    the weight files are (their tensors are checked when read).

    Returns:
        The Hugging Face class name.

    Raises:
        ImportProblem: As :func:`from_pretrained`.
    """
    return checked_folder(Path(folder))[0]


def checked_folder(folder: Path) -> tuple[str, Any, str]:
    """:func:`_folder_architecture` of a folder that holds weights (its index and files checked)."""
    if not folder.is_dir():
        raise ImportProblem(
            f"{str(folder)!r} is not a folder; give a folder written by save_pretrained "
            "(config.json and weights) or a model in memory"
        )
    arch, hf_config, source = _folder_architecture(folder)
    if not weight_files(folder):  # (the index and every file checked, before any size check)
        raise ImportProblem(
            f"{str(folder)!r} has a config.json but no weights ({', '.join(WEIGHT_FILES)}); "
            "save the model with save_pretrained(folder)"
        )
    return arch, hf_config, source


def module_architecture(module: nn.Module) -> str:
    """The class name of :data:`ARCHITECTURES` a model in memory is (or subclasses).

    Raises:
        ImportProblem: None of them (the message lists what is supported).
    """
    for cls in type(module).__mro__:
        if cls.__name__ in ARCHITECTURES:
            return cls.__name__
    raise _unsupported(f"a {type(module).__name__}")


def bridge_model(bridge: Any) -> nn.Module:
    """The Hugging Face model a TransformerLens ``TransformerBridge`` wraps.

    Raises:
        ImportProblem: Its weights were processed (``enable_compatibility_mode()``).
    """
    if getattr(bridge, "_weights_processed", False):
        raise ImportProblem(
            "this TransformerBridge's weights were processed by enable_compatibility_mode() "
            "(norms folded, unembedding centred); import it before that, or after "
            "enable_compatibility_mode(no_processing=True)"
        )
    return bridge.original_model
