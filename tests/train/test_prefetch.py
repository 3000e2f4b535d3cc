"""Batches drawn ahead (mechlab.train.prefetch): the same batches, in order, errors passed on,
and a prefetched training run equal to an on-demand one bit for bit."""

from __future__ import annotations

import time

import pytest
import torch

from mechlab.train import train
from mechlab.train.config import TrainConfig
from mechlab.train.prefetch import Prefetcher
from tests.train.test_trainer import read_metrics, small_cfg, state


def draw(step: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(3, 4, generator=g), torch.full((2,), step)


def test_batches_come_in_order_and_equal_drawing_on_demand():
    with Prefetcher(draw, 5, 12, torch.device("cpu"), depth=3) as ahead:
        for step in range(5, 13):
            got = ahead.get(step)
            for a, b in zip(got, draw(step), strict=True):
                assert torch.equal(a, b)
        with pytest.raises(ValueError, match="past the last step"):
            ahead.get(13)


def test_steps_out_of_order_and_bad_depth_are_refused():
    with Prefetcher(draw, 1, 4, torch.device("cpu")) as ahead:
        with pytest.raises(ValueError, match="expected step 1, got 2"):
            ahead.get(2)
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        Prefetcher(draw, 1, 4, torch.device("cpu"), depth=0)


def test_an_error_while_drawing_reaches_the_caller_at_its_step():
    def failing(step: int):
        if step == 3:
            raise RuntimeError("generator broke at 3")
        return draw(step)

    with Prefetcher(failing, 1, 10, torch.device("cpu")) as ahead:
        ahead.get(1)
        ahead.get(2)
        with pytest.raises(RuntimeError, match="generator broke at 3"):
            ahead.get(3)


def test_close_stops_a_worker_blocked_on_a_full_queue():
    ahead = Prefetcher(draw, 1, 10_000, torch.device("cpu"), depth=1)
    time.sleep(0.05)  # the worker fills the queue and waits
    started = time.perf_counter()
    ahead.close()
    assert time.perf_counter() - started < 2
    assert not ahead._thread.is_alive()


def test_a_prefetched_run_equals_an_on_demand_run(tmp_path):
    assert TrainConfig().prefetch == -1  # the device's default: none on the CPU
    with pytest.raises(ValueError, match="prefetch must be >= 0"):
        small_cfg(prefetch=-2)
    train(small_cfg(prefetch=0), tmp_path / "a", progress=False)
    train(small_cfg(prefetch=3), tmp_path / "b", progress=False)
    assert read_metrics(tmp_path / "a")[0] == read_metrics(tmp_path / "b")[0]
    sa, sb = state(tmp_path / "a").model.state_dict(), state(tmp_path / "b").model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
