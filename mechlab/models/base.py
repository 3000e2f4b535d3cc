"""What every mechlab model shares: the config fields for input/output, and the
read-in and read-out layers.

Two input/output modes:

* ``continuous``: a Linear read-in ``d_in -> d_model`` and a Linear read-out
  ``d_model -> d_out`` (the recall study uses 57 -> d -> 5).
* ``tokens``: an embedding table of ``d_vocab`` rows and a Linear unembedding
  ``d_model -> d_vocab_out`` (the state-tracking study).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import Slice, SliceInput

from mechlab.models.buffers import POOL
from mechlab.models.cache import MechCache, NamesFilter, caching_hooks

IO_MODES = ("continuous", "tokens")


@dataclass
class ModelConfig:
    """Fields every architecture has. Subclasses add their own and set ``arch``.

    Args:
        d_model: Width of the residual stream.
        n_layers: Number of blocks.
        io: ``"continuous"`` or ``"tokens"``.
        d_in: Input vector size (continuous mode).
        d_out: Output vector size (continuous mode).
        d_vocab: Input vocabulary size (tokens mode).
        d_vocab_out: Output vocabulary size (tokens mode); defaults to ``d_vocab``.
        n_ctx: Longest sequence the model accepts.

    Besides its fields, a config has ``device`` and ``dtype`` attributes, which
    TransformerLens' ``ActivationCache`` reads: the model keeps them equal to its
    parameters' device and dtype (also after ``.to(...)``). They are not fields, so
    ``to_dict()`` and checkpoints do not hold them.
    """

    arch: ClassVar[str] = ""

    d_model: int = 64
    n_layers: int = 2
    io: str = "continuous"
    d_in: int = 57
    d_out: int = 5
    d_vocab: int = 0
    d_vocab_out: int = 0
    n_ctx: int = 251

    def __post_init__(self) -> None:
        if self.io not in IO_MODES:
            raise ValueError(f"io must be one of {IO_MODES}, got {self.io!r}")
        if self.io == "tokens":
            if self.d_vocab <= 0:
                raise ValueError("io='tokens' needs d_vocab > 0 (the vocabulary size)")
            if self.d_vocab_out <= 0:
                self.d_vocab_out = self.d_vocab
        for name in ("d_model", "n_layers", "n_ctx", "d_in", "d_out"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.device: torch.device = torch.device("cpu")
        self.dtype: torch.dtype = torch.get_default_dtype()

    @property
    def d_output(self) -> int:
        """Size of the last axis of the model's output."""
        return self.d_out if self.io == "continuous" else self.d_vocab_out

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form of the config, with ``arch`` included."""
        return {"arch": self.arch, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """Build a config from a dict, refusing unknown keys with a clear message."""
        values = {k: v for k, v in values.items() if k != "arch"}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown {cls.arch} config field(s) {unknown}; known fields: {sorted(known)}"
            )
        return cls(**values)


class ReadIn(nn.Module):
    """Continuous Linear read-in or token embedding, ``-> [batch, pos, d_model]``; a
    config's ``embed_scale`` (Gemma's sqrt(d_model)) multiplies the token embedding."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.io = cfg.io
        self.scale = getattr(cfg, "embed_scale", None)  # Gemma's sqrt(d_model)
        if cfg.io == "continuous":
            self.proj = nn.Linear(cfg.d_in, cfg.d_model)
        else:
            self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)

    def forward(self, x: Tensor) -> Float[Tensor, "batch pos d_model"]:
        if self.io == "continuous":
            if x.dim() != 3 or x.shape[-1] != self.proj.in_features:
                raise ValueError(
                    f"expected input of shape [batch, pos, {self.proj.in_features}], "
                    f"got {list(x.shape)}"
                )
            return self.proj(x)
        if x.dim() != 2 or x.dtype not in (torch.long, torch.int, torch.int32, torch.int64):
            raise ValueError(
                f"expected integer token ids of shape [batch, pos], got {x.dtype} {list(x.shape)}"
            )
        return self.embed(x) if self.scale is None else self.embed(x) * self.scale


class ReadOut(nn.Module):
    """Linear read-out ``[batch, pos, d_model] -> [batch, pos, d_output]``.

    In tokens mode the bias starts at zero, as language-model heads have none (GPT-2's and
    Mamba's ``lm_head``), so a fresh token model exports to Hugging Face as it is. A
    config's ``final_softcap`` ``c`` soft-caps the output, ``c * tanh(out / c)`` (Gemma 2).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.d_model, cfg.d_output)
        self.softcap = getattr(cfg, "final_softcap", None)  # Gemma 2's c * tanh(out / c)
        if cfg.io == "tokens":
            with torch.no_grad():
                self.proj.bias.zero_()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_output"]:
        out = self.proj(x)
        return out if self.softcap is None else torch.tanh(out / self.softcap) * self.softcap


@torch.no_grad()
def predict_in_chunks(model: nn.Module, inputs: Tensor, batch_size: int = 256) -> Tensor:
    """The model's output on ``inputs`` without gradients, ``batch_size`` rows at a time.

    Args:
        model: Any model taking a batch-first tensor.
        inputs: ``[batch, ...]`` inputs (moved to the model's device chunk by chunk).
        batch_size: Rows per forward pass.

    Returns:
        The outputs concatenated along the batch axis, on the model's device.
    """
    device = next(model.parameters()).device
    chunks = [model(inputs[i : i + batch_size].to(device)) for i in range(0, inputs.shape[0], batch_size)]
    return torch.cat(chunks)


# Axes of the hooks every family has, keyed by name with the block index as ``*``.
SHARED_HOOK_AXES: dict[str, tuple[str, ...]] = {
    "hook_embed": ("batch", "pos", "d_model"),
    "blocks.*.hook_resid_pre": ("batch", "pos", "d_model"),
    "blocks.*.hook_resid_post": ("batch", "pos", "d_model"),
    "hook_out": ("batch", "pos", "d_output"),
}
# ... and those of the recurrent families' ResidualBlock.
RESIDUAL_BLOCK_HOOK_AXES: dict[str, tuple[str, ...]] = {
    "blocks.*.hook_mixer_in": ("batch", "pos", "d_model"),
    "blocks.*.hook_mixer_out": ("batch", "pos", "d_model"),
}
# Names of the axes that index positions: the sequence position, or the query
# position of an attention score / pattern.
POSITION_AXES = ("pos", "query_pos")


def hook_pattern(name: str) -> str:
    """A hook name with its block index replaced by ``*``: ``blocks.3.attn.hook_q`` ->
    ``blocks.*.attn.hook_q``."""
    return re.sub(r"^blocks\.\d+\.", "blocks.*.", name)


class MechModel(HookedRootModule):
    """Base class of mechlab's models: a HookedRootModule that knows its config.

    Subclasses list the axes of their own hooks in ``HOOK_AXES`` (names with the block
    index as ``*``; the shared hooks are added here) and their per-time-step hook points
    in ``STEP_HOOKS``.
    """

    cfg: ModelConfig
    HOOK_AXES: ClassVar[dict[str, tuple[str, ...]]] = {}
    STEP_HOOKS: ClassVar[frozenset[str]] = frozenset()

    def _check_hook_name(self, name: str) -> str:
        if name not in self.hook_dict:
            arch = self.cfg.arch
            raise ValueError(
                f"unknown hook name {name!r} for this {arch} model; list the valid names "
                f"with `mechlab info --model {arch}` or `list(model.hook_dict)`"
            )
        return hook_pattern(name)

    def hook_axes(self, name: str) -> tuple[str, ...]:
        """Name of every axis of a hook's activation.

        Args:
            name: A hook name, e.g. ``"blocks.0.attn.hook_pattern"``.

        Returns:
            One name per axis, e.g. ``("batch", "head", "query_pos", "key_pos")``.

        Raises:
            ValueError: ``name`` is not a hook point of this model.
        """
        pattern = self._check_hook_name(name)
        return {**SHARED_HOOK_AXES, **self.HOOK_AXES}[pattern]

    def pos_dim(self, name: str) -> int:
        """Index of the position axis of a hook (the query axis for attention scores and
        patterns).

        Args:
            name: A hook name.

        Returns:
            The axis index in the batched activation (1 for almost every hook, 2 for
            ``hook_attn_scores`` / ``hook_pattern``).
        """
        axes = self.hook_axes(name)
        return next(i for i, axis in enumerate(axes) if axis in POSITION_AXES)

    def is_step_hook(self, name: str) -> bool:
        """Whether a hook point is called once per time step (a recurrent state or gate,
        see :mod:`mechlab.models.recurrence`) rather than once per forward pass.

        Args:
            name: A hook name.

        Returns:
            True for e.g. ``blocks.0.lstm.hook_h``, False for ``blocks.0.hook_resid_post``.

        Raises:
            ValueError: ``name`` is not a hook point of this model.
        """
        return self._check_hook_name(name) in self.STEP_HOOKS

    def setup(self) -> None:
        """TransformerLens' hook-point naming, plus ``cfg.device`` / ``cfg.dtype``."""
        super().setup()
        self._sync_cfg_device()

    def _apply(self, fn: Callable, recurse: bool = True) -> MechModel:
        # Every .to / .cuda / .double / .half goes through here.
        out = super()._apply(fn, recurse)
        self._sync_cfg_device()
        return out

    def _sync_cfg_device(self) -> None:
        param = next(self.parameters(), None)
        if param is not None and "cfg" in self.__dict__:
            self.cfg.device, self.cfg.dtype = param.device, param.dtype

    @property
    def W_U(self) -> Float[Tensor, "d_model d_output"]:
        """The read-out weight as TransformerLens' unembedding, ``[d_model, d_output]``."""
        return self.read_out.proj.weight.T

    @property
    def b_U(self) -> Float[Tensor, " d_output"]:
        """The read-out bias, ``[d_output]``."""
        return self.read_out.proj.bias

    def get_caching_hooks(
        self,
        names_filter: NamesFilter = None,
        incl_bwd: bool = False,
        device: str | torch.device | None = None,
        remove_batch_dim: bool = False,
        cache: dict | None = None,
        pos_slice: Slice | SliceInput = None,
    ) -> tuple[dict, list, list]:
        """TransformerLens' caching hooks, slicing ``pos_slice`` on each hook's position axis.

        A per-step hook point's entry is its whole ``[batch, pos, ...]`` buffer (see
        :func:`mechlab.models.cache.caching_hooks`); ``run_with_cache`` slices it.

        Returns:
            ``(cache, fwd_hooks, bwd_hooks)``.
        """
        cache = {} if cache is None else cache
        fwd, bwd, _ = caching_hooks(
            self, cache, names_filter, incl_bwd, device, remove_batch_dim, pos_slice
        )
        return cache, fwd, bwd

    def run_with_cache(
        self,
        *model_args: Any,
        names_filter: NamesFilter = None,
        device: str | torch.device | None = None,
        remove_batch_dim: bool = False,
        incl_bwd: bool = False,
        metric: Callable[[Tensor], Tensor] | None = None,
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        pos_slice: Slice | SliceInput = None,
        **model_kwargs: Any,
    ) -> tuple[Tensor, MechCache]:
        """Run the model and cache every hook's activation (and, optionally, gradient).

        Args:
            *model_args: The model's input, e.g. ``x``.
            names_filter: Hooks to cache: a name, a list of names or a predicate.
            device: Where to store the cache (default: the model's device).
            remove_batch_dim: Drop the batch axis (needs a batch of one).
            incl_bwd: Also backpropagate ``metric(output)`` and cache each hook's
                gradient as ``name + "_grad"``.
            metric: ``output -> scalar tensor``, needed with ``incl_bwd``.
            reset_hooks_end: Remove the caching hooks afterwards.
            clear_contexts: Clear the hook contexts when the hooks are reset.
            pos_slice: Positions to keep (an int, a slice, a list of ints or a
                TransformerLens ``Slice``), applied on each hook's position axis
                (the query axis of attention scores and patterns). As in
                TransformerLens, an int keeps the axis (length 1).
            **model_kwargs: Passed to ``forward``.

        Returns:
            ``(output, cache)``: the model's output and a :class:`MechCache`.

        Raises:
            ValueError: ``incl_bwd`` without a usable ``metric``, or
                ``remove_batch_dim`` with a batch larger than one.
        """
        if incl_bwd and metric is None:
            raise ValueError(
                "run_with_cache(incl_bwd=True) needs metric=fn mapping the [batch, pos, d_output] "
                "output to a scalar, e.g. metric=lambda out: out[:, -1, 0].sum()"
            )
        if metric is not None and not callable(metric):
            raise ValueError(f"metric must be a function output -> scalar, not {type(metric).__name__}")
        if remove_batch_dim and model_args and isinstance(model_args[0], Tensor):
            if model_args[0].shape[0] != 1:
                raise ValueError(
                    f"remove_batch_dim=True needs a batch of 1, got {model_args[0].shape[0]}; "
                    "call cache.remove_batch_dim() on a single-example cache instead"
                )
        cache_dict: dict[str, Tensor] = {}
        # the big activations go into reusable memory (mechlab.models.buffers)
        with POOL.session() as buffers:
            fwd, bwd, finalize = caching_hooks(
                self, cache_dict, names_filter, incl_bwd, device, remove_batch_dim, pos_slice, buffers
            )
            with self.hooks(
                fwd_hooks=fwd, bwd_hooks=bwd, reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts
            ):
                out = self(*model_args, **model_kwargs)
                if incl_bwd:
                    value = metric(out)
                    if not isinstance(value, Tensor) or value.dim() != 0:
                        shape = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
                        raise ValueError(
                            f"metric must return a scalar tensor, got {shape}; reduce it, e.g. with .sum()"
                        )
                    value.backward()
            finalize()
        return out, MechCache(cache_dict, self, has_batch_dim=not remove_batch_dim)

    def check_length(self, n_pos: int) -> None:
        """Raise a clear error when a sequence is longer than the model accepts."""
        if n_pos > self.cfg.n_ctx:
            raise ValueError(f"sequence of {n_pos} positions exceeds n_ctx={self.cfg.n_ctx}")

    def hook_shapes(self, batch: int = 1, n_pos: int | None = None) -> dict[str, tuple[int, ...]]:
        """Name and shape of every hook point, from one forward pass on dummy input.

        Args:
            batch: Batch size of the dummy input.
            n_pos: Sequence length; defaults to ``min(n_ctx, 8)``.

        Returns:
            Hook name -> activation shape, in forward order.
        """
        n_pos = n_pos or min(self.cfg.n_ctx, 8)
        device = next(self.parameters()).device
        if self.cfg.io == "continuous":
            x = torch.zeros(batch, n_pos, self.cfg.d_in, device=device)
        else:
            x = torch.zeros(batch, n_pos, dtype=torch.long, device=device)
        with torch.no_grad():
            _, cache = self.run_with_cache(x)
        return {name: tuple(t.shape) for name, t in cache.items()}


class ResidualBlock(nn.Module):
    """Pre-norm residual block of the recurrent families:
    ``resid_post = resid_pre + mixer(norm(resid_pre))``.

    Args:
        norm: The block's normalisation (LayerNorm, RMSNorm).
        mixer_name: Attribute name of the mixer, which prefixes its hooks
            (``lstm`` -> ``blocks.{i}.lstm.hook_h``).
        mixer: The sequence mixer, ``[batch, pos, d_model] -> [batch, pos, d_model]``.
    """

    def __init__(self, norm: nn.Module, mixer_name: str, mixer: nn.Module):
        super().__init__()
        self.norm = norm
        self.mixer_name = mixer_name
        self.add_module(mixer_name, mixer)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_mixer_in = HookPoint()  # [batch, pos, d_model]
        self.hook_mixer_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, resid_pre: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)
        mixer_in = self.hook_mixer_in(self.norm(resid_pre))
        mixer_out = self.hook_mixer_out(self._modules[self.mixer_name](mixer_in))
        return self.hook_resid_post(resid_pre + mixer_out)
