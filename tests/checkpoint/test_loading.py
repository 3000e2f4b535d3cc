"""Loading: zip directories checked before anything is decompressed (issue 19, the zip
bomb), old-format files load with a one-line note, and one constructor builds every
Checkpoint whatever the file type."""

from __future__ import annotations

import resource
import time
import warnings
import zipfile

import pytest
import torch

from mechlab.checkpoint import (
    CheckpointError,
    UncheckedCheckpointWarning,
    check_archive,
    load_checkpoint,
    save_checkpoint,
    save_safetensors,
)
from mechlab.checkpoint import loading as loading_module
from mechlab.models import build_model

MODEL = {"arch": "transformer", "d_model": 8, "n_layers": 1, "n_heads": 2, "io": "continuous",
         "d_in": 5, "d_out": 3, "n_ctx": 8}  # fmt: skip


@pytest.fixture
def ckpt_path(tmp_path):
    torch.manual_seed(0)
    return save_checkpoint(build_model(MODEL), tmp_path / "good.pt", step=3, task="lds")


def rezip(source, target, compress=zipfile.ZIP_DEFLATED, extra=None):
    """A copy of a zip checkpoint with its entries recompressed, plus ``extra`` entries
    (name -> number of zero bytes, written in 16 MiB chunks)."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", compression=compress) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
        for name, size in (extra or {}).items():
            with zout.open(name, "w", force_zip64=True) as f:
                chunk = bytes(16 << 20)
                for _ in range(size // len(chunk)):
                    f.write(chunk)
    return target


def test_a_zip_bomb_is_refused_from_its_directory_before_anything_is_decompressed(ckpt_path, tmp_path, monkeypatch):
    # Issue 19: a 4.4 MB checkpoint with a 2 GiB entry was decompressed (2.5 GB peak)
    # before it was refused. Here 128 MiB of zeros in about 0.2 MB; torch.load must
    # never be reached.
    bomb = rezip(ckpt_path, tmp_path / "bomb.pt", extra={"archive/data/999": 128 << 20})
    assert bomb.stat().st_size < 2 << 20
    calls = []
    monkeypatch.setattr(loading_module.torch, "load", lambda *a, **k: calls.append(a))
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(bomb)
    assert time.perf_counter() - start < 1.0 and not calls
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 64 << 10  # KiB: < 64 MiB
    message = str(err.value)
    assert "\n" not in message and "is compressed" in message and "nothing was decompressed" in message
    assert "'archive/data/999'" in message and "expand to 134,217,728" in message


def test_a_recompressed_checkpoint_is_refused_and_the_stored_original_loads(ckpt_path, tmp_path):
    assert load_checkpoint(ckpt_path).step == 3
    with pytest.raises(CheckpointError, match="is compressed"):
        load_checkpoint(rezip(ckpt_path, tmp_path / "deflated.pt"))
    stored = rezip(ckpt_path, tmp_path / "stored.pt", compress=zipfile.ZIP_STORED)
    assert load_checkpoint(stored).checksum_verified  # stored entries are what torch writes


def test_declared_sizes_the_file_cannot_hold_are_refused(ckpt_path, tmp_path):
    data = bytearray(ckpt_path.read_bytes())
    with zipfile.ZipFile(ckpt_path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    # The central directory's sizes of that entry (compressed, uncompressed) doubled-up:
    # find its central header by the name and patch both 4-byte sizes.
    name = info.filename.encode()
    at = data.rindex(b"PK\x01\x02" + data[data.rindex(name) - 46 + 4 : data.rindex(name) - 46 + 20])
    big = (len(data) * 4).to_bytes(4, "little")
    data[at + 20 : at + 24] = big
    data[at + 24 : at + 28] = big
    path = tmp_path / "liar.pt"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        check_archive(path)
    assert "\n" not in str(err.value)


def test_an_old_format_file_loads_with_a_one_line_note(ckpt_path, tmp_path):
    payload = torch.load(ckpt_path, weights_only=True)
    payload.pop("checksum")  # as written before checksums existed
    old = tmp_path / "old.pt"
    torch.save(payload, old)
    with pytest.warns(UncheckedCheckpointWarning) as record:
        ckpt = load_checkpoint(old)
    assert not ckpt.checksum_verified and ckpt.step == 3
    (note,) = [str(w.message) for w in record]
    assert "\n" not in note and "carries no checksum" in note and "re-save it" in note
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a file with a checksum loads without a note
        assert load_checkpoint(ckpt_path).checksum_verified


def test_one_constructor_builds_every_checkpoint(ckpt_path, tmp_path, monkeypatch):
    built = []
    real = loading_module._checkpoint
    monkeypatch.setattr(loading_module, "_checkpoint", lambda *a, **k: built.append(a[1]) or real(*a, **k))
    torch.manual_seed(0)
    weights = save_safetensors(build_model(MODEL), tmp_path / "w.safetensors", step=5)
    a, b = load_checkpoint(ckpt_path), load_checkpoint(weights)
    assert built == [ckpt_path, weights]
    assert (a.step, b.step) == (3, 5) and a.checksum_verified and b.checksum_verified
    for name, tensor in a.model.state_dict().items():
        assert torch.equal(tensor, b.model.state_dict()[name])


def test_a_hostile_safetensors_config_is_refused_in_one_line(ckpt_path, tmp_path):
    torch.manual_seed(0)
    weights = save_safetensors(build_model(MODEL), tmp_path / "w.safetensors")
    (tmp_path / "w.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(weights)
    assert "nests more than" in str(err.value) and "\n" not in str(err.value)
