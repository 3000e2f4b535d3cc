"""Every bundled checkpoint carries per-tensor checksums (issue 19: the bundled
``recall-cpu`` run predated them, so a flipped bit in it loaded silently), and one bit
flipped in a temporary copy of each is refused, naming the tensor."""

from __future__ import annotations

import re
import shutil
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from mechlab.checkpoint import CheckpointError, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = sorted((ROOT / "examples").rglob("*.pt"))


def largest_storage(path: Path) -> tuple[str, int, int]:
    """``(name, offset, size)`` of the largest tensor storage in a zip checkpoint."""
    with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        raw.seek(info.header_offset)
        header = raw.read(30)
        skip = int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
        return info.filename, info.header_offset + 30 + skip, info.file_size


def test_every_bundled_checkpoint_is_found():
    assert len(BUNDLED) >= 17  # recall-cpu (last + 13 log-spaced), recall-lstm, two state-tracking runs
    assert ROOT / "examples" / "checkpoints" / "recall-cpu" / "last.pt" in BUNDLED


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_a_bit_flipped_in_a_bundled_checkpoint_is_refused(path, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "carries no checksum" note
        assert load_checkpoint(path).checksum_verified
    copy = tmp_path / path.name
    shutil.copyfile(path, copy)
    _, offset, size = largest_storage(copy)
    data = bytearray(copy.read_bytes())
    data[offset + (size // 8) * 4] ^= 0x01  # the lowest mantissa bit of a float32 mid-tensor
    copy.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(copy)
    message = str(err.value)
    assert "\n" not in message and "does not match its checksum" in message
    name = re.search(r"tensor '([^']+)'", message).group(1)
    payload = torch.load(path, weights_only=True)
    keys = name.split("/")
    tensor = payload
    for key in keys:
        tensor = tensor[int(key)] if isinstance(tensor, list | tuple) else tensor[key if key in tensor else int(key)]
    assert isinstance(tensor, torch.Tensor) and tensor.numel() * tensor.element_size() == size  # the flipped one
