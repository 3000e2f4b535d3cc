"""The rotary embedding of a Hugging Face config as mechlab's options: ``rope_theta``, the
share of each head rotated, and its scaling (``linear``, ``llama3``, ``yarn``, ``longrope``)
as :class:`~mechlab.models.transformer_config.TransformerConfig`'s ``rotary_scaling``, every
value resolved as Hugging Face's ``_compute_*_parameters`` resolve it (the frequencies
themselves: :func:`mechlab.models.rotary.rotary_inv_freq`).
"""

from __future__ import annotations

import math
from typing import Any

from mechlab.models.hf_files import ImportProblem

__all__ = ["ROPE_TYPES", "rotary_settings"]


ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")
"""The ``rope_type`` values :func:`~mechlab.models.importers.from_pretrained` imports."""


def rotary_settings(
    hf: Any, arch: str, params: dict | None = None
) -> tuple[float, float, dict | None]:
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
    if (
        attention_factor is None
        and isinstance(factor, (int, float))
        and isinstance(old_len, (int, float))
    ):
        attention_factor = (
            1.0
            if factor <= 1 or old_len <= 1
            else math.sqrt(1 + math.log(factor) / math.log(old_len))
        )
    short, long = params.get("short_factor"), params.get("long_factor")
    return {"rope_type": "longrope", "original_max_position_embeddings": old_len,
            "short_factor": [float(v) for v in short] if isinstance(short, list) else short,
            "long_factor": [float(v) for v in long] if isinstance(long, list) else long,
            "attention_factor": float(attention_factor) if isinstance(attention_factor, (int, float)) else attention_factor}  # fmt: skip
