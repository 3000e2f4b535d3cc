"""The normalisations of :class:`~mechlab.models.transformer.Transformer`: LayerNorm,
RMSNorm (per vector, or over every head together), weightless LayerNorm and none, with
TransformerLens' ``hook_scale`` and ``hook_normalized`` (the output *before* the affine
``w, b``; the identity has only the latter). The norms compute in float32 at least and
return their input's dtype, as Hugging Face does.

:func:`make_norm` picks one from a config's ``normalization``.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mechlab.models.transformer_config import TransformerConfig

__all__ = ["HeadsRMSNorm", "LayerNorm", "LayerNormPre", "NoNorm", "RMSNorm", "make_norm"]


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
