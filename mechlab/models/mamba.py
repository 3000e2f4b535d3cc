"""Mamba-1 (Gu & Dao, 2023) in pure PyTorch, hookable like TransformerLens.

A residual stack of Mamba blocks, ``resid_post = resid_pre + mixer(RMSNorm(resid_pre))``,
with a final RMSNorm ``ln_final`` before the read-out. The mixer of one block:

    x, z      = in_proj(u).chunk(2)                        # [batch, pos, d_inner] each
    x         = SiLU(causal depthwise conv1d(x))           # kernel d_conv: sees x_{t-d_conv+1..t}
    dr, B, C  = x_proj(x).split(dt_rank, d_state, d_state)
    delta     = softplus(dt_proj(dr))                      # [batch, pos, d_inner]
    A         = -exp(A_log)                                # [d_inner, d_state]
    h_t       = exp(delta_t A) * h_{t-1} + (delta_t x_t) B_t   # [batch, d_inner, d_state]
    y_t       = h_t C_t + D x_t
    out       = out_proj(y * SiLU(z))

Parameter names follow Hugging Face's ``transformers.MambaModel`` (``blocks.{i}`` is
HF's ``layers.{i}``, ``ln_final`` is ``norm_f``, ``read_in.embed`` is ``embeddings``,
``read_out.proj`` is ``lm_head``), so :func:`load_hf_mamba_weights` and
:func:`to_hf_state_dict` are a renaming. The scan is the same arithmetic as HF's
reference ("slow") path, a loop over positions (``model.scan = "chunked"`` runs
:func:`mechlab.models.scan.selective_scan` instead); no CUDA kernel is needed.

Hook points (``B`` batch, ``T`` pos; ``E`` = d_inner, ``N`` = d_state):

* ``hook_embed`` [B, T, d_model], ``hook_out`` [B, T, d_output]
* ``blocks.{i}.hook_resid_pre`` / ``hook_mixer_in`` / ``hook_mixer_out`` /
  ``hook_resid_post`` [B, T, d_model]
* ``blocks.{i}.mixer.hook_conv_in`` [B, T, E]: x half of ``in_proj``, before the conv
* ``blocks.{i}.mixer.hook_z`` [B, T, E]: the gate, before its SiLU
* ``blocks.{i}.mixer.hook_x`` [B, T, E]: after conv and SiLU (the scan's input)
* ``blocks.{i}.mixer.hook_delta`` [B, T, E]: after the softplus
* ``blocks.{i}.mixer.hook_B`` / ``hook_C`` [B, T, N]
* ``blocks.{i}.mixer.hook_ssm_state`` [B, T, E, N]: the state h_t, one call per
  step (a :class:`~mechlab.models.recurrence.StepHook`), so a patch at step t is
  carried into every later step
* ``blocks.{i}.mixer.hook_y`` [B, T, E]: scan output ``C h + D x``, before gating
* ``blocks.{i}.mixer.hook_y_gated`` [B, T, E]: ``y * SiLU(z)``, the input of ``out_proj``
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mechlab.models.base import RESIDUAL_BLOCK_HOOK_AXES, ModelConfig, ResidualBlock
from mechlab.models.buffers import cache_buffer
from mechlab.models.recurrence import StepHook, hook_use, read_trajectory
from mechlab.models.scan import DEFAULT_CHUNK, selective_scan, use_chunked
from mechlab.models.stack import ResidualStack, mixer_scan

# Mamba is not in the state-tracking study; these are sized like its other models: one
# layer of width 256 like the recurrent ones, and 6 x 256 like its transformer.
PRESETS: dict[str, dict] = {
    "st_mamba_1x256": {"d_model": 256, "n_layers": 1},
    "st_mamba_6x256": {"d_model": 256, "n_layers": 6},
    "st_mamba_small": {"d_model": 64, "n_layers": 1},  # CPU-sized
    # state-spaces/mamba-130m's shape (24 x 768, d_state 16, expand 2): the scale row of
    # `mechlab bench prune` (random weights; import real ones with from_pretrained).
    "mamba_130m_shape": {"d_model": 768, "n_layers": 24},
}


@dataclass
class MambaConfig(ModelConfig):
    """Config of a Mamba-1 stack; defaults follow ``transformers.MambaConfig``.

    Args:
        d_state: Size N of the SSM state per channel (HF ``state_size``).
        d_conv: Kernel size of the causal depthwise conv (HF ``conv_kernel``).
        expand: d_inner = expand * d_model (HF ``expand``).
        dt_rank: Rank of the delta projection, or ``"auto"`` for ceil(d_model / 16)
            (HF ``time_step_rank``).
        dt_min: Smallest initial delta (HF ``time_step_min``).
        dt_max: Largest initial delta (HF ``time_step_max``).
        dt_init_floor: Lower clamp of the initial delta (HF ``time_step_floor``).
        conv_bias: Whether the conv has a bias (HF ``use_conv_bias``).
        bias: Whether ``in_proj`` and ``out_proj`` have biases (HF ``use_bias``).
        norm_eps: Epsilon of every RMSNorm (HF ``layer_norm_epsilon``).
    """

    arch = "mamba"

    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int | str = "auto"
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    conv_bias: bool = True
    bias: bool = False
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("d_state", "d_conv", "expand"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dt_rank != "auto" and (
            not isinstance(self.dt_rank, int) or isinstance(self.dt_rank, bool) or self.dt_rank <= 0
        ):
            raise ValueError(f"dt_rank must be 'auto' or a positive integer, got {self.dt_rank!r}")
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")
        if self.dt_init_floor <= 0:
            raise ValueError(f"dt_init_floor must be positive, got {self.dt_init_floor}")
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps}")

    @property
    def d_inner(self) -> int:
        """Width E of the mixer's inner channels, ``expand * d_model``."""
        return self.expand * self.d_model

    @property
    def resolved_dt_rank(self) -> int:
        """``dt_rank`` as an integer (``"auto"`` -> ceil(d_model / 16))."""
        return math.ceil(self.d_model / 16) if self.dt_rank == "auto" else int(self.dt_rank)


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain, computed in float32 like HF's ``MambaRMSNorm``."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class MambaMixer(nn.Module):
    """The selective-SSM mixer of one block (HF ``MambaMixer``).

    ``scan`` chooses how the scan runs when ``hook_ssm_state`` is not written to:
    ``"loop"`` (default: the per-step reference loop, HF's slow path) or ``"chunked"``
    (:func:`mechlab.models.scan.selective_scan`, ``chunk`` positions at a time) or
    ``"auto"`` (chunked under autograd; see :data:`mechlab.models.scan.SCANS` for why
    the loop is the default). A hook that
    may write to ``hook_ssm_state`` always gets the loop, step by step; read-only hooks
    (``run_with_cache``) get the states once, from the chunked scan when no autograd
    graph is built (it writes the states in place), else from the loop.
    """

    def __init__(self, cfg: MambaConfig):
        super().__init__()
        self.cfg = cfg
        self.scan = "loop"
        self.chunk = DEFAULT_CHUNK
        d_inner, d_state, dt_rank = cfg.d_inner, cfg.d_state, cfg.resolved_dt_rank
        self.in_proj = nn.Linear(cfg.d_model, 2 * d_inner, bias=cfg.bias)
        self.conv1d = nn.Conv1d(
            d_inner, d_inner, kernel_size=cfg.d_conv, groups=d_inner,
            padding=cfg.d_conv - 1, bias=cfg.conv_bias,
        )  # fmt: skip
        self.x_proj = nn.Linear(d_inner, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(d_inner, d_state))
        self.D = nn.Parameter(torch.empty(d_inner))
        self.out_proj = nn.Linear(d_inner, cfg.d_model, bias=cfg.bias)

        self.hook_conv_in = HookPoint()  # [batch, pos, d_inner]
        self.hook_z = HookPoint()  # [batch, pos, d_inner]
        self.hook_x = HookPoint()  # [batch, pos, d_inner]
        self.hook_delta = HookPoint()  # [batch, pos, d_inner]
        self.hook_B = HookPoint()  # [batch, pos, d_state]
        self.hook_C = HookPoint()  # [batch, pos, d_state]
        self.hook_ssm_state = HookPoint()  # [batch, pos, d_inner, d_state], once per step
        self.hook_y = HookPoint()  # [batch, pos, d_inner]
        self.hook_y_gated = HookPoint()  # [batch, pos, d_inner]
        self.reset_ssm_parameters()

    @torch.no_grad()
    def reset_ssm_parameters(self) -> None:
        """HF's Mamba initialisation of the SSM parameters.

        A_log[e] = log(1..d_state) (S4D-real), D = 1, dt_proj.weight ~ U(+-dt_rank^-0.5),
        dt_proj.bias = softplus^-1(delta0) with delta0 log-uniform in [dt_min, dt_max]
        (clamped at dt_init_floor), conv bias 0. The Linear and conv weights keep
        PyTorch's default (Kaiming-uniform) init.
        """
        cfg = self.cfg
        A = torch.arange(1, cfg.d_state + 1, dtype=torch.float32).repeat(cfg.d_inner, 1)
        self.A_log.copy_(torch.log(A))
        self.D.fill_(1.0)
        std = cfg.resolved_dt_rank**-0.5
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        log_min, log_max = math.log(cfg.dt_min), math.log(cfg.dt_max)
        dt = torch.exp(torch.rand(cfg.d_inner) * (log_max - log_min) + log_min)
        dt = dt.clamp(min=cfg.dt_init_floor)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        if self.conv1d.bias is not None:
            self.conv1d.bias.zero_()

    @property
    def state_shape(self) -> tuple[int, int]:
        """Shape of one trace's recurrent state: ``(d_inner, d_conv - 1 + d_state)``, the
        conv's last ``d_conv - 1`` inputs and the SSM state side by side."""
        return (self.cfg.d_inner, self.cfg.d_conv - 1 + self.cfg.d_state)

    def forward(
        self,
        u: Float[Tensor, "batch pos d_model"],
        initial_state: Float[Tensor, "batch d_inner d_conv_minus_1_plus_d_state"] | None = None,
        return_state: bool = False,
    ) -> Float[Tensor, "batch pos d_model"] | tuple[Tensor, Tensor]:
        """Run the mixer over ``u``.

        Args:
            u: The (normalised) input.
            initial_state: ``[batch, d_inner, d_conv - 1 + d_state]``: the conv's inputs
                at the ``d_conv - 1`` positions before ``u`` (oldest first) and the SSM
                state ``h_{-1}``, concatenated on the last axis (:attr:`state_shape`;
                what ``return_state`` gives); None for zeros (the start of a sequence).
            return_state: Also return the state after the last position.

        Returns:
            ``[batch, pos, d_model]``, and with ``return_state`` the final state.
        """
        n_pos = u.shape[1]
        cfg = self.cfg
        n_buf = cfg.d_conv - 1
        x, z = self.in_proj(u).chunk(2, dim=-1)  # [batch, pos, d_inner] each
        x = self.hook_conv_in(x)
        z = self.hook_z(z)
        h0 = conv_state = None
        if initial_state is None and not return_state:
            x = self.conv1d(x.transpose(1, 2))[..., :n_pos].transpose(1, 2)  # causal: cut to pos
        else:
            if initial_state is None:
                buffer = x.new_zeros(x.shape[0], cfg.d_inner, n_buf)  # [batch, d_inner, d_conv - 1]
            else:
                buffer, h0 = initial_state.split([n_buf, cfg.d_state], dim=-1)
            # [batch, d_inner, d_conv - 1 + pos]: the carried inputs, then this window's
            x_in = torch.cat([buffer.to(x.dtype), x.transpose(1, 2)], dim=-1)
            conv_state = x_in[..., x_in.shape[-1] - n_buf :]  # the last d_conv - 1 inputs
            x = F.conv1d(x_in, self.conv1d.weight, self.conv1d.bias, groups=cfg.d_inner)
            x = x.transpose(1, 2)  # [batch, pos, d_inner]
        x = self.hook_x(F.silu(x))  # [batch, pos, d_inner]

        delta_raw, B, C = self.x_proj(x).split(
            [cfg.resolved_dt_rank, cfg.d_state, cfg.d_state], dim=-1
        )
        delta = self.hook_delta(F.softplus(self.dt_proj(delta_raw)))  # [batch, pos, d_inner]
        B = self.hook_B(B)  # [batch, pos, d_state]
        C = self.hook_C(C)  # [batch, pos, d_state]

        if conv_state is None:
            y = self.selective_scan(x, delta, B, C)
        else:
            y, h = self.selective_scan(x, delta, B, C, initial_state=h0, return_state=True)
        y = self.hook_y(y)  # [batch, pos, d_inner]
        y_gated = self.hook_y_gated(y * F.silu(z))
        out = self.out_proj(y_gated)
        if not return_state:
            return out
        return out, torch.cat([conv_state, h.to(conv_state.dtype)], dim=-1)

    def selective_scan(
        self,
        x: Float[Tensor, "batch pos d_inner"],
        delta: Float[Tensor, "batch pos d_inner"],
        B: Float[Tensor, "batch pos d_state"],
        C: Float[Tensor, "batch pos d_state"],
        initial_state: Float[Tensor, "batch d_inner d_state"] | None = None,
        return_state: bool = False,
    ) -> Float[Tensor, "batch pos d_inner"] | tuple[Tensor, Tensor]:
        """The scan h_t = exp(delta_t A) h_{t-1} + delta_t x_t B_t, y_t = C_t h_t + D x_t.

        It starts from h_{-1} = ``initial_state`` (default 0) and, with ``return_state``,
        also returns the last ``h`` (float32). When a hook that may write is on
        ``hook_ssm_state``, the state goes through it once per step (so patches at step t
        carry on); read-only hooks get the whole trajectory once; otherwise no buffer is
        kept. ``self.scan`` picks the chunked scan or the loop (see the class docstring).
        """
        batch, n_pos, d_inner = x.shape
        A = -torch.exp(self.A_log.float())  # [d_inner, d_state]
        delta, B, C = delta.float(), B.float(), C.float()  # the scan runs in float32, as HF's
        use = hook_use(self.hook_ssm_state)
        # read-only hooks without autograd: the chunked scan writes every state straight
        # into the trajectory they get (the loop would stack 251 fresh states)
        autograd = torch.is_grad_enabled() and any(
            t.requires_grad for t in (x, delta, B, C, self.A_log)
        )
        read_in_place = use == "read" and not autograd
        if use != "write" and (use_chunked(self.scan, autograd) or read_in_place):
            h0 = None if initial_state is None else initial_state.to(delta.dtype)
            keep = use == "read"
            shape = (batch, n_pos, d_inner, self.cfg.d_state)  # a cache's states: reused memory
            states_out = cache_buffer(self.hook_ssm_state, shape, delta, autograd) if keep else None
            y, h, states = selective_scan(
                x.float(),
                delta,
                A,
                B,
                C,
                h0,
                chunk=self.chunk,
                keep_states=keep,
                states_out=states_out,
            )
            if states is not None:
                read_trajectory(self.hook_ssm_state, states)
            y = y.to(x.dtype) + x * self.D  # [batch, pos, d_inner]
            return (y, h) if return_state else y
        delta_x = delta * x.float()  # [batch, pos, d_inner]
        step_hook = StepHook(self.hook_ssm_state, n_pos) if use != "none" else None
        if step_hook is not None and use == "read":
            step_hook.active = False  # read-only hooks: the whole trajectory once, below

        if initial_state is None:
            h = delta.new_zeros(batch, d_inner, self.cfg.d_state)  # [batch, d_inner, d_state]
        else:
            h = initial_state.to(delta.dtype)
        ys = []
        # unbind (not delta[:, t]): the backward pass then stacks the steps' gradients once
        steps = zip(delta.unbind(1), delta_x.unbind(1), B.unbind(1), C.unbind(1), strict=True)
        for t, (delta_t, delta_x_t, B_t, C_t) in enumerate(steps):
            decay = torch.exp(delta_t[..., None] * A)  # [batch, d_inner, d_state]
            h = decay * h + delta_x_t[..., None] * B_t[:, None, :]
            if step_hook is not None:
                h = step_hook(t, h)
            ys.append((h * C_t[:, None, :]).sum(-1))  # [batch, d_inner]
        if use == "read":
            read_trajectory(self.hook_ssm_state, step_hook.stacked())
        y = torch.stack(ys, dim=1).to(x.dtype)  # [batch, pos, d_inner]
        return (y + x * self.D, h) if return_state else y + x * self.D


class MambaBlock(ResidualBlock):
    """``resid_post = resid_pre + mixer(norm(resid_pre))``."""

    def __init__(self, cfg: MambaConfig):
        super().__init__(RMSNorm(cfg.d_model, cfg.norm_eps), "mixer", MambaMixer(cfg))


class Mamba(ResidualStack):
    """A stack of Mamba-1 blocks with mechlab's read-in and read-out.

    Args:
        cfg: The model's config.
    """

    HOOK_AXES: ClassVar[dict[str, tuple[str, ...]]] = {
        **RESIDUAL_BLOCK_HOOK_AXES,
        **{
            f"blocks.*.mixer.hook_{n}": ("batch", "pos", "d_inner")
            for n in ("conv_in", "z", "x", "delta", "y", "y_gated")
        },
        "blocks.*.mixer.hook_B": ("batch", "pos", "d_state"),
        "blocks.*.mixer.hook_C": ("batch", "pos", "d_state"),
        "blocks.*.mixer.hook_ssm_state": ("batch", "pos", "d_inner", "d_state"),
    }
    STEP_HOOKS: ClassVar[frozenset[str]] = frozenset({"blocks.*.mixer.hook_ssm_state"})

    scan = mixer_scan(
        """How the blocks run their scans: ``"loop"``, ``"chunked"`` or ``"auto"`` (see
        :class:`MambaMixer`); ``"mixed"`` when the blocks differ."""
    )

    def __init__(self, cfg: MambaConfig):
        super().__init__(cfg)

    def make_block(self, cfg: MambaConfig) -> MambaBlock:
        """One Mamba block."""
        return MambaBlock(cfg)

    def make_final_norm(self, cfg: MambaConfig) -> RMSNorm:
        """Mamba's final norm is an RMSNorm (HF's ``norm_f``)."""
        return RMSNorm(cfg.d_model, cfg.norm_eps)

    @classmethod
    def from_hf(cls, hf_model: nn.Module, **overrides: Any) -> Mamba:
        """Build a tokens-mode Mamba with the config and weights of a HF Mamba model.

        Args:
            hf_model: A ``transformers.MambaModel`` or ``MambaForCausalLM``.
            **overrides: Extra config fields (e.g. ``n_ctx``).

        Returns:
            The model, with ``read_out`` = ``lm_head`` (bias 0) when ``hf_model`` has one.
        """
        model = cls(mamba_config_from_hf(hf_model.config, **overrides))
        return load_hf_mamba_weights(model, hf_model)


def mamba_config_from_hf(hf_config: Any, **overrides: Any) -> MambaConfig:
    """Translate a ``transformers.MambaConfig`` into a tokens-mode :class:`MambaConfig`.

    Args:
        hf_config: The HF config.
        **overrides: Fields to set on top (e.g. ``n_ctx``).

    Returns:
        The mechlab config.
    """
    if hf_config.intermediate_size != hf_config.expand * hf_config.hidden_size:
        raise ValueError("HF intermediate_size must equal expand * hidden_size")
    if hf_config.hidden_act != "silu":
        raise ValueError(f"only hidden_act='silu' is supported, got {hf_config.hidden_act!r}")
    fields: dict[str, Any] = dict(
        d_model=hf_config.hidden_size,
        n_layers=hf_config.num_hidden_layers,
        io="tokens",
        d_vocab=hf_config.vocab_size,
        d_state=hf_config.state_size,
        d_conv=hf_config.conv_kernel,
        expand=hf_config.expand,
        dt_rank=int(hf_config.time_step_rank),
        dt_min=hf_config.time_step_min,
        dt_max=hf_config.time_step_max,
        dt_init_floor=hf_config.time_step_floor,
        conv_bias=hf_config.use_conv_bias,
        bias=hf_config.use_bias,
        norm_eps=hf_config.layer_norm_epsilon,
    )
    return MambaConfig(**{**fields, **overrides})


def hf_name(name: str) -> str | None:
    """HF ``MambaForCausalLM`` name of a mechlab Mamba parameter (``None`` if it has none).

    ``read_out.proj.bias`` has no HF counterpart (HF's ``lm_head`` has no bias), nor
    does the continuous read-in.
    """
    if name == "read_in.embed.weight":
        return "backbone.embeddings.weight"
    if name == "read_out.proj.weight":
        return "lm_head.weight"
    if name.startswith("ln_final."):
        return "backbone.norm_f." + name.removeprefix("ln_final.")
    match = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
    if match:
        return f"backbone.layers.{match.group(1)}.{match.group(2)}"
    return None


@torch.no_grad()
def load_hf_mamba_weights(model: Mamba, hf_model: nn.Module) -> Mamba:
    """Copy the weights of a HF ``MambaModel`` or ``MambaForCausalLM`` into ``model``.

    Every block and ``ln_final`` is copied. In tokens mode the embedding is copied
    too, and, from a ``MambaForCausalLM``, ``lm_head`` goes to ``read_out.proj``
    with a zero bias (from a bare ``MambaModel`` the read-out is left as it is). In
    continuous mode the read-in and read-out are left as they are.

    Args:
        model: The mechlab model; its shapes must match ``hf_model``'s.
        hf_model: The HF model.

    Returns:
        ``model``, with its weights replaced.

    Raises:
        ValueError: A shape or setting (e.g. ``norm_eps``) that does not match.
    """
    hf_config = hf_model.config
    if not math.isclose(model.cfg.norm_eps, hf_config.layer_norm_epsilon):
        raise ValueError(
            f"norm_eps {model.cfg.norm_eps} != HF layer_norm_epsilon {hf_config.layer_norm_epsilon}"
        )
    hf_state = {
        (k if k.startswith(("backbone.", "lm_head.")) else "backbone." + k): v
        for k, v in hf_model.state_dict().items()
    }
    has_head = "lm_head.weight" in hf_state
    for name, param in model.named_parameters():
        key = hf_name(name)
        if key is None or (key == "lm_head.weight" and not has_head):
            continue
        if key == "backbone.embeddings.weight" and model.cfg.io != "tokens":
            continue
        if key == "lm_head.weight" and model.cfg.io != "tokens":
            continue
        if key not in hf_state:
            raise ValueError(f"HF model has no {key!r} (for mechlab's {name!r})")
        if hf_state[key].shape != param.shape:
            raise ValueError(
                f"shape mismatch for {name}: mechlab {tuple(param.shape)} vs HF "
                f"{key} {tuple(hf_state[key].shape)}"
            )
        param.copy_(hf_state[key])
    if has_head and model.cfg.io == "tokens":
        model.read_out.proj.bias.zero_()
    return model


def to_hf_state_dict(model: Mamba) -> dict[str, Tensor]:
    """The model's weights under HF ``MambaForCausalLM`` names (tokens mode).

    ``read_out.proj.bias`` must be zero, since HF's ``lm_head`` has none. Load the
    result with ``hf_model.load_state_dict(sd)`` into a ``MambaForCausalLM`` built
    with ``tie_word_embeddings=False`` unless the read-in and read-out are equal.
    """
    if model.cfg.io != "tokens":
        raise ValueError("to_hf_state_dict needs a tokens-mode model")
    if model.read_out.proj.bias.abs().max() > 0:
        raise ValueError("read_out.proj.bias is not zero; HF's lm_head has no bias")
    out = {}
    for name, param in model.state_dict().items():
        key = hf_name(name)
        if key is not None:
            out[key] = param.detach().clone()
    return out
