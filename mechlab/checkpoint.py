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
    }

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

from mechlab.io import atomic_write
from mechlab.models.base import MechModel, ModelConfig
from mechlab.models.registry import FAMILIES, build_model, make_config

FORMAT = "mechlab-checkpoint"
VERSION = 1

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

    @property
    def task(self) -> str | None:
        """Name of the task the run was trained on (``metadata["task"]``), or None."""
        task = self.metadata.get("task")
        return task if isinstance(task, str) else None

    @property
    def examples_seen(self) -> int:
        """Training examples seen at save time: ``step`` x the run's ``batch_size`` (1 if
        the metadata records no training settings)."""
        return self.step * int(self.metadata.get("train_cfg", {}).get("batch_size", 1))

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


def load_checkpoint(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> Checkpoint:
    """Load a checkpoint written by :func:`save_checkpoint` or :func:`save_safetensors`.

    ``.pt`` files are read with ``torch.load(path, weights_only=True)``, so no
    code in the file can run. A ``.safetensors`` file is read with
    ``safetensors.torch.load_file``; its config comes from the JSON file beside
    it: ``<stem>.json`` (``w.safetensors`` -> ``w.json``), or else
    ``config.json`` in the same directory. That JSON is either the layout
    :func:`save_safetensors` writes or a bare config dict with an ``"arch"`` key.

    The model is built from the config through the registry, moved to the
    weights' dtype when they all share one floating dtype (so float64 or bf16
    weights load bit-exactly), loaded with ``strict=True`` and put in eval mode.

    Args:
        path: The checkpoint file.
        map_location: Passed to ``torch.load`` (for safetensors: a device).

    Returns:
        A :class:`Checkpoint`.

    Raises:
        CheckpointError: With a one-line message, for a missing, empty,
            truncated or corrupt file; a file holding pickled Python objects; a
            file that is not a mechlab checkpoint; an unsupported version; an
            unknown architecture or invalid config; weights that do not fit the
            config (missing or unexpected keys, a shape mismatch).
    """
    path = Path(path)
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
        return _load_safetensors(path, map_location)
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

    step = payload.get("step", 0)
    metrics = payload.get("metrics", {})
    metadata = payload.get("metadata", {})
    optimizer_state = payload.get("optimizer")
    rng_state = payload.get("rng")
    if not isinstance(step, int) or isinstance(step, bool):
        raise _corrupt_field(path, "step", "an int", step)
    for field, value in (("metrics", metrics), ("metadata", metadata)):
        if not isinstance(value, dict):
            raise _corrupt_field(path, field, "a dict", value)
    for field, value in (("optimizer", optimizer_state), ("rng", rng_state)):
        if value is not None and not isinstance(value, dict):
            raise _corrupt_field(path, field, "a dict", value)

    model = _build_and_load(payload["config"], payload["state_dict"], path)
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
    )


def _load_safetensors(path: Path, map_location: Any) -> Checkpoint:
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
    if "format" in sidecar:
        _check_format({**sidecar, "state_dict": state_dict}, sidecar_path)
        config = sidecar["config"]
    else:
        config = sidecar
    model = _build_and_load(config, state_dict, path)
    return Checkpoint(
        model=model,
        config=model.cfg,
        step=sidecar.get("step", 0) if "format" in sidecar else 0,
        metrics=sidecar.get("metrics", {}) if "format" in sidecar else {},
        metadata=sidecar.get("metadata", {}) if "format" in sidecar else {},
        optimizer_state=None,
        rng_state=None,
        path=path,
        sha256=_sha256(path),
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


def _build_and_load(config: Any, state_dict: dict[str, Any], path: Path) -> MechModel:
    """Build the model of ``config`` and load ``state_dict`` into it, strictly."""
    if not isinstance(config, dict):
        raise _corrupt_field(path, "config", "a dict", config)
    arch = config.get("arch")
    if arch not in FAMILIES:
        raise CheckpointError(
            f"unknown architecture {arch!r} in {path}; this mechlab knows {sorted(FAMILIES)} - "
            "use a mechlab version that has it"
        )
    try:
        model = build_model(make_config(dict(config)))
    except ImportError as err:
        raise CheckpointError(
            f"architecture {arch!r} of {path} cannot be imported ({_brief(err)}); fix or "
            "install that model family"
        ) from None
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"invalid {arch} config in {path}: {_brief(err)}; fix the config or re-save the "
            "checkpoint"
        ) from None

    bad = [k for k, v in state_dict.items() if not isinstance(v, Tensor)]
    if bad:
        raise CheckpointError(
            f"state_dict in {path} holds non-tensor entries {_names(bad)}; re-save the checkpoint"
        )
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

    float_dtypes = {v.dtype for v in state_dict.values() if v.is_floating_point()}
    devices = {v.device for v in state_dict.values()}
    if len(float_dtypes) == 1:
        model.to(dtype=float_dtypes.pop())
    if len(devices) == 1:
        model.to(device=devices.pop())
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


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


def _check_step(step: Any) -> int:
    if not isinstance(step, int) or isinstance(step, bool):
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
        with open(path, "rb") as f:
            return any(op.name in _OBJECT_OPCODES for op, _, _ in pickletools.genops(f))
    except Exception:  # not a valid pickle stream: just bytes
        return False


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
