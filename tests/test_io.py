"""mechlab.io: atomic writes keep the permissions a plain write would give."""

import os
import stat

import pytest

from mechlab.io import atomic_write, atomic_write_text


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_file_gets_umask_permissions_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "a" / "report.json", "{}")
        plain = tmp_path / "plain.json"
        plain.write_text("{}")
    finally:
        os.umask(old)
    assert path.read_text() == "{}"
    assert _mode(path) == _mode(plain) == 0o644


def test_existing_file_keeps_its_mode_and_failed_write_leaves_it_intact(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("old")
    os.chmod(path, 0o640)
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and _mode(path) == 0o640

    def boom(f):
        f.write(b"half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        atomic_write(path, boom)
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]  # no temporary file left
