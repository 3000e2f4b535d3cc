"""mechlab bench startup: the command answers from fresh processes, timed."""

import pytest

from mechlab.bench.startup import bench_startup


def test_every_line_is_timed_and_help_really_ran():
    result = bench_startup(repeats=1, commands=("", "prune"))
    assert set(result.medians) == {"import mechlab", "mechlab --help", "mechlab prune --help"}
    for name, median in result.medians.items():
        lo, hi = result.ranges[name]
        assert 0 < lo <= median <= hi
    assert "mechlab prune --help" in result.format_table()


def test_a_failing_command_line_is_an_error_not_a_time():
    import subprocess

    with pytest.raises(subprocess.CalledProcessError):
        bench_startup(repeats=1, commands=("no-such-command",))
    with pytest.raises(ValueError, match="repeats"):
        bench_startup(repeats=0)
