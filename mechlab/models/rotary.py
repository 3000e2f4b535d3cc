"""Rotary position embeddings of :class:`~mechlab.models.transformer.Transformer`'s
queries and keys: the inverse frequencies, plain or scaled (``linear``, Llama 3's
``llama3``, ``yarn``, Phi-3's ``longrope``) as Hugging Face computes them
(:func:`rotary_inv_freq`), and the rotation itself in the "rotate half" layout of GPT-NeoX
and Llama or GPT-J's "rotate every two" (:class:`Rotary`).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor, nn

__all__ = ["Rotary", "rotary_inv_freq"]


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
