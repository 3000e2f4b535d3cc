"""The files of a Hugging Face ``save_pretrained`` folder, each checked before it is used.

:func:`mechlab.from_pretrained` reads a model folder only through this module, so a file
that is damaged, hostile or of another shape is one :class:`ImportProblem` naming it and
what to do, never a traceback from ``json``, ``transformers``, ``safetensors`` or ``torch``:

* ``config.json``: within size and depth limits (:func:`mechlab.schema.load_json`), a JSON
  object, every value the import reads of the right type and range
  (:func:`check_config_values`, before ``transformers`` sees it);
* the weight index (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``): a
  ``weight_map`` of tensor names to shard files, each a regular file inside the folder
  (:func:`weight_files`; what the prompt digest hashes too);
* ``model.safetensors`` and its shards: the header checked against the file before any
  tensor is read (:func:`safetensors_header`: its claimed size, JSON, dtypes, shapes and
  byte ranges);
* ``pytorch_model.bin``: ``torch.load(weights_only=True)``, memory-mapped when it is a zip
  file, read in full when it is in the legacy (pre-zip) format (:func:`torch_weights`);
* a symbolic link that leaves the folder is refused (but for a Hugging Face hub cache's
  ``snapshots/<revision>`` folder, whose files link into its ``blobs``).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mechlab.schema import json_depth, load_json


class ImportProblem(ValueError):
    """A model or folder :func:`~mechlab.from_pretrained` cannot import (the message says why)."""


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")  # fmt: skip
"""The weight files of a folder, in the order they are looked for."""


RESAVE = "save the model again with save_pretrained(folder)"
MAX_CONFIG_BYTES = 16 << 20  # a config.json (a few KB; some list thousands of labels)
MAX_INDEX_BYTES = 64 << 20  # a weight index (a line per tensor)
MAX_HEADER_BYTES = 100 << 20  # a safetensors header (safetensors' own limit)
# safetensors dtype -> bytes per element (the dtypes torch reads)
SAFETENSORS_DTYPES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
    "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip


def brief(exc: BaseException, limit: int = 160) -> str:
    """An exception's message on one line, at most ``limit`` characters."""
    if str(exc).startswith("Weights only load failed") and exc.__context__ is not None:
        exc = exc.__context__  # torch's wrapper; the cause is the inner unpickling error
    text = " ".join(str(exc).split())
    if isinstance(exc, KeyError | EOFError | IndexError) or not text:
        text = f"{type(exc).__name__} {text}".strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters with an ellipsis."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bad_file(path: Path, problem: str, advice: str) -> ImportProblem:
    """``'<path>' <problem>; <advice>``: the one line of a file that cannot be read."""
    return ImportProblem(f"{str(path)!r} {problem}; {advice}")


def _inside(folder: Path, path: Path, what: str) -> Path:
    """``path`` (a file of ``folder``) once it is known to be a regular file in the folder.

    A symbolic link may point anywhere inside the folder, or into the ``blobs`` folder of a
    Hugging Face hub cache when the folder is one of its ``snapshots/<revision>`` (the
    cache's own layout); one that leaves the folder otherwise is refused, so a model folder
    never reads (nor hashes) a file elsewhere on the machine.
    """
    try:
        root, target = folder.resolve(), path.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links
        raise bad_file(path, f"({what}) cannot be followed ({brief(exc)})", RESAVE) from None
    allowed = [root]
    if root.parent.name == "snapshots":
        allowed.append(root.parent.parent / "blobs")
    if not any(target.is_relative_to(a) for a in allowed):
        raise bad_file(
            path, f"({what}) leads outside the model folder, to {str(target)!r}",
            "copy the file into the folder instead of linking to it",
        )  # fmt: skip
    if not target.is_file():
        if target.is_dir():
            kind = "a folder"
        else:
            kind = "not a regular file" if target.exists() else "missing"
        raise bad_file(path, f"({what}) is {kind}", RESAVE)
    return path


def read_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of a folder: a JSON object within size and depth limits.

    Raises:
        ImportProblem: A missing, oversized, unreadable or invalid file, or one that does
            not hold a JSON object (one line naming the file).
    """
    path = folder / "config.json"
    if not os.path.lexists(path):
        raise ImportProblem(
            f"{str(folder)!r} has no config.json; give a folder written by save_pretrained"
        )
    _inside(folder, path, "the config")
    try:
        raw = load_json(path, "config file", MAX_CONFIG_BYTES)
    except (OSError, ValueError) as exc:
        raise ImportProblem(f"{brief(exc, 300)} ({RESAVE})") from None
    if not isinstance(raw, dict):
        raise bad_file(path, f"holds {json_type(raw)}, not a JSON object", RESAVE)
    return raw


def json_type(value: Any) -> str:
    """``"an object"``, ``"a list"``, ... (the JSON kind of ``value``, with its article)."""
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    kind = names.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )
    return f"a{'n' if kind[0] in 'aeiou' else ''} {kind}"


def weight_files(folder: Path) -> list[Path]:
    """The weight files :func:`from_pretrained` reads from a folder, each checked to be a
    regular file inside it: ``model.safetensors``; else the shards that
    ``model.safetensors.index.json`` names; else ``pytorch_model.bin``; else the shards of
    ``pytorch_model.bin.index.json`` (wherever they are inside the folder).

    Returns:
        The files (empty when the folder holds none of these).

    Raises:
        ImportProblem: An index that is not a JSON object with a ``weight_map`` of tensor
            names to files, a shard that is missing, of the wrong kind or outside the folder,
            a weight file that is a link out of the folder.
    """
    found = next((n for n in WEIGHT_FILES if os.path.lexists(folder / n)), None)
    if found is None:
        return []
    first = _inside(folder, folder / found, "the weights")
    if not found.endswith(".index.json"):
        return [first]
    suffix = ".safetensors" if found.startswith("model.safetensors") else ".bin"
    try:
        index = load_json(first, "weight index", MAX_INDEX_BYTES)
    except (OSError, ValueError) as exc:
        raise ImportProblem(f"{brief(exc, 300)} ({RESAVE})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        got = json_type(index) if not isinstance(index, dict) else (
            "no weight_map" if "weight_map" not in index else f"a weight_map that is {json_type(weight_map)}"
            + (" (empty)" if weight_map == {} else "")
        )  # fmt: skip
        raise bad_file(first, f"must be a JSON object whose weight_map maps tensor names to files; it holds {got}",
                        RESAVE)  # fmt: skip
    paths: dict[str, Path] = {}
    for name, file in weight_map.items():
        if not isinstance(file, str) or not file.endswith(suffix):
            shown = _short(file, 80) if isinstance(file, str) else json_type(file)
            raise bad_file(
                first, f"maps {_short(name)} to {shown}, not a {suffix} file name", RESAVE
            )
        if "\0" in file:
            raise bad_file(
                first, f"maps {_short(name)} to a file name with a NUL character", RESAVE
            )
        relative = Path(file)
        if relative.is_absolute() or ".." in relative.parts:  # (links out are refused by _inside)
            raise bad_file(first, f"names the shard {_short(file, 80)}, outside the model folder",
                            "keep every shard inside the folder (save_pretrained does)")  # fmt: skip
        if file not in paths:
            shard = folder / relative
            try:
                shard.lstat()
                there = True
            except (FileNotFoundError, NotADirectoryError):
                there = False
            except OSError as exc:  # a name too long for the file system, ...
                raise bad_file(first, f"names the shard {_short(file, 80)}, which cannot be opened ({brief(exc)})",
                                RESAVE) from None  # fmt: skip
            if not there:
                raise ImportProblem(
                    f"{str(folder)!r} lacks the weight shard {_short(file, 80)} its index names; {RESAVE}"
                )
            paths[file] = _inside(folder, shard, f"a shard {first.name} names")
    return [paths[f] for f in sorted(paths)]


def safetensors_header(path: Path) -> dict[str, tuple[str, list[int]]]:
    """The tensors of a safetensors file (name -> ``(dtype, shape)``), its header checked
    against the file: the size it claims, its JSON, every dtype, shape and byte range (inside
    the data, matching the shape, neither overlapping nor leaving gaps).

    Raises:
        ImportProblem: Anything a safetensors file cannot hold (one line naming the file).
    """
    return {name: (dtype, shape) for name, (dtype, shape, _, _) in safetensors_layout(path).items()}


def safetensors_layout(path: Path) -> dict[str, tuple[str, list[int], int, int]]:
    """:func:`safetensors_header` with where each tensor lies: name -> ``(dtype, shape,
    start, stop)``, ``start:stop`` its bytes in the file (checked as there).

    Raises:
        ImportProblem: Anything a safetensors file cannot hold (one line naming the file).
    """
    size = path.stat().st_size
    if size < 8:
        raise bad_file(
            path, f"is {size} bytes, too short for a safetensors file (truncated?)", RESAVE
        )
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8 or n > MAX_HEADER_BYTES:
            raise bad_file(path, f"is not a safetensors file, or is truncated: its header claims {n:,} bytes "
                            f"and the file has {size:,}", RESAVE)  # fmt: skip
        text = f.read(n)
    try:
        text = text.decode("utf-8")
        if json_depth(text, 8) > 8:
            raise ValueError("it nests too deeply")
        header = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise bad_file(path, f"has a header that is not JSON ({brief(exc, 80)})", RESAVE) from None
    if not isinstance(header, dict):
        raise bad_file(path, f"has a header that is {json_type(header)}, not a JSON object", RESAVE)
    data = size - 8 - n
    tensors: dict[str, tuple[str, list[int], int, int]] = {}
    ranges = []
    for name, info in header.items():
        if name == "__metadata__":
            if info is not None and not isinstance(info, dict):
                raise bad_file(path, "has __metadata__ that is not a JSON object", RESAVE)
            continue
        dtype = info.get("dtype") if isinstance(info, dict) else None
        shape = info.get("shape") if isinstance(info, dict) else None
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
            raise bad_file(path, f"gives tensor {_short(name, 80)} the dtype {_short(dtype, 40)}; known: "
                            f"{', '.join(SAFETENSORS_DTYPES)}", RESAVE)  # fmt: skip
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise bad_file(
                path,
                f"gives tensor {_short(name, 80)} the shape {_short(shape, 60)}, not a list of sizes",
                RESAVE,
            )
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data):  # fmt: skip
            raise bad_file(path, f"places tensor {_short(name, 80)} at bytes {_short(offsets, 60)}, outside its {data:,} "
                            "bytes of data (truncated?)", RESAVE)  # fmt: skip
        if offsets[1] - offsets[0] != math.prod(shape) * SAFETENSORS_DTYPES[dtype]:
            raise bad_file(path, f"gives tensor {_short(name, 80)} of shape {_short(shape)} ({dtype}) "
                            f"{offsets[1] - offsets[0]:,} bytes; the shape needs "
                            f"{math.prod(shape) * SAFETENSORS_DTYPES[dtype]:,}", RESAVE)  # fmt: skip
        tensors[name] = (dtype, shape, 8 + n + offsets[0], 8 + n + offsets[1])
        ranges.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(ranges):
        if begin != end:
            problem = "overlap the one before it" if begin < end else "leave a gap before it"
            raise bad_file(
                path, f"has tensor offsets that {problem} (tensor {_short(name, 80)})", RESAVE
            )
        end = stop
    if end != data:
        raise bad_file(path, f"has {data - end:,} bytes after its last tensor", RESAVE)
    return tensors


def torch_weights(path: Path) -> dict[str, Tensor]:
    """The state dict of a ``pytorch_model.bin``, loaded with ``weights_only=True`` (no code
    runs); a zip file is memory-mapped, a legacy (pre-zip) one read in full."""
    if path.stat().st_size == 0:
        raise bad_file(path, "is empty (0 bytes), probably an interrupted copy", RESAVE)
    try:
        state = torch.load(
            path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path)
        )
    except pickle.UnpicklingError as exc:
        inner = str(exc.__context__ or "")
        if str(exc).startswith("Weights only load failed") and "global" in inner.lower():
            raise bad_file(
                path, f"holds Python objects besides tensors, which mechlab does not load (loading them "
                f"could run code: {brief(exc, 100)})", "save the model with save_pretrained(folder) "
                "(safetensors), from a source you trust",
            ) from None  # fmt: skip
        raise bad_file(
            path, f"is not a torch weight file or is damaged ({brief(exc)})", RESAVE
        ) from None
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for damaged files
        raise bad_file(
            path, f"is not a torch weight file or is damaged ({brief(exc)})", RESAVE
        ) from None
    if not isinstance(state, dict):
        raise bad_file(path, f"holds a {type(state).__name__}, not a state dict of tensors", RESAVE)
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise bad_file(path, f"holds {_short(key, 60)} -> {type(value).__name__}; a state dict maps names to "
                            "tensors", RESAVE)  # fmt: skip
    return state


# The config values each architecture's import reads, and what each must be. Checked in
# config.json before transformers sees it, and on the config object after (a model in
# memory, defaults), so no value of the wrong type reaches arithmetic.
_COUNT, _COUNT_OR_NONE, _EPS, _NUMBER, _NUMBER_OR_NONE = "count", "count?", "eps", "number", "number?"  # fmt: skip
_NAME, _FLAG, _MAPPING_OR_NONE, _NAMES_OR_NONE, _RANK = "name", "flag", "mapping?", "names?", "rank"
_NUMBERS_OR_NONE = "numbers?"
_MAX_COUNT = 2**31 - 1
_ROPE = {"rope_theta": _NUMBER_OR_NONE, "partial_rotary_factor": _NUMBER_OR_NONE,
         "rope_parameters": _MAPPING_OR_NONE, "rope_scaling": _MAPPING_OR_NONE}  # fmt: skip
# the scaled rotary embeddings' values (rope_parameters.factor, ...)
_ROPE_SCALING = tuple((name, _NUMBER_OR_NONE) for name in (
    "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "beta_fast",
    "beta_slow", "attention_factor", "mscale", "mscale_all_dim")) + (("truncate", _FLAG),
    ("short_factor", _NUMBERS_OR_NONE), ("long_factor", _NUMBERS_OR_NONE))  # fmt: skip
_LLAMA_FIELDS = {
    "vocab_size": _COUNT, "hidden_size": _COUNT, "num_hidden_layers": _COUNT, "num_attention_heads": _COUNT,
    "intermediate_size": _COUNT, "max_position_embeddings": _COUNT, "head_dim": _COUNT_OR_NONE,
    "num_key_value_heads": _COUNT_OR_NONE, "sliding_window": _COUNT_OR_NONE, "hidden_act": _NAME,
    "rms_norm_eps": _EPS, "use_sliding_window": _FLAG, "attention_bias": _FLAG, "mlp_bias": _FLAG,
    "tie_word_embeddings": _FLAG, "layer_types": _NAMES_OR_NONE, **_ROPE,
}  # fmt: skip
_GEMMA_FIELDS = {
    **{k: v for k, v in _LLAMA_FIELDS.items() if k != "hidden_act"}, "hidden_activation": _NAME,
    "query_pre_attn_scalar": _NUMBER, "attn_logit_softcapping": _NUMBER_OR_NONE,
    "final_logit_softcapping": _NUMBER_OR_NONE, "use_bidirectional_attention": _FLAG,
}  # fmt: skip
CONFIG_FIELDS: dict[str, dict[str, str]] = {
    "GPT2LMHeadModel": {
        "vocab_size": _COUNT, "n_embd": _COUNT, "n_layer": _COUNT, "n_head": _COUNT, "n_positions": _COUNT,
        "n_inner": _COUNT_OR_NONE, "activation_function": _NAME, "layer_norm_epsilon": _EPS,
        "tie_word_embeddings": _FLAG, "scale_attn_weights": _FLAG, "scale_attn_by_inverse_layer_idx": _FLAG,
    },
    "GPTNeoXForCausalLM": {
        "vocab_size": _COUNT, "hidden_size": _COUNT, "num_hidden_layers": _COUNT, "num_attention_heads": _COUNT,
        "intermediate_size": _COUNT, "max_position_embeddings": _COUNT, "hidden_act": _NAME,
        "layer_norm_eps": _EPS, "use_parallel_residual": _FLAG, "attention_bias": _FLAG,
        "tie_word_embeddings": _FLAG, "rotary_pct": _NUMBER_OR_NONE, "rotary_emb_base": _NUMBER_OR_NONE, **_ROPE,
    },
    "LlamaForCausalLM": _LLAMA_FIELDS,
    "Qwen2ForCausalLM": _LLAMA_FIELDS,
    "MistralForCausalLM": _LLAMA_FIELDS,
    "Qwen3ForCausalLM": _LLAMA_FIELDS,
    "OlmoForCausalLM": {**_LLAMA_FIELDS, "clip_qkv": _NUMBER_OR_NONE},
    "Phi3ForCausalLM": {**_LLAMA_FIELDS, "original_max_position_embeddings": _COUNT_OR_NONE},
    "Olmo2ForCausalLM": _LLAMA_FIELDS,
    "Gemma2ForCausalLM": _GEMMA_FIELDS,
    "Gemma3ForCausalLM": _GEMMA_FIELDS,
    "GPTJForCausalLM": {
        "vocab_size": _COUNT, "n_embd": _COUNT, "n_layer": _COUNT, "n_head": _COUNT, "n_positions": _COUNT,
        "n_inner": _COUNT_OR_NONE, "rotary_dim": _COUNT_OR_NONE, "activation_function": _NAME,
        "layer_norm_epsilon": _EPS, "tie_word_embeddings": _FLAG,
    },
    "MambaForCausalLM": {
        "vocab_size": _COUNT, "hidden_size": _COUNT, "num_hidden_layers": _COUNT, "state_size": _COUNT,
        "conv_kernel": _COUNT, "expand": _COUNT, "intermediate_size": _COUNT, "time_step_rank": _RANK,
        "time_step_min": _NUMBER, "time_step_max": _NUMBER, "time_step_floor": _NUMBER,
        "use_conv_bias": _FLAG, "use_bias": _FLAG, "layer_norm_epsilon": _EPS, "hidden_act": _NAME,
    },
}  # fmt: skip
_MUST_BE = {
    _COUNT: f"an integer in 1..{_MAX_COUNT}", _COUNT_OR_NONE: f"an integer in 1..{_MAX_COUNT} or null",
    _EPS: "a finite number >= 0", _NUMBER: "a finite number", _NUMBER_OR_NONE: "a finite number or null",
    _NAME: "a string", _FLAG: "true or false", _MAPPING_OR_NONE: "an object or null",
    _NAMES_OR_NONE: "a list of strings or null", _RANK: f'an integer in 1..{_MAX_COUNT} or "auto"',
    _NUMBERS_OR_NONE: "a list of finite numbers or null",
}  # fmt: skip


def _is_integer(value: Any) -> bool:
    """An integer (a numpy one too, in a config built in memory), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _fits(value: Any, kind: str) -> bool:
    if value is None and kind.endswith("?") or value is None and kind == _FLAG:
        return True
    if kind in (_COUNT, _COUNT_OR_NONE, _RANK):
        return (_is_integer(value) and 1 <= value <= _MAX_COUNT) or (
            kind == _RANK and value == "auto"
        )
    if kind in (_NUMBER, _NUMBER_OR_NONE):
        return _is_number(value)
    if kind == _EPS:
        return _is_number(value) and value >= 0
    if kind == _NAME:
        return isinstance(value, str)
    if kind == _FLAG:
        return isinstance(value, bool)
    if kind == _MAPPING_OR_NONE:
        return isinstance(value, dict)
    if kind == _NUMBERS_OR_NONE:
        return isinstance(value, list) and all(_is_number(v) for v in value)
    return isinstance(value, list) and all(isinstance(v, str) for v in value)  # _NAMES_OR_NONE


def shown(value: Any) -> str:
    """A value as JSON writes it (``"32"``, ``2.0``, ``NaN``), or its kind when long."""
    text = (
        json.dumps(value) if isinstance(value, int | float | str | bool) or value is None else None
    )
    return json_type(value) if text is None or len(text) > 40 else text


def check_config_values(arch: str, values: Any, source: str, advice: str) -> None:
    """Every value the import of ``arch`` reads, of the right type and range.

    Args:
        arch: The Hugging Face class name.
        values: ``config.json``'s object (keys present are checked) or a ``transformers``
            config (its attributes).
        source: What the values came from, for the message.
        advice: What to do, the message's end.

    Raises:
        ImportProblem: The first value that is not what it must be, named.
    """
    for name, kind in CONFIG_FIELDS.get(arch, {}).items():
        if isinstance(values, dict):
            if name not in values:
                continue
            value = values[name]
        else:
            value = getattr(values, name, None)
            if (
                value is None
                and kind in (_COUNT, _NUMBER, _EPS, _NAME, _RANK)
                and not hasattr(values, name)
            ):
                continue  # the builders use a default
        if kind == _RANK and not isinstance(values, dict) and value == "auto":
            value = None  # transformers resolves "auto"; the object must hold the integer
        if not _fits(value, kind):
            raise ImportProblem(
                f"{source}: {name} must be {_MUST_BE[kind]}, got {shown(value)}; {advice}"
            )
    if isinstance(values, dict):
        rope = values.get("rope_parameters") or values.get("rope_scaling")
    else:
        rope = getattr(values, "rope_parameters", None) or getattr(values, "rope_scaling", None)
    for name, kind in (("rope_theta", _NUMBER_OR_NONE), ("partial_rotary_factor", _NUMBER_OR_NONE),
                       ("rope_type", _NAME), ("type", _NAME), *_ROPE_SCALING):  # fmt: skip
        if isinstance(rope, dict) and name in rope and not _fits(rope[name], kind):
            raise ImportProblem(f"{source}: rope_parameters.{name} must be {_MUST_BE[kind]}, got "
                                f"{shown(rope[name])}; {advice}")  # fmt: skip
