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
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

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
    """Continuous Linear read-in or token embedding, ``-> [batch, pos, d_model]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.io = cfg.io
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
        return self.embed(x)


class ReadOut(nn.Module):
    """Linear read-out ``[batch, pos, d_model] -> [batch, pos, d_output]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.d_model, cfg.d_output)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_output"]:
        return self.proj(x)


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


class MechModel(HookedRootModule):
    """Base class of mechlab's models: a HookedRootModule that knows its config."""

    cfg: ModelConfig

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
