"""Save and load mechlab models safely.

A checkpoint is a ``.pt`` file written by :func:`save_checkpoint`. It holds only
tensors and plain Python values, so :func:`load_checkpoint` reads it with
``torch.load(..., weights_only=True)``: a file that carries pickled Python
objects is refused before anything in it can run. Its layout::

    {
        "format": "mechlab-checkpoint",
        "version": 1,
        "config": model.cfg.to_dict(),      # {"arch": ..., fields...}
        "state_dict": {name: tensor},
        "step": int,
        "metrics": {...},                   # plain values and tensors
        "metadata": {...},                  # plain values and tensors
        "optimizer": optimizer.state_dict(),  # only when given
        "rng": {"torch": ByteTensor, "cuda": [ByteTensor], "numpy": {...},
                "python": {...}},           # only with rng=True
        "checksum": {"algorithm": "sha256",
                     "tensors": {"state_dict/up.weight": hex, ...},
                     "structure": hex},     # since mechlab 0.1 (older files load too)
    }

The checksum covers every tensor (by path, dtype, shape and bytes) and every
other value of the payload. torch does not verify a zip checkpoint's CRCs, so
without it a bit flipped on disk or in a copy would load silently;
:func:`load_checkpoint` recomputes it and refuses a file that does not match,
naming the tensor. Checkpoints written before checksums existed (such as the
bundled ``examples/checkpoints/recall-cpu/last.pt``) load as before, with
``Checkpoint.checksum_verified`` False.

Weights that are not finite (NaN or inf) are refused unless
``allow_non_finite=True``: they cannot come from a healthy run, and every
analysis of them would print NaN.

Dtypes: the weights load into a model of their own dtype (bit-exact), which
:func:`load_checkpoint` then casts to ``dtype`` (float32 by default), the
dtype every mechlab analysis feeds its models; pass ``dtype=None`` to keep the
saved dtype (``Checkpoint.saved_dtype`` records it either way).

Weights alone can also live in a ``.safetensors`` file with a JSON config
beside it (:func:`save_safetensors`; :func:`load_checkpoint` reads both).

Every problem a file can have is reported as a :class:`CheckpointError` whose
message is one line: what is wrong, then what to do.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import pickle
import pickletools
import random
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.devices import check_device
from mechlab.io import atomic_write
from mechlab.models.base import MechModel, ModelConfig
from mechlab.models.registry import FAMILIES, build_model, check_size, make_config

FORMAT = "mechlab-checkpoint"
VERSION = 1
CHECKSUM_ALGORITHM = "sha256"

# Values a checkpoint may hold besides tensors. Exact types: a subclass such as
# numpy.float64 (a float) or an IntEnum (an int) pickles as a class reference,
# which weights_only loading refuses.
_SCALARS = (str, int, float, bool, type(None))
_MAPPINGS = (dict, collections.OrderedDict)
_SEQUENCES = (list, tuple)
_TENSORS = (Tensor, nn.Parameter)

# Pickle opcodes that name or build Python objects (a plain pickle of dicts,
# lists and numbers has none of them).
_OBJECT_OPCODES = {
    "GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX",
    "EXT1", "EXT2", "EXT4",
}  # fmt: skip


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded. The message is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).splitlines()))


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
        from mechlab.tasks import task_config

        return task_config(self.metadata, self.path)

    def restore_rng(self) -> None:
        """Put every random-number generator back into its saved state."""
        if self.rng_state is None:
            raise CheckpointError(
                f"{self.path} holds no RNG state; save it with save_checkpoint(..., rng=True)"
            )
        restore_rng(self.rng_state)


# --------------------------------------------------------------------------- saving


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
    from safetensors.torch import save as safetensors_bytes

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


def capture_rng() -> dict[str, Any]:
    """The current torch (CPU and CUDA), numpy and Python RNG states, as plain values."""
    import numpy as np

    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    bit_generator, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state["numpy"] = {
        "bit_generator": str(bit_generator),
        "keys": [int(k) for k in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }
    version, internal, gauss_next = random.getstate()
    state["python"] = {"version": version, "state": list(internal), "gauss_next": gauss_next}
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the RNGs to a state from :func:`capture_rng` (or ``Checkpoint.rng_state``).

    CUDA states are restored for the devices present; the rest are ignored.
    """
    import numpy as np

    try:
        if "torch" in state:
            torch.set_rng_state(state["torch"].cpu())
        cuda_states = state.get("cuda") or []
        if cuda_states and torch.cuda.is_available():
            for index, cuda_state in enumerate(cuda_states[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(cuda_state.cpu(), index)
        if "numpy" in state:
            s = state["numpy"]
            keys = np.asarray(s["keys"], dtype=np.uint32)
            np.random.set_state(
                (s["bit_generator"], keys, s["pos"], s["has_gauss"], s["cached_gaussian"])
            )
        if "python" in state:
            s = state["python"]
            random.setstate((s["version"], tuple(s["state"]), s["gauss_next"]))
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as err:
        raise CheckpointError(
            f"malformed RNG state ({_brief(err)}); pass the rng_state of a checkpoint saved "
            "with rng=True"
        ) from err


# --------------------------------------------------------------------------- loading


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    map_location: Any = "cpu",
    dtype: torch.dtype | None = torch.float32,
    allow_non_finite: bool = False,
) -> Checkpoint:
    """Load a checkpoint written by :func:`save_checkpoint` or :func:`save_safetensors`.

    ``.pt`` files are read with ``torch.load(path, weights_only=True)``, so no
    code in the file can run. A ``.safetensors`` file is read with
    ``safetensors.torch.load_file``; its config comes from the JSON file beside
    it: ``<stem>.json`` (``w.safetensors`` -> ``w.json``), or else
    ``config.json`` in the same directory. That JSON is either the layout
    :func:`save_safetensors` writes or a bare config dict with an ``"arch"`` key.

    Before the model is built, the file's checksum (if it has one) is verified,
    the config's size is checked against the registry's limit
    (:func:`mechlab.models.registry.check_size`) and the weights are checked to
    be finite. The model is built from the config through the registry, moved to
    the weights' dtype when they all share one floating dtype (so float64 or bf16
    weights load bit-exactly), loaded with ``strict=True``, cast to ``dtype`` and
    put in eval mode.

    Args:
        path: The checkpoint file.
        map_location: Passed to ``torch.load`` (for safetensors: a device). A
            device name is checked first (:func:`mechlab.devices.check_device`).
        dtype: Floating dtype of the returned model: float32 (the default) is what
            every mechlab analysis feeds it; None keeps the saved dtype.
        allow_non_finite: Load weights holding NaN or inf instead of refusing them
            (to inspect a diverged run).

    Returns:
        A :class:`Checkpoint`.

    Raises:
        ValueError: An unknown or unavailable device, or ``dtype`` not a floating dtype.
        CheckpointError: With a one-line message, for a missing, empty,
            truncated or corrupt file; a checksum that does not match (naming the
            tensor); a file holding pickled Python objects; a file that is not a
            mechlab checkpoint; an unsupported version; an unknown architecture,
            invalid or oversized config; weights that do not fit the config
            (missing or unexpected keys, a shape mismatch), hold no data (meta
            tensors) or are not finite.
    """
    path = Path(path)
    if isinstance(map_location, str | torch.device):
        map_location = check_device(map_location)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch dtype or None, got {dtype!r}")
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}: the file does not exist; check the path")
    if not path.is_file():
        raise CheckpointError(f"{path} is not a file; pass the path of a checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(
            f"checkpoint {path} is empty (0 bytes), probably an interrupted copy; "
            "re-save it or restore an intact copy"
        )
    if path.suffix == ".safetensors":
        return _load_safetensors(path, map_location, dtype, allow_non_finite)
    try:
        with warnings.catch_warnings():
            # Said of foreign pickles, which are refused below anyway.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            payload = torch.load(path, weights_only=True, map_location=map_location)
    except pickle.UnpicklingError as err:
        if _holds_pickled_objects(path, err):
            raise CheckpointError(
                f"refusing to load {path}: it contains pickled Python objects (not a mechlab "
                "checkpoint); nothing in it was executed. Only if you trust its source, open it "
                "with torch.load(weights_only=False) and re-save the model with save_checkpoint"
            ) from None
        raise _unreadable(path, err) from None
    except Exception as err:  # zip, EOF and format errors from torch.load
        raise _unreadable(path, err) from None
    _check_format(payload, path)
    verified = _verify_checksum(payload, path)

    step = payload.get("step", 0)
    metrics = payload.get("metrics", {})
    metadata = payload.get("metadata", {})
    optimizer_state = payload.get("optimizer")
    rng_state = payload.get("rng")
    if not _is_int(step):
        raise _corrupt_field(path, "step", "an int", step)
    for field, value in (("metrics", metrics), ("metadata", metadata)):
        if not isinstance(value, dict):
            raise _corrupt_field(path, field, "a dict", value)
    for field, value in (("optimizer", optimizer_state), ("rng", rng_state)):
        if value is not None and not isinstance(value, dict):
            raise _corrupt_field(path, field, "a dict", value)
    _check_metadata(metadata, path)

    model, saved_dtype = _build_and_load(
        payload["config"], payload["state_dict"], path, dtype, allow_non_finite
    )
    return Checkpoint(
        model=model,
        config=model.cfg,
        step=step,
        metrics=metrics,
        metadata=metadata,
        optimizer_state=optimizer_state,
        rng_state=rng_state,
        path=path,
        sha256=_sha256(path),
        checksum_verified=verified,
        saved_dtype=saved_dtype,
    )


def _load_safetensors(
    path: Path, map_location: Any, dtype: torch.dtype | None, allow_non_finite: bool
) -> Checkpoint:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    device = map_location if isinstance(map_location, str | torch.device) else "cpu"
    try:
        state_dict = load_file(path, device=str(device))
    except SafetensorError as err:
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({_brief(err)}); re-save it with "
            "save_safetensors or restore an intact copy"
        ) from None
    except Exception as err:  # a header that parses but describes impossible tensors
        raise CheckpointError(
            f"checkpoint {path} is corrupt ({_brief(err)}); re-save it with save_safetensors or "
            "restore an intact copy"
        ) from None

    candidates = [path.with_suffix(".json"), path.parent / "config.json"]
    sidecar_path = next((c for c in candidates if c.is_file()), None)
    if sidecar_path is None:
        raise CheckpointError(
            f"no config for {path}: expected {candidates[0].name} or config.json beside it; "
            "write both files with save_safetensors"
        )
    try:
        sidecar = json.loads(sidecar_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(
            f"cannot read the config {sidecar_path} ({_brief(err)}); fix the JSON or re-save with "
            "save_safetensors"
        ) from None
    if not isinstance(sidecar, dict):
        raise CheckpointError(
            f"config file {sidecar_path} holds a {type(sidecar).__name__}, not a JSON object; "
            "re-save with save_safetensors"
        )
    verified = False
    if "format" in sidecar:
        _check_format({**sidecar, "state_dict": state_dict}, sidecar_path)
        config = sidecar["config"]
        step, metrics, metadata = (
            sidecar.get("step", 0), sidecar.get("metrics", {}), sidecar.get("metadata", {})
        )
        if not _is_int(step):
            raise _corrupt_field(sidecar_path, "step", "an int", step)
        for field, value in (("metrics", metrics), ("metadata", metadata)):
            if not isinstance(value, dict):
                raise _corrupt_field(sidecar_path, field, "a dict", value)
        _check_metadata(metadata, sidecar_path)
        if "checksum" in sidecar:
            expected = _checksum_block(sidecar["checksum"], sidecar_path).get("tensors")
            if not isinstance(expected, dict):
                raise _bad_checksum_block(sidecar_path)
            _compare_tensor_digests(
                {k: _tensor_sha256(v) for k, v in state_dict.items()}, expected, path
            )
            verified = True
    else:
        config, step, metrics, metadata = sidecar, 0, {}, {}
    model, saved_dtype = _build_and_load(config, state_dict, path, dtype, allow_non_finite)
    return Checkpoint(
        model=model,
        config=model.cfg,
        step=step,
        metrics=metrics,
        metadata=metadata,
        optimizer_state=None,
        rng_state=None,
        path=path,
        sha256=_sha256(path),
        checksum_verified=verified,
        saved_dtype=saved_dtype,
    )


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


def _build_and_load(
    config: Any,
    state_dict: dict[str, Any],
    path: Path,
    dtype: torch.dtype | None = None,
    allow_non_finite: bool = False,
) -> tuple[MechModel, torch.dtype | None]:
    """Build the model of ``config`` and load ``state_dict`` into it, strictly.

    Returns:
        The model (cast to ``dtype`` unless None) and the saved weights' floating
        dtype (None if they mix several).
    """
    if not isinstance(config, dict):
        raise _corrupt_field(path, "config", "a dict", config)
    arch = config.get("arch")
    if not isinstance(arch, str) or arch not in FAMILIES:
        raise CheckpointError(
            f"unknown architecture {arch!r} in {path}; this mechlab knows {sorted(FAMILIES)} - "
            "use a mechlab version that has it"
        )
    try:
        cfg = make_config(dict(config))
    except ImportError as err:
        raise CheckpointError(
            f"architecture {arch!r} of {path} cannot be imported ({_brief(err)}); fix or "
            "install that model family"
        ) from None
    except (TypeError, ValueError, OverflowError) as err:
        raise CheckpointError(
            f"invalid {arch} config in {path}: {_brief(err)}; fix the config or re-save the "
            "checkpoint"
        ) from None
    try:
        check_size(cfg)  # before anything is allocated
    except (TypeError, ValueError, OverflowError) as err:
        raise CheckpointError(f"checkpoint {path}: {_brief(err, limit=400)}") from None

    bad = [k for k, v in state_dict.items() if not isinstance(v, Tensor)]
    if bad:
        raise CheckpointError(
            f"state_dict in {path} holds non-tensor entries {_names(bad)}; re-save the checkpoint"
        )
    empty = [k for k, v in state_dict.items() if v.device.type == "meta"]
    if empty:
        raise CheckpointError(
            f"tensors {_names(empty)} in {path} hold no data (saved from a model on the meta "
            "device); re-save the checkpoint from a model whose weights are materialised"
        )
    try:
        model = build_model(cfg)
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"invalid {arch} config in {path}: {_brief(err)}; fix the config or re-save the "
            "checkpoint"
        ) from None
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_names(unexpected)}")
        raise CheckpointError(
            f"weights in {path} do not fit its {arch} config: {' and '.join(parts)}; the config "
            "and the weights come from different models - re-save the checkpoint from the model"
        )
    for name, target in expected.items():
        got = state_dict[name]
        if got.shape != target.shape:
            raise CheckpointError(
                f"tensor {name!r} has shape {list(got.shape)} in {path} but its {arch} config "
                f"builds {list(target.shape)}; the config and the weights disagree - re-save "
                "the checkpoint from the model"
            )
        if got.is_floating_point() != target.is_floating_point():
            raise CheckpointError(
                f"tensor {name!r} in {path} is {got.dtype} but its {arch} config builds "
                f"{target.dtype}; re-save the checkpoint from the model"
            )
    if not allow_non_finite:
        for name, tensor in state_dict.items():
            if tensor.is_floating_point() or tensor.is_complex():
                bad_count = int((~torch.isfinite(tensor)).sum())
                if bad_count:
                    raise CheckpointError(
                        f"checkpoint {path} holds non-finite weights: tensor {name!r} has "
                        f"{bad_count} NaN/inf value(s) of {tensor.numel()}; load an earlier "
                        "checkpoint of the run, or pass allow_non_finite=True to inspect it"
                    )

    float_dtypes = {v.dtype for v in state_dict.values() if v.is_floating_point()}
    devices = {v.device for v in state_dict.values()}
    saved_dtype = next(iter(float_dtypes)) if len(float_dtypes) == 1 else None
    if saved_dtype is not None:
        model.to(dtype=saved_dtype)
    if len(devices) == 1:
        model.to(device=devices.pop())
    model.load_state_dict(state_dict, strict=True)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.eval(), saved_dtype


# --------------------------------------------------------------------------- checksums


def seal(payload: dict[str, Any]) -> dict[str, Any]:
    """Set ``payload["checksum"]``: SHA-256 of every tensor and of the other values.

    :func:`save_checkpoint` calls it on the payload it writes; call it yourself
    only if you assemble a payload by hand.

    Args:
        payload: A checkpoint dict (its ``"checksum"`` entry, if any, is replaced).

    Returns:
        The same dict.
    """
    payload.pop("checksum", None)
    tensors, structure = _digests(payload)
    payload["checksum"] = {
        "algorithm": CHECKSUM_ALGORITHM,
        "tensors": tensors,
        "structure": structure,
    }
    return payload


def _digests(payload: dict[str, Any]) -> tuple[dict[str, str], str]:
    """Per-tensor SHA-256 by path (``state_dict/up.weight``), and one over everything else."""
    tensors: dict[str, str] = {}
    structure = hashlib.sha256()

    def walk(value: Any, where: str) -> None:
        if isinstance(value, Tensor):
            tensors[where] = _tensor_sha256(value)
            structure.update(f"T<{where}>".encode())
        elif isinstance(value, dict):
            structure.update(f"D{len(value)}(".encode())
            for key, item in value.items():
                structure.update(f"{type(key).__name__}:{key!r}=".encode())
                walk(item, f"{where}/{key}" if where else str(key))
            structure.update(b")")
        elif isinstance(value, list | tuple):
            structure.update(f"{type(value).__name__}{len(value)}(".encode())
            for i, item in enumerate(value):
                walk(item, f"{where}/{i}")
            structure.update(b")")
        else:
            structure.update(f"{type(value).__name__}:{value!r};".encode())

    walk({k: v for k, v in payload.items() if k != "checksum"}, "")
    return tensors, structure.hexdigest()


def _tensor_sha256(tensor: Tensor) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes (on the CPU, in C order)."""
    t = tensor.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.to("cpu").contiguous().reshape(-1)
    digest = hashlib.sha256(f"{t.dtype}{list(tensor.shape)}".encode())
    if t.numel():
        digest.update(t.view(torch.uint8).numpy())
    return digest.hexdigest()


def _checksum_block(block: Any, path: Path) -> dict[str, Any]:
    if not isinstance(block, dict) or block.get("algorithm") != CHECKSUM_ALGORITHM:
        raise _bad_checksum_block(path)
    return block


def _bad_checksum_block(path: Path) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is corrupt: its checksum entry is malformed; restore an intact copy "
        "or re-save it with save_checkpoint"
    )


def _verify_checksum(payload: dict[str, Any], path: Path) -> bool:
    """Check ``payload["checksum"]``; False when the file predates checksums."""
    if "checksum" not in payload:
        return False
    block = _checksum_block(payload["checksum"], path)
    expected_tensors, expected_structure = block.get("tensors"), block.get("structure")
    if not isinstance(expected_tensors, dict) or not isinstance(expected_structure, str):
        raise _bad_checksum_block(path)
    tensors, structure = _digests(payload)
    _compare_tensor_digests(tensors, expected_tensors, path)
    if structure != expected_structure:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its non-tensor values (config, step, metrics, "
            "metadata) do not match the checksum written with them; restore an intact copy"
        )
    return True


def _compare_tensor_digests(got: dict[str, str], expected: dict[str, Any], path: Path) -> None:
    for name, digest in got.items():
        if name not in expected:
            raise CheckpointError(
                f"checkpoint {path} is corrupt: tensor {name!r} is not in the checksum written "
                "with the file; restore an intact copy"
            )
        if digest != expected[name]:
            raise CheckpointError(
                f"checkpoint {path} is corrupt: tensor {name!r} does not match its checksum "
                "(changed after it was written, e.g. a bit flipped on disk or in a copy); "
                "restore an intact copy"
            )
    lost = [name for name in expected if name not in got]
    if lost:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: tensors {_names(lost)} in its checksum are missing "
            "from the file; restore an intact copy"
        )


# --------------------------------------------------------------------------- helpers


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


def _holds_pickled_objects(path: Path, err: BaseException) -> bool:
    """Whether a weights_only refusal was about Python objects (not about broken bytes).

    torch names the refused global in its message for zip checkpoints. A raw
    pickle (``pickle.dump``) fails earlier, on an opcode, so its opcodes are
    listed with ``pickletools.genops``, which only parses and never executes.
    """
    text = f"{err} {err.__context__ or ''}"
    if "GLOBAL" in text or "Unsupported global" in text or "Unsupported class" in text:
        return True
    if zipfile.is_zipfile(path):
        return False
    try:
        # The whole stream must parse (to its STOP opcode): random bytes can start with an
        # object opcode (0x82 is EXT1) and are corrupt, not pickled objects.
        with open(path, "rb") as f:
            names = [op.name for op, _, _ in pickletools.genops(f)]
    except Exception:  # not a valid pickle stream: just bytes
        return False
    return bool(names) and names[-1] == "STOP" and any(n in _OBJECT_OPCODES for n in names)


def _unreadable(path: Path, err: BaseException) -> CheckpointError:
    if zipfile.is_zipfile(path) or _starts_with(path, b"PK\x03\x04"):
        what = "is truncated or corrupt"
    else:
        what = "is corrupt or not a PyTorch checkpoint file"
    reason = _brief(err) or type(err).__name__
    return CheckpointError(
        f"checkpoint {path} {what} ({reason}); re-save it or restore an intact copy"
    )


def _starts_with(path: Path, magic: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(magic)) == magic


def _corrupt_field(path: Path, field: str, wanted: str, got: Any) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} is corrupt: its {field!r} entry is {type(got).__name__}, not "
        f"{wanted}; re-save it with save_checkpoint"
    )


def _brief(err: BaseException, limit: int = 120) -> str:
    """First sentence of an exception message, on one line and at most ``limit`` characters."""
    if str(err).startswith("Weights only load failed") and err.__context__ is not None:
        err = err.__context__  # torch's wrapper; the cause is the inner unpickling error
    text = " ".join(str(err).split())
    if isinstance(err, KeyError | EOFError) or not text:
        text = f"{type(err).__name__} {text}".strip()
    text = text.split(". ")[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _names(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"[{shown}]{more}"
