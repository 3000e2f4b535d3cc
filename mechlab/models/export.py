"""Export a mechlab :class:`~mechlab.models.transformer.Transformer` to Hugging Face GPT-2,
and from there to a TransformerLens ``TransformerBridge``.

The mapping is exact: mechlab's transformer *is* a GPT-2 block stack (pre-LN,
learned positions, biases everywhere, the same GELU), only stored in
TransformerLens' per-head layout. Hugging Face's ``Conv1D`` keeps weights as
``[in, out]``, so ``c_attn.weight`` is ``[d_model, 3 * n_heads * d_head]`` =
``[W_Q | W_K | W_V]`` with each block ordered head by head, and
``attn.c_proj.weight`` is ``W_O`` flattened to ``[n_heads * d_head, d_model]``.

Two differences have to be handled, and are handled openly:

* **The unembedding bias.** mechlab's read-out is an ``nn.Linear`` with a bias;
  GPT-2's ``lm_head`` has none, and by default shares its weight with ``wte``.
  The export always unties ``lm_head`` (``tie_word_embeddings=False``) and copies
  the read-out weight into it. The bias cannot be folded into anything GPT-2
  has (the final LayerNorm's output has no constant direction), so with
  ``read_out_bias="error"`` (the default) a non-zero bias raises a ``ValueError``,
  and with ``read_out_bias="attach"`` ``lm_head`` is replaced by an
  ``nn.Linear`` *with* a bias: outputs then match exactly in memory (and through
  the bridge), but ``save_pretrained`` -> ``GPT2LMHeadModel.from_pretrained``
  drops ``lm_head.bias`` (an unexpected key), so keep the mechlab checkpoint as
  the source of truth.
* **Continuous input/output.** GPT-2 reads token ids. A continuous model is
  exported as :class:`GPT2WithReadInOut`: ``_read_in`` (Linear ``d_in -> d_model``),
  a ``GPT2Model`` trunk fed ``inputs_embeds`` (it adds ``wpe`` itself), and
  ``_read_out`` (Linear ``d_model -> d_out``). The attribute names and the
  forward pass follow the recall study's own ``GPT2`` model class, so its
  state-dict keys have the same names (that study's trunk has ``n_positions =
  2048`` rows and an unused 50257-row ``wte``, ours ``n_ctx`` rows and one).
  The TransformerBridge reads token ids only, so a continuous model has no
  bridge export.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.model_bridge.sources import build_bridge_from_module
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

from mechlab.models.transformer import Transformer

READ_OUT_BIAS_CHOICES = ("error", "attach")


class GPT2WithReadInOut(nn.Module):
    """A Hugging Face ``GPT2Model`` between a Linear read-in and a Linear read-out.

    Args:
        read_in: ``nn.Linear(d_in, d_model)``.
        backbone: The GPT-2 trunk; it receives ``inputs_embeds`` and adds positions.
        read_out: ``nn.Linear(d_model, d_out)``.
    """

    def __init__(self, read_in: nn.Linear, backbone: GPT2Model, read_out: nn.Linear):
        super().__init__()
        self._read_in = read_in
        self._backbone = backbone
        self._read_out = read_out

    def forward(self, x: Tensor) -> Tensor:
        """``[batch, pos, d_in]`` -> ``[batch, pos, d_out]``."""
        hidden = self._backbone(inputs_embeds=self._read_in(x)).last_hidden_state
        return self._read_out(hidden)


def _require_transformer(model: Any, what: str) -> None:
    """Refuse anything but a mechlab transformer before reading any of its attributes."""
    if not isinstance(model, Transformer):
        arch = getattr(getattr(model, "cfg", None), "arch", None) or type(model).__name__
        raise TypeError(
            f"{what} exports mechlab transformers (GPT-2 is one); got a {arch} model, which has "
            "no GPT-2 equivalent - keep it as a mechlab checkpoint (save_checkpoint)"
            + ("; a token-mode Mamba maps to Hugging Face with mechlab.models.mamba.to_hf_state_dict"
               if arch == "mamba" else "")
        )


def gpt2_config(model: Transformer) -> GPT2Config:
    """The ``GPT2Config`` equivalent to a mechlab transformer's config.

    Args:
        model: A mechlab :class:`Transformer`.

    Returns:
        A config with dropout 0, an untied ``lm_head`` and eager attention.

    Raises:
        TypeError: ``model`` is not a mechlab transformer (an LSTM, Mamba, ...).
        ValueError: When the model has no GPT-2 equivalent (``n_heads * d_head !=
            d_model``, no LayerNorm, ReLU or non-causal attention, as loaded Tracr
            programs have, or the Llama/NeoX/Qwen3/OLMo options: rotary positions,
            RMSNorm or weightless LayerNorms, SiLU, gated MLPs, grouped key/value heads, a
            parallel residual, no MLP, query/key norms, ``clip_qkv``, or Gemma's and OLMo
            2's: norms after the sublayers, scaled embeddings and scores, soft-capping,
            sliding windows). Biases that
            are off export as zeros.
    """
    _require_transformer(model, "gpt2_config")
    cfg = model.cfg
    unlike_gpt2 = [
        what
        for what, differs in (
            (f"normalization={cfg.normalization!r}", cfg.normalization != "LN"),
            (f"act_fn={cfg.act_fn!r}", cfg.act_fn not in ("gelu_new", "gelu")),
            ("causal=False", not cfg.causal),
            ("positional='rotary'", cfg.positional != "learned"),
            ("gated_mlp=True", cfg.gated_mlp),
            ("parallel_attn_mlp=True", cfg.parallel_attn_mlp),
            ("attn_only=True", cfg.attn_only),
            (f"n_key_value_heads={cfg.n_key_value_heads}", cfg.n_key_value_heads != cfg.n_heads),
            ("qk_norm=True", cfg.qk_norm),
            (f"clip_qkv={cfg.clip_qkv}", cfg.clip_qkv is not None),
            ("pre_norms=False", not cfg.pre_norms),
            ("post_norms=True", cfg.post_norms),
            *((f"{name}={getattr(cfg, name)!r}", getattr(cfg, name) is not None) for name in (
                "embed_scale", "attn_scale", "attn_softcap", "final_softcap", "sliding_window")),
        )
        if differs
    ]
    if unlike_gpt2:
        raise ValueError(
            f"GPT-2 has LayerNorms, GELU, causal attention, a position table, one key/value "
            f"head per head and sequential MLP blocks; this model has {', '.join(unlike_gpt2)} "
            "and cannot be exported (keep it as a mechlab checkpoint)"
        )
    if cfg.n_heads * cfg.d_head != cfg.d_model:
        raise ValueError(
            f"GPT-2 needs n_heads * d_head == d_model, got {cfg.n_heads} * {cfg.d_head} "
            f"!= {cfg.d_model}"
        )
    return GPT2Config(
        vocab_size=cfg.d_vocab if cfg.io == "tokens" else 1,
        n_positions=cfg.n_ctx,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_inner=cfg.d_mlp,
        activation_function=cfg.act_fn,
        layer_norm_epsilon=cfg.layer_norm_eps,
        initializer_range=cfg.init_std,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        scale_attn_weights=True,
        tie_word_embeddings=False,
        bos_token_id=None,  # mechlab vocabularies have no GPT-2 special tokens
        eos_token_id=None,
        use_cache=False,
        attn_implementation="eager",
    )


def _copy_or_zero(target: Tensor, source: Tensor | None) -> None:
    """Copy a bias, or zero the target when the mechlab model has none."""
    if source is None:
        target.zero_()
    else:
        target.copy_(source)


@torch.no_grad()
def _copy_trunk(model: Transformer, trunk: GPT2Model) -> None:
    """Copy positions, blocks and the final LayerNorm into a ``GPT2Model``."""
    trunk.wpe.weight.copy_(model.W_pos)
    for block, hf in zip(model.blocks, trunk.h, strict=True):
        attn = block.attn
        # [head, d_model, d_head] -> [d_model, head * d_head], heads in order
        w_qkv = [w.permute(1, 0, 2).flatten(1) for w in (attn.W_Q, attn.W_K, attn.W_V)]
        hf.attn.c_attn.weight.copy_(torch.cat(w_qkv, dim=1))
        b_qkv = [w.new_zeros(w.shape[1]) if b is None else b.flatten()
                 for w, b in zip(w_qkv, attn.biases(), strict=True)]  # fmt: skip
        hf.attn.c_attn.bias.copy_(torch.cat(b_qkv))
        hf.attn.c_proj.weight.copy_(attn.W_O.flatten(0, 1))  # [head * d_head, d_model]
        _copy_or_zero(hf.attn.c_proj.bias, attn.b_O)
        hf.mlp.c_fc.weight.copy_(block.mlp.W_in)
        _copy_or_zero(hf.mlp.c_fc.bias, block.mlp.b_in)
        hf.mlp.c_proj.weight.copy_(block.mlp.W_out)
        _copy_or_zero(hf.mlp.c_proj.bias, block.mlp.b_out)
        for ln, hf_ln in ((block.ln1, hf.ln_1), (block.ln2, hf.ln_2)):
            hf_ln.weight.copy_(ln.w)
            hf_ln.bias.copy_(ln.b)
    trunk.ln_f.weight.copy_(model.ln_final.w)
    trunk.ln_f.bias.copy_(model.ln_final.b)


def _linear_copy(linear: nn.Linear) -> nn.Linear:
    out = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    out.load_state_dict(linear.state_dict())
    return out


def to_hf_gpt2(model: Transformer, read_out_bias: str = "error") -> GPT2LMHeadModel:
    """Copy a token-mode mechlab transformer into a ``GPT2LMHeadModel``.

    Args:
        model: A mechlab :class:`Transformer` with ``io="tokens"``.
        read_out_bias: What to do when the read-out (unembedding) has a non-zero
            bias, which GPT-2's ``lm_head`` lacks: ``"error"`` raises; ``"attach"``
            gives ``lm_head`` a bias (exact in memory, dropped by a
            ``save_pretrained``/``from_pretrained`` round trip). A zero bias is
            always dropped silently.

    Returns:
        The Hugging Face model, in eval mode, on the CPU, in float32, with an
        untied ``lm_head`` (``d_vocab_out`` rows) and eager attention. Its logits
        equal ``model(tokens)``.

    Raises:
        TypeError: ``model`` is not a mechlab transformer (an LSTM, Mamba, ...).
        ValueError: For a continuous model (see :func:`to_hf_gpt2_read_in_out`),
            for a non-zero read-out bias under ``read_out_bias="error"``, or when
            ``n_heads * d_head != d_model``.
    """
    _require_transformer(model, "to_hf_gpt2")
    if read_out_bias not in READ_OUT_BIAS_CHOICES:
        raise ValueError(f"read_out_bias must be one of {READ_OUT_BIAS_CHOICES}")
    cfg = model.cfg
    if cfg.io != "tokens":
        raise ValueError(
            "to_hf_gpt2 exports token-mode models; for io='continuous' use "
            "to_hf_gpt2_read_in_out(model)"
        )
    unembed = model.read_out.proj
    has_bias = bool(unembed.bias.detach().abs().max() > 0)
    if has_bias and read_out_bias == "error":
        raise ValueError(
            "the model's read-out has a non-zero bias, which GPT-2's lm_head cannot hold; "
            "pass read_out_bias='attach' to give lm_head a bias (exact in memory, lost by "
            "save_pretrained/from_pretrained)"
        )
    hf = GPT2LMHeadModel(gpt2_config(model)).float().eval()
    _copy_trunk(model, hf.transformer)
    with torch.no_grad():
        hf.transformer.wte.weight.copy_(model.read_in.embed.weight)
        if has_bias or cfg.d_vocab_out != cfg.d_vocab:
            hf.lm_head = nn.Linear(cfg.d_model, cfg.d_vocab_out, bias=has_bias)
        hf.lm_head.weight.copy_(unembed.weight)
        if has_bias:
            hf.lm_head.bias.copy_(unembed.bias)
    return hf


def to_hf_gpt2_read_in_out(model: Transformer) -> GPT2WithReadInOut:
    """Copy a continuous mechlab transformer into read-in + ``GPT2Model`` + read-out.

    Args:
        model: A mechlab :class:`Transformer` with ``io="continuous"``.

    Returns:
        A :class:`GPT2WithReadInOut` in eval mode whose output equals ``model(x)``.
        The trunk's one-row ``wte`` is unused.

    Raises:
        TypeError: ``model`` is not a mechlab transformer (an LSTM, Mamba, ...).
        ValueError: A token-mode model, or one GPT-2 cannot hold (see :func:`gpt2_config`).
    """
    _require_transformer(model, "to_hf_gpt2_read_in_out")
    if model.cfg.io != "continuous":
        raise ValueError("to_hf_gpt2_read_in_out exports continuous models; use to_hf_gpt2")
    trunk = GPT2Model(gpt2_config(model)).float()
    _copy_trunk(model, trunk)
    exported = GPT2WithReadInOut(
        _linear_copy(model.read_in.proj), trunk, _linear_copy(model.read_out.proj)
    )
    return exported.eval()


def to_transformer_bridge(
    model: Transformer, read_out_bias: str = "error", tokenizer: Any = None
) -> TransformerBridge:
    """Wrap the GPT-2 export of a token-mode model in a TransformerLens ``TransformerBridge``.

    Works offline: the bridge is built around the in-memory Hugging Face model by
    ``build_bridge_from_module`` with the ``GPT2LMHeadModel`` adapter.
    (``TransformerBridge.boot_transformers(name, hf_model=hf)`` works offline only
    when a ``tokenizer=`` is passed too; without one it fetches the tokenizer of
    ``name`` from the Hub.)

    Args:
        model: A token-mode mechlab :class:`Transformer`.
        read_out_bias: As in :func:`to_hf_gpt2`.
        tokenizer: Optional Hugging Face tokenizer for the model's vocabulary. Without
            one the bridge takes token ids only (no strings, no ``to_tokens``).

    Returns:
        The bridge; its logits equal ``model(tokens)``. Call
        ``enable_compatibility_mode(no_processing=True)`` for TransformerLens hook
        names (``blocks.0.hook_resid_post``, ...) with unprocessed numerics that
        match mechlab's cache, and ``set_use_attn_result(True)`` for
        ``attn.hook_result``. Plain ``enable_compatibility_mode()`` also folds the
        LayerNorms and centres the residual stream and the unembedding: activations
        change, and logits shift by a constant per position (softmax unchanged).
    """
    _require_transformer(model, "to_transformer_bridge")
    hf = to_hf_gpt2(model, read_out_bias=read_out_bias)
    return build_bridge_from_module(
        hf,
        "GPT2LMHeadModel",
        hf_config=hf.config,
        tokenizer=tokenizer,
        model_name="mechlab-transformer",
    )
