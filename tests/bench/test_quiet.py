"""Waiting for a quiet machine: quiet at most 0.5 load per core; refused, saying the load."""

import os

import mechlab.bench.quiet as quiet


def fake_load(monkeypatch, average: float, others: int) -> None:
    monkeypatch.setattr(quiet, "_loadavg", lambda: [average] * 3)
    monkeypatch.setattr(quiet, "_running_threads_elsewhere", lambda tree=None: others)


def test_a_quiet_machine_passes_at_once(monkeypatch, capsys):
    fake_load(monkeypatch, 0.2, 0)
    assert quiet.main(["--sample", "0"]) == 0
    assert capsys.readouterr().out.startswith("quiet: load average 0.20, other threads running 0.0")


def test_a_busy_machine_is_refused_after_the_wait_saying_its_load(monkeypatch, capsys):
    cores = os.cpu_count()
    fake_load(monkeypatch, 0.9 * cores, cores)
    assert quiet.main(["--sample", "0", "--wait", "0.2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"busy after waiting 0 s: load average {0.9 * cores:.2f} now;")
    assert f"other processes kept {cores:.1f} threads running" in err and "ALLOW_LOAD=1" in err
    assert quiet.main(["--wait", "-1"]) == 2


def test_waiting_ends_when_the_load_falls(monkeypatch):
    cores = os.cpu_count()
    loads = iter([3.0 * cores, 2.0 * cores, 0.1])
    monkeypatch.setattr(quiet, "_loadavg", lambda: [next(loads)] * 3)
    monkeypatch.setattr(quiet, "_running_threads_elsewhere", lambda tree=None: 0)
    said = []
    ok, load = quiet.wait_for_quiet(60, sample_seconds=0, say=said.append, every=0)
    assert ok and load.average == 0.1 and len(said) == 2 and f"load average {3.0 * cores:.2f}" in said[0]
