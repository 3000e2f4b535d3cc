"""Writing checkpoints: :func:`save_checkpoint` (``.pt``) and :func:`save_safetensors`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from mechlab.checkpoint.checksums import CHECKSUM_ALGORITHM, _tensor_sha256, seal
from mechlab.checkpoint.format import (
    FORMAT,
    VERSION,
    _check_materialised,
    _check_plain,
    _check_step,
    _config_dict,
)
from mechlab.checkpoint.rng import capture_rng
from mechlab.io import atomic_write
from mechlab.models.base import MechModel


def save_checkpoint(
    model: MechModel,
    path: str | os.PathLike[str],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    step: int = 0,
    metrics: dict[str, Any] | None = None,
    rng: bool = False,
    **metadata: Any,
) -> Path:
    """Write a model, and optionally its training state, to a ``.pt`` checkpoint.

    The write is atomic: the file is written to a temporary file in the same
    directory, flushed to disk and renamed over ``path``, so an interrupted save
    leaves any earlier checkpoint at ``path`` intact. A ``.safetensors`` path is
    handed to :func:`save_safetensors` (weights and JSON only, so neither
    ``optimizer`` nor ``rng`` may be given).

    Args:
        model: A mechlab model (anything with a ``cfg`` :class:`ModelConfig`).
        path: Where to write; parent directories are created.
        optimizer: Optimizer whose ``state_dict()`` to save.
        step: Training step to record.
        metrics: Metrics to record (plain values and tensors).
        rng: Also save the torch (CPU and CUDA), numpy and Python RNG states.
        **metadata: Any other values to record: str, int, float, bool, None,
            tensors, and lists/tuples/dicts of these.

    Returns:
        The path written.

    Raises:
        TypeError: ``model`` has no config, or a value is not plain.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        if optimizer is not None or rng:
            raise ValueError(
                "a .safetensors file holds weights only; save optimizer or RNG state to a .pt "
                "checkpoint instead"
            )
        return save_safetensors(model, path, step=step, metrics=metrics, **metadata)
    config = _config_dict(model)
    step = _check_step(step)
    metrics = dict(metrics or {})
    _check_plain(metrics, "metrics")
    _check_plain(metadata, "metadata")
    state_dict = dict(model.state_dict())
    _check_plain(state_dict, "state_dict")
    _check_materialised(state_dict)
    payload: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "config": config,
        "state_dict": state_dict,
        "step": step,
        "metrics": metrics,
        "metadata": dict(metadata),
    }
    if optimizer is not None:
        optimizer_state = optimizer.state_dict()
        _check_plain(optimizer_state, "optimizer.state_dict()")
        payload["optimizer"] = optimizer_state
    if rng:
        payload["rng"] = capture_rng()
    seal(payload)
    atomic_write(path, lambda f: torch.save(payload, f))
    return path


def save_safetensors(
    model: MechModel,
    path: str | os.PathLike[str],
    *,
    step: int = 0,
    metrics: dict[str, Any] | None = None,
    **metadata: Any,
) -> Path:
    """Write the weights to ``path`` (``.safetensors``) and the config to JSON beside it.

    The JSON goes to ``path`` with the suffix ``.json`` (``w.safetensors`` ->
    ``w.json``) and reads ``{"format": "mechlab-checkpoint", "version": 1,
    "config": {...}, "step": ..., "metrics": {...}, "metadata": {...}}``. Each
    file is written atomically (the weights first, then the JSON).

    Args:
        model: A mechlab model.
        path: Weights file to write; must end in ``.safetensors``.
        step: Training step to record in the JSON.
        metrics: Metrics to record in the JSON (JSON-serialisable values).
        **metadata: Other values to record in the JSON (JSON-serialisable values).

    Returns:
        The weights path.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"save_safetensors writes a .safetensors file, got {str(path)!r}")

    config = _config_dict(model)
    _check_materialised(dict(model.state_dict()))
    tensors = {}
    for name, value in model.state_dict().items():
        if not isinstance(value, Tensor):
            raise TypeError(
                f"state_dict entry {name!r} is not a tensor; safetensors holds tensors only"
            )
        # Cloned so that tied weights (one storage, two names) are saved twice.
        tensors[name] = value.detach().clone().contiguous()
    sidecar = {
        "format": FORMAT,
        "version": VERSION,
        "config": config,
        "step": _check_step(step),
        "metrics": dict(metrics or {}),
        "metadata": dict(metadata),
        "checksum": {
            "algorithm": CHECKSUM_ALGORITHM,
            "tensors": {name: _tensor_sha256(t) for name, t in tensors.items()},
        },
    }
    try:
        text = json.dumps(sidecar, indent=2)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"metrics and metadata must be JSON-serialisable for safetensors: {err}"
        ) from err
    data = safetensors_bytes(tensors, metadata={"format": "pt"})
    atomic_write(path, lambda f: f.write(data))
    atomic_write(path.with_suffix(".json"), lambda f: f.write(text.encode() + b"\n"))
    return path

