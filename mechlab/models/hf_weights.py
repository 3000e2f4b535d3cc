"""The weights of a Hugging Face model by name, from its state dict or read lazily from a
``save_pretrained`` folder (safetensors tensors memory-mapped, never copied whole), and
:func:`put`, which copies one into a mechlab parameter after checking that it fits.

:func:`~mechlab.models.importers.from_pretrained` reads a checkpoint's weights through
these; :mod:`mechlab.models.hf_loaders` maps them onto each architecture's parameters.
"""

from __future__ import annotations

import math
import mmap
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from mechlab.models.hf_files import (
    RESAVE,
    ImportProblem,
    bad_file,
    brief,
    safetensors_layout,
    torch_weights,
    weight_files,
)

__all__ = ["Mismatch", "Weights", "folder_weights", "put", "state_dict_weights"]

_SAFETENSORS_TORCH = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


class Mismatch(ImportProblem):
    """A weight missing, or not fitting the mechlab parameter its config implies (the
    caller names the weights' source)."""


class Weights:
    """Tensors by Hugging Face name, found with or without the base-model prefix.

    Args:
        get: ``name -> tensor`` for the names in ``names``.
        names: Every stored name.
        prefix: The architecture's base-model prefix (``transformer``, ``model``, ...).
        source: Where the weights come from (for messages).
    """

    def __init__(self, get: Callable[[str], Tensor], names: set[str], prefix: str, source: str):
        self._get, self.names, self.prefix, self.source = get, names, prefix, source

    def key(self, name: str) -> str | None:
        """The stored name of ``name`` (``transformer.h.0...`` or ``h.0...``), or None."""
        bare = name.removeprefix(self.prefix + ".")
        for candidate in (name, bare, f"{self.prefix}.{bare}"):
            if candidate in self.names:
                return candidate
        return None

    def __contains__(self, name: str) -> bool:
        return self.key(name) is not None

    def __call__(self, name: str) -> Tensor:
        key = self.key(name)
        if key is None:
            raise Mismatch(f"it has no weight {name!r}, which its config implies")
        return self._get(key)


def state_dict_weights(state: dict[str, Tensor], prefix: str, source: str) -> Weights:
    """The weights of a model in memory's ``state``, a TransformerBridge's names unwrapped."""
    # a TransformerBridge wraps every module: "transformer.h.0._original_component.attn..."
    clean = {k.replace("._original_component", "").replace("_original_component.", ""): v
             for k, v in state.items()}  # fmt: skip
    return Weights(clean.__getitem__, set(clean), prefix, source)


def folder_weights(folder: Path, prefix: str) -> Weights:
    """The weights of a ``save_pretrained`` folder, read tensor by tensor when asked (every
    file checked first: :func:`weight_files`, :func:`safetensors_layout`, :func:`torch_weights`).

    A safetensors tensor is a view of its bytes in the file, memory-mapped (no copy): the
    loader copies it into its parameter and drops it, so an import holds the parameters
    and one tensor's pages at a time."""
    where: dict[str, Path] = {}
    layouts: dict[Path, dict[str, tuple[str, list[int], int, int]]] = {}
    loaded: dict[Path, dict[str, Tensor]] = {}
    for path in weight_files(folder):
        if path.suffix == ".safetensors":
            layouts[path] = safetensors_layout(path)
            for key in layouts[path]:
                where.setdefault(key, path)
        else:
            loaded[path] = torch_weights(path)
            for key in loaded[path]:
                where.setdefault(key, path)

    def get(key: str) -> Tensor:
        path = where[key]
        if path in loaded:
            return loaded[path][key]
        kind, shape, start, stop = layouts[path][key]
        try:
            return _mapped(path, _SAFETENSORS_TORCH[kind], shape, start, stop)
        except (OSError, ValueError, RuntimeError) as exc:  # the file changed since its check
            raise bad_file(path, f"cannot be read ({brief(exc)})", RESAVE) from None

    return Weights(get, set(where), prefix, repr(str(folder)))


def _mapped(path: Path, dtype: torch.dtype, shape: list[int], start: int, stop: int) -> Tensor:
    """The tensor in bytes ``start:stop`` of ``path``, a read-only memory map of them (its
    pages read when touched, unmapped when the tensor is freed)."""
    if stop == start:
        return torch.empty(shape, dtype=dtype)
    aligned = start - start % mmap.ALLOCATIONGRANULARITY
    with path.open("rb") as f:
        view = mmap.mmap(f.fileno(), stop - aligned, access=mmap.ACCESS_READ, offset=aligned)
    with warnings.catch_warnings():  # "the buffer is not writable": nothing writes to it
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(view, dtype=dtype, count=math.prod(shape), offset=start - aligned)
    tensor = flat.view(shape)
    # for put's copy by rows: the map, and where the tensor starts in it
    tensor._mechlab_map = (view, start - aligned)
    return tensor


_COPY_CHUNK = 4 << 20  # bytes of a mapped tensor copied before its pages are released


def _copy_by_rows(param: Tensor, value: Tensor) -> bool:
    """Copy a memory-mapped tensor (:func:`_mapped`) of ``param``'s shape into it a block of
    rows at a time, releasing each block's pages once copied (``MADV_DONTNEED``: a large
    embedding never has all its pages resident beside its parameter).

    Returns:
        Whether it copied (False: not a mapped tensor, or the platform cannot release pages).
    """
    mapped = getattr(value, "_mechlab_map", None)
    if mapped is None or value.dim() == 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    view, offset = mapped
    row_bytes = max(1, value[0].numel() * value.element_size())
    step = max(1, _COPY_CHUNK // row_bytes)
    for first in range(0, value.shape[0], step):
        last = min(value.shape[0], first + step)
        param[first:last].copy_(value[first:last])
        begin, end = offset + first * row_bytes, offset + last * row_bytes
        begin -= begin % mmap.PAGESIZE
        if end > begin:
            view.madvise(mmap.MADV_DONTNEED, begin, end - begin)
    return True


@torch.no_grad()
def put(param: Tensor | None, value: Tensor, what: str) -> None:
    """Copy ``value`` into ``param`` (converting its dtype), named ``what`` in messages.

    Raises:
        Mismatch: No such parameter, a value that is not floating-point, or another shape.
    """
    if param is None:
        raise Mismatch(f"{what}: the mechlab model has no such parameter (a bias that is off)")
    if not (value.is_floating_point() and value.device.type != "meta"):
        raise Mismatch(
            f"{what} holds {value.dtype} values on {value.device.type}, not floating-point numbers"
        )
    if tuple(param.shape) != tuple(value.shape):
        raise Mismatch(
            f"{what} has shape {list(value.shape)}, the config implies {list(param.shape)}"
        )
    if not _copy_by_rows(param, value):
        param.copy_(value)  # (copy_ converts the dtype as it copies: no converted copy first)
