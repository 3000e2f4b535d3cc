"""A GPT-2 style decoder-only transformer with TransformerLens hook points.

Pre-LayerNorm blocks, a learned position table of ``n_ctx`` rows, causal
softmax attention, a GELU MLP, a final LayerNorm, no dropout (the defaults; the
``normalization``, ``act_fn`` and ``causal`` options give the no-LayerNorm, ReLU,
bidirectional layout of Tracr's compiled programs, see :mod:`mechlab.models.tracr`)::

    resid_pre  = embed + pos_embed                        (block 0)
    resid_mid  = resid_pre + attn(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid))
    out        = read_out(ln_final(resid_post of the last block))

Parameters use TransformerLens' names and layouts (``W_Q`` is
``[head, d_model, d_head]``, ``W_O`` is ``[head, d_head, d_model]``, ``W_in`` is
``[d_model, d_mlp]``, ...), and so do the hook points; ``hook_normalized`` is
the LayerNorm output *before* its affine ``w, b`` (as in TransformerLens'
bridge and its folded ``LNPre``).

``attn.hook_result`` (``[batch, pos, head, d_model]``, head ``h``'s output
``z_h @ W_O[h]``) is always computed, and the attention output is its sum over
heads plus ``b_O``: one code path, so a forward pass gives bit-identical numbers
whether or not anything is hooked (a fused ``z @ W_O`` would save about 1% of a
training step of the ``tiny`` preset).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mechlab.models.base import MechModel, ModelConfig, ReadIn, ReadOut

ACT_FNS = ("gelu_new", "gelu", "relu")
NORMALIZATIONS = ("LN", "none")

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
}


@dataclass
class TransformerConfig(ModelConfig):
    """Config of :class:`Transformer`.

    Args:
        n_heads: Attention heads per block.
        d_head: Width of each head; defaults to ``d_model // n_heads`` (which must
            then divide evenly).
        d_mlp: Hidden width of the MLP; defaults to ``4 * d_model``.
        act_fn: ``"gelu_new"`` (tanh approximation, GPT-2's and Hugging Face's
            default), ``"gelu"`` (exact erf form) or ``"relu"``.
        normalization: ``"LN"`` (a LayerNorm before attention, MLP and read-out) or
            ``"none"`` (no normalisation: those three read the residual stream as is).
        causal: Each position attends to itself and earlier positions only (True), or
            to the whole sequence (False, as in Tracr's compiled programs).
        layer_norm_eps: Epsilon of every LayerNorm.
        init_std: Standard deviation of the normal init of weight matrices,
            embeddings and the position table. As in GPT-2, the two projections
            that write into the residual stream (``W_O``, ``W_out``) use
            ``init_std / sqrt(2 * n_layers)``. Biases start at 0, LayerNorm
            scales at 1. A continuous read-in/read-out keeps PyTorch's default
            ``nn.Linear`` init, as in the recall study's code; a token
            embedding and unembedding use ``init_std`` (with a zero bias).
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

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.n_heads, int) or self.n_heads <= 0:
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
        for name in ("d_head", "d_mlp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.act_fn not in ACT_FNS:
            raise ValueError(f"act_fn must be one of {ACT_FNS}, got {self.act_fn!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}"
            )
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be True or False, got {self.causal!r}")
        if self.layer_norm_eps <= 0 or self.init_std <= 0:
            raise ValueError("layer_norm_eps and init_std must be positive")

    # What TransformerLens' ActivationCache reads from ``model.cfg`` (not config fields).
    @property
    def attn_only(self) -> bool:
        """Every block has an MLP."""
        return False

    @property
    def normalization_type(self) -> str | None:
        """``"LN"``: LayerNorms with their weight and bias not folded into the next layer;
        None without normalisation."""
        return "LN" if self.normalization == "LN" else None

    @property
    def final_rms(self) -> bool:
        """The final norm is a LayerNorm, not an RMSNorm."""
        return False

    @property
    def positional_embedding_type(self) -> str:
        """``"standard"``: a learned position table added to the embedding."""
        return "standard"


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
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = self.hook_normalized(x / scale)
        return x * self.w + self.b


class NoNorm(nn.Module):
    """The identity in place of a LayerNorm (``normalization="none"``), with ``hook_normalized``."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return self.hook_normalized(x)


def make_norm(cfg: TransformerConfig) -> nn.Module:
    """The block's normalisation: a :class:`LayerNorm` or, with ``normalization="none"``,
    a :class:`NoNorm`."""
    return LayerNorm(cfg.d_model, cfg.layer_norm_eps) if cfg.normalization == "LN" else NoNorm()


class Attention(nn.Module):
    """Multi-head softmax attention (causal unless ``cfg.causal`` is False), per-head
    outputs summed into ``d_model``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        h, d, m = cfg.n_heads, cfg.d_head, cfg.d_model
        self.W_Q = nn.Parameter(torch.empty(h, m, d))
        self.W_K = nn.Parameter(torch.empty(h, m, d))
        self.W_V = nn.Parameter(torch.empty(h, m, d))
        self.W_O = nn.Parameter(torch.empty(h, d, m))
        self.b_Q = nn.Parameter(torch.zeros(h, d))
        self.b_K = nn.Parameter(torch.zeros(h, d))
        self.b_V = nn.Parameter(torch.zeros(h, d))
        self.b_O = nn.Parameter(torch.zeros(m))
        causal = torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool))
        self.register_buffer("causal_mask", causal, persistent=False)
        self.causal = cfg.causal
        self.scale = math.sqrt(d)

        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, head, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        n_pos = x.shape[1]
        q = self.hook_q(torch.einsum("bpm,hmd->bphd", x, self.W_Q) + self.b_Q)
        k = self.hook_k(torch.einsum("bpm,hmd->bphd", x, self.W_K) + self.b_K)
        v = self.hook_v(torch.einsum("bpm,hmd->bphd", x, self.W_V) + self.b_V)

        # The [batch, head, query_pos, key_pos] tensors dominate the memory traffic, so
        # allocate only two of them: scale q rather than the scores, mask in place.
        scores = torch.einsum("bqhd,bkhd->bhqk", q / self.scale, k)
        if self.causal:
            scores.masked_fill_(~self.causal_mask[:n_pos, :n_pos], float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(F.softmax(scores, dim=-1))

        z = self.hook_z(torch.einsum("bhqk,bkhd->bqhd", pattern, v))
        result = self.hook_result(torch.einsum("bqhd,hdm->bqhm", z, self.W_O))
        return result.sum(dim=2) + self.b_O


class MLP(nn.Module):
    """``W_out act(W_in x + b_in) + b_out`` with ``hook_pre`` / ``hook_post`` ``[batch, pos, d_mlp]``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act_fn = cfg.act_fn
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        if self.act_fn == "relu":
            post = self.hook_post(F.relu(pre))
        else:
            approximate = "tanh" if self.act_fn == "gelu_new" else "none"
            post = self.hook_post(F.gelu(pre, approximate=approximate))
        return post @ self.W_out + self.b_out


class TransformerBlock(nn.Module):
    """Pre-LN block: ``resid += attn(ln1(resid)); resid += mlp(ln2(resid))``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.ln1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.ln2 = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self, resid: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid)))
        resid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid)))
        return self.hook_resid_post(resid + mlp_out)


def _reset_norm(norm: nn.Module) -> None:
    if isinstance(norm, LayerNorm):
        nn.init.ones_(norm.w)
        nn.init.zeros_(norm.b)


_D = ("batch", "pos", "d_model")
_HEADS = ("batch", "pos", "head", "d_head")
_ATTN = ("batch", "head", "query_pos", "key_pos")
_SCALE = ("batch", "pos", "one")


class Transformer(MechModel):
    """GPT-2 style decoder: read-in + positions, pre-LN blocks, final LN, read-out.

    Args:
        cfg: The model's :class:`TransformerConfig`.
    """

    HOOK_AXES: ClassVar[dict[str, tuple[str, ...]]] = {
        "hook_pos_embed": _D,
        "blocks.*.ln1.hook_scale": _SCALE,
        "blocks.*.ln1.hook_normalized": _D,
        "blocks.*.attn.hook_q": _HEADS,
        "blocks.*.attn.hook_k": _HEADS,
        "blocks.*.attn.hook_v": _HEADS,
        "blocks.*.attn.hook_attn_scores": _ATTN,
        "blocks.*.attn.hook_pattern": _ATTN,
        "blocks.*.attn.hook_z": _HEADS,
        "blocks.*.attn.hook_result": ("batch", "pos", "head", "d_model"),
        "blocks.*.hook_attn_out": _D,
        "blocks.*.hook_resid_mid": _D,
        "blocks.*.ln2.hook_scale": _SCALE,
        "blocks.*.ln2.hook_normalized": _D,
        "blocks.*.mlp.hook_pre": ("batch", "pos", "d_mlp"),
        "blocks.*.mlp.hook_post": ("batch", "pos", "d_mlp"),
        "blocks.*.hook_mlp_out": _D,
        "ln_final.hook_scale": _SCALE,
        "ln_final.hook_normalized": _D,
    }

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.read_in = ReadIn(cfg)
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
        self.blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_final = make_norm(cfg)
        self.read_out = ReadOut(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, d_output]
        self.init_weights()
        self.setup()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter as described in :class:`TransformerConfig`."""
        std = self.cfg.init_std
        resid_std = std / math.sqrt(2 * self.cfg.n_layers)
        nn.init.normal_(self.W_pos, std=std)
        for block in self.blocks:
            for ln in (block.ln1, block.ln2):
                _reset_norm(ln)
            attn, mlp = block.attn, block.mlp
            for w in (attn.W_Q, attn.W_K, attn.W_V, mlp.W_in):
                nn.init.normal_(w, std=std)
            for w in (attn.W_O, mlp.W_out):
                nn.init.normal_(w, std=resid_std)
            for b in (attn.b_Q, attn.b_K, attn.b_V, attn.b_O, mlp.b_in, mlp.b_out):
                nn.init.zeros_(b)
        _reset_norm(self.ln_final)
        if self.cfg.io == "tokens":
            nn.init.normal_(self.read_in.embed.weight, std=std)
            nn.init.normal_(self.read_out.proj.weight, std=std)
            nn.init.zeros_(self.read_out.proj.bias)
        else:
            self.read_in.proj.reset_parameters()
            self.read_out.proj.reset_parameters()

    def tokens_to_residual_directions(
        self, tokens: int | Tensor
    ) -> Float[Tensor, "... d_model"]:
        """The residual-stream direction that the read-out reads output ``tokens`` from.

        That is the read-out row ``W_U[:, k]`` times the final LayerNorm's weight:
        ``out[..., k] = (normalized * ln_final.w) @ W_U[:, k] + const``, with
        ``normalized`` the centred, scaled stream (what ``cache.apply_ln_to_stack``
        gives). So ``cache.logit_attrs(stack, k)`` summed over a complete decomposition
        is ``out[..., k]`` minus the constant ``ln_final.b @ W_U[:, k] + b_U[k]``
        (TransformerLens gets the same by folding the LayerNorm into ``W_U``).

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
        if isinstance(self.ln_final, LayerNorm):
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
            total = total + block.attn.b_O
            if include_mlp_biases:
                total = total + block.mlp.b_out
        if mlp_input:
            if layer >= self.cfg.n_layers:
                raise ValueError(f"mlp_input needs layer < n_layers={self.cfg.n_layers}, got {layer}")
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
        embed = self.hook_embed(self.read_in(x))  # [batch, pos, d_model]
        pos_embed = self.hook_pos_embed(self.W_pos[:n_pos].expand(batch, n_pos, -1).clone())
        resid = embed + pos_embed
        for block in self.blocks:
            resid = block(resid)
        return self.hook_out(self.read_out(self.ln_final(resid)))
