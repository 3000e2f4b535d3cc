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

:func:`mechlab.models.importers.from_pretrained` fills these models from Hugging Face
GPT-2, GPT-NeoX, Llama, Qwen2, Mistral, Qwen3, OLMo, OLMo 2, Phi-3, GPT-J, Gemma 2 and
Gemma 3 checkpoints.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mechlab.models.base import MechModel, ReadIn, ReadOut
from mechlab.models.buffers import cache_buffer
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

# The config and presets live in mechlab.models.transformer_config; they are re-exported
# here, where the registry (mechlab.models.registry.FAMILIES) and users import them.
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


def _wide(x: Tensor) -> Tensor:
    """``x`` in float32 at least (a bfloat16 or float16 norm input; float64 stays)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class LayerNorm(nn.Module):
    """LayerNorm with ``hook_scale`` ``[batch, pos, 1]`` and ``hook_normalized`` (pre-affine)."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d_model))
        self.b = nn.Parameter(torch.zeros(d_model))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        dtype = x.dtype  # computed in float32 (or wider), hooked and returned in x's dtype
        x = _wide(x)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt().to(dtype))
        x = self.hook_normalized((x / scale.to(x.dtype)).to(dtype))
        return (x * self.w + self.b).to(dtype)


class RMSNorm(nn.Module):
    """RMSNorm ``x / sqrt(mean(x^2) + eps) * w`` with ``hook_scale`` and ``hook_normalized``."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d_model))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        dtype = x.dtype  # as Hugging Face: the mean square in float32, the result in x's dtype
        x32 = _wide(x)
        scale = self.hook_scale((x32.pow(2).mean(-1, keepdim=True) + self.eps).sqrt().to(dtype))
        return (self.hook_normalized((x32 / scale.to(x32.dtype)).to(dtype)) * self.w).to(dtype)


class HeadsRMSNorm(RMSNorm):
    """An RMSNorm over all the heads of a ``[batch, pos, head, d_head]`` input together
    (OLMo 2's query/key norm over the whole projection): ``w`` is ``[head * d_head]``,
    ``hook_scale`` ``[batch, pos, head, 1]`` (the one root mean square, repeated per head, so
    its axes are a per-head norm's), ``hook_normalized`` ``[batch, pos, head, d_head]``."""

    def forward(
        self, x: Float[Tensor, "batch pos head d_head"]
    ) -> Float[Tensor, "batch pos head d_head"]:
        dtype, x32 = x.dtype, _wide(x)
        rms = (x32.pow(2).mean((-2, -1), keepdim=True) + self.eps).sqrt()  # [batch, pos, 1, 1]
        scale = self.hook_scale(rms.expand(*x.shape[:-1], 1).to(dtype))
        normalized = self.hook_normalized((x32 / scale.to(x32.dtype)).to(dtype))
        return (normalized * self.w.view(x.shape[-2:])).to(dtype)


class LayerNormPre(LayerNorm):
    """A LayerNorm without learned weights (OLMo's): ``w`` and ``b`` are constant buffers of
    ones and zeros (not parameters, not saved), so every tool that reads a LayerNorm's
    ``w, b`` reads this one too."""

    def __init__(self, d_model: int, eps: float):
        nn.Module.__init__(self)
        self.eps = eps
        self.register_buffer("w", torch.ones(d_model), persistent=False)
        self.register_buffer("b", torch.zeros(d_model), persistent=False)
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]


class NoNorm(nn.Module):
    """The identity in place of a LayerNorm (``normalization="none"``), with ``hook_normalized``."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return self.hook_normalized(x)


def make_norm(cfg: TransformerConfig) -> nn.Module:
    """The block's normalisation: a :class:`LayerNorm`, an :class:`RMSNorm`, a
    :class:`LayerNormPre` (``"LNPre"``) or, with ``normalization="none"``, a :class:`NoNorm`."""
    if cfg.normalization == "LN":
        return LayerNorm(cfg.d_model, cfg.layer_norm_eps)
    if cfg.normalization == "RMS":
        return RMSNorm(cfg.d_model, cfg.layer_norm_eps)
    if cfg.normalization == "LNPre":
        return LayerNormPre(cfg.d_model, cfg.layer_norm_eps)
    return NoNorm()


def _bias(enabled: bool, *shape: int) -> nn.Parameter | None:
    return nn.Parameter(torch.zeros(*shape)) if enabled else None


def rotary_inv_freq(
    dim: int, base: float, scaling: dict | None = None, long: bool = False
) -> Tensor:
    """The rotary inverse frequencies ``base^(-2i / dim)``, ``i < dim / 2``, scaled as
    ``scaling`` says (:class:`TransformerConfig`'s ``rotary_scaling``), in float32 with
    Hugging Face's arithmetic (``_compute_*_parameters`` of ``modeling_rope_utils``).

    Args:
        dim: Rotated dimensions per head (even).
        base: The frequencies' base (``rope_theta``).
        scaling: None, or a ``linear``, ``llama3``, ``yarn`` or ``longrope`` scaling.
        long: ``longrope``'s frequencies for sequences longer than its
            ``original_max_position_embeddings`` (``long_factor``); else ``short_factor``'s.

    Returns:
        ``[dim / 2]`` float32.
    """
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if scaling is not None and scaling["rope_type"] == "longrope":  # one factor per frequency
        ext = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
        return 1.0 / (ext * base**exponents)
    inv_freq = 1.0 / (base**exponents)
    if scaling is None:
        return inv_freq
    kind, factor = scaling["rope_type"], scaling["factor"]
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        old_len = scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        divided = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * divided / factor + smooth * divided
        medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
        return torch.where(medium, smoothed, divided)
    # yarn: a linear ramp over the dimensions between the original and the divided frequencies
    old_len = scaling["original_max_position_embeddings"]

    def correction_dim(n_rotations: float) -> float:
        return dim * math.log(old_len / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = correction_dim(scaling["beta_fast"]), correction_dim(scaling["beta_slow"])
    if scaling["truncate"]:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    keep = 1 - ramp  # the share of the original (extrapolated) frequency
    return 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep


class Rotary(nn.Module):
    """Rotary position embeddings of the first ``dim`` dimensions.

    Position ``t`` rotates the pair ``(x_i, x_{i + dim/2})`` ("rotate half", GPT-NeoX and
    Llama) or, with ``adjacent_pairs``, the pair ``(x_{2i}, x_{2i+1})`` ("rotate every
    two", GPT-J) by the angle ``t * inv_freq[i]``, ``i < dim / 2``, with ``inv_freq`` from
    :func:`rotary_inv_freq` (``base^(-2i / dim)``, or scaled); the dimensions past ``dim``
    pass unchanged (partial rotary, as in GPT-NeoX). YaRN's and LongRoPE's scalings also
    multiply ``cos`` and ``sin`` by their ``attention_factor``; LongRoPE's frequencies are its
    long ones for a sequence longer than its ``original_max_position_embeddings`` (every
    position then, as Hugging Face's ``longrope_frequency_update`` chooses from the longest
    position id). The same arithmetic as Hugging Face's ``apply_rotary_pos_emb``.
    """

    def __init__(
        self, dim: int, base: float, scaling: dict | None = None, adjacent_pairs: bool = False
    ):
        super().__init__()
        self.dim = dim
        self.adjacent_pairs = adjacent_pairs
        self.attention_factor = (
            float(scaling["attention_factor"]) if scaling and "attention_factor" in scaling else 1.0
        )
        inv_freq = rotary_inv_freq(dim, base, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [dim / 2]
        # longrope: its long frequencies for sequences longer than this
        self.long_after: int | None = None
        if scaling is not None and scaling["rope_type"] == "longrope":
            self.long_after = int(scaling["original_max_position_embeddings"])
            long_freq = rotary_inv_freq(dim, base, scaling, long=True)
            self.register_buffer("long_inv_freq", long_freq, persistent=False)  # [dim / 2]

    def cos_sin(self, n_pos: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """``cos, sin`` of every position's angles, ``[pos, dim]`` each, in ``like``'s dtype
        (each angle twice: ``[a_0 .. a_{dim/2-1}, a_0 ..]``, or ``[a_0, a_0, a_1, a_1, ..]``
        with adjacent pairs)."""
        t = torch.arange(n_pos, device=self.inv_freq.device, dtype=torch.float32)
        inv_freq = self.inv_freq
        if self.long_after is not None and n_pos > self.long_after:
            inv_freq = self.long_inv_freq
        freqs = t[:, None] * inv_freq.float()  # [pos, dim / 2]
        if self.adjacent_pairs:
            angles = freqs.repeat_interleave(2, dim=-1)  # [pos, dim]
        else:
            angles = torch.cat([freqs, freqs], dim=-1)  # [pos, dim]
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(like.dtype), sin.to(like.dtype)

    def forward(
        self, x: Float[Tensor, "batch pos head d_head"]
    ) -> Float[Tensor, "batch pos head d_head"]:
        cos, sin = self.cos_sin(x.shape[1], x)
        cos, sin = cos[:, None], sin[:, None]  # [pos, 1, dim]
        x_rot, x_pass = x[..., : self.dim], x[..., self.dim :]
        if self.adjacent_pairs:
            x1, x2 = x_rot[..., ::2], x_rot[..., 1::2]
            rotated = torch.stack([-x2, x1], dim=-1).flatten(-2)
        else:
            x1, x2 = x_rot.chunk(2, dim=-1)
            rotated = torch.cat([-x2, x1], dim=-1)
        return torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1)


def causal_mask(n_pos: int, device: torch.device, window: int | None = None) -> Tensor:
    """``[pos, pos]`` bool, True where a query may *not* attend (a key after it, or, with a
    sliding ``window``, a key ``window`` or more positions before it)."""
    mask = torch.ones(n_pos, n_pos, dtype=torch.bool, device=device).triu_(1)
    if window is not None:
        mask |= torch.ones(n_pos, n_pos, dtype=torch.bool, device=device).tril_(-window)
    return mask


class Attention(nn.Module):
    """Multi-head softmax attention (causal unless ``cfg.causal`` is False; grouped
    key/value heads with ``n_key_value_heads < n_heads``), per-head outputs summed into
    ``d_model``."""

    def __init__(self, cfg: TransformerConfig, layer: int = 0):
        super().__init__()
        h, g, d, m = cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.d_model
        self.n_groups = cfg.n_groups
        self.W_Q = nn.Parameter(torch.empty(h, m, d))
        self.W_K = nn.Parameter(torch.empty(g, m, d))
        self.W_V = nn.Parameter(torch.empty(g, m, d))
        self.W_O = nn.Parameter(torch.empty(h, d, m))
        self.b_Q = _bias(cfg.qkv_bias, h, d)
        self.b_K = _bias(cfg.qkv_bias, g, d)
        self.b_V = _bias(cfg.qkv_bias, g, d)
        self.b_O = _bias(cfg.attn_out_bias, m)
        self.causal = cfg.causal
        self.scale = math.sqrt(d) if cfg.attn_scale is None else float(cfg.attn_scale)
        self.softcap = cfg.attn_softcap
        self.window = cfg.sliding_window if cfg.sliding(layer) else None
        base, scaling = cfg.rotary_base, cfg.rotary_scaling
        if self.window is not None and cfg.rotary_base_local is not None:  # Gemma 3's local layers
            base, scaling = cfg.rotary_base_local, None
        self.rotary = (
            Rotary(cfg.rotary_dim, base, scaling, cfg.rotary_adjacent_pairs)
            if cfg.positional == "rotary"
            else None
        )
        self.clip_qkv = cfg.clip_qkv
        self.q_norm = self.k_norm = None
        if cfg.qk_norm and cfg.qk_norm_over == "all":  # over every head together (OLMo 2)
            self.q_norm = HeadsRMSNorm(h * d, cfg.layer_norm_eps)
            self.k_norm = HeadsRMSNorm(g * d, cfg.layer_norm_eps)
        elif cfg.qk_norm:  # per head, over d_head: [batch, pos, head, d_head] as a [..., d] input
            self.q_norm = RMSNorm(d, cfg.layer_norm_eps)
            self.k_norm = RMSNorm(d, cfg.layer_norm_eps)

        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, kv_head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, kv_head, d_head]
        if cfg.qk_norm:
            self.hook_q_normed = HookPoint()  # [batch, pos, head, d_head]
            self.hook_k_normed = HookPoint()  # [batch, pos, kv_head, d_head]
        if self.rotary is not None:
            self.hook_rot_q = HookPoint()  # [batch, pos, head, d_head]
            self.hook_rot_k = HookPoint()  # [batch, pos, kv_head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]

    def biases(self) -> list[Tensor | None]:
        """``[b_Q, b_K, b_V]`` (None where a bias is off)."""
        return [self.b_Q, self.b_K, self.b_V]

    def project(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor]:
        """``q, k, v`` ``[batch, pos, head | kv_head, d_head]``: the projections plus biases,
        clamped with ``clip_qkv``."""
        q = torch.einsum("bpm,hmd->bphd", x, self.W_Q)
        k = torch.einsum("bpm,hmd->bphd", x, self.W_K)
        v = torch.einsum("bpm,hmd->bphd", x, self.W_V)
        if self.b_Q is not None:
            q, k, v = q + self.b_Q, k + self.b_K, v + self.b_V
        return self.clip(q), self.clip(k), self.clip(v)

    def clip(self, x: Tensor) -> Tensor:
        """``x`` clamped to ``[-clip_qkv, clip_qkv]`` (unchanged without ``clip_qkv``)."""
        return x if self.clip_qkv is None else x.clamp(-self.clip_qkv, self.clip_qkv)

    def position(
        self,
        q: Float[Tensor, "batch pos head d_head"],
        k: Float[Tensor, "batch pos kv_head d_head"],
    ) -> tuple[Tensor, Tensor]:
        """Queries and keys as the scores read them: through ``q_norm`` / ``k_norm`` (with
        ``qk_norm``), then rotated (rotary positions), without hooks (the masked forward of
        :mod:`mechlab.prune.forward` uses this; :meth:`forward` hooks each step)."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        return q, k

    def scores(
        self,
        q: Float[Tensor, "batch pos head d_head"],
        k: Float[Tensor, "batch pos kv_head d_head"],
        out: Tensor | None = None,
    ) -> Float[Tensor, "batch head query_pos key_pos"]:
        """Masked attention scores of (rotated) queries and keys, ``q . k / scale``,
        soft-capped with ``attn_softcap``; each key/value head serves ``n_groups``
        consecutive query heads; a sliding-window layer masks the keys ``window`` or more
        positions back. ``out``: memory to write them into (``[batch, head, query_pos,
        key_pos]``, no autograd), e.g. a cache buffer."""
        if self.n_groups > 1:
            k = k.repeat_interleave(self.n_groups, dim=2)  # [batch, pos, head, d_head]
        batch, n_q, n_heads, d_head = q.shape
        n_k = k.shape[1]
        # The [batch, head, query_pos, key_pos] tensors dominate the memory traffic, so
        # allocate only two of them: scale q rather than the scores, mask in place.
        q_bh = (q / self.scale).transpose(1, 2).reshape(batch * n_heads, n_q, d_head)
        k_bh = k.permute(0, 2, 3, 1).reshape(batch * n_heads, d_head, n_k)
        flat = None if out is None else out.view(batch * n_heads, n_q, n_k)
        scores = torch.bmm(q_bh, k_bh, out=flat).view(batch, n_heads, n_q, n_k)
        if self.softcap is not None:
            if scores.requires_grad:  # (tanh_ saves its output, which mul_ would overwrite)
                scores = torch.tanh(scores / self.softcap) * self.softcap
            else:
                scores.div_(self.softcap).tanh_().mul_(self.softcap)
        if self.causal:
            scores.masked_fill_(causal_mask(n_q, q.device, self.window), float("-inf"))
        return scores

    def mix_values(
        self,
        pattern: Float[Tensor, "batch head query_pos key_pos"],
        v: Float[Tensor, "batch pos kv_head d_head"],
    ) -> Float[Tensor, "batch pos head d_head"]:
        """``z``: each query head's pattern applied to its key/value head's values."""
        if self.n_groups > 1:
            v = v.repeat_interleave(self.n_groups, dim=2)
        return torch.einsum("bhqk,bkhd->bqhd", pattern, v)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        q, k, v = self.project(x)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if self.q_norm is not None:
            q, k = self.hook_q_normed(self.q_norm(q)), self.hook_k_normed(self.k_norm(k))
        if self.rotary is not None:
            q, k = self.hook_rot_q(self.rotary(q)), self.hook_rot_k(self.rotary(k))
        # A cache that keeps the maps gets them written into reused memory (models/buffers.py)
        maps = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])  # [batch, head, query_pos, key_pos]
        grad = q.requires_grad or k.requires_grad
        scores = self.scores(q, k, out=cache_buffer(self.hook_attn_scores, maps, q, grad))
        scores = self.hook_attn_scores(scores)
        pattern_out = cache_buffer(self.hook_pattern, maps, q, grad or scores.requires_grad)
        pattern = self.hook_pattern(torch.softmax(scores, dim=-1, out=pattern_out))
        z = self.hook_z(self.mix_values(pattern, v))
        result = self.hook_result(torch.einsum("bqhd,hdm->bqhm", z, self.W_O))
        out = result.sum(dim=2)
        return out if self.b_O is None else out + self.b_O


def activation(act_fn: str, x: Tensor) -> Tensor:
    """``act_fn`` (one of :data:`ACT_FNS`) applied to ``x``."""
    if act_fn == "relu":
        return F.relu(x)
    if act_fn == "silu":
        return F.silu(x)
    return F.gelu(x, approximate="tanh" if act_fn == "gelu_new" else "none")


class MLP(nn.Module):
    """``W_out act(W_in x + b_in) + b_out``, or gated ``W_out (act(W_gate x + b_gate) *
    (W_in x + b_in)) + b_out``, with ``hook_pre`` (the activation's input), ``hook_pre_linear``
    (gated: ``W_in x + b_in``) and ``hook_post`` ``[batch, pos, d_mlp]``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.gated = cfg.gated_mlp
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = _bias(cfg.mlp_bias, cfg.d_mlp)
        if self.gated:
            self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
            self.b_gate = _bias(cfg.mlp_bias, cfg.d_mlp)
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = _bias(cfg.mlp_bias, cfg.d_model)
        self.act_fn = cfg.act_fn
        self.hook_pre = HookPoint()
        if self.gated:
            self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    @staticmethod
    def _affine(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        return x @ w if b is None else x @ w + b

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.gated:
            pre = self.hook_pre(self._affine(x, self.W_gate, self.b_gate))
            linear = self.hook_pre_linear(self._affine(x, self.W_in, self.b_in))
            post = self.hook_post(activation(self.act_fn, pre) * linear)
        else:
            pre = self.hook_pre(self._affine(x, self.W_in, self.b_in))
            post = self.hook_post(activation(self.act_fn, pre))
        return self._affine(post, self.W_out, self.b_out)


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
