"""The two sublayers of a :class:`~mechlab.models.transformer.Transformer` block: the
attention (:class:`Attention`: causal or bidirectional, grouped-query, rotary positions,
sliding windows, soft-capped scores, query/key norms, clipped projections) and the MLP
(:class:`MLP`: plain or gated), in TransformerLens' parameter layouts and with its hook
points. A bias that is off is no parameter (None).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mechlab.models.buffers import cache_buffer
from mechlab.models.norms import HeadsRMSNorm, RMSNorm
from mechlab.models.rotary import Rotary
from mechlab.models.transformer_config import TransformerConfig

__all__ = ["MLP", "Attention", "activation", "causal_mask"]


def _bias(enabled: bool, *shape: int) -> nn.Parameter | None:
    return nn.Parameter(torch.zeros(*shape)) if enabled else None


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
