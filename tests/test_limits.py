"""mechlab.limits: planned allocations are multiplied out in Python and refused above the
limit with one line naming the counts and what to lower, before anything is allocated."""

from __future__ import annotations

import time

import pytest

from mechlab import limits
from mechlab.models import registry


def test_the_limit_and_its_environment_variable(monkeypatch):
    monkeypatch.delenv(limits.MAX_ELEMENTS_ENV, raising=False)
    assert limits.max_elements() == limits.MAX_ELEMENTS == 2**31
    monkeypatch.setenv(limits.MAX_ELEMENTS_ENV, "4e9")
    assert limits.max_elements() == 4_000_000_000
    for bad in ("lots", "0", "-5", "inf", "nan"):
        monkeypatch.setenv(limits.MAX_ELEMENTS_ENV, bad)
        with pytest.raises(ValueError, match="is not a positive number of elements"):
            limits.max_elements()


def test_the_registry_keeps_its_names_for_the_limit():
    assert registry.MAX_ELEMENTS == limits.MAX_ELEMENTS
    assert registry.MAX_ELEMENTS_ENV == limits.MAX_ELEMENTS_ENV
    assert registry.max_elements is limits.max_elements


def test_a_product_of_huge_counts_is_refused_at_once_naming_what_to_lower():
    start = time.thread_time()
    with pytest.raises(ValueError) as err:
        limits.check_elements("the traces", {"traces": 10**12, "positions": 72, "width": 57})
    assert time.thread_time() - start < 0.1
    message = str(err.value)
    assert "\n" not in message
    assert "traces 1e+12 x positions 72 x width 57 = 4.1e+15 elements" in message
    assert "lower traces" in message and "MECHLAB_MAX_ELEMENTS=4104000000000000" in message


def test_what_to_lower_and_the_limit_can_be_given():
    assert limits.check_elements("x", {"a": 10, "b": 10}, limit=100) == 100
    with pytest.raises(ValueError, match=r"lower the batch size,"):
        limits.check_elements("x", {"a": 11, "b": 10}, limit=100, lower="the batch size")


@pytest.mark.parametrize("value", [1.5, "7", True, None, -1])
def test_a_factor_that_is_not_a_count_is_refused(value):
    with pytest.raises(ValueError, match="traces must be"):
        limits.check_elements("x", {"traces": value})


def test_count_takes_numpy_integers_and_refuses_floats():
    import numpy as np

    assert limits.count("n", np.int64(5)) == 5
    with pytest.raises(ValueError, match="n must be an integer, got 5.0"):
        limits.count("n", 5.0)
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        limits.count("n", 0, minimum=1)


def test_check_at_most_names_the_count_its_limit_and_its_cost():
    assert limits.check_at_most("--ig-steps", 10, 100, "each point is a pass") == 10
    with pytest.raises(ValueError) as err:
        limits.check_at_most("--ig-steps", 10**12, 100, "each point is a pass")
    assert (
        str(err.value)
        == "--ig-steps 1e+12 is more than mechlab's limit of 100 (each point is a pass); lower --ig-steps"
    )
    with pytest.raises(ValueError, match="must be >= 1"):
        limits.check_at_most("n", 0, 100, "x", minimum=1)


def test_threads_are_bounded_by_a_multiple_of_the_cores(monkeypatch):
    monkeypatch.setattr(limits.os, "cpu_count", lambda: 3)
    assert limits.max_threads() == 12 and limits.check_threads(12) == 12
    with pytest.raises(
        ValueError, match=r"--threads 13 is more than 12 \(4 per CPU core; this machine has 3\)"
    ):
        limits.check_threads(13)
    with pytest.raises(ValueError, match="must be >= 1"):
        limits.check_threads(0)
    monkeypatch.setattr(limits.os, "cpu_count", lambda: None)
    assert limits.max_threads() == 4


def _meminfo(tmp_path, available_kb: int, swap_kb: int | None = 0) -> str:
    path = tmp_path / "meminfo"
    swap = "" if swap_kb is None else f"SwapFree:       {swap_kb} kB\n"
    path.write_text(f"MemTotal:       24683584 kB\nMemFree:         1000000 kB\n"
                    f"MemAvailable:   {available_kb} kB\n{swap}")  # fmt: skip
    return str(path)


def test_available_memory_is_memavailable_plus_free_swap_within_a_cgroup_limit(tmp_path):
    no_cgroup = str(tmp_path / "none")
    assert limits.available_memory(_meminfo(tmp_path, 2_000_000, 500_000), no_cgroup) == 2_500_000 * 1024
    assert limits.available_memory(_meminfo(tmp_path, 2_000_000, None), no_cgroup) == 2_000_000 * 1024
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("1000000000\n")
    (cgroup / "memory.current").write_text("400000000\n")
    assert limits.available_memory(_meminfo(tmp_path, 2_000_000), str(cgroup)) == 600_000_000
    (cgroup / "memory.max").write_text("max\n")
    assert limits.available_memory(_meminfo(tmp_path, 2_000_000), str(cgroup)) == 2_000_000 * 1024
    assert limits.available_memory(str(tmp_path / "missing"), no_cgroup) is None  # not Linux: not checked
    (tmp_path / "odd").write_text("MemTotal: 5 kB\n")
    assert limits.available_memory(str(tmp_path / "odd"), no_cgroup) is None


def test_check_memory_refuses_more_than_is_free_in_one_line_and_passes_the_rest(monkeypatch):
    with pytest.raises(ValueError) as err:
        limits.check_memory("the writers' outputs", 4_100_000_000, lower="traces", available=3_000_000_000)
    assert str(err.value) == (
        "the writers' outputs would need 4.1 GB, more than the 3.0 GB this machine has free; lower traces, "
        "or run on a device with more memory (--device cuda)"
    )
    limits.check_memory("x", 3_000_000_000, lower="traces", available=3_000_000_000)
    monkeypatch.setattr(limits, "available_memory", lambda: None)  # where it cannot be read
    limits.check_memory("x", 10**15, lower="traces")
