"""The options of :class:`~mechlab.models.transformer.Transformer`: its config dataclass
(validated in ``__post_init__``), the choices of its string fields and the named presets.

:mod:`mechlab.models.transformer` re-exports every name here, so
``from mechlab.models.transformer import TransformerConfig, PRESETS`` keeps working; the
layers and the model read the config from this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mechlab.models.base import ModelConfig

ACT_FNS = ("gelu_new", "gelu", "relu", "silu")
NORMALIZATIONS = ("LN", "RMS", "LNPre", "none")
ROPE_SCALINGS = ("linear", "llama3", "yarn", "longrope")
# the keys each rotary scaling needs (Hugging Face's names)
_ROPE_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
             "truncate"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings", "attention_factor"),
}  # fmt: skip
_ROPE_LISTS = ("short_factor", "long_factor")  # longrope's per-frequency factors, one per rotated pair
POSITIONALS = ("learned", "rotary")
QK_NORM_OVER = ("head", "all")
LAYER_TYPES = ("full_attention", "sliding_attention")

# The recall study's models (Daniels et al. 2025): 57-dim tokens in, 5-dim states
# out, 251 positions. Parameter counts: 212,189 / 701,381 / 2,419,717 / 10,737,413.
_RECALL_IO = {"io": "continuous", "d_in": 57, "d_out": 5, "n_ctx": 251}
PRESETS: dict[str, dict] = {
    "tiny": {"d_model": 72, "n_layers": 3, "n_heads": 6, **_RECALL_IO},
    "small": {"d_model": 96, "n_layers": 6, "n_heads": 6, **_RECALL_IO},
    "medium": {"d_model": 128, "n_layers": 12, "n_heads": 8, **_RECALL_IO},
    "big": {"d_model": 192, "n_layers": 24, "n_heads": 12, **_RECALL_IO},
    # The state-tracking study's GPT-2 style models (vocabulary and n_ctx come from the task).
    "st_transformer_6x256": {"d_model": 256, "n_layers": 6, "n_heads": 4},
    "st_transformer_2x256": {"d_model": 256, "n_layers": 2, "n_heads": 4},
    "st_transformer_small": {"d_model": 64, "n_layers": 2, "n_heads": 4},  # CPU-sized
    # GPT-2 small's shape (12 x 768, 12 heads, 32,936 edges): the scale row of
    # `mechlab bench prune` (random weights; import real ones with from_pretrained).
    "gpt2_small_shape": {"d_model": 768, "n_layers": 12, "n_heads": 12},
}


def _check_bool(cfg: object, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(cfg, name)!r}")


def _check_positive(cfg: object, name: str) -> None:
    value = getattr(cfg, name)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf")
    ):
        raise ValueError(f"{name} must be a positive number or None, got {value!r}")


def _positive(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < float("inf")


def _described(values: object) -> str:
    if isinstance(values, (list, tuple)):
        return f"{len(values)} value(s)" + ("" if all(_positive(v) for v in values) else ", not all positive numbers")
    return repr(values)


def _check_rotary_scaling(scaling: object, n_pairs: int) -> None:
    kind = scaling.get("rope_type") if isinstance(scaling, dict) else None
    if kind not in _ROPE_KEYS:
        raise ValueError(
            f"rotary_scaling must be None or a dict whose rope_type is one of {ROPE_SCALINGS}, "
            f"got {scaling!r}"
        )
    keys = set(_ROPE_KEYS[kind])
    if set(scaling) != keys | {"rope_type"}:
        raise ValueError(
            f"rotary_scaling of rope_type {kind!r} takes the keys {sorted(keys)}, got {sorted(scaling)}"
        )
    for key in (k for k in _ROPE_KEYS[kind] if k != "truncate" and k not in _ROPE_LISTS):  # in a fixed order
        value = scaling[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 < value < float("inf")
        ):
            raise ValueError(f"rotary_scaling[{key!r}] must be a positive number, got {value!r}")
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ValueError("rotary_scaling: llama3 needs high_freq_factor > low_freq_factor")
    for key in (k for k in _ROPE_KEYS[kind] if k in _ROPE_LISTS):
        values = scaling[key]
        if (
            not isinstance(values, (list, tuple))
            or len(values) != n_pairs
            or not all(_positive(v) for v in values)
        ):
            raise ValueError(
                f"rotary_scaling[{key!r}] must be a list of rotary_dim / 2 = {n_pairs} positive "
                f"numbers, got {_described(values)}"
            )
    if kind == "yarn" and not isinstance(scaling["truncate"], bool):
        raise ValueError(
            f"rotary_scaling['truncate'] must be True or False, got {scaling['truncate']!r}"
        )


@dataclass
class TransformerConfig(ModelConfig):
    """Config of :class:`Transformer`.

    Args:
        n_heads: Attention (query) heads per block.
        d_head: Width of each head; defaults to ``d_model // n_heads`` (which must
            then divide evenly).
        d_mlp: Hidden width of the MLP; defaults to ``4 * d_model``.
        act_fn: ``"gelu_new"`` (tanh approximation, GPT-2's and Hugging Face's
            default), ``"gelu"`` (exact erf form), ``"relu"`` or ``"silu"``.
        normalization: ``"LN"`` (a LayerNorm before attention, MLP and read-out),
            ``"RMS"`` (RMSNorms there), ``"LNPre"`` (LayerNorms without a learned scale
            or bias, OLMo's; ``w`` and ``b`` are constant buffers of ones and zeros) or
            ``"none"`` (no normalisation: those three read the residual stream as is).
        causal: Each position attends to itself and earlier positions only (True), or
            to the whole sequence (False, as in Tracr's compiled programs).
        layer_norm_eps: Epsilon of every LayerNorm or RMSNorm.
        init_std: Standard deviation of the normal init of weight matrices,
            embeddings and the position table. As in GPT-2, the two projections
            that write into the residual stream (``W_O``, ``W_out``) use
            ``init_std / sqrt(2 * n_layers)``. Biases start at 0, norm scales at 1.
            A continuous read-in/read-out keeps PyTorch's default ``nn.Linear`` init,
            as in the recall study's code; a token embedding and unembedding use
            ``init_std`` (with a zero bias).
        positional: ``"learned"`` (a position table ``W_pos`` added to the embedding)
            or ``"rotary"`` (rotary embeddings of queries and keys, no table).
        rotary_dim: Dimensions of each query and key that are rotated (even, at most
            ``d_head``); defaults to ``d_head`` with rotary embeddings. Only with
            ``positional="rotary"``.
        rotary_base: The rotary frequencies' base (``rope_theta``).
        rotary_scaling: Scaled rotary frequencies, as Hugging Face's ``rope_parameters``
            name them: ``{"rope_type": "linear", "factor": f}`` (every frequency divided
            by ``f``), ``{"rope_type": "llama3", "factor", "low_freq_factor",
            "high_freq_factor", "original_max_position_embeddings"}`` (Llama 3.1's
            wavelength-dependent division) or ``{"rope_type": "yarn", "factor",
            "original_max_position_embeddings", "beta_fast", "beta_slow",
            "attention_factor", "truncate"}`` (YaRN's ramp between the divided and the
            original frequencies, and ``cos``/``sin`` times ``attention_factor``) or
            ``{"rope_type": "longrope", "short_factor", "long_factor",
            "original_max_position_embeddings", "attention_factor"}`` (Phi-3's LongRoPE: the
            frequencies divided one by one by ``short_factor``, or by ``long_factor`` for a
            sequence longer than ``original_max_position_embeddings``; ``cos``/``sin`` times
            ``attention_factor``); None:
            ``base^(-2i / rotary_dim)`` unscaled. Only with ``positional="rotary"``.
        rotary_adjacent_pairs: Rotate the adjacent pairs ``(x_{2i}, x_{2i+1})`` (GPT-J's
            "rotate every two") instead of ``(x_i, x_{i + rotary_dim/2})`` ("rotate half",
            GPT-NeoX and Llama).
        qk_norm: An RMSNorm over ``d_head`` (weights per dimension, shared by the heads)
            of every query and key head before the rotary embedding (Qwen3's
            ``q_norm`` / ``k_norm``), with ``layer_norm_eps``.
        qk_norm_over: ``"head"``: the query/key RMSNorm is over each head's ``d_head``
            dimensions (Qwen3, Gemma 3); ``"all"``: over all the heads' dimensions together,
            ``n_heads * d_head`` for queries and ``n_key_value_heads * d_head`` for keys, with
            a weight per dimension (OLMo 2). Only with ``qk_norm``.
        clip_qkv: Clamp the query, key and value projections (biases included) to
            ``[-clip_qkv, clip_qkv]`` (OLMo); None: no clamp.
        n_key_value_heads: Key/value heads per block (dividing ``n_heads``); defaults
            to ``n_heads`` (no grouping).
        gated_mlp: A gated MLP ``W_out (act(x W_gate) * (x W_in))``.
        parallel_attn_mlp: Attention and MLP both read the block's input and are added
            to it together (GPT-NeoX).
        attn_only: Blocks without an MLP.
        qkv_bias: Biases ``b_Q``, ``b_K``, ``b_V``.
        attn_out_bias: The attention output bias ``b_O``.
        mlp_bias: The MLP biases ``b_in`` (and ``b_gate``), ``b_out``.
        tie_embeddings: The read-out's weight *is* the token embedding (tokens mode,
            ``d_vocab_out == d_vocab``).
        pre_norms: A norm before the attention and the MLP (``ln1``, ``ln2``); False: they
            read the residual stream as is (``ln1`` / ``ln2`` are the identity, OLMo 2).
        post_norms: A norm (of ``normalization``'s kind) of the attention output and of the
            MLP output before each is added to the residual stream (``ln1_post``,
            ``ln2_post``; Gemma 2/3 and OLMo 2).
        embed_scale: The token embedding times this number (Gemma: ``sqrt(d_model)``);
            None: unscaled.
        attn_scale: The attention scores are ``q . k / attn_scale``; None:
            ``sqrt(d_head)`` (Gemma: ``sqrt(query_pre_attn_scalar)``).
        attn_softcap: Soft-capped attention scores ``c * tanh(scores / c)`` before the
            mask (Gemma 2); None: none.
        final_softcap: Soft-capped read-out ``c * tanh(out / c)`` (Gemma 2); None: none.
        sliding_window: Sliding-window attention: a query at position ``t`` attends to the
            keys ``t - sliding_window < s <= t`` in the layers ``layer_types`` names
            ``"sliding_attention"`` (every layer when ``layer_types`` is None); None: none.
        layer_types: ``"full_attention"`` or ``"sliding_attention"`` per layer (Hugging
            Face's name), or None. Needs ``sliding_window`` for a sliding layer.
        rotary_base_local: The rotary base of the sliding-window layers, unscaled (Gemma 3's
            local layers); None: every layer uses ``rotary_base`` and ``rotary_scaling``.
    """

    arch: ClassVar[str] = "transformer"

    n_heads: int = 4
    d_head: int | None = None
    d_mlp: int | None = None
    act_fn: str = "gelu_new"
    normalization: str = "LN"
    causal: bool = True
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02
    positional: str = "learned"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    rotary_scaling: dict | None = None
    rotary_adjacent_pairs: bool = False
    qk_norm: bool = False
    clip_qkv: float | None = None
    n_key_value_heads: int | None = None
    gated_mlp: bool = False
    parallel_attn_mlp: bool = False
    attn_only: bool = False
    qkv_bias: bool = True
    attn_out_bias: bool = True
    mlp_bias: bool = True
    tie_embeddings: bool = False
    qk_norm_over: str = "head"
    pre_norms: bool = True
    post_norms: bool = False
    embed_scale: float | None = None
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    rotary_base_local: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.n_heads, int) or isinstance(self.n_heads, bool) or self.n_heads <= 0:
            raise ValueError(f"n_heads must be a positive integer, got {self.n_heads!r}")
        if self.d_head is None:
            if self.d_model % self.n_heads != 0:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "change one of them or set d_head explicitly"
                )
            self.d_head = self.d_model // self.n_heads
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        if self.n_key_value_heads is None:
            self.n_key_value_heads = self.n_heads
        for name in ("d_head", "d_mlp", "n_key_value_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_key_value_heads != 0:
            raise ValueError(
                f"n_key_value_heads={self.n_key_value_heads} must divide n_heads={self.n_heads} "
                "(each key/value head serves the same number of query heads)"
            )
        if self.act_fn not in ACT_FNS:
            raise ValueError(f"act_fn must be one of {ACT_FNS}, got {self.act_fn!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}"
            )
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional must be one of {POSITIONALS}, got {self.positional!r}")
        _check_bool(
            self, "causal", "gated_mlp", "parallel_attn_mlp", "attn_only", "qkv_bias",
            "attn_out_bias", "mlp_bias", "tie_embeddings", "rotary_adjacent_pairs", "qk_norm",
            "pre_norms", "post_norms",
        )  # fmt: skip
        for name in ("embed_scale", "attn_scale", "attn_softcap", "final_softcap", "rotary_base_local"):
            _check_positive(self, name)
        if self.qk_norm_over not in QK_NORM_OVER:
            raise ValueError(f"qk_norm_over must be one of {QK_NORM_OVER}, got {self.qk_norm_over!r}")
        if self.qk_norm_over != "head" and not self.qk_norm:
            raise ValueError("qk_norm_over needs qk_norm=True")
        self._check_layers()
        if self.clip_qkv is not None and (
            isinstance(self.clip_qkv, bool)
            or not isinstance(self.clip_qkv, (int, float))
            or not 0 < self.clip_qkv < float("inf")
        ):
            raise ValueError(f"clip_qkv must be a positive number or None, got {self.clip_qkv!r}")
        if self.layer_norm_eps <= 0 or self.init_std <= 0:
            raise ValueError("layer_norm_eps and init_std must be positive")
        if self.positional == "rotary":
            if self.rotary_dim is None:
                self.rotary_dim = self.d_head
            dim = self.rotary_dim
            if (
                not isinstance(dim, int)
                or isinstance(dim, bool)
                or not 0 < dim <= self.d_head
                or dim % 2
            ):
                raise ValueError(
                    f"rotary_dim must be an even number in 2..d_head={self.d_head}, got {dim!r}"
                )
            if not self.rotary_base > 0:
                raise ValueError(f"rotary_base must be positive, got {self.rotary_base!r}")
            if self.rotary_scaling is not None:
                _check_rotary_scaling(self.rotary_scaling, dim // 2)
        else:
            for name in ("rotary_dim", "rotary_scaling", "rotary_adjacent_pairs"):
                if getattr(self, name) is not None and getattr(self, name) is not False:
                    raise ValueError(f"{name} needs positional='rotary'")
        if self.attn_only and (self.gated_mlp or self.parallel_attn_mlp):
            raise ValueError(
                "attn_only blocks have no MLP: gated_mlp and parallel_attn_mlp must be False"
            )
        if self.tie_embeddings and (self.io != "tokens" or self.d_vocab_out != self.d_vocab):
            raise ValueError(
                "tie_embeddings needs io='tokens' and d_vocab_out == d_vocab (the read-out "
                "reuses the embedding table)"
            )

    def _check_layers(self) -> None:
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
            raise ValueError(f"sliding_window must be a positive integer or None, got {window!r}")
        if self.layer_types is not None:
            types = self.layer_types
            if (
                not isinstance(types, list)
                or len(types) != self.n_layers
                or any(t not in LAYER_TYPES for t in types)
            ):
                raise ValueError(
                    f"layer_types must be None or a list of n_layers={self.n_layers} names from "
                    f"{LAYER_TYPES}, got {types!r}"
                )
            if "sliding_attention" in types and window is None:
                raise ValueError("layer_types names a sliding_attention layer: set sliding_window")
        if self.rotary_base_local is not None and (self.positional != "rotary" or window is None):
            raise ValueError("rotary_base_local needs positional='rotary' and a sliding_window")

    def sliding(self, layer: int) -> bool:
        """Whether layer ``layer`` attends within ``sliding_window`` only."""
        if self.sliding_window is None:
            return False
        return self.layer_types is None or self.layer_types[layer] == "sliding_attention"

    @property
    def n_groups(self) -> int:
        """Query heads per key/value head, ``n_heads // n_key_value_heads``."""
        return self.n_heads // self.n_key_value_heads

    # What TransformerLens' ActivationCache reads from ``model.cfg`` (``attn_only`` is a field).
    @property
    def normalization_type(self) -> str | None:
        """``"LN"`` / ``"RMS"``: norms with their weights not folded into the next layer;
        ``"LNPre"``: LayerNorms without weights (TransformerLens' name); None without
        normalisation."""
        return None if self.normalization == "none" else self.normalization

    @property
    def final_rms(self) -> bool:
        """Whether the final norm is an RMSNorm."""
        return self.normalization == "RMS"

    @property
    def positional_embedding_type(self) -> str:
        """``"standard"`` (a learned position table added to the embedding) or ``"rotary"``."""
        return "standard" if self.positional == "learned" else "rotary"
