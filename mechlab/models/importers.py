"""Import the models users bring: Hugging Face GPT-2, GPT-NeoX (Pythia), Llama (3.x
included), Qwen2, Mistral, Qwen3, OLMo, OLMo 2, Phi-3, GPT-J, Gemma 2, Gemma 3 and Mamba
checkpoints, and
TransformerLens ``TransformerBridge`` objects.

One entry point, :func:`from_pretrained`, takes a model in memory or a local folder
written by ``save_pretrained`` (``config.json`` plus ``model.safetensors``, sharded
safetensors or ``pytorch_model.bin``; nothing is ever downloaded) and returns a mechlab
model with the same weights, in the checkpoint's own dtype (or ``dtype=``: bfloat16,
float16, float32, float64), in eval mode on the CPU, so every mechlab tool (hooks,
caching, nnsight, patching, probes, edge pruning) works on it::

    model = mechlab.from_pretrained("path/to/pythia-70m")     # a folder
    model = mechlab.from_pretrained(hf_model)                  # a transformers model
    logits = model(tokens)                                     # = hf_model(tokens).logits

What each architecture becomes (options of :class:`~mechlab.models.transformer.TransformerConfig`):

* ``GPT2LMHeadModel``: the default transformer (LayerNorm, learned positions, GELU),
  ``tie_embeddings`` as saved.
* ``GPTNeoXForCausalLM`` (Pythia): rotary positions on ``rotary_dim = int(d_head *
  partial_rotary_factor)`` dimensions, ``parallel_attn_mlp`` (``use_parallel_residual``),
  exact GELU, untied read-out.
* ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``MistralForCausalLM``: ``normalization="RMS"``,
  rotary positions, ``gated_mlp`` with SiLU (SwiGLU), ``n_key_value_heads`` (grouped-query
  attention), biases as the architecture has them (Qwen2: on q/k/v only; Llama:
  ``attention_bias`` / ``mlp_bias``). A sliding attention window (Mistral, Qwen2 with
  ``use_sliding_window``) caps ``n_ctx`` at the window, so it never bites.
* ``Qwen3ForCausalLM``: as Llama, with ``qk_norm`` (an RMSNorm over each query and key
  head, before the rotary embedding), ``head_dim`` as configured, biases on q, k, v and
  the output with ``attention_bias``.
* ``OlmoForCausalLM``: as Llama, with ``normalization="LNPre"`` (LayerNorms without
  weights, eps 1e-5) and ``clip_qkv``.
* ``Phi3ForCausalLM``: as Llama without biases; the fused ``qkv_proj`` and ``gate_up_proj``
  are split into ``W_Q, W_K, W_V`` and ``W_gate, W_in``; partial rotary
  (``partial_rotary_factor``) and a sliding window as Mistral's.
* ``GPTJForCausalLM``: ``parallel_attn_mlp`` with its one LayerNorm ``ln_1`` copied into
  ``ln1`` and ``ln2``, ``rotary_adjacent_pairs`` on ``rotary_dim`` dimensions, no
  attention biases, the read-out's bias from ``lm_head.bias``.
* ``Olmo2ForCausalLM``: as Llama, with ``pre_norms=False, post_norms=True`` (RMSNorms after
  the attention and the MLP only) and ``qk_norm`` with ``qk_norm_over="all"`` (over the whole
  query and key projections).
* ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM`` (text only): as Llama with GeGLU (tanh GELU),
  ``post_norms`` as well as pre-norms, ``embed_scale = sqrt(d_model)``, ``attn_scale =
  sqrt(query_pre_attn_scalar)``, ``attn_softcap`` / ``final_softcap``, ``sliding_window``
  on the layers ``layer_types`` names (the window applied, not a cap on ``n_ctx``); every
  norm weight is stored as ``1 + w`` (float32, as Gemma computes it). Gemma 3: ``qk_norm``
  per head, ``rotary_base_local`` from ``rope_parameters["sliding_attention"]`` (a scaled
  local rotary embedding is refused) and the global layers' scaling from
  ``["full_attention"]``; its ``attn_logit_softcapping``, which Hugging Face's Gemma 3 never
  applies, is ignored as there.
* ``MambaForCausalLM``: :class:`~mechlab.models.mamba.Mamba` (as
  :meth:`~mechlab.models.mamba.Mamba.from_hf`).
* A ``TransformerBridge``: the Hugging Face model it wraps, if its weights are unprocessed
  (``enable_compatibility_mode()`` folds the norms into the weights and centres the
  unembedding, which changes what the weights compute).

Rotary scalings (:data:`ROPE_TYPES`): ``linear``, ``llama3``, ``yarn`` and ``longrope``
become ``rotary_scaling`` (the frequencies computed as Hugging Face computes them, YaRN's and
LongRoPE's ``attention_factor`` included; LongRoPE's long frequencies for a prompt longer
than ``original_max_position_embeddings``); ``dynamic`` rescales only past
``max_position_embeddings``, which is the longest sequence mechlab accepts, so it imports as
the default. Any other ``rope_type`` (``proportional``, ...) is refused in one line naming
these, as is any other
architecture, a folder without weights, and a model above the size limit
(:func:`mechlab.models.registry.check_size`), which is checked from ``config.json``
before anything is allocated. Hugging Face's read-out has no bias (GPT-J's has one):
mechlab's is zero.
"""

from __future__ import annotations

import math
import mmap
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import Tensor, nn

from mechlab.models.base import MechModel
from mechlab.models.hf_files import (
    RESAVE,
    WEIGHT_FILES,
    ImportProblem,
    bad_file,
    brief,
    check_config_values,
    read_config,
    safetensors_header,
    safetensors_layout,
    shown,
    torch_weights,
    weight_files,
)
from mechlab.models.mamba import Mamba, hf_name, mamba_config_from_hf
from mechlab.models.registry import check_size
from mechlab.models.transformer import RMSNorm, Transformer, TransformerConfig

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
"""What :func:`from_pretrained` imports."""
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
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16, "float64": torch.float64,
}  # fmt: skip
"""The dtypes :func:`from_pretrained` imports into, by name (or give the ``torch.dtype``)."""
_SAFETENSORS_TORCH = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
_SAFETENSORS_FLOATS = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                       "F64": torch.float64}  # fmt: skip


def _unsupported(what: str) -> ImportProblem:
    return ImportProblem(f"cannot import {what}: mechlab imports {', '.join(SUPPORTED)}")


# ---------------------------------------------------------------------------------------
# Weights by name, from a state dict or a folder
# ---------------------------------------------------------------------------------------


class _Mismatch(ImportProblem):
    """A weight missing, or not fitting the mechlab parameter its config implies (the
    caller names the weights' source)."""


class Weights:
    """Tensors by Hugging Face name, found with or without the base-model prefix.

    Args:
        get: ``name -> tensor`` for the names in ``names``.
        names: Every stored name.
        prefix: The architecture's base-model prefix (``transformer``, ``model``, ...).
        source: Where the weights come from (for messages).
    """

    def __init__(self, get: Callable[[str], Tensor], names: set[str], prefix: str, source: str):
        self._get, self.names, self.prefix, self.source = get, names, prefix, source

    def key(self, name: str) -> str | None:
        """The stored name of ``name`` (``transformer.h.0...`` or ``h.0...``), or None."""
        bare = name.removeprefix(self.prefix + ".")
        for candidate in (name, bare, f"{self.prefix}.{bare}"):
            if candidate in self.names:
                return candidate
        return None

    def __contains__(self, name: str) -> bool:
        return self.key(name) is not None

    def __call__(self, name: str) -> Tensor:
        key = self.key(name)
        if key is None:
            raise _Mismatch(f"it has no weight {name!r}, which its config implies")
        return self._get(key)


def _state_dict_weights(state: dict[str, Tensor], prefix: str, source: str) -> Weights:
    # a TransformerBridge wraps every module: "transformer.h.0._original_component.attn..."
    clean = {k.replace("._original_component", "").replace("_original_component.", ""): v
             for k, v in state.items()}  # fmt: skip
    return Weights(clean.__getitem__, set(clean), prefix, source)


def _folder_weights(folder: Path, prefix: str) -> Weights:
    """The weights of a ``save_pretrained`` folder, read tensor by tensor when asked (every
    file checked first: :func:`weight_files`, :func:`safetensors_layout`, :func:`torch_weights`).

    A safetensors tensor is a view of its bytes in the file, memory-mapped (no copy): the
    loader copies it into its parameter and drops it, so an import holds the parameters
    and one tensor's pages at a time."""
    where: dict[str, Path] = {}
    layouts: dict[Path, dict[str, tuple[str, list[int], int, int]]] = {}
    loaded: dict[Path, dict[str, Tensor]] = {}
    for path in weight_files(folder):
        if path.suffix == ".safetensors":
            layouts[path] = safetensors_layout(path)
            for key in layouts[path]:
                where.setdefault(key, path)
        else:
            loaded[path] = torch_weights(path)
            for key in loaded[path]:
                where.setdefault(key, path)

    def get(key: str) -> Tensor:
        path = where[key]
        if path in loaded:
            return loaded[path][key]
        kind, shape, start, stop = layouts[path][key]
        try:
            return _mapped(path, _SAFETENSORS_TORCH[kind], shape, start, stop)
        except (OSError, ValueError, RuntimeError) as exc:  # the file changed since its check
            raise bad_file(path, f"cannot be read ({brief(exc)})", RESAVE) from None

    return Weights(get, set(where), prefix, repr(str(folder)))


def _mapped(path: Path, dtype: torch.dtype, shape: list[int], start: int, stop: int) -> Tensor:
    """The tensor in bytes ``start:stop`` of ``path``, a read-only memory map of them (its
    pages read when touched, unmapped when the tensor is freed)."""
    if stop == start:
        return torch.empty(shape, dtype=dtype)
    aligned = start - start % mmap.ALLOCATIONGRANULARITY
    with path.open("rb") as f:
        view = mmap.mmap(f.fileno(), stop - aligned, access=mmap.ACCESS_READ, offset=aligned)
    with warnings.catch_warnings():  # "the buffer is not writable": nothing writes to it
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(view, dtype=dtype, count=math.prod(shape), offset=start - aligned)
    tensor = flat.view(shape)
    tensor._mechlab_map = (view, start - aligned)  # for _put's copy by rows (the map, where it starts)
    return tensor


_COPY_CHUNK = 4 << 20  # bytes of a mapped tensor copied before its pages are released


def _copy_by_rows(param: Tensor, value: Tensor) -> bool:
    """Copy a memory-mapped tensor (:func:`_mapped`) of ``param``'s shape into it a block of
    rows at a time, releasing each block's pages once copied (``MADV_DONTNEED``: a large
    embedding never has all its pages resident beside its parameter).

    Returns:
        Whether it copied (False: not a mapped tensor, or the platform cannot release pages).
    """
    mapped = getattr(value, "_mechlab_map", None)
    if mapped is None or value.dim() == 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    view, offset = mapped
    row_bytes = max(1, value[0].numel() * value.element_size())
    step = max(1, _COPY_CHUNK // row_bytes)
    for first in range(0, value.shape[0], step):
        last = min(value.shape[0], first + step)
        param[first:last].copy_(value[first:last])
        begin, end = offset + first * row_bytes, offset + last * row_bytes
        begin -= begin % mmap.PAGESIZE
        if end > begin:
            view.madvise(mmap.MADV_DONTNEED, begin, end - begin)
    return True


@torch.no_grad()
def _put(param: Tensor | None, value: Tensor, what: str) -> None:
    if param is None:
        raise _Mismatch(f"{what}: the mechlab model has no such parameter (a bias that is off)")
    if not (value.is_floating_point() and value.device.type != "meta"):
        raise _Mismatch(
            f"{what} holds {value.dtype} values on {value.device.type}, not floating-point numbers"
        )
    if tuple(param.shape) != tuple(value.shape):
        raise _Mismatch(
            f"{what} has shape {list(value.shape)}, the config implies {list(param.shape)}"
        )
    if not _copy_by_rows(param, value):
        param.copy_(value)  # (copy_ converts the dtype as it copies: no converted copy first)


# ---------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------


ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")
"""The ``rope_type`` values :func:`from_pretrained` imports."""


def _rope(hf: Any, arch: str, params: dict | None = None) -> tuple[float, float, dict | None]:
    """``(rope_theta, partial_rotary_factor, rotary_scaling)`` of a config (or of its
    ``params``, one layer type's rotary parameters): its rotary scaling as
    :class:`~mechlab.models.transformer.TransformerConfig`'s ``rotary_scaling`` (None for
    the default and for ``dynamic``, whose frequencies are the default ones up to
    ``max_position_embeddings``, the longest sequence mechlab accepts)."""
    if params is None:
        params = dict(getattr(hf, "rope_parameters", None) or {})
        scaling = getattr(hf, "rope_scaling", None)
        if isinstance(scaling, dict) and not params:
            params = dict(scaling)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ImportProblem(
            f"this {arch} uses rope_type={rope_type!r}; mechlab supports rope_type "
            f"{', '.join(ROPE_TYPES)}"
        )
    theta = params.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0))
    factor = 1.0 if factor is None else float(factor)
    return float(theta), factor, _scaling(hf, params, rope_type)


def _scaling(hf: Any, params: dict, rope_type: str) -> dict | None:
    """The ``rotary_scaling`` of a ``linear``, ``llama3``, ``yarn`` or ``longrope`` config, every value
    resolved as Hugging Face's ``_compute_*_parameters`` resolve it (a value missing or of
    the wrong type is left for :class:`~mechlab.models.transformer.TransformerConfig` to
    name)."""
    if rope_type in ("default", "dynamic"):
        return None

    def number(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        return float(value)

    factor = params.get("factor")
    if rope_type == "linear":
        return {"rope_type": "linear", "factor": number(factor)}
    old_len = (  # the config's own field first, as Hugging Face's standardize_rope_params has it
        getattr(hf, "original_max_position_embeddings", None)
        or params.get("original_max_position_embeddings")
        or hf.max_position_embeddings
    )
    if rope_type == "longrope":
        return _longrope(hf, params, old_len)
    if rope_type == "llama3":
        return {"rope_type": "llama3", "factor": number(factor), "original_max_position_embeddings": old_len,
                "low_freq_factor": number(params.get("low_freq_factor")),
                "high_freq_factor": number(params.get("high_freq_factor"))}  # fmt: skip
    if factor is None:
        factor = hf.max_position_embeddings / old_len
    attention_factor = params.get("attention_factor")
    if attention_factor is None and isinstance(factor, (int, float)):

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor)
        if m and m_all:
            attention_factor = mscale(factor, m) / mscale(factor, m_all)
    return {"rope_type": "yarn", "factor": number(factor), "original_max_position_embeddings": old_len,
            "beta_fast": number(params.get("beta_fast") or 32), "beta_slow": number(params.get("beta_slow") or 1),
            "attention_factor": number(attention_factor), "truncate": params.get("truncate", True)}  # fmt: skip


def _longrope(hf: Any, params: dict, old_len: Any) -> dict:
    """LongRoPE's ``rotary_scaling`` (Phi-3's long-context checkpoints), as Hugging Face's
    ``_compute_longrope_parameters`` resolves it: without an ``attention_factor``,
    ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`` where ``factor`` is the
    config's, else ``max_position_embeddings / original_max_position_embeddings`` (1 when
    ``factor <= 1``)."""
    factor, attention_factor = params.get("factor"), params.get("attention_factor")
    if factor is None and isinstance(old_len, (int, float)) and old_len > 0:
        factor = hf.max_position_embeddings / old_len
    if attention_factor is None and isinstance(factor, (int, float)) and isinstance(old_len, (int, float)):
        attention_factor = 1.0 if factor <= 1 or old_len <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_len))
    short, long = params.get("short_factor"), params.get("long_factor")
    return {"rope_type": "longrope", "original_max_position_embeddings": old_len,
            "short_factor": [float(v) for v in short] if isinstance(short, list) else short,
            "long_factor": [float(v) for v in long] if isinstance(long, list) else long,
            "attention_factor": float(attention_factor) if isinstance(attention_factor, (int, float)) else attention_factor}  # fmt: skip


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
        raise ImportProblem(f"n_ctx must be an integer in 1..{limit} for this {arch}, got {n_ctx!r}")
    return n_ctx


def _gpt2_config(hf: Any, n_ctx: int | None) -> dict[str, Any]:
    if not getattr(hf, "scale_attn_weights", True) or getattr(hf, "scale_attn_by_inverse_layer_idx", False):
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
    theta, factor, scaling = _rope(hf, "GPT-NeoX")
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
        theta, factor, scaling = _rope(hf, arch, dict(hf.rope_parameters["full_attention"]))
    else:
        theta, factor, scaling = _rope(hf, arch)
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


# ---------------------------------------------------------------------------------------
# Weights into the mechlab model
# ---------------------------------------------------------------------------------------


def _put_norm(norm: nn.Module, weights: Weights, name: str, offset: float = 0.0) -> None:
    """A LayerNorm's ``weight`` and ``bias``, or an RMSNorm's ``weight``, from ``name.*``;
    ``offset``: the weight stored is ``offset + weight`` in float32 (Gemma's norms scale by
    ``1 + weight``, computed in float32 as Gemma computes it)."""
    value = weights(name + ".weight")
    if offset and value.is_floating_point():
        value = offset + value.float()
    _put(norm.w, value, name)
    if hasattr(norm, "b"):
        _put(norm.b, weights(name + ".bias"), name)


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
        _put(model.read_out.proj.weight, weights(head), head)
    model.read_out.proj.bias.data.zero_()


def _load_gpt2(model: MechModel, w: Weights) -> None:
    H = model.cfg.n_heads
    _put(model.read_in.embed.weight, w("transformer.wte.weight"), "wte")
    _put(model.W_pos, w("transformer.wpe.weight")[: model.cfg.n_ctx], "wpe")
    for i, block in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        attn, mlp = block.attn, block.mlp
        _put_norm(block.ln1, w, p + "ln_1")
        _put_norm(block.ln2, w, p + "ln_2")
        # Conv1D keeps [in, out]: c_attn is [d_model, 3 * H * d_head] = [W_Q | W_K | W_V]
        for param, weight in zip((attn.W_Q, attn.W_K, attn.W_V), w(p + "attn.c_attn.weight").chunk(3, dim=1), strict=True):
            _put(param, weight.reshape(weight.shape[0], H, -1).transpose(0, 1), p + "attn.c_attn.weight")
        for param, bias in zip(attn.biases(), w(p + "attn.c_attn.bias").chunk(3), strict=True):
            _put(param, bias.view(H, -1), p + "attn.c_attn.bias")
        _put(attn.W_O, w(p + "attn.c_proj.weight").view(H, -1, model.cfg.d_model), p + "attn.c_proj.weight")
        _put(attn.b_O, w(p + "attn.c_proj.bias"), p + "attn.c_proj.bias")
        _put(mlp.W_in, w(p + "mlp.c_fc.weight"), p + "mlp.c_fc.weight")
        _put(mlp.b_in, w(p + "mlp.c_fc.bias"), p + "mlp.c_fc.bias")
        _put(mlp.W_out, w(p + "mlp.c_proj.weight"), p + "mlp.c_proj.weight")
        _put(mlp.b_out, w(p + "mlp.c_proj.bias"), p + "mlp.c_proj.bias")
    _put_norm(model.ln_final, w, "transformer.ln_f")
    _read_out(model, w, "lm_head.weight")


def _load_neox(model: MechModel, w: Weights) -> None:
    H = model.cfg.n_heads
    _put(model.read_in.embed.weight, w("gpt_neox.embed_in.weight"), "embed_in")
    for i, block in enumerate(model.blocks):
        p = f"gpt_neox.layers.{i}."
        attn, mlp = block.attn, block.mlp
        _put_norm(block.ln1, w, p + "input_layernorm")
        _put_norm(block.ln2, w, p + "post_attention_layernorm")
        # query_key_value's outputs are ordered [head, (q, k, v), d_head]
        qkv = w(p + "attention.query_key_value.weight")  # [H * 3 * d_head, d_model]
        qkv = qkv.view(H, 3, -1, qkv.shape[-1])
        for j, param in enumerate((attn.W_Q, attn.W_K, attn.W_V)):
            _put(param, qkv[:, j].transpose(1, 2), p + "attention.query_key_value.weight")
        if attn.b_Q is not None:
            b = w(p + "attention.query_key_value.bias").view(H, 3, -1)
            for j, param in enumerate(attn.biases()):
                _put(param, b[:, j], p + "attention.query_key_value.bias")
        _put(attn.W_O, _out_heads(w(p + "attention.dense.weight"), H), p + "attention.dense.weight")
        if attn.b_O is not None:
            _put(attn.b_O, w(p + "attention.dense.bias"), p + "attention.dense.bias")
        _put(mlp.W_in, w(p + "mlp.dense_h_to_4h.weight").T, p + "mlp.dense_h_to_4h.weight")
        _put(mlp.b_in, w(p + "mlp.dense_h_to_4h.bias"), p + "mlp.dense_h_to_4h.bias")
        _put(mlp.W_out, w(p + "mlp.dense_4h_to_h.weight").T, p + "mlp.dense_4h_to_h.weight")
        _put(mlp.b_out, w(p + "mlp.dense_4h_to_h.bias"), p + "mlp.dense_4h_to_h.bias")
    _put_norm(model.ln_final, w, "gpt_neox.final_layer_norm")
    _read_out(model, w, "embed_out.weight", "lm_head.weight")  # saved / in memory (transformers 5)


def _load_llama(model: MechModel, w: Weights) -> None:
    """Llama's weights (Qwen2, Mistral, Qwen3, OLMo), and Phi-3's, whose fused ``qkv_proj``
    (``[q | k | v]`` rows) and ``gate_up_proj`` (``[gate | up]`` rows) are split here."""
    H, G = model.cfg.n_heads, model.cfg.n_key_value_heads
    d_head = model.cfg.d_head
    offset = 1.0 if model.cfg.embed_scale is not None else 0.0  # Gemma's norms scale by 1 + w
    _put(model.read_in.embed.weight, w("model.embed_tokens.weight"), "embed_tokens")
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
                _put(param, _heads(part, n), fused)
        for param, bias, name, n in (
            (attn.W_Q, attn.b_Q, "q_proj", H), (attn.W_K, attn.b_K, "k_proj", G), (attn.W_V, attn.b_V, "v_proj", G),
        ):  # fmt: skip
            name = f"{p}self_attn.{name}"
            if fused not in w:
                _put(param, _heads(w(name + ".weight"), n), name + ".weight")
            if bias is not None:
                _put(bias, w(name + ".bias").view(n, -1), name + ".bias")
        if attn.q_norm is not None:  # Qwen3, OLMo 2, Gemma 3
            _put_norm(attn.q_norm, w, p + "self_attn.q_norm", offset)
            _put_norm(attn.k_norm, w, p + "self_attn.k_norm", offset)
        o_proj = p + "self_attn.o_proj"
        _put(attn.W_O, _out_heads(w(o_proj + ".weight"), H), o_proj + ".weight")
        if attn.b_O is not None:
            _put(attn.b_O, w(o_proj + ".bias"), o_proj + ".bias")
        fused = p + "mlp.gate_up_proj.weight"
        if fused in w:  # Phi-3
            gate, up = w(fused).chunk(2)
            _put(mlp.W_gate, gate.T, fused)
            _put(mlp.W_in, up.T, fused)
        for param, bias, name in ((mlp.W_gate, mlp.b_gate, "gate"), (mlp.W_in, mlp.b_in, "up")):
            if fused not in w:
                _put(param, w(f"{p}mlp.{name}_proj.weight").T, f"{p}mlp.{name}_proj.weight")
            if bias is not None:
                _put(bias, w(f"{p}mlp.{name}_proj.bias"), f"{p}mlp.{name}_proj.bias")
        _put(mlp.W_out, w(p + "mlp.down_proj.weight").T, p + "mlp.down_proj.weight")
        if mlp.b_out is not None:
            _put(mlp.b_out, w(p + "mlp.down_proj.bias"), p + "mlp.down_proj.bias")
    if isinstance(model.ln_final.w, nn.Parameter):
        _put_norm(model.ln_final, w, "model.norm", offset)
    _read_out(model, w, "lm_head.weight")


def _block_norms(cfg: Any, block: nn.Module) -> list[tuple[nn.Module, str]]:
    """A Llama-like block's norms and their Hugging Face names: Llama's two pre-norms,
    OLMo 2's two post-norms, or Gemma's four."""
    if not cfg.post_norms:
        return [(block.ln1, "input_layernorm"), (block.ln2, "post_attention_layernorm")]
    post = [(block.ln1_post, "post_attention_layernorm"), (block.ln2_post, "post_feedforward_layernorm")]
    if not cfg.pre_norms:
        return post
    return [(block.ln1, "input_layernorm"), (block.ln2, "pre_feedforward_layernorm"), *post]


def _load_gptj(model: MechModel, w: Weights) -> None:
    """GPT-J's weights; its one LayerNorm ``ln_1`` per block is copied into ``ln1`` and
    ``ln2`` (attention and MLP both read it), and its read-out has a bias."""
    H = model.cfg.n_heads
    _put(model.read_in.embed.weight, w("transformer.wte.weight"), "wte")
    for i, block in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        attn, mlp = block.attn, block.mlp
        _put_norm(block.ln1, w, p + "ln_1")
        _put_norm(block.ln2, w, p + "ln_1")
        for param, name in ((attn.W_Q, "q_proj"), (attn.W_K, "k_proj"), (attn.W_V, "v_proj")):
            _put(param, _heads(w(f"{p}attn.{name}.weight"), H), f"{p}attn.{name}.weight")
        _put(attn.W_O, _out_heads(w(p + "attn.out_proj.weight"), H), p + "attn.out_proj.weight")
        _put(mlp.W_in, w(p + "mlp.fc_in.weight").T, p + "mlp.fc_in.weight")
        _put(mlp.b_in, w(p + "mlp.fc_in.bias"), p + "mlp.fc_in.bias")
        _put(mlp.W_out, w(p + "mlp.fc_out.weight").T, p + "mlp.fc_out.weight")
        _put(mlp.b_out, w(p + "mlp.fc_out.bias"), p + "mlp.fc_out.bias")
    _put_norm(model.ln_final, w, "transformer.ln_f")
    _read_out(model, w, "lm_head.weight")
    _put(model.read_out.proj.bias, w("lm_head.bias"), "lm_head.bias")


def _load_mamba(model: MechModel, w: Weights) -> None:
    for name, param in model.named_parameters():
        key = hf_name(name)
        if key is None:  # read_out.proj.bias: HF's lm_head has none
            continue
        if key == "lm_head.weight" and key not in w:  # tied: saved once, as the embedding
            key = "backbone.embeddings.weight"
        _put(param, w(key), key)
    model.read_out.proj.bias.data.zero_()


_LOADERS: dict[str, Callable[[MechModel, Weights], None]] = {
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


# ---------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------


def import_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """The ``torch.dtype`` a ``dtype`` argument of :func:`from_pretrained` names (None, or
    ``"auto"``: the checkpoint's own, decided later), checked to run on this machine.

    Raises:
        ImportProblem: An unknown name or dtype, or one this machine's torch cannot multiply
            matrices in on the CPU.
    """
    if dtype is None or dtype == "auto":
        return None
    known = ", ".join(n for n in DTYPES if n not in ("fp32", "bf16", "fp16", "half"))
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        dtype = DTYPES[dtype.lower()]
    if not isinstance(dtype, torch.dtype) or dtype not in DTYPES.values():
        raise ImportProblem(
            f"unknown dtype {shown(dtype) if not isinstance(dtype, torch.dtype) else str(dtype)}; "
            f"mechlab imports in {known} (default: the checkpoint's own)"
        )
    check_runs(dtype)
    return dtype


def check_runs(dtype: torch.dtype) -> None:
    """Check that this machine's torch multiplies matrices in ``dtype`` on the CPU.

    Raises:
        ImportProblem: It cannot (one line, naming the dtype and what to use instead).
    """
    try:
        ones = torch.ones(2, 2, dtype=dtype)
        torch.matmul(ones, ones)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        raise ImportProblem(
            f"this machine's torch cannot run {str(dtype).removeprefix('torch.')} on the CPU "
            f"({brief(exc, 100)}); import with dtype='float32' (or 'bfloat16')"
        ) from None


def _checkpoint_dtype(hf_config: Any, folder: Path | None, module: nn.Module | None) -> torch.dtype:
    """The dtype a checkpoint is stored in: a model in memory's first floating-point
    parameter's; a folder's ``dtype`` / ``torch_dtype`` in config.json, else its first
    safetensors file's floating-point tensors'; float32 when none of these names one of
    :data:`DTYPES`."""
    if module is not None:
        found = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    else:
        found = getattr(hf_config, "dtype", None)
        if not isinstance(found, torch.dtype) and folder is not None:
            files = [f for f in weight_files(folder) if f.suffix == ".safetensors"]
            kinds = safetensors_header(files[0]).values() if files else ()
            found = next((_SAFETENSORS_FLOATS[k] for k, _ in kinds if k in _SAFETENSORS_FLOATS), None)
    return found if isinstance(found, torch.dtype) and found in DTYPES.values() else torch.float32


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside moves to the ``meta`` device (no memory, and its
    initialisation costs nothing); buffers stay where they are made. As accelerate's
    ``init_empty_weights(include_buffers=False)``, it patches ``nn.Module.register_parameter``
    for the duration: modules built by other threads meanwhile would get meta parameters too."""
    register = nn.Module.register_parameter

    def on_meta(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(self, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _empty_model(cfg: Any, dtype: torch.dtype, mamba: bool) -> MechModel:
    """The mechlab model of ``cfg`` with uninitialised parameters in ``dtype`` (Gemma's
    norm weights in float32, or float64): memory the loaders fill tensor by tensor, allocated once
    (no float32 copy, no random initialisation). Tied parameters stay tied."""
    with _parameters_on_meta():
        if mamba:
            model: MechModel = Mamba(cfg)
        else:
            model = Transformer(cfg)
    gemma = getattr(cfg, "embed_scale", None) is not None
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            if id(param) not in made:
                kind = torch.promote_types(dtype, torch.float32) if gemma and isinstance(module, RMSNorm) else dtype
                made[id(param)] = nn.Parameter(
                    torch.empty(param.shape, dtype=kind), requires_grad=param.requires_grad
                )
            module._parameters[name] = made[id(param)]
    model._sync_cfg_device()
    return model


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
    return _checked_folder(Path(folder))[0]


def _checked_folder(folder: Path) -> tuple[str, Any, str]:
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


def _module_architecture(module: nn.Module) -> str:
    for cls in type(module).__mro__:
        if cls.__name__ in ARCHITECTURES:
            return cls.__name__
    raise _unsupported(f"a {type(module).__name__}")


def _bridge_model(bridge: Any) -> nn.Module:
    if getattr(bridge, "_weights_processed", False):
        raise ImportProblem(
            "this TransformerBridge's weights were processed by enable_compatibility_mode() "
            "(norms folded, unembedding centred); import it before that, or after "
            "enable_compatibility_mode(no_processing=True)"
        )
    return bridge.original_model


def from_pretrained(
    model_or_folder: nn.Module | str | os.PathLike,
    *,
    n_ctx: int | None = None,
    max_elements: int | None = None,
    dtype: str | torch.dtype | None = None,
) -> MechModel:
    """Import a Hugging Face model, a ``save_pretrained`` folder or a TransformerBridge.

    Args:
        model_or_folder: A ``GPT2LMHeadModel``, ``GPTNeoXForCausalLM``,
            ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``MistralForCausalLM``,
            ``Qwen3ForCausalLM``, ``OlmoForCausalLM``, ``Olmo2ForCausalLM``,
            ``Phi3ForCausalLM``, ``GPTJForCausalLM``, ``Gemma2ForCausalLM``,
            ``Gemma3ForCausalLM`` or ``MambaForCausalLM`` (or a subclass), a TransformerLens ``TransformerBridge``
            around one, or the path of a local folder one was saved to. Nothing is
            downloaded.
        n_ctx: Longest sequence the imported model accepts (default: the checkpoint's
            ``max_position_embeddings`` / ``n_positions``, capped by a sliding attention
            window; 2048 for Mamba, which has no limit).
        max_elements: Size limit for this call (default: ``MECHLAB_MAX_ELEMENTS`` or
            :data:`mechlab.models.registry.MAX_ELEMENTS`), checked before the mechlab
            model is allocated (and, for a folder, before any weight is read).
        dtype: The dtype of the imported parameters and of every activation: a name of
            :data:`DTYPES` (``"bfloat16"``, ``"float16"``, ``"float32"``, ...) or a
            ``torch.dtype``. Default (None or ``"auto"``): the checkpoint's own (a folder's
            ``dtype`` / ``torch_dtype`` in config.json, else its safetensors' dtype; a model
            in memory's parameters'; float32 when none is named). Gemma's norm weights
            ``1 + w`` stay float32 in any dtype (Gemma computes its norms in float32).

    Returns:
        A mechlab :class:`~mechlab.models.transformer.Transformer` or
        :class:`~mechlab.models.mamba.Mamba` in tokens mode, in ``dtype``, eval mode, on
        the CPU, whose logits equal the Hugging Face model's (in float32; in bfloat16 to
        bfloat16's precision). A folder's weights are read one tensor at a time into the
        model's parameters, allocated once in ``dtype``: the Hugging Face model is never
        built and no float32 copy is made.

    Raises:
        ImportProblem: An unsupported architecture or setting (the message lists what is
            supported), a folder without config.json or weights, weights that do not
            fit the config, or a model above the size limit; a damaged or hostile file
            (config, index, safetensors or torch file) of a folder, named; an unknown
            dtype, or one this machine cannot run. A ``ValueError``.
        TypeError: Neither a model nor a path.
    """
    target = import_dtype(dtype)
    folder: Path | None = None
    module: nn.Module | None = None
    if isinstance(model_or_folder, (str, os.PathLike)):
        folder = Path(model_or_folder)
        arch, hf_config, source = _checked_folder(folder)
        weights: Callable[[], Weights] = lambda: _folder_weights(Path(model_or_folder), ARCHITECTURES[arch][1])  # noqa: E731
    elif isinstance(model_or_folder, nn.Module):
        module = model_or_folder
        if type(module).__name__ == "TransformerBridge" or hasattr(module, "original_model"):
            module = _bridge_model(module)
        arch = _module_architecture(module)
        hf_config = module.config
        source = None
        name = f"the {type(module).__name__}"
        weights = lambda: _state_dict_weights(module.state_dict(), ARCHITECTURES[arch][1], name)  # noqa: E731
    else:
        raise TypeError(
            f"from_pretrained takes a Hugging Face model, a TransformerBridge or a folder path, "
            f"not {type(model_or_folder).__name__}"
        )
    cfg = mechlab_config(arch, hf_config, n_ctx, source=source)
    try:
        check_size(cfg, max_elements)
    except ImportProblem:
        raise
    except ValueError as exc:
        raise ImportProblem(f"{source + ': ' if source else ''}{exc}") from None
    if target is None:
        target = _checkpoint_dtype(hf_config, folder, module)
        check_runs(target)
    model = _empty_model(cfg, target, arch == "MambaForCausalLM")
    loaded = weights()
    advice = "the weights and config.json disagree: " + RESAVE if source else "check the model"
    try:
        _LOADERS[arch](model, loaded)
    except _Mismatch as exc:
        raise ImportProblem(f"{loaded.source}: {exc}; {advice}") from None
    except ImportProblem:
        raise
    except Exception as exc:  # noqa: BLE001 - a reshape of a weight the config does not fit
        raise ImportProblem(
            f"{loaded.source}: a weight does not fit the config ({brief(exc)}); {advice}"
        ) from None
    return model.eval()
