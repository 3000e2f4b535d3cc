"""Reading checkpoints: :func:`load_checkpoint`, for ``.pt`` and ``.safetensors`` files."""

from __future__ import annotations

import os
import pickle
import pickletools
import warnings
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from mechlab.checkpoint.checksums import (
    _bad_checksum_block,
    _checksum_block,
    _compare_tensor_digests,
    _tensor_sha256,
    _verify_checksum,
)
from mechlab.checkpoint.errors import (
    CheckpointError,
    UncheckedCheckpointWarning,
    _brief,
    _corrupt_field,
    _names,
)
from mechlab.checkpoint.format import (
    Checkpoint,
    _check_format,
    _check_metadata,
    _is_int,
    _sha256,
)
from mechlab.devices import check_device
from mechlab.models.base import MechModel
from mechlab.models.registry import FAMILIES, build_model, check_size, make_config
from mechlab.schema import MAX_CONFIG_BYTES, load_json

# Pickle opcodes that name or build Python objects (a plain pickle of dicts,
# lists and numbers has none of them).
_OBJECT_OPCODES = {
    "GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "BUILD", "NEWOBJ", "NEWOBJ_EX",
    "EXT1", "EXT2", "EXT4",
}  # fmt: skip


def first_non_finite(tensors: Iterable[tuple[str, Tensor]]) -> tuple[str, int, int] | None:
    """``(name, NaN/inf count, size)`` of the first floating or complex tensor holding a NaN
    or an infinity, or None when every one is finite."""
    with torch.no_grad():
        for name, tensor in tensors:
            if tensor.is_floating_point() or tensor.is_complex():
                bad = int((~torch.isfinite(tensor)).sum())
                if bad:
                    return name, bad, tensor.numel()
    return None


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

    Before ``torch.load`` decompresses or reads anything, the zip directory of a
    ``.pt`` file is checked (:func:`check_archive`: a compressed entry, such as a zip
    bomb's, is refused by its declared sizes). Before the model is built, the file's
    checksum (if it has one) is verified,
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

    Warns:
        UncheckedCheckpointWarning: The file carries no checksum (written before
            checksums existed), so damage to it could not be detected.

    Raises:
        ValueError: An unknown or unavailable device, or ``dtype`` not a floating dtype.
        CheckpointError: With a one-line message, for a missing, empty,
            truncated or corrupt file; a checksum that does not match (naming the
            tensor); a file holding pickled Python objects; a file that is not a
            mechlab checkpoint; a compressed zip entry; an unsupported version; an unknown architecture,
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
        payload, verified, source = _read_safetensors(path, map_location)
    else:
        payload, verified, source = _read_pt(path, map_location), None, path
    return _checkpoint(payload, path, source, verified, dtype, allow_non_finite)


def _checkpoint(
    payload: dict[str, Any],
    path: Path,
    source: Path,
    verified: bool | None,
    dtype: torch.dtype | None,
    allow_non_finite: bool,
) -> Checkpoint:
    """The one place a :class:`Checkpoint` is built, whatever the file type.

    Args:
        payload: The checkpoint dict (a ``.pt`` file's, or a safetensors file's weights
            with its JSON), its format already checked.
        path: The checkpoint file.
        source: The file the non-tensor values came from (the JSON of a safetensors file).
        verified: Whether the tensors' checksums were verified; None to verify the
            payload's own checksum here.
        dtype: The returned model's dtype (None keeps the saved one).
        allow_non_finite: Load NaN or inf weights instead of refusing them.
    """
    if verified is None:
        verified = _verify_checksum(payload, path)
    step = payload.get("step", 0)
    metrics = payload.get("metrics", {})
    metadata = payload.get("metadata", {})
    optimizer_state = payload.get("optimizer")
    rng_state = payload.get("rng")
    if not _is_int(step):
        raise _corrupt_field(source, "step", "an int", step)
    for field, value in (("metrics", metrics), ("metadata", metadata)):
        if not isinstance(value, dict):
            raise _corrupt_field(source, field, "a dict", value)
    for field, value in (("optimizer", optimizer_state), ("rng", rng_state)):
        if value is not None and not isinstance(value, dict):
            raise _corrupt_field(source, field, "a dict", value)
    _check_metadata(metadata, source)

    model, saved_dtype = _build_and_load(
        payload["config"], payload["state_dict"], path, dtype, allow_non_finite
    )
    if not verified:
        warnings.warn(
            f"checkpoint {path} carries no checksum (an old-format or hand-made file), so damage "
            "to it cannot be detected; re-save it with save_checkpoint to add one",
            UncheckedCheckpointWarning,
            stacklevel=3,
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


def _read_pt(path: Path, map_location: Any) -> dict[str, Any]:
    """The payload of a ``.pt`` file, read with ``weights_only=True`` once its zip directory
    has been checked (:func:`check_archive`); its format checked."""
    check_archive(path)
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
    return payload


def check_archive(path: str | os.PathLike[str]) -> None:
    """Check a zip checkpoint's directory before anything in it is decompressed or read.

    ``torch.save`` stores every entry uncompressed, so each entry's declared size equals
    the bytes it takes in the file and together they fit in the file. A compressed entry
    (a zip bomb declares gigabytes in a few megabytes) or sizes the file cannot hold are
    refused from the directory alone. A file that is not a zip archive (torch's legacy
    format, or damage) is left to ``torch.load``.

    Raises:
        CheckpointError: One line naming the entry and its declared sizes.
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise _unreadable(path, err) from None
    file_size = path.stat().st_size
    compressed = [e for e in entries if e.compress_type != zipfile.ZIP_STORED or e.file_size != e.compress_size]
    if compressed:
        entry = max(compressed, key=lambda e: e.file_size)  # the largest declared expansion
        raise CheckpointError(
            f"refusing to load {path}: its entry {entry.filename!r} is compressed "
            f"({entry.compress_size:,} bytes declared to expand to {entry.file_size:,}), which "
            "torch.save never writes; nothing was decompressed. Restore an intact copy or "
            "re-save the model with save_checkpoint"
        )
    declared = sum(e.file_size for e in entries)
    if declared > file_size:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its zip directory declares {declared:,} bytes of "
            f"entries in a file of {file_size:,}; restore an intact copy"
        )


def _read_safetensors(path: Path, map_location: Any) -> tuple[dict[str, Any], bool, Path]:
    """A safetensors file's weights and the JSON beside it, as a payload; whether its
    tensors matched the JSON's checksums; the JSON's path."""
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
        sidecar = load_json(sidecar_path, "config", MAX_CONFIG_BYTES)  # size and depth first
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"cannot read the config {sidecar_path} ({_brief(err, limit=200)}); fix the JSON or "
            "re-save with save_safetensors"
        ) from None
    if not isinstance(sidecar, dict):
        raise CheckpointError(
            f"config file {sidecar_path} holds a {type(sidecar).__name__}, not a JSON object; "
            "re-save with save_safetensors"
        )
    if (
        "format" not in sidecar
        and "arch" not in sidecar
        and ("architectures" in sidecar or "model_type" in sidecar)
    ):
        raise CheckpointError(
            f"{path} is a Hugging Face model's weights ({sidecar_path} is its config.json), not a mechlab "
            f"checkpoint; import its folder instead: --model {path.parent} (mechlab.from_pretrained)"
        )
    if "format" not in sidecar:  # a bare config dict
        return {"config": sidecar, "state_dict": state_dict}, False, sidecar_path
    payload = {**sidecar, "state_dict": state_dict}
    _check_format(payload, sidecar_path)
    verified = False
    if "checksum" in sidecar:
        expected = _checksum_block(sidecar["checksum"], sidecar_path).get("tensors")
        if not isinstance(expected, dict):
            raise _bad_checksum_block(sidecar_path)
        _compare_tensor_digests({k: _tensor_sha256(v) for k, v in state_dict.items()}, expected, path)
        verified = True
    return payload, verified, sidecar_path


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
    bad = None if allow_non_finite else first_non_finite(state_dict.items())
    if bad is not None:
        name, bad_count, numel = bad
        raise CheckpointError(
            f"checkpoint {path} holds non-finite weights: tensor {name!r} has "
            f"{bad_count} NaN/inf value(s) of {numel}; load an earlier "
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
