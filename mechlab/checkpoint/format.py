"""What a checkpoint holds: the format tag, the :class:`Checkpoint` a load returns, and the
checks of plain values (on save) and of a payload's fields (on load)."""

from __future__ import annotations

import collections
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.checkpoint.errors import CheckpointError, _corrupt_field, _names
from mechlab.checkpoint.rng import restore_rng
from mechlab.models.base import MechModel, ModelConfig
from mechlab.tasks import task_config

FORMAT = "mechlab-checkpoint"
VERSION = 1

# Values a checkpoint may hold besides tensors. Exact types: a subclass such as
# numpy.float64 (a float) or an IntEnum (an int) pickles as a class reference,
# which weights_only loading refuses.
_SCALARS = (str, int, float, bool, type(None))
_MAPPINGS = (dict, collections.OrderedDict)
_SEQUENCES = (list, tuple)
_TENSORS = (Tensor, nn.Parameter)


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns.

    Attributes:
        model: The model, built from the config with the saved weights loaded
            (``strict=True``), in eval mode.
        config: The model's config dataclass.
        step: Training step recorded at save time.
        metrics: Metrics recorded at save time.
        metadata: Any other keyword values given to :func:`save_checkpoint`.
        optimizer_state: ``optimizer.state_dict()`` as saved, or None; restore it
            with ``optimizer.load_state_dict(ckpt.optimizer_state)``.
        rng_state: The random-number-generator states, or None; restore them with
            :meth:`restore_rng`.
        path: The file that was read.
        sha256: Hex SHA-256 of that file (of the weights file for safetensors).
        checksum_verified: Whether the file carried a checksum of its tensors and
            values and it matched (False for files written before checksums).
        saved_dtype: The floating dtype of the saved weights (None if they mix
            several); the model itself is in the ``dtype`` asked of
            :func:`load_checkpoint`.
    """

    model: MechModel
    config: ModelConfig
    step: int
    metrics: dict[str, Any]
    metadata: dict[str, Any]
    optimizer_state: dict[str, Any] | None
    rng_state: dict[str, Any] | None
    path: Path
    sha256: str
    checksum_verified: bool = False
    saved_dtype: torch.dtype | None = None

    @property
    def task(self) -> str | None:
        """Name of the task the run was trained on (``metadata["task"]``), or None."""
        task = self.metadata.get("task")
        return task if isinstance(task, str) else None

    @property
    def examples_seen(self) -> int:
        """Training examples seen at save time: ``step`` x the run's ``batch_size`` (1 if
        the metadata records no training settings)."""
        train_cfg = self.metadata.get("train_cfg", {})
        batch_size = train_cfg.get("batch_size", 1) if isinstance(train_cfg, dict) else 1
        return self.step * (batch_size if _is_int(batch_size) and batch_size > 0 else 1)

    @property
    def task_config(self) -> Any:
        """The task config of the run (an :class:`~mechlab.tasks.LDSConfig` for ``lds``).

        Raises:
            ValueError: The checkpoint records no task, or a task mechlab does not know.
        """
        return task_config(self.metadata, self.path)

    def restore_rng(self) -> None:
        """Put every random-number generator back into its saved state."""
        if self.rng_state is None:
            raise CheckpointError(
                f"{self.path} holds no RNG state; save it with save_checkpoint(..., rng=True)"
            )

        restore_rng(self.rng_state)



def _check_format(payload: Any, path: Path) -> None:
    """Raise CheckpointError unless ``payload`` is a mechlab checkpoint dict of this version."""
    advice = "save models with mechlab.checkpoint.save_checkpoint"
    if not isinstance(payload, dict):
        raise CheckpointError(
            f"{path} is not a mechlab checkpoint: it holds a {type(payload).__name__}, not a "
            f"checkpoint dict; {advice}"
        )
    if "format" not in payload:
        if payload and all(isinstance(v, Tensor) for v in payload.values()):
            n = len(payload)
            if (path.parent / "config.json").is_file() and path.name.startswith("pytorch_model"):
                raise CheckpointError(
                    f"{path} is a Hugging Face model's weights (config.json beside it), not a mechlab "
                    f"checkpoint; import its folder instead: --model {path.parent} (mechlab.from_pretrained)"
                )
            raise CheckpointError(
                f"{path} is not a mechlab checkpoint: it looks like a bare state_dict of {n} "
                f"tensor{'s' if n != 1 else ''} (no config, no 'format' tag); load it into a "
                "model you built with model.load_state_dict(torch.load(path, weights_only=True)) "
                "or re-save that model with save_checkpoint"
            )
        keys = ", ".join(repr(k) for k in list(payload)[:6]) + (", ..." if len(payload) > 6 else "")
        raise CheckpointError(
            f"{path} is not a mechlab checkpoint: a dict without the 'format': {FORMAT!r} tag "
            f"(keys: {keys or 'none'}); {advice}"
        )
    if payload["format"] != FORMAT:
        raise CheckpointError(
            f"{path} is not a mechlab checkpoint: its format tag is {payload['format']!r}, not "
            f"{FORMAT!r}; {advice}"
        )
    version = payload.get("version")
    if version != VERSION:
        if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            raise CheckpointError(
                f"checkpoint {path} has format version {version} but this mechlab reads version "
                f"{VERSION}; upgrade mechlab to load it"
            )
        raise CheckpointError(
            f"checkpoint {path} has an unsupported format version {version!r} (this mechlab reads "
            f"version {VERSION}); re-save it with save_checkpoint"
        )
    for field in ("config", "state_dict"):
        if not isinstance(payload.get(field), dict):
            raise _corrupt_field(path, field, "a dict", payload.get(field))



def _config_dict(model: Any) -> dict[str, Any]:
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise TypeError(
            f"save_checkpoint needs a mechlab model with a .cfg ModelConfig, got "
            f"{type(model).__name__}; for any other module save model.state_dict() with "
            "torch.save"
        )
    config = cfg.to_dict()
    _check_plain(config, "config")
    return config


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_materialised(state_dict: dict[str, Any]) -> None:
    """Refuse tensors without data (meta device): a checkpoint of them restores nothing."""
    empty = [k for k, v in state_dict.items() if isinstance(v, Tensor) and v.device.type == "meta"]
    if empty:
        raise ValueError(
            f"tensors {_names(empty)} are on the meta device and hold no data; materialise the "
            "model (e.g. model.to_empty(device='cpu') and initialise it) before saving"
        )


# Metadata entries mechlab itself writes and reads back, with the type they must have.
_RESERVED_METADATA = {"task": str, "task_cfg": dict, "train_cfg": dict}


def _check_metadata(metadata: dict[str, Any], path: Path) -> None:
    for key, kind in _RESERVED_METADATA.items():
        if key in metadata and not isinstance(metadata[key], kind):
            raise CheckpointError(
                f"checkpoint {path} is corrupt: its metadata entry {key!r} is "
                f"{type(metadata[key]).__name__}, not {kind.__name__}; re-save it with "
                "save_checkpoint"
            )


def _check_step(step: Any) -> int:
    if not _is_int(step):
        raise TypeError(f"step must be an int, got {type(step).__name__}")
    return step


def _check_plain(value: Any, where: str) -> None:
    """Raise TypeError unless ``value`` is made of tensors and plain Python values only."""
    kind = type(value)
    if kind in _SCALARS or kind in _TENSORS:
        return
    if kind in _SEQUENCES:
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    if kind in _MAPPINGS:
        for key, item in value.items():
            if type(key) not in _SCALARS:
                raise TypeError(
                    f"{where} has a key of type {_type_name(key)}; checkpoint dict keys must be "
                    "str, int, float, bool or None"
                )
            _check_plain(item, f"{where}[{key!r}]")
        return
    raise TypeError(
        f"{where} is a {_type_name(value)}; a checkpoint holds only str, int, float, bool, None, "
        "tensors and lists/tuples/dicts of these - convert it (e.g. with .item(), .tolist(), "
        "torch.as_tensor() or str())"
    )


def _type_name(value: Any) -> str:
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes (what ``Checkpoint.sha256`` and circuits record)."""
    return _sha256(Path(path))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

