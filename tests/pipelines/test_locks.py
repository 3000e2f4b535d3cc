"""Output-folder locks (mechlab/pipelines/locks.py): one lock per folder, refused naming its
owner, and a dead owner's taken over (with fcntl and with the pid file)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from mechlab.pipelines import locks
from mechlab.pipelines.outputs import OutputFolder


def _fork_holding(folder: Path, then: str) -> tuple[int, int]:
    """A child process that claims ``folder``, tells the parent, then waits (``then="wait"``,
    until its pipe closes) or dies by SIGKILL holding the lock (``then="die"``)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(ready_r)
            os.close(go_w)
            lock = locks.Lock(folder, "prune", "--out")
            lock.acquire()
            os.write(ready_w, b"1")
            if then == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            os.read(go_r, 1)
            lock.release()
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    return pid, go_w


def test_a_second_run_into_a_locked_folder_is_refused_naming_the_owner(tmp_path):
    pid, go = _fork_holding(tmp_path, "wait")
    try:
        with pytest.raises(ValueError) as err:
            with OutputFolder(tmp_path, "prune"):
                pass
        line = str(err.value)
        assert f"being written by another mechlab run (pid {pid}, mechlab prune, started" in line
        assert "wait for it to finish, or choose another --out" in line
    finally:
        os.close(go)
        os.waitpid(pid, 0)
    with OutputFolder(tmp_path, "prune"):  # free again
        pass
    assert not (tmp_path / locks.LOCK_NAME).exists()


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path):
    pid, go = _fork_holding(tmp_path, "die")
    os.close(go)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert json.loads((tmp_path / locks.LOCK_NAME).read_text())["pid"] == pid  # left behind
    with OutputFolder(tmp_path, "prune") as folder:
        assert json.loads((tmp_path / locks.LOCK_NAME).read_text())["pid"] == os.getpid()
        folder.write_text("x.json", "{}")
    assert sorted(os.listdir(tmp_path)) == ["x.json"]


def test_the_pid_file_lock_without_fcntl_takes_over_a_dead_owner(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_fcntl(name, *args, **kwargs):
        if name == "fcntl":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_fcntl)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / locks.LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "command": "prune", "started": 0}))
    with OutputFolder(tmp_path, "prune"):
        assert json.loads((tmp_path / locks.LOCK_NAME).read_text())["pid"] == os.getpid()
    (tmp_path / locks.LOCK_NAME).write_text(json.dumps({"pid": 1, "command": "curve", "started": 0}))
    with pytest.raises(ValueError, match=r"pid 1, mechlab curve"):
        with OutputFolder(tmp_path, "prune"):
            pass
