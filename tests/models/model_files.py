"""Model folders users bring, damaged or hostile one file at a time (shared by the importer's
and the CLI's tests of issue 34: each case is a way one file of a ``save_pretrained``
folder can be wrong, with a part of the one-line message it must give)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from hypothesis import strategies as st

from tests.models.hf_models import hf_model

V = 61  # the models' vocabulary (hf_models.V)


def good_folder(root: Path, kind: str = "safetensors") -> Path:
    """A random 2-layer GPT-2 saved in ``root/<kind>``: ``model.safetensors``, a legacy
    (pre-zip) ``pytorch_model.bin``, a zip one, or sharded safetensors."""
    folder = root / kind
    if folder.exists():
        return folder
    hf = hf_model("gpt2")
    if kind == "safetensors":
        hf.save_pretrained(folder)
    elif kind == "sharded":
        hf.save_pretrained(folder, max_shard_size="40KB")
        assert (folder / "model.safetensors.index.json").is_file()
    else:
        hf.config.save_pretrained(folder)
        torch.save(
            hf.state_dict(),
            folder / "pytorch_model.bin",
            _use_new_zipfile_serialization=kind == "bin",
        )
    return folder


def copy(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest, symlinks=True)
    return dest


# --- edits ------------------------------------------------------------------------------


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


_DROP = object()


def safetensors_parts(path: Path) -> tuple[dict, bytes]:
    """The header and the data of a safetensors file."""
    return safetensors_parts_of(path.read_bytes())


def write_safetensors(path: Path, header: dict, body: bytes) -> None:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def move_to_shard(folder: Path, where: str) -> tuple[dict, bytes]:
    """Move the folder's ``model.safetensors`` to the shard ``where`` (a path inside the folder,
    in a subfolder or hidden) and write an index mapping every tensor to it; returns the
    shard's header and data."""
    header, body = safetensors_parts(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    (folder / where).parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / where, header, body)
    names = [k for k in header if k != "__metadata__"]
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": dict.fromkeys(names, where)})
    )
    return header, body


def edit_header(folder: Path, edit: Callable[[dict], None]) -> None:
    path = folder / "model.safetensors"
    header, body = safetensors_parts(path)
    edit(header)
    write_safetensors(path, header, body)


def _tensors(header: dict) -> list[str]:
    """The header's tensor names, by offset."""
    return sorted(
        (k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"]
    )


def _grow_shape(header: dict) -> None:
    name = _tensors(header)[0]
    header[name]["shape"][0] += 1


def _overlap(header: dict) -> None:
    last = _tensors(header)[-1]
    begin, end = header[last]["data_offsets"]
    header[last]["data_offsets"] = [0, end - begin]


def _out_of_file(header: dict) -> None:
    name = _tensors(header)[0]
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [10**12, 10**12 + end - begin]


def _dtype(header: dict) -> None:
    header[_tensors(header)[0]]["dtype"] = "Q7"


def _write_state(folder: Path, edit: Callable[[dict], None]) -> None:
    from safetensors.torch import save_file

    state = {
        k: v.clone().contiguous()
        for k, v in hf_model("gpt2").state_dict().items()
        if k != "lm_head.weight"
    }
    edit(state)
    save_file(state, folder / "model.safetensors")


class RunsACommand:
    """A pickle that would run a shell command when loaded without ``weights_only``."""

    def __reduce__(self):
        return (os.system, ("echo this should never run",))


def _bin(folder: Path, obj=None, raw: bytes | None = None) -> None:
    (folder / "model.safetensors").unlink()
    if raw is not None:
        (folder / "pytorch_model.bin").write_bytes(raw)
    else:
        torch.save(obj, folder / "pytorch_model.bin")


def _truncated_bin(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    torch.save(hf_model("gpt2").state_dict(), folder / "pytorch_model.bin")
    data = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(data[: len(data) // 2])


def index(folder: Path, content, name: str = "model.safetensors.index.json") -> None:
    """Weights moved to ``shard.safetensors`` (or ``.bin``) and an index holding ``content``
    (a JSON value, or bytes written as they are)."""
    if name.startswith("pytorch"):
        _bin(folder, hf_model("gpt2").state_dict())
        (folder / "pytorch_model.bin").rename(folder / "shard.bin")
    else:
        (folder / "model.safetensors").rename(folder / "shard.safetensors")
    text = content if isinstance(content, bytes) else json.dumps(content).encode()
    (folder / name).write_bytes(text)


def _map_to(folder: Path, file: str) -> None:
    header, _ = safetensors_parts(folder / "model.safetensors")
    index(folder, {"metadata": {}, "weight_map": dict.fromkeys(_tensors(header), file)})


def _shard_links_out(folder: Path) -> None:
    _map_to(folder, "shard.safetensors")
    outside = folder.parent / f"{folder.name}-outside.safetensors"
    (folder / "shard.safetensors").rename(outside)
    (folder / "shard.safetensors").symlink_to(outside)


def _config_links_out(folder: Path) -> None:
    outside = folder.parent / f"{folder.name}-config.json"
    (folder / "config.json").rename(outside)
    (folder / "config.json").symlink_to(outside)


def _link(folder: Path, name: str, target: str) -> None:
    (folder / name).unlink()
    (folder / name).symlink_to(target)


# case -> (edit of a good safetensors folder, part of the message)
CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    # config.json
    "config-int-as-string": (lambda f: edit_config(f, n_embd="32"), 'n_embd must be an integer in 1..2147483647, got "32"'),
    "config-int-as-float": (lambda f: edit_config(f, n_layer=2.0), "n_layer must be an integer in 1..2147483647, got 2.0"),
    "config-nan": (lambda f: edit_config(f, layer_norm_epsilon=float("nan")), "layer_norm_epsilon must be a finite number >= 0, got NaN"),
    "config-int-too-large": (lambda f: edit_config(f, n_head=10**30), "n_head must be an integer in 1..2147483647, got 1000000000000000000000000000000"),
    "config-zero-heads": (lambda f: edit_config(f, n_head=0), "n_head must be an integer in 1..2147483647, got 0"),
    "config-list-for-string": (lambda f: edit_config(f, activation_function=["gelu"]), "activation_function must be a string, got a list"),
    "config-string-for-flag": (lambda f: edit_config(f, tie_word_embeddings="yes"), 'tie_word_embeddings must be true or false, got "yes"'),
    "config-null-for-int": (lambda f: edit_config(f, vocab_size=None), "vocab_size must be an integer in 1..2147483647, got null"),
    "config-is-a-list": (lambda f: (f / "config.json").write_text("[1, 2]"), "config.json' holds a list, not a JSON object"),
    "config-deeply-nested": (lambda f: (f / "config.json").write_text("[" * 100_000 + "]" * 100_000), "nests more than 64 levels deep"),
    "config-not-json": (lambda f: (f / "config.json").write_text('{"n_embd": '), "is not valid JSON"),
    "config-not-text": (lambda f: (f / "config.json").write_bytes(b"\xff\xfe\x00junk"), "is not UTF-8 text"),
    "config-links-out": (_config_links_out, "config.json' (the config) leads outside the model folder"),
    "architectures-a-mapping": (lambda f: edit_config(f, architectures={"a": 1}), "architectures must be a list of class names, got an object"),
    "architectures-a-string": (lambda f: edit_config(f, architectures="GPT2LMHeadModel"), 'architectures must be a list of class names, got "GPT2LMHeadModel"'),
    "architectures-numbers": (lambda f: edit_config(f, architectures=[0]), "architectures must be a list of class names"),
    "model-type-a-number": (lambda f: edit_config(f, architectures=_DROP, model_type=3), "model_type must be a string, got 3"),
    # model.safetensors
    "safetensors-header-claims-more": (
        lambda f: (f / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + (f / "model.safetensors").read_bytes()[8:]),
        "its header claims 1,000,000,000 bytes and the file has"),
    "safetensors-junk": (lambda f: (f / "model.safetensors").write_bytes(b"this is not a safetensors file" * 3), "is not a safetensors file, or is truncated"),
    "safetensors-truncated": (
        lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:50_000]), "(truncated?)"),
    "safetensors-empty": (lambda f: (f / "model.safetensors").write_bytes(b""), "model.safetensors' is 0 bytes"),
    "safetensors-header-not-json": (lambda f: (f / "model.safetensors").write_bytes(struct.pack("<Q", 8) + b"{{{{{{{{" + b"\0" * 64), "has a header that is not JSON"),
    "safetensors-header-a-list": (lambda f: (f / "model.safetensors").write_bytes(struct.pack("<Q", 8) + b"[1, 2]  "), "has a header that is a list"),
    "safetensors-shape-vs-bytes": (lambda f: edit_header(f, _grow_shape), "the shape needs"),
    "safetensors-overlapping-offsets": (lambda f: edit_header(f, _overlap), "has tensor offsets that overlap"),
    "safetensors-offsets-out-of-file": (lambda f: edit_header(f, _out_of_file), "at bytes [1000000000000, "),
    "safetensors-unknown-dtype": (lambda f: edit_header(f, _dtype), "the dtype 'Q7'; known: F64"),
    "safetensors-links-to-a-system-file": (lambda f: _link(f, "model.safetensors", "/etc/passwd"), "leads outside the model folder, to '/etc/passwd'"),
    "safetensors-links-to-a-device": (lambda f: _link(f, "model.safetensors", "/dev/zero"), "leads outside the model folder, to '/dev/zero'"),
    "safetensors-a-folder": (lambda f: ((f / "model.safetensors").unlink(), (f / "model.safetensors").mkdir()), "(the weights) is a folder"),
    # pytorch_model.bin
    "bin-pickle-runs-a-command": (lambda f: _bin(f, {"w": RunsACommand()}), "holds Python objects besides tensors"),
    "bin-junk": (lambda f: _bin(f, raw=b"junk" * 100), "is not a torch weight file or is damaged"),
    "bin-empty": (lambda f: _bin(f, raw=b""), "pytorch_model.bin' is empty (0 bytes)"),
    "bin-truncated": (_truncated_bin, "is not a torch weight file or is damaged"),
    "bin-not-a-state-dict": (lambda f: _bin(f, [1, 2]), "holds a list, not a state dict of tensors"),
    "bin-not-tensors": (lambda f: _bin(f, {"transformer.wte.weight": 3}), "a state dict maps names to tensors"),
    # the weight index
    "index-without-weight-map": (lambda f: index(f, {"metadata": {}}), "it holds no weight_map"),
    "index-weight-map-a-list": (lambda f: index(f, {"weight_map": ["shard.safetensors"]}), "it holds a weight_map that is a list"),
    "index-weight-map-nested": (lambda f: index(f, {"weight_map": {"a": {"b": "shard.safetensors"}}}), "maps 'a' to an object, not a .safetensors file name"),
    "index-a-list": (lambda f: index(f, [1]), "it holds a list"),
    "index-not-json": (lambda f: index(f, b"{"), "is not valid JSON"),
    "index-points-up-and-out": (lambda f: _map_to(f, "../other/model.safetensors"), "names the shard '../other/model.safetensors', outside the model folder"),
    "index-points-to-an-absolute-path": (lambda f: _map_to(f, "/etc/passwd.safetensors"), "names the shard '/etc/passwd.safetensors', outside the model folder"),
    "index-names-a-missing-shard": (lambda f: _map_to(f, "gone.safetensors"), "lacks the weight shard 'gone.safetensors'"),
    "index-shard-links-out": (_shard_links_out, "(a shard model.safetensors.index.json names) leads outside the model folder"),
    "bin-index-without-weight-map": (lambda f: index(f, {"metadata": {}}, "pytorch_model.bin.index.json"), "pytorch_model.bin.index.json' must be a JSON object"),
    # weights against the config
    "weights-wider-than-config": (lambda f: edit_config(f, n_embd=48), "wte has shape [61, 32], the config implies [61, 48]"),
    "weights-of-another-rank": (lambda f: _write_state(f, lambda s: s.update({"transformer.h.0.attn.c_attn.weight": s["transformer.h.0.attn.c_attn.weight"].flatten()})),
                                "a weight does not fit the config"),
    "weights-of-integers": (lambda f: _write_state(f, lambda s: s.update({"transformer.h.0.attn.c_attn.weight": torch.zeros(32, 96, dtype=torch.int32)})),
                            "holds torch.int32 values on cpu, not floating-point numbers"),
    "weights-missing": (lambda f: _write_state(f, lambda s: s.pop("transformer.h.1.mlp.c_fc.bias")), "has no weight 'transformer.h.1.mlp.c_fc.bias'"),
}  # fmt: skip


def bad_folder(root: Path, case: str) -> tuple[Path, str]:
    """A copy of the good safetensors folder with ``case``'s damage, and its message part."""
    edit, message = CASES[case]
    dest, n = root / case, 1
    while dest.exists():
        dest, n = root / f"{case}-{n}", n + 1
    folder = copy(good_folder(root), dest)
    edit(folder)
    return folder, message


def id_pairs(path: Path, n: int = 4) -> Path:
    """``n`` token-id pairs for the models above (vocabulary :data:`V`), as JSONL."""
    gen = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(n):
        clean = torch.randint(1, V, (6,), generator=gen).tolist()
        corrupted = torch.randint(1, V, (6,), generator=gen).tolist()
        lines.append(
            json.dumps(
                {
                    "clean": clean,
                    "corrupted": corrupted,
                    "answer": clean[-1],
                    "wrong": corrupted[-1],
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


# --- any content of each file (the property tests) -------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
_NAMES = st.sampled_from(["shard.safetensors", "sub/shard.safetensors", "../shard.safetensors", "/etc/passwd",
                          "", ".", "shard.bin", "a\0b.safetensors", "x" * 300 + ".safetensors"])  # fmt: skip


def config_contents(config: dict) -> st.SearchStrategy:
    keys = st.sampled_from(
        sorted(config) + ["architectures", "model_type", "n_inner", "rope_scaling"]
    )
    one_value = st.tuples(keys, _JSON).map(lambda kv: json.dumps({**config, kv[0]: kv[1]}).encode())
    return st.one_of(
        st.binary(max_size=200), _JSON.map(lambda v: json.dumps(v).encode()), one_value
    )


def safetensors_contents(data: bytes) -> st.SearchStrategy:
    header, body = safetensors_parts_of(data)
    names = sorted(k for k in header if k != "__metadata__")
    fields = st.sampled_from(["dtype", "shape", "data_offsets"])

    def edited(args):
        name, field, value = args
        new = json.loads(json.dumps(header))
        new[name][field] = value
        text = json.dumps(new).encode()
        return struct.pack("<Q", len(text)) + text + body

    return st.one_of(
        st.binary(max_size=200),
        st.integers(0, len(data)).map(lambda n: data[:n]),
        st.tuples(
            st.sampled_from(names), fields, _JSON | st.lists(st.integers(-5, 10**6), max_size=3)
        ).map(edited),
        st.integers(0, 2**64 - 1).map(lambda n: struct.pack("<Q", n) + data[8:]),
    )


def safetensors_parts_of(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def bin_contents(zip_data: bytes, legacy_data: bytes) -> st.SearchStrategy:
    objects = st.recursive(st.none() | st.integers() | st.text(max_size=5) | st.just(torch.zeros(2)),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                           max_leaves=5)  # fmt: skip

    def saved(obj):
        with tempfile.TemporaryFile() as f:
            torch.save(obj, f)
            f.seek(0)
            return f.read()

    return st.one_of(
        st.binary(max_size=200),
        st.integers(0, len(zip_data)).map(lambda n: zip_data[:n]),
        st.integers(0, len(legacy_data)).map(lambda n: legacy_data[:n]),
        objects.map(saved),
    )


def index_contents() -> st.SearchStrategy:
    maps = st.dictionaries(st.text(max_size=20), _NAMES | _JSON, max_size=3)
    return st.one_of(st.binary(max_size=100), _JSON.map(lambda v: json.dumps(v).encode()),
                     maps.map(lambda m: json.dumps({"weight_map": m}).encode()))  # fmt: skip


def write_case(base: Path, folder: Path, name: str, data: bytes) -> Path:
    target = copy(folder, base / "m")
    (target / name).write_bytes(data)
    (target / "shard.safetensors").write_bytes(
        (folder.parent / "safetensors" / "model.safetensors").read_bytes()
    )
    return target


def file_contents(root: Path) -> dict:
    """File name -> (strategy of its contents, right- and wrong-shaped, and the good folder
    it goes into) for each file a model folder holds."""
    good = good_folder(root)
    config = json.loads((good / "config.json").read_text())
    zip_data = (good_folder(root, "bin") / "pytorch_model.bin").read_bytes()
    legacy = (good_folder(root, "legacy-bin") / "pytorch_model.bin").read_bytes()
    return {
        "config.json": (config_contents(config), good),
        "model.safetensors": (
            safetensors_contents((good / "model.safetensors").read_bytes()),
            good,
        ),
        "pytorch_model.bin": (bin_contents(zip_data, legacy), good_folder(root, "bin")),
        "model.safetensors.index.json": (index_contents(), good_folder(root, "sharded")),
    }
