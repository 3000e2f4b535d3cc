"""time_interleaved: interleaved runs, medians, and CUDA synchronisation around each timed run."""

import pytest
import torch

from mechlab.bench.timing import time_interleaved


def test_runs_are_interleaved_and_counted():
    calls = []
    times = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4  # one warm-up round, then three timed rounds, in turn
    assert {t.runs for t in times.values()} == {3}
    assert all(0 <= t.q1 <= t.median <= t.q3 for t in times.values())
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        time_interleaved({"a": lambda: None}, repeats=0)


def test_a_cuda_device_synchronises_before_and_after_every_timed_run(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    time_interleaved({"a": lambda: None, "b": lambda: None}, repeats=2, warmup=1, device="cuda:0")
    assert len(synced) == 2 * 2 * 2  # two contenders x two timed runs x (before, after)
    synced.clear()
    time_interleaved({"a": lambda: None}, repeats=2, device="cpu")
    assert synced == []  # the CPU runs synchronously: nothing to wait for
