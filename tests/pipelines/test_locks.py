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


# --------------------------------------------------------------------------- issue 34: nested folders
# A `report --out R` and a `prune --out R/circuits` at the same time both exited 0, the
# prune's circuit file replaced by the report's: a lock covered its folder, not the folders
# inside it. Now a claimed folder's lock covers everything under it.


def test_a_folder_inside_a_claimed_one_is_refused_naming_the_owner(tmp_path):
    (tmp_path / "R").mkdir()
    pid, go = _fork_holding(tmp_path / "R", "wait")  # the report
    try:
        with pytest.raises(ValueError) as err:
            with OutputFolder(tmp_path / "R" / "circuits", "prune"):  # the prune
                pass
        line = str(err.value)
        assert "circuits' lies inside" in line and f"which is being written by another mechlab run (pid {pid}" in line
        assert not (tmp_path / "R" / "circuits").exists()  # nothing left behind
    finally:
        os.close(go)
        os.waitpid(pid, 0)


def test_a_folder_holding_a_claimed_one_is_refused_naming_the_owner(tmp_path):
    (tmp_path / "R" / "circuits").mkdir(parents=True)
    pid, go = _fork_holding(tmp_path / "R" / "circuits", "wait")  # the prune
    try:
        with pytest.raises(ValueError) as err:
            with OutputFolder(tmp_path / "R", "report"):  # the report
                pass
        line = str(err.value)
        assert "'R' holds" in line or f"{str(tmp_path / 'R')!r} holds" in line
        assert f"being written by another mechlab run (pid {pid}, mechlab prune" in line
        assert sorted(os.listdir(tmp_path / "R")) == ["circuits"]  # no lock of the refused run left
    finally:
        os.close(go)
        os.waitpid(pid, 0)
    with OutputFolder(tmp_path / "R", "report"):  # free again
        pass


def test_a_run_nests_its_own_claims_and_siblings_do_not_collide(tmp_path):
    with OutputFolder(tmp_path / "R", "prune") as top:
        with OutputFolder(tmp_path / "R" / "step_1", "prune") as inner:  # through-training's nesting
            inner.write_text("x.json", "{}")
        top.write_text("y.json", "{}")
    (tmp_path / "R" / "a").mkdir()
    pid, go = _fork_holding(tmp_path / "R" / "a", "wait")
    try:
        with OutputFolder(tmp_path / "R" / "b", "prune"):  # a sibling: not inside, not holding
            pass
    finally:
        os.close(go)
        os.waitpid(pid, 0)


def _claim_on_signal(folder: Path) -> tuple[int, int, int, int]:
    """A child that waits for a byte on its ``go`` pipe, then claims ``folder`` (Lock API),
    reports ``b"1"`` (held) or ``b"0"`` (refused) and holds until a byte on ``done`` (bytes,
    not closed pipes: another child holds copies of these pipes' ends)."""
    go_r, go_w = os.pipe()
    said_r, said_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (go_w, said_r, done_w):
                os.close(fd)
            os.read(go_r, 1)
            lock = locks.Lock(folder, "prune", "--out")
            try:
                lock.acquire()
            except ValueError:
                os.write(said_w, b"0")
            else:
                os.write(said_w, b"1")
                os.read(done_r, 1)
                lock.release()
        finally:
            os._exit(0)
    for fd in (go_r, said_w, done_r):
        os.close(fd)
    return pid, go_w, said_r, done_w


@pytest.mark.parametrize("round_", range(10))
def test_two_overlapping_claims_at_once_never_both_hold(tmp_path, round_):
    """Two processes released together claim R and R/circuits: at most one holds (no sleeps:
    each takes its own lock before it looks above and below, so the later one sees it)."""
    (tmp_path / "R" / "circuits").mkdir(parents=True)
    children = [_claim_on_signal(tmp_path / "R"), _claim_on_signal(tmp_path / "R" / "circuits")]
    if round_ % 2:
        children.reverse()
    for _, go, _, _ in children:
        os.write(go, b"1")
    held = [os.read(said, 1) == b"1" for _, _, said, _ in children]
    for (pid, go, said, done), holds in zip(children, held, strict=True):
        if holds:
            os.write(done, b"1")
        for fd in (go, said, done):
            os.close(fd)
        os.waitpid(pid, 0)
    assert held.count(True) <= 1, held
