"""Per-tensor checksums: what :func:`seal` writes into a payload and loading verifies.

The checksum covers every tensor (by path, dtype, shape and bytes) and every other
value of the payload. torch does not verify a zip checkpoint's CRCs, so without it a
bit flipped on disk or in a copy would load silently.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mechlab.checkpoint.errors import CheckpointError, _names

CHECKSUM_ALGORITHM = "sha256"


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

