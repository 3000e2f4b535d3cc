"""mechlab.pipelines.stops: what a command stopped by a signal says it kept (every long
command's one line; the commands themselves are stopped in their own test files)."""

from __future__ import annotations

import os
import signal

import pytest

from mechlab.pipelines import stops


def test_interrupted_names_the_unit_and_an_unknown_total(tmp_path):
    stop = stops.Interrupted(2, tmp_path, ["nih"], 2, unit="suite")
    assert str(stop) == f"stopped by signal 2 (SIGINT, Ctrl-C) after 1 of 2 suite(s); kept nih in '{tmp_path}'"
    trials = [f"t{i}" for i in range(stops.SHOWN + 3)]
    line = str(stops.Interrupted(15, tmp_path, trials, None, unit="trial"))
    assert line.startswith(f"stopped by signal 15 (SIGTERM) after {len(trials)} trial(s); kept t0, t1, ")
    assert f"t{stops.SHOWN - 1} and 3 more in '{tmp_path}'" in line


def test_unwritten_says_nothing_was_written(tmp_path):
    stop = stops.Unwritten(15, tmp_path / "o.json")
    assert stop.exit_code == 143 and isinstance(stop, KeyboardInterrupt) and not stop.resumes
    assert stops.Interrupted(2, tmp_path, ["a"], 1).resumes and not stops.Interrupted(2, tmp_path, [], 1).resumes
    assert str(stop) == (f"stopped by signal 15 (SIGTERM) before the end; nothing was written ('{tmp_path / 'o.json'}' "
                         "is written only at the end) and no partial file is left")  # fmt: skip
    assert "the results are printed at the end" in str(stops.Unwritten(2))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_within_resumable_names_what_the_tally_kept_then_and_restores_the_handlers(signum, tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    tally = stops.Tally(tmp_path, 3, unit="target")
    with pytest.raises(stops.Interrupted) as caught, stops.resumable(tally):
        tally.kept.append("curve_1-after")
        tally.total = 2  # known once the plan is made
        os.kill(os.getpid(), signum)
    assert caught.value.signum == signum and caught.value.kept == ["curve_1-after"]
    assert "after 1 of 2 target(s)" in str(caught.value)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_written_at_end_turns_a_stop_into_unwritten_and_lets_a_pipelines_own_line_pass(tmp_path):
    with pytest.raises(stops.Unwritten) as caught, stops.written_at_end(tmp_path / "o.json"):
        raise KeyboardInterrupt
    assert caught.value.signum == signal.SIGINT and caught.value.out == tmp_path / "o.json"
    inner = stops.Interrupted(2, tmp_path, ["a"], 2)
    with pytest.raises(stops.Interrupted) as passed, stops.resumable(stops.Tally(tmp_path, 5)):
        raise inner
    assert passed.value is inner
