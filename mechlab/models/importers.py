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

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechlab.models.base import MechModel
from mechlab.models.hf_config import (
    ARCHITECTURES,
    MAMBA_N_CTX,
    SUPPORTED,
    bridge_model,
    check_folder,
    checked_folder,
    mechlab_config,
    module_architecture,
)
from mechlab.models.hf_files import (
    RESAVE,
    ImportProblem,
    brief,
    safetensors_header,
    shown,
    weight_files,
)
from mechlab.models.hf_loaders import LOADERS
from mechlab.models.hf_rope import ROPE_TYPES
from mechlab.models.hf_weights import Mismatch, Weights, folder_weights, state_dict_weights
from mechlab.models.mamba import Mamba
from mechlab.models.norms import RMSNorm
from mechlab.models.registry import check_size
from mechlab.models.transformer import Transformer

# The entry point's parts live beside it, one job a module: which architecture and the
# config it becomes (hf_config, with its rotary scalings: hf_rope), the weights read by
# name (hf_weights) and mapped onto each architecture (hf_loaders). Their public names are
# re-exported here, where users have always imported them.
__all__ = [
    "ARCHITECTURES",
    "DTYPES",
    "MAMBA_N_CTX",
    "ROPE_TYPES",
    "SUPPORTED",
    "ImportProblem",
    "Weights",
    "check_folder",
    "check_runs",
    "from_pretrained",
    "import_dtype",
    "mechlab_config",
    "weight_files",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16, "float64": torch.float64,
}  # fmt: skip
"""The dtypes :func:`from_pretrained` imports into, by name (or give the ``torch.dtype``)."""
_SAFETENSORS_FLOATS = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                       "F64": torch.float64}  # fmt: skip


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
        arch, hf_config, source = checked_folder(folder)
        weights: Callable[[], Weights] = lambda: folder_weights(Path(model_or_folder), ARCHITECTURES[arch][1])  # noqa: E731
    elif isinstance(model_or_folder, nn.Module):
        module = model_or_folder
        if type(module).__name__ == "TransformerBridge" or hasattr(module, "original_model"):
            module = bridge_model(module)
        arch = module_architecture(module)
        hf_config = module.config
        source = None
        name = f"the {type(module).__name__}"
        weights = lambda: state_dict_weights(module.state_dict(), ARCHITECTURES[arch][1], name)  # noqa: E731
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
        LOADERS[arch](model, loaded)
    except Mismatch as exc:
        raise ImportProblem(f"{loaded.source}: {exc}; {advice}") from None
    except ImportProblem:
        raise
    except Exception as exc:  # noqa: BLE001 - a reshape of a weight the config does not fit
        raise ImportProblem(
            f"{loaded.source}: a weight does not fit the config ({brief(exc)}); {advice}"
        ) from None
    return model.eval()
