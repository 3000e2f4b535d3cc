"""Tests of mechlab.checkpoint: bit-exact round trips and one-line errors for bad files."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import pickle
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from mechlab.checkpoint import (
    CheckpointError,
    UncheckedCheckpointWarning,
    capture_rng,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
    save_safetensors,
    seal,
)
from mechlab.models.base import MechModel, ModelConfig, ReadIn, ReadOut
from mechlab.models.registry import FAMILIES, build_model

# ----------------------------------------------------------------- a toy family


@dataclass
class ToyConfig(ModelConfig):
    arch = "toy"
    d_hidden: int = 8


class Toy(MechModel):
    """A two-layer MLP per position, registered as family "toy" by the `toy` fixture."""

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.cfg = cfg
        self.read_in = ReadIn(cfg)
        self.hook_embed = HookPoint()
        self.up = nn.Linear(cfg.d_model, cfg.d_hidden)
        self.down = nn.Linear(cfg.d_hidden, cfg.d_model)
        self.read_out = ReadOut(cfg)
        self.hook_out = HookPoint()
        self.register_buffer("n_seen", torch.tensor(7, dtype=torch.long))
        self.setup()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.hook_embed(self.read_in(x))
        h = h + self.down(torch.relu(self.up(h)))
        return self.hook_out(self.read_out(h))


BUNDLED = Path(__file__).resolve().parents[1] / "examples" / "checkpoints" / "recall-cpu" / "last.pt"
TOY = dict(arch="toy", d_model=8, n_layers=1, n_ctx=8, d_in=3, d_out=2, d_hidden=6)


@pytest.fixture
def toy(monkeypatch):
    """Register the toy family (this module) in the registry for one test."""
    monkeypatch.setitem(FAMILIES, "toy", (__name__, "ToyConfig", "Toy"))
    assert importlib.import_module(__name__).Toy is Toy


@pytest.fixture
def toy_ckpt(toy, tmp_path):
    torch.manual_seed(0)
    model = build_model(TOY)
    return model, save_checkpoint(model, tmp_path / "toy.pt", step=5)


def tamper(path, change, reseal=True):
    """Rewrite a checkpoint's payload with ``change(payload)`` applied.

    With ``reseal`` the checksum is recomputed, as a writer with a bug would have
    written it, so the checks behind the checksum are what the test sees.
    """
    payload = torch.load(path, weights_only=True)
    change(payload)
    if reseal:
        seal(payload)
    torch.save(payload, path)
    return path


def error_of(path, **kwargs) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message and message
    return message


def assert_same_tree(a, b):
    """Equal nested dicts/lists of plain values, tensors compared with torch.equal."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for key in a:
            assert_same_tree(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_tree(x, y)
    else:
        assert a == b


def small_model(arch: str, **fields) -> MechModel:
    module = pytest.importorskip(FAMILIES[arch][0])
    known = {f.name for f in dataclasses.fields(getattr(module, FAMILIES[arch][1]))}
    small = {k: v for k, v in {"d_state": 4, "d_mlp": 32}.items() if k in known}
    return build_model({"arch": arch, "d_model": 16, "n_layers": 2, "n_ctx": 8, **small, **fields})


def example_input(model: MechModel, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if model.cfg.io == "tokens":
        return torch.randint(0, model.cfg.d_vocab, (2, 6), generator=g)
    return torch.randn(2, 6, model.cfg.d_in, generator=g)


# ----------------------------------------------------------------- round trips


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_round_trip_is_bit_exact(arch, tmp_path):
    torch.manual_seed(0)
    model = small_model(arch, d_in=3, d_out=2)
    x = example_input(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(x).square().mean().backward()
    optimizer.step()
    metrics = {"loss": 0.25, "acc": [0.5, 1.0], "curve": torch.arange(4.0)}
    path = save_checkpoint(
        model, tmp_path / "run" / "ckpt.pt", optimizer=optimizer, step=17, metrics=metrics,
        rng=True, note="hello", seed=3, extra={"nested": [1, None, True], "t": torch.ones(2)},
    )  # fmt: skip
    assert path == tmp_path / "run" / "ckpt.pt"
    draws = (torch.rand(5), np.random.rand(5), [random.random() for _ in range(5)])

    ckpt = load_checkpoint(path)

    assert type(ckpt.model) is type(model) and ckpt.config == model.cfg
    assert_same_tree(dict(model.state_dict()), dict(ckpt.model.state_dict()))
    assert ckpt.step == 17
    assert_same_tree(metrics, ckpt.metrics)
    assert_same_tree(
        {"note": "hello", "seed": 3, "extra": {"nested": [1, None, True], "t": torch.ones(2)}},
        ckpt.metadata,
    )
    assert ckpt.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert ckpt.path == path and not ckpt.model.training
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), ckpt.model(x))

    # The optimizer state is saved exactly and resumes training identically.
    assert_same_tree(optimizer.state_dict(), ckpt.optimizer_state)
    resumed = torch.optim.Adam(ckpt.model.parameters(), lr=1e-2)
    resumed.load_state_dict(ckpt.optimizer_state)
    for m, opt in ((model, optimizer), (ckpt.model, resumed)):
        m.train()
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
    assert_same_tree(dict(model.state_dict()), dict(ckpt.model.state_dict()))

    # The RNGs go back to where they were at save time.
    ckpt.restore_rng()
    again = (torch.rand(5), np.random.rand(5), [random.random() for _ in range(5)])
    assert torch.equal(draws[0], again[0])
    assert np.array_equal(draws[1], again[1])
    assert draws[2] == again[2]


def test_round_trip_tokens_mode(tmp_path):
    torch.manual_seed(0)
    model = small_model("transformer", io="tokens", d_vocab=11).eval()
    ckpt = load_checkpoint(save_checkpoint(model, tmp_path / "tok.pt"))
    x = example_input(model)
    assert ckpt.config.io == "tokens" and ckpt.config.d_vocab_out == 11
    with torch.no_grad():
        assert torch.equal(model(x), ckpt.model(x))


def test_float64_weights_keep_their_dtype(toy, tmp_path):
    torch.manual_seed(0)
    model = build_model(TOY).double()
    with torch.no_grad():
        model.up.weight.add_(1e-12)  # not representable in float32
    path = save_checkpoint(model, tmp_path / "f64.pt")
    ckpt = load_checkpoint(path, dtype=None)
    assert ckpt.model.up.weight.dtype == torch.float64 == ckpt.saved_dtype
    assert ckpt.model.n_seen.dtype == torch.long and int(ckpt.model.n_seen) == 7
    assert_same_tree(dict(model.state_dict()), dict(ckpt.model.state_dict()))
    # By default the model comes in float32, the dtype every analysis feeds it.
    cast = load_checkpoint(path)
    assert cast.model.up.weight.dtype == torch.float32 and cast.saved_dtype == torch.float64
    assert cast.model.n_seen.dtype == torch.long
    assert torch.equal(cast.model.up.weight, model.up.weight.float())


def test_rng_helpers_restore_the_same_stream():
    state = capture_rng()
    first = (torch.randn(3), np.random.randn(3), random.random())
    restore_rng(state)
    second = (torch.randn(3), np.random.randn(3), random.random())
    assert torch.equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert first[2] == second[2]
    with pytest.raises(CheckpointError, match="malformed RNG state"):
        restore_rng({"numpy": {"keys": [1, 2]}})


def test_checkpoint_without_rng_says_so(toy_ckpt):
    ckpt = load_checkpoint(toy_ckpt[1])
    assert ckpt.rng_state is None and ckpt.optimizer_state is None
    with pytest.raises(CheckpointError, match="rng=True"):
        ckpt.restore_rng()


# ----------------------------------------------------------------- refusing to save


class Opaque:
    pass


@pytest.mark.parametrize(
    "value, where",
    [
        (np.float64(1.0), "numpy.float64"),
        (Opaque(), "Opaque"),
        ({1, 2}, "set"),
        ([1, {"deep": object()}], "object"),
        (torch.Size([2, 3]), "Size"),
    ],
)
def test_metadata_must_be_plain(toy, tmp_path, value, where):
    model = build_model(TOY)
    with pytest.raises(TypeError, match=where) as info:
        save_checkpoint(model, tmp_path / "x.pt", info=value)
    assert "metadata['info']" in str(info.value)
    with pytest.raises(TypeError, match="metrics"):
        save_checkpoint(model, tmp_path / "x.pt", metrics={"m": value})
    assert not (tmp_path / "x.pt").exists()


def test_save_needs_a_mechlab_model(tmp_path):
    with pytest.raises(TypeError, match="ModelConfig"):
        save_checkpoint(nn.Linear(2, 2), tmp_path / "x.pt")


# ----------------------------------------------------------------- atomic writes


def test_failed_write_leaves_old_checkpoint_and_no_temp_file(toy_ckpt, monkeypatch):
    model, path = toy_ckpt
    before = path.read_bytes()

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    with torch.no_grad():
        model.up.weight.zero_()
    with monkeypatch.context() as patch, pytest.raises(OSError, match="disk full"):
        patch.setattr(torch, "save", broken_save)
        save_checkpoint(model, path, step=6)

    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == [path.name]
    assert load_checkpoint(path).step == 5


# ----------------------------------------------------------------- refusing to load


class RunsCode:
    """Unpickling this writes a file: the attack weights_only loading must stop."""

    def __init__(self, sentinel):
        self.sentinel = str(sentinel)

    def __reduce__(self):
        return (exec, (f"open({self.sentinel!r}, 'w').write('pwned')",))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_pickled_code_is_refused_and_never_runs(tmp_path, writer):
    sentinel = tmp_path / "SENTINEL"
    path = tmp_path / "evil.pt"
    payload = {"state_dict": {"w": torch.ones(2)}, "x": RunsCode(sentinel)}
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))

    message = error_of(path)
    assert message.startswith(f"refusing to load {path}")
    assert "pickled Python objects" in message and "nothing in it was executed" in message
    assert not sentinel.exists()

    # The file really is an attack: an unsafe load would have run it.
    if writer == "pickle.dump":
        pickle.loads(path.read_bytes())
        assert sentinel.read_text() == "pwned"


def test_missing_file(tmp_path):
    assert "does not exist" in error_of(tmp_path / "nope.pt")
    assert "not a file" in error_of(tmp_path)


def test_truncated_file(toy_ckpt):
    _, path = toy_ckpt
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "truncated or corrupt" in error_of(path)


@pytest.mark.parametrize(
    "content, phrase",
    [
        (b"", "empty (0 bytes)"),
        (bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)), "corrupt"),
        (b"hello, I am a text file\n", "not a PyTorch checkpoint"),
        (pickle.dumps({"a": 1}), "not a PyTorch checkpoint"),
    ],
    ids=["empty", "random", "text", "plain-pickle"],
)
def test_corrupt_files(tmp_path, content, phrase):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    assert phrase in error_of(path)


def test_foreign_files(tmp_path):
    path = tmp_path / "foreign.pt"
    torch.save(nn.Linear(3, 2).state_dict(), path)
    assert "bare state_dict of 2 tensors" in error_of(path)
    torch.save({"model": nn.Linear(3, 2).state_dict(), "epoch": 3}, path)
    message = error_of(path)
    assert "without the 'format'" in message and "'epoch'" in message
    torch.save([torch.ones(2)], path)
    assert "not a mechlab checkpoint: it holds a list" in error_of(path)
    torch.save({"format": "other-tool", "version": 1}, path)
    assert "format tag is 'other-tool'" in error_of(path)


def test_unsupported_version(toy_ckpt):
    path = tamper(toy_ckpt[1], lambda p: p.update(version=2))
    assert "version 2" in error_of(path) and "upgrade mechlab" in error_of(path)
    tamper(path, lambda p: p.update(version="1"))
    assert "unsupported format version '1'" in error_of(path)


def test_unknown_architecture(toy_ckpt):
    path = tamper(toy_ckpt[1], lambda p: p["config"].update(arch="rnn9000"))
    assert "unknown architecture 'rnn9000'" in error_of(path)


def test_config_errors(toy_ckpt):
    path = tamper(toy_ckpt[1], lambda p: p["config"].update(d_model=-3))
    message = error_of(path)
    assert "invalid toy config" in message and "d_model must be a positive integer" in message
    tamper(path, lambda p: p["config"].update(d_model=8, colour="red"))
    assert "unknown toy config field(s) ['colour']" in error_of(path)
    tamper(path, lambda p: p.update(config=[1, 2]))
    assert "'config' entry is list" in error_of(path)


def test_shape_mismatch_names_tensor_and_shapes(toy_ckpt):
    path = tamper(toy_ckpt[1], lambda p: p["state_dict"].update({"up.weight": torch.ones(5, 8)}))
    message = error_of(path)
    assert "'up.weight' has shape [5, 8]" in message and "builds [6, 8]" in message
    # A config that disagrees with the weights is caught the same way.
    tamper(path, lambda p: (p["state_dict"].update(build_model(TOY).state_dict()),
                            p["config"].update(d_hidden=4)))  # fmt: skip
    assert "'up.weight' has shape [6, 8]" in error_of(path)


def test_missing_and_unexpected_keys(toy_ckpt):
    path = tamper(toy_ckpt[1], lambda p: p["state_dict"].pop("down.bias"))
    assert "missing keys ['down.bias']" in error_of(path)
    tamper(
        path, lambda p: p["state_dict"].update({"down.bias": torch.ones(8), "extra": torch.ones(1)})
    )
    assert "unexpected keys ['extra']" in error_of(path)


# ----------------------------------------------------------------- safetensors


def test_safetensors_round_trip(toy, tmp_path):
    torch.manual_seed(0)
    model = build_model(TOY).eval()
    path = save_safetensors(model, tmp_path / "w.safetensors", step=9, metrics={"loss": 0.5})
    assert sorted(os.listdir(tmp_path)) == ["w.json", "w.safetensors"]
    ckpt = load_checkpoint(path)
    assert ckpt.config == model.cfg and ckpt.step == 9 and ckpt.metrics == {"loss": 0.5}
    assert_same_tree(dict(model.state_dict()), dict(ckpt.model.state_dict()))
    assert ckpt.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    x = example_input(model)
    with torch.no_grad():
        assert torch.equal(model(x), ckpt.model(x))
    # save_checkpoint hands a .safetensors path over, but cannot store optimizer state.
    assert save_checkpoint(model, tmp_path / "v.safetensors") == tmp_path / "v.safetensors"
    with pytest.raises(ValueError, match="weights only"):
        save_checkpoint(model, tmp_path / "u.safetensors", rng=True)


def test_safetensors_with_bare_config_json(toy, tmp_path):
    torch.manual_seed(0)
    model = build_model(TOY)
    path = save_safetensors(model, tmp_path / "model.safetensors")
    (tmp_path / "model.json").rename(tmp_path / "config.json")
    import json

    (tmp_path / "config.json").write_text(json.dumps(model.cfg.to_dict()))
    with pytest.warns(UncheckedCheckpointWarning, match="carries no checksum"):  # a bare config has none
        ckpt = load_checkpoint(path)
    assert ckpt.config == model.cfg and ckpt.step == 0
    assert_same_tree(dict(model.state_dict()), dict(ckpt.model.state_dict()))


def test_safetensors_errors(toy, tmp_path):
    path = save_safetensors(build_model(TOY), tmp_path / "w.safetensors")
    (tmp_path / "w.json").write_text("{not json")
    assert "cannot read the config" in error_of(path)
    (tmp_path / "w.json").unlink()
    assert "expected w.json or config.json beside it" in error_of(path)
    path.write_bytes(path.read_bytes()[:40])
    assert "truncated or corrupt" in error_of(path)


# ----------------------------------------------------------------- checksums, finiteness, dtypes
# (issue 10 cases 3, 4, 5, 6 and 7)


def storage_records(path):
    """``(name, offset, size)`` of every tensor storage in a zip checkpoint (stored, uncompressed)."""
    import zipfile

    out = []
    with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
        for info in zf.infolist():
            if "/data/" not in info.filename or info.file_size < 4:
                continue
            raw.seek(info.header_offset)
            header = raw.read(30)
            name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
            out.append((info.filename, info.header_offset + 30 + name_len + extra_len, info.file_size))
    return out


def flip_bit(path, offset, mask=0x40):
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


@pytest.fixture
def full_ckpt(toy, tmp_path):
    """A toy checkpoint with optimizer state and RNG state (every kind of tensor)."""
    torch.manual_seed(0)
    model = build_model(TOY)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4, 3)).pow(2).sum().backward()
    optimizer.step()
    return save_checkpoint(model, tmp_path / "full.pt", optimizer=optimizer, step=3, rng=True,
                           metrics={"loss": 0.5}, task="lds")  # fmt: skip


def test_an_exponent_bit_flipped_in_any_tensor_is_refused_naming_it(full_ckpt, tmp_path):
    # Issue 10 case 3: one exponent bit flipped per tensor loaded and evaluated to NaN.
    assert load_checkpoint(full_ckpt).checksum_verified
    records = storage_records(full_ckpt)
    assert len(records) >= 10  # weights, the buffer, Adam moments, RNG states
    named = set()
    for _, offset, _ in records:
        copy = tmp_path / "flipped.pt"
        copy.write_bytes(full_ckpt.read_bytes())
        flip_bit(copy, offset + 3)  # the high byte of a little-endian float32: exponent bits
        message = error_of(copy)
        assert "does not match its checksum" in message and "restore an intact copy" in message
        named.add(re.search(r"tensor '([^']+)'", message).group(1))
    assert len(named) == len(records)  # each flip is pinned on its own tensor
    assert {"state_dict/up.weight", "state_dict/n_seen"} <= named
    assert any(n.startswith("optimizer/state/") for n in named) and "rng/torch" in named


def test_changed_plain_values_are_refused_and_old_files_still_load(full_ckpt):
    tamper(full_ckpt, lambda p: p.update(step=4), reseal=False)
    assert "non-tensor values" in error_of(full_ckpt)
    tamper(full_ckpt, lambda p: p.pop("checksum"), reseal=False)  # as written before checksums
    with pytest.warns(UncheckedCheckpointWarning, match="carries no checksum"):
        ckpt = load_checkpoint(full_ckpt)
    assert ckpt.step == 4 and not ckpt.checksum_verified
    tamper(full_ckpt, lambda p: p.update(checksum={"algorithm": "md5"}), reseal=False)
    assert "checksum entry is malformed" in error_of(full_ckpt)


def test_the_bundled_checkpoint_loads_with_its_checksum_verified():
    # Re-saved with checksums in issue 19 (examples/reseal_checkpoints.py); every bundled
    # file is bit-flipped in tests/checkpoint/test_bundled_checkpoints.py.
    ckpt = load_checkpoint(BUNDLED)
    assert ckpt.checksum_verified and ckpt.saved_dtype == torch.float32
    assert ckpt.step == 20000 and ckpt.config.arch == "transformer"


def test_non_finite_weights_are_refused_unless_asked_for(toy, tmp_path):
    model = build_model(TOY)
    with torch.no_grad():
        model.up.weight[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    path = save_checkpoint(model, tmp_path / "nan.pt")
    message = error_of(path)
    assert "non-finite weights: tensor 'up.weight' has 3 NaN/inf value(s) of 48" in message
    assert "allow_non_finite=True" in message
    ckpt = load_checkpoint(path, allow_non_finite=True)
    assert torch.isnan(ckpt.model.up.weight[0, 0])


def test_meta_device_weights_are_refused_on_save_and_load(toy, tmp_path):
    # Issue 10 case 5: meta-device weights "loaded" into a model that held no data.
    with torch.device("meta"):
        model = build_model(TOY)
    with pytest.raises(ValueError, match="meta device and hold no data"):
        save_checkpoint(model, tmp_path / "meta.pt")
    path = save_checkpoint(build_model(TOY), tmp_path / "meta.pt")
    tamper(path, lambda p: p["state_dict"].update({"up.weight": torch.empty(6, 8, device="meta")}),
           reseal=False)  # fmt: skip
    tamper(path, lambda p: p.pop("checksum"), reseal=False)
    assert "['up.weight'] in" in error_of(path) and "hold no data" in error_of(path)


def test_random_bytes_that_start_like_an_object_opcode_are_called_corrupt(tmp_path):
    # Issue 10 case 7: bytes starting 0x82 (EXT1) were "pickled Python objects".
    path = tmp_path / "r.pt"
    for first in (b"\x82", b"\x80\x02\x82", b"c"):
        path.write_bytes(first + bytes(np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8)))
        message = error_of(path)
        assert "pickled Python objects" not in message and "corrupt" in message


def test_a_bad_device_is_named_not_blamed_on_the_file(toy_ckpt):
    # Issue 10 case 7: --device bogus called a good checkpoint "truncated or corrupt".
    for device, phrase in (("bogus", "unknown device 'bogus'"), ("meta", "does not run on")):
        with pytest.raises(ValueError, match=phrase) as info:
            load_checkpoint(toy_ckpt[1], map_location=device)
        assert not isinstance(info.value, CheckpointError)


def test_an_oversized_config_is_refused_before_allocation(toy_ckpt, monkeypatch):
    # Issue 10 case 6: a huge d_model allocated the model before any check.
    path = tamper(toy_ckpt[1], lambda p: p["config"].update(d_model=10**6, d_hidden=10**6))
    message = error_of(path)
    assert "would allocate about" in message and "MECHLAB_MAX_ELEMENTS" in message
    monkeypatch.setenv("MECHLAB_MAX_ELEMENTS", "100")
    assert "more than the limit 100" in error_of(toy_ckpt[1].parent / "toy.pt")
    monkeypatch.setenv("MECHLAB_MAX_ELEMENTS", "lots")
    with pytest.raises(ValueError, match="MECHLAB_MAX_ELEMENTS='lots' is not a positive number"):
        load_checkpoint(path)


def test_reserved_metadata_of_the_wrong_type_is_refused(toy, tmp_path):
    # Issue 10 case 5: train_cfg="x" gave an AttributeError traceback.
    path = save_checkpoint(build_model(TOY), tmp_path / "m.pt", train_cfg="x")
    assert "metadata entry 'train_cfg' is str, not dict" in error_of(path)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_any_float_dtype_loads_and_runs(toy, tmp_path, dtype):
    # Issue 10 case 4: float64/bf16/fp16 checkpoints failed with a dtype mismatch.
    torch.manual_seed(0)
    model = build_model(TOY).to(dtype)
    path = save_checkpoint(model, tmp_path / f"{dtype}.pt")
    ckpt = load_checkpoint(path)
    assert ckpt.saved_dtype == dtype and ckpt.model.up.weight.dtype == torch.float32
    x = torch.randn(2, 4, 3)
    with torch.no_grad():
        assert torch.allclose(ckpt.model(x), model.float()(x))
    kept = load_checkpoint(path, dtype=None)
    assert kept.model.up.weight.dtype == dtype
    assert_same_tree(dict(model.to(dtype).state_dict()), dict(kept.model.state_dict()))
    with pytest.raises(ValueError, match="floating torch dtype"):
        load_checkpoint(path, dtype=torch.int64)


def test_safetensors_checksum_names_the_changed_tensor(toy, tmp_path):
    model = build_model(TOY)
    path = save_safetensors(model, tmp_path / "w.safetensors")
    assert load_checkpoint(path).checksum_verified
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x40  # the last tensor's bytes
    path.write_bytes(bytes(data))
    message = error_of(path)
    assert "does not match its checksum" in message and re.search(r"tensor '[\w.]+'", message)
