"""A decoder-only transformer with TransformerLens hook points: GPT-2 by default, and the
options that GPT-NeoX (Pythia), Llama, Qwen2, Mistral, Qwen3, OLMo, OLMo 2, Phi-3, GPT-J,
Gemma 2 and Gemma 3 need.

The default is GPT-2's layout: pre-LayerNorm blocks, a learned position table of
``n_ctx`` rows, causal softmax attention, a GELU MLP, a final LayerNorm, biases
everywhere, no dropout::

    resid_pre  = embed + pos_embed                        (block 0)
    resid_mid  = resid_pre + attn(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid))
    out        = read_out(ln_final(resid_post of the last block))

Options (fields of :class:`TransformerConfig`, validated in ``__post_init__``; the config
and the presets live in :mod:`mechlab.models.transformer_config` and are re-exported here):

* ``positional="rotary"``: no position table; rotary position embeddings rotate the
  first ``rotary_dim`` dimensions of each query and key (all of them by default;
  Pythia rotates a quarter), in the "rotate half" layout of GPT-NeoX and Llama.
* ``rotary_scaling``: scaled rotary frequencies (``linear``, Llama 3's ``llama3``,
  ``yarn``, Phi-3's ``longrope``), computed as Hugging Face computes them (:func:`rotary_inv_freq`);
  ``rotary_adjacent_pairs=True``: rotary embeddings of the adjacent pairs ``(x_{2i},
  x_{2i+1})`` (GPT-J's "rotate every two").
* ``qk_norm=True``: an RMSNorm over ``d_head`` of every query and key head, before the
  rotary embedding (Qwen3); ``clip_qkv=c``: the q, k, v projections clamped to ``[-c, c]``
  (OLMo).
* ``normalization="RMS"``: RMSNorms (``x / sqrt(mean(x^2) + eps) * w``) instead of
  LayerNorms; ``"LNPre"``: LayerNorms without learned weights (OLMo); ``"none"``: no
  normalisation (Tracr's compiled programs).
* ``gated_mlp=True``: ``W_out (act(x W_gate) * (x W_in))`` (SwiGLU with ``act_fn="silu"``).
* ``n_key_value_heads=G`` (< ``n_heads``): grouped-query attention; query head ``h``
  uses key/value head ``h // (n_heads / G)``, as Hugging Face's ``repeat_kv`` does.
* ``parallel_attn_mlp=True``: ``resid_post = resid_pre + attn(ln1(resid_pre)) +
  mlp(ln2(resid_pre))`` (GPT-NeoX's parallel residual); no ``hook_resid_mid``.
* ``attn_only=True``: blocks without an MLP (and without ``ln2``).
* ``qkv_bias`` / ``attn_out_bias`` / ``mlp_bias``: biases of the query/key/value
  projections, of the attention output and of the MLP; a bias that is off is no
  parameter (``attn.b_Q is None``).
* ``tie_embeddings=True``: the token read-out shares its weight with the embedding.
* ``post_norms=True``: norms of the attention and MLP outputs before they are added
  (``ln1_post`` / ``ln2_post``; Gemma 2/3, and OLMo 2 with ``pre_norms=False``, which
  makes ``ln1`` / ``ln2`` the identity); ``qk_norm_over="all"``: the query/key RMSNorm
  over every head together (OLMo 2).
* ``embed_scale`` (the embedding times sqrt(d_model)), ``attn_scale`` (scores over
  sqrt(query_pre_attn_scalar)), ``attn_softcap`` / ``final_softcap`` (``c tanh(x / c)`` of
  the scores and of the read-out), ``sliding_window`` with ``layer_types`` (local and
  global layers) and ``rotary_base_local`` (the local layers' rotary base): Gemma 2/3.
* ``causal=False``: bidirectional attention (Tracr).

Parameters use TransformerLens' names and layouts (``W_Q`` is ``[head, d_model,
d_head]``, ``W_K`` / ``W_V`` ``[kv_head, d_model, d_head]``, ``W_O`` ``[head, d_head,
d_model]``, ``W_in`` / ``W_gate`` ``[d_model, d_mlp]``, ...), and so do the hook points;
``hook_normalized`` is the norm's output *before* its affine ``w, b`` (as in
TransformerLens' bridge and its folded ``LNPre``). With rotary embeddings ``hook_q`` /
``hook_k`` are the projections and ``hook_rot_q`` / ``hook_rot_k`` the rotated ones; with
``qk_norm`` ``hook_q_normed`` / ``hook_k_normed`` are the normalised ones (before the
rotation; TransformerLens' bridge names), and ``attn.q_norm`` / ``attn.k_norm`` have
``hook_scale`` and ``hook_normalized`` of their own; with grouped-query attention ``hook_k`` / ``hook_v`` have ``n_key_value_heads`` heads.

``attn.hook_result`` (``[batch, pos, head, d_model]``, head ``h``'s output
``z_h @ W_O[h]``) is always computed, and the attention output is its sum over
heads plus ``b_O``: one code path, so a forward pass gives bit-identical numbers
whether or not anything is hooked (a fused ``z @ W_O`` would save about 1% of a
training step of the ``tiny`` preset).

This module holds the block and the model; their parts live beside it, one job a module,
and are re-exported here: the norms in :mod:`mechlab.models.norms`, the rotary embeddings
in :mod:`mechlab.models.rotary`, the attention and the MLP in
:mod:`mechlab.models.sublayers`.

:func:`mechlab.models.importers.from_pretrained` fills these models from Hugging Face
GPT-2, GPT-NeoX, Llama, Qwen2, Mistral, Qwen3, OLMo, OLMo 2, Phi-3, GPT-J, Gemma 2 and
Gemma 3 checkpoints.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mechlab.models.base import MechModel, ReadIn, ReadOut
from mechlab.models.norms import (
    HeadsRMSNorm,
    LayerNorm,
    LayerNormPre,
    NoNorm,
    RMSNorm,
    make_norm,
)
from mechlab.models.rotary import Rotary, rotary_inv_freq
from mechlab.models.sublayers import MLP, Attention, activation, causal_mask
from mechlab.models.transformer_config import (
    ACT_FNS,
    LAYER_TYPES,
    NORMALIZATIONS,
    POSITIONALS,
    PRESETS,
    QK_NORM_OVER,
    ROPE_SCALINGS,
    TransformerConfig,
)

# The config and presets (mechlab.models.transformer_config) and the block's parts (norms,
# rotary, sublayers) are re-exported here, where the registry
# (mechlab.models.registry.FAMILIES) and users import them.
__all__ = [
    "ACT_FNS",
    "LAYER_TYPES",
    "MLP",
    "NORMALIZATIONS",
    "POSITIONALS",
    "PRESETS",
    "QK_NORM_OVER",
    "ROPE_SCALINGS",
    "Attention",
    "HeadsRMSNorm",
    "LayerNorm",
    "LayerNormPre",
    "NoNorm",
    "RMSNorm",
    "Rotary",
    "Transformer",
    "TransformerBlock",
    "TransformerConfig",
    "activation",
    "causal_mask",
    "make_norm",
    "rotary_inv_freq",
]


class TransformerBlock(nn.Module):
    """Pre-norm block: ``resid += attn(ln1(resid)); resid += mlp(ln2(resid))``; with
    ``parallel_attn_mlp`` ``resid += attn(ln1(resid)) + mlp(ln2(resid))``; with
    ``attn_only`` the attention alone. With ``post_norms`` the attention and MLP outputs
    pass through ``ln1_post`` / ``ln2_post`` before they are added (``hook_attn_out`` /
    ``hook_mlp_out`` are the normed outputs, as in TransformerLens' Gemma 2); without
    ``pre_norms`` ``ln1`` / ``ln2`` are the identity (:class:`NoNorm`)."""

    def __init__(self, cfg: TransformerConfig, layer: int = 0):
        super().__init__()
        self.parallel = cfg.parallel_attn_mlp
        self.ln1 = make_norm(cfg) if cfg.pre_norms else NoNorm()
        self.attn = Attention(cfg, layer)
        self.ln1_post = make_norm(cfg) if cfg.post_norms else None
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.ln2 = self.mlp = self.ln2_post = None
        if not cfg.attn_only:
            self.ln2 = make_norm(cfg) if cfg.pre_norms else NoNorm()
            self.mlp = MLP(cfg)
            self.ln2_post = make_norm(cfg) if cfg.post_norms else None
            if not self.parallel:
                self.hook_resid_mid = HookPoint()
            self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self, resid: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self._post(self.ln1_post, self.attn(self.ln1(resid))))
        if self.mlp is None:
            return self.hook_resid_post(resid + attn_out)
        if self.parallel:
            mlp_out = self.hook_mlp_out(self._post(self.ln2_post, self.mlp(self.ln2(resid))))
            return self.hook_resid_post(resid + attn_out + mlp_out)
        resid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self._post(self.ln2_post, self.mlp(self.ln2(resid))))
        return self.hook_resid_post(resid + mlp_out)

    @staticmethod
    def _post(norm: nn.Module | None, x: Tensor) -> Tensor:
        return x if norm is None else norm(x)


def _reset_norm(norm: nn.Module | None) -> None:
    if hasattr(norm, "w"):
        nn.init.ones_(norm.w)
    if hasattr(norm, "b"):
        nn.init.zeros_(norm.b)


_D = ("batch", "pos", "d_model")
_HEADS = ("batch", "pos", "head", "d_head")
_KV_HEADS = ("batch", "pos", "kv_head", "d_head")
_ATTN = ("batch", "head", "query_pos", "key_pos")
_SCALE = ("batch", "pos", "one")


class Transformer(MechModel):
    """Decoder: read-in (+ positions), pre-norm blocks, final norm, read-out.

    Args:
        cfg: The model's :class:`TransformerConfig`.
    """

    HOOK_AXES: ClassVar[dict[str, tuple[str, ...]]] = {
        "hook_pos_embed": _D,
        "blocks.*.ln1.hook_scale": _SCALE,
        "blocks.*.ln1.hook_normalized": _D,
        "blocks.*.attn.hook_q": _HEADS,
        "blocks.*.attn.hook_k": _KV_HEADS,
        "blocks.*.attn.hook_v": _KV_HEADS,
        "blocks.*.attn.q_norm.hook_scale": ("batch", "pos", "head", "one"),
        "blocks.*.attn.q_norm.hook_normalized": _HEADS,
        "blocks.*.attn.k_norm.hook_scale": ("batch", "pos", "kv_head", "one"),
        "blocks.*.attn.k_norm.hook_normalized": _KV_HEADS,
        "blocks.*.attn.hook_q_normed": _HEADS,
        "blocks.*.attn.hook_k_normed": _KV_HEADS,
        "blocks.*.attn.hook_rot_q": _HEADS,
        "blocks.*.attn.hook_rot_k": _KV_HEADS,
        "blocks.*.attn.hook_attn_scores": _ATTN,
        "blocks.*.attn.hook_pattern": _ATTN,
        "blocks.*.attn.hook_z": _HEADS,
        "blocks.*.attn.hook_result": ("batch", "pos", "head", "d_model"),
        "blocks.*.ln1_post.hook_scale": _SCALE,
        "blocks.*.ln1_post.hook_normalized": _D,
        "blocks.*.hook_attn_out": _D,
        "blocks.*.hook_resid_mid": _D,
        "blocks.*.ln2.hook_scale": _SCALE,
        "blocks.*.ln2.hook_normalized": _D,
        "blocks.*.mlp.hook_pre": ("batch", "pos", "d_mlp"),
        "blocks.*.mlp.hook_pre_linear": ("batch", "pos", "d_mlp"),
        "blocks.*.mlp.hook_post": ("batch", "pos", "d_mlp"),
        "blocks.*.ln2_post.hook_scale": _SCALE,
        "blocks.*.ln2_post.hook_normalized": _D,
        "blocks.*.hook_mlp_out": _D,
        "ln_final.hook_scale": _SCALE,
        "ln_final.hook_normalized": _D,
    }

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.read_in = ReadIn(cfg)
        if cfg.positional == "learned":
            self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        else:
            self.W_pos = None
        self.blocks = nn.ModuleList(TransformerBlock(cfg, i) for i in range(cfg.n_layers))
        self.ln_final = make_norm(cfg)
        self.read_out = ReadOut(cfg)
        if cfg.tie_embeddings:
            self.read_out.proj.weight = self.read_in.embed.weight
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, d_output]
        self.init_weights()
        self.setup()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter as described in :class:`TransformerConfig`."""
        std = self.cfg.init_std
        resid_std = std / math.sqrt(2 * self.cfg.n_layers)
        if self.W_pos is not None:
            nn.init.normal_(self.W_pos, std=std)
        for block in self.blocks:
            for ln in (block.ln1, block.ln2, block.ln1_post, block.ln2_post):
                _reset_norm(ln)
            attn, mlp = block.attn, block.mlp
            _reset_norm(attn.q_norm)
            _reset_norm(attn.k_norm)
            weights, out_weights, biases = (
                [attn.W_Q, attn.W_K, attn.W_V],
                [attn.W_O],
                attn.biases() + [attn.b_O],
            )
            if mlp is not None:
                weights += [mlp.W_in] + ([mlp.W_gate] if mlp.gated else [])
                out_weights.append(mlp.W_out)
                biases += [mlp.b_in, mlp.b_out] + ([mlp.b_gate] if mlp.gated else [])
            for w in weights:
                nn.init.normal_(w, std=std)
            for w in out_weights:
                nn.init.normal_(w, std=resid_std)
            for b in biases:
                if b is not None:
                    nn.init.zeros_(b)
        _reset_norm(self.ln_final)
        if self.cfg.io == "tokens":
            nn.init.normal_(self.read_in.embed.weight, std=std)
            if not self.cfg.tie_embeddings:
                nn.init.normal_(self.read_out.proj.weight, std=std)
            nn.init.zeros_(self.read_out.proj.bias)
        else:
            self.read_in.proj.reset_parameters()
            self.read_out.proj.reset_parameters()

    def tokens_to_residual_directions(self, tokens: int | Tensor) -> Float[Tensor, "... d_model"]:
        """The residual-stream direction that the read-out reads output ``tokens`` from.

        That is the read-out row ``W_U[:, k]`` times the final LayerNorm's weight:
        ``out[..., k] = (normalized * ln_final.w) @ W_U[:, k] + const``, with
        ``normalized`` the centred, scaled stream (what ``cache.apply_ln_to_stack``
        gives). So ``cache.logit_attrs(stack, k)`` summed over a complete decomposition
        is ``out[..., k]`` minus the constant ``ln_final.b @ W_U[:, k] + b_U[k]``
        (TransformerLens gets the same by folding the LayerNorm into ``W_U``). With
        ``final_softcap`` (Gemma 2) ``out`` here is the logit *before* the cap, which is
        monotone in it.

        Args:
            tokens: An output index ``k`` (a continuous output dim or a token id), or a
                tensor of them.

        Returns:
            ``[d_model]`` for one index, ``[*tokens.shape, d_model]`` for a tensor.
        """
        if isinstance(tokens, Tensor) and tokens.numel() == 1:
            tokens = int(tokens.item())
        if not isinstance(tokens, (int, Tensor)) or isinstance(tokens, bool):
            raise ValueError(
                f"tokens must be an output index or a tensor of them, not {type(tokens).__name__} "
                "(mechlab models have no tokenizer)"
            )
        if isinstance(self.ln_final, (LayerNorm, RMSNorm)):
            folded = self.W_U * self.ln_final.w[:, None]  # [d_model, d_output]
        else:
            folded = self.W_U
        return folded[:, tokens].movedim(0, -1)

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
    ) -> Float[Tensor, " d_model"]:
        """Sum of the biases written into the residual stream before block ``layer``.

        Args:
            layer: Blocks ``0 .. layer - 1`` count (``n_layers``: all of them).
            mlp_input: Also count block ``layer``'s attention bias ``b_O``.
            include_mlp_biases: Count each MLP's ``b_out`` (leave it out when the MLP
                outputs, which include it, are in the decomposition whole).

        Returns:
            ``[d_model]``.
        """
        total = torch.zeros(self.cfg.d_model, device=self.cfg.device, dtype=self.cfg.dtype)
        for block in self.blocks[:layer]:
            if block.attn.b_O is not None:
                total = total + block.attn.b_O
            if include_mlp_biases and block.mlp is not None and block.mlp.b_out is not None:
                total = total + block.mlp.b_out
        if mlp_input:
            if layer >= self.cfg.n_layers:
                raise ValueError(
                    f"mlp_input needs layer < n_layers={self.cfg.n_layers}, got {layer}"
                )
            if self.blocks[layer].attn.b_O is not None:
                total = total + self.blocks[layer].attn.b_O
        return total

    def forward(self, x: Tensor) -> Float[Tensor, "batch pos d_output"]:
        """Run the model.

        Args:
            x: ``[batch, pos, d_in]`` floats (continuous) or ``[batch, pos]`` token ids.

        Returns:
            ``[batch, pos, d_output]`` predictions (continuous) or logits (tokens).
        """
        batch, n_pos = x.shape[:2]
        self.check_length(n_pos)
        resid = self.hook_embed(self.read_in(x))  # [batch, pos, d_model]
        if self.W_pos is not None:
            resid = resid + self.hook_pos_embed(self.W_pos[:n_pos].expand(batch, n_pos, -1).clone())
        for block in self.blocks:
            resid = block(resid)
        return self.hook_out(self.read_out(self.ln_final(resid)))
