"""Re-save checkpoints written before checksums existed, adding the checksums and
changing nothing else, then update every committed file that records their sha256.

    python examples/reseal_checkpoints.py                # every bundled .pt without one
    python examples/reseal_checkpoints.py a.pt b.pt      # these files
    python examples/reseal_checkpoints.py --check        # only report what would change

For each file: the payload is read with ``torch.load(weights_only=True)``, sealed
(:func:`mechlab.checkpoint.seal`) and written back atomically; then the written file is
read again and compared with the original payload, value by value (every tensor with
``torch.equal`` and the same dtype, every plain value with the same type), and loaded
with :func:`mechlab.checkpoint.load_checkpoint`, which must verify the checksum. A file
that already carries a checksum is left alone.

Re-saving changes a file's sha256, which circuits, evaluations and recall reports record
(``checkpoint_sha256``, ``sha256``): each old digest is replaced by the new one in every
git-tracked text file that holds it, as text (nothing else in those files changes). Run
it again after merging a branch that adds results recorded against an old digest: with
``--map`` it replaces the digests of an earlier run's mapping (``old new`` per line, as
printed; issue 19's is ``examples/checkpoints/resealed-digests.txt``) without re-saving
anything:

    python examples/reseal_checkpoints.py --map examples/checkpoints/resealed-digests.txt
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from mechlab.checkpoint import load_checkpoint, seal
from mechlab.io import atomic_write

ROOT = Path(__file__).resolve().parents[1]
DIGESTS = ROOT / "examples" / "checkpoints" / "resealed-digests.txt"  # issue 19's re-save: old new path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def same(a: Any, b: Any, where: str = "") -> None:
    """Raise AssertionError unless ``a`` and ``b`` are equal in value and type, recursively."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: dtype or shape"
        assert torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                     and torch.equal(a.nan_to_num(), b.nan_to_num())), where  # fmt: skip
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys"
        for key in a:
            same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), f"{where}: length"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}/{i}")
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"  # NaN equals NaN here


def reseal(path: Path, check: bool = False) -> tuple[str, str] | None:
    """Seal one file; return (old sha256, new sha256), or None if it already had a checksum."""
    payload = torch.load(path, weights_only=True)
    if "checksum" in payload:
        return None
    old = sha256(path)
    if check:
        return old, "(would change)"
    original = torch.load(path, weights_only=True)  # a second copy, untouched by seal()
    sealed = seal(dict(payload))
    atomic_write(path, lambda f: torch.save(sealed, f))
    written = torch.load(path, weights_only=True)
    assert set(written) == set(original) | {"checksum"}, path
    same({k: v for k, v in written.items() if k != "checksum"}, original, str(path))
    ckpt = load_checkpoint(path)
    assert ckpt.checksum_verified, path
    return old, sha256(path)


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def replace_digests(mapping: dict[str, str], check: bool = False, keep: tuple[Path, ...] = ()) -> list[Path]:
    """Replace each old digest by its new one in every tracked text file but ``keep`` (the
    mappings themselves); the files changed."""
    changed = []
    keep = tuple(p.resolve() for p in keep) + (DIGESTS,)
    for path in tracked_files():
        if path.suffix in (".pt", ".safetensors", ".png") or not path.is_file() or path.resolve() in keep:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = text
        for old, digest in mapping.items():
            new = new.replace(old, digest)
        if new != text:
            changed.append(path)
            if not check:
                atomic_write(path, lambda f, new=new: f.write(new.encode("utf-8")))
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="report only; change nothing")
    parser.add_argument("--map", type=Path, help="replace the digests listed in this file (old new per line)")
    args = parser.parse_args(argv)
    if args.map is not None:
        mapping = dict(line.split()[:2] for line in args.map.read_text().splitlines() if line.strip())
    else:
        paths = args.paths or sorted((ROOT / "examples" / "checkpoints").rglob("*.pt"))
        mapping = {}
        for path in paths:
            result = reseal(path, args.check)
            if result is not None:
                print(*result, path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
                mapping[result[0]] = result[1]
        if args.check:
            return 0
    for path in replace_digests(mapping, args.check, keep=(args.map,) if args.map else ()):
        print("updated", path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
