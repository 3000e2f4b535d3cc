"""Benchmark records: the machine, torch's build, threads and load beside the figures; a
run under load marked provisional; --json written atomically and never over a file
unless --force; docs/benchmarks.md's tables rendered from the records."""

import json
import os
import subprocess
import sys

import pytest
import torch

import mechlab.bench.record as record
from mechlab.bench import tables
from mechlab.bench.record import BenchRecord, Recorder, Table
from mechlab.bench.timing import Timing, paired_ratio, quartiles, timing_of
from mechlab.cli import main
from mechlab.pipelines import outputs


def make_record(others: int, monkeypatch, load: float = 0.1) -> BenchRecord:
    """A record taken while ``others`` threads of other processes ran, at load average ``load``."""
    monkeypatch.setattr(record, "_running_threads_elsewhere", lambda tree=None: others)
    monkeypatch.setattr(record, "_loadavg", lambda: [load, load, load])
    with Recorder("hooks", {"repeats": 3}, command="mechlab bench hooks --repeats 3") as rec:
        table = Table(["family", "cache / plain"], [["transformer", "1.01x [1.00-1.02]"]],
                      values=[{"family": "transformer", "cache_ratio": 1.01}])  # fmt: skip
        return rec.record([table], {"raw": [1, 2]})


def test_a_record_says_where_and_how_it_was_measured(monkeypatch):
    rec = make_record(0, monkeypatch)
    m = rec.machine
    assert m["torch"] == torch.__version__ and m["threads"] == torch.get_num_threads()
    assert m["interop_threads"] == torch.get_num_interop_threads()
    assert m["blas"] != "" and m["lapack"] != "" and m["cpu_model"] and m["cores"] == os.cpu_count()
    assert m["device"] == "cpu"
    assert rec.load["others_mean"] == 0 and not rec.provisional
    assert len(rec.load["before"]) == 3 and len(rec.load["after"]) == 3
    text = rec.text()
    assert "PROVISIONAL" not in text and "torch " + torch.__version__ in text and "1.01x" in text


def test_a_run_while_other_threads_want_the_cores_is_provisional(monkeypatch):
    rec = make_record(3 * os.cpu_count(), monkeypatch)
    assert rec.provisional and rec.load["others_mean"] == 3 * os.cpu_count()
    assert "PROVISIONAL: other processes kept" in rec.text()
    assert "**Provisional: measured under load** (other processes kept" in tables.render(rec)


def test_a_run_started_or_ended_above_half_a_load_per_core_is_provisional(monkeypatch):
    cores = os.cpu_count()
    rec = make_record(0, monkeypatch, load=0.6 * cores + torch.get_num_threads())
    assert rec.provisional and rec.load["limit"] == 0.5 * cores
    assert any(r.startswith(f"load average {0.6 * cores + torch.get_num_threads():.2f} before") for r in rec.load["reasons"])
    # after: the run's own threads count in the load average, so they are taken off it
    assert record.load_verdict([0.1] * 3, [1.9] * 3, 0.0, own_threads=2, cores=2) == []
    assert record.load_verdict([0.1] * 3, [3.2] * 3, 0.0, own_threads=2, cores=2) == [
        "load average 3.20 after it, 1.20 beyond its own 2 thread(s) (limit 1.00: 0.5 per core x 2 cores)"]
    assert record.load_verdict([1.01] * 3, None, None, own_threads=1, cores=2)[0].startswith("load average 1.01 before")
    assert record.load_verdict([0.99] * 3, [0.99] * 3, 0.99, own_threads=0, cores=2) == []
    assert record.load_verdict([0.5] * 3, [0.5] * 3, 0.6, own_threads=1, cores=1)[0].startswith("other processes kept 0.6")


def test_the_sampler_counts_a_child_process_as_this_runs_own_work():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in record._own_tree() and os.getpid() in record._own_tree()
    finally:
        child.kill()
        child.wait()
    n = record._running_threads_elsewhere()
    assert n is None or n >= 0


def test_a_record_reads_back_from_its_json(tmp_path, monkeypatch):
    """--json writes ``to_json`` under the output policy (tests/cli/test_bench.py checks the
    refusals of every bench subcommand); what it writes reads back as the same record."""
    rec = make_record(0, monkeypatch)
    path = outputs.write_text(tmp_path / "sub" / "hooks.json", rec.to_json())
    again = BenchRecord.read(path)
    assert again.to_dict() == json.loads(json.dumps(rec.to_dict(), default=str))
    assert sorted(p.name for p in path.parent.iterdir()) == ["hooks.json"]  # no temporary left
    with pytest.raises(ValueError, match="not a mechlab benchmark record"):
        BenchRecord.from_dict({"schema": "other"})


def test_bench_json_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "h.json"
    args = ["bench", "hooks", "--families", "mamba", "--batch", "2", "--pos", "4", "--repeats", "1",
            "--threads", "1", "--json", str(path)]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "load average" in out and "mamba" in out and f"record written to {path}" in out
    first = path.read_text()
    data = json.loads(first)
    assert data["bench"] == "hooks" and data["settings"]["threads"] == 1 and data["machine"]["threads"] == 1
    row = data["tables"][0]["values"][0]
    assert row["family"] == "mamba" and row["cache_ratio"] > 0
    assert main(args) == 2  # exists: refused before anything runs
    assert "--force" in capsys.readouterr().err and path.read_text() == first
    assert main([*args, "--force"]) == 0 and path.read_text() != first


def test_tables_render_every_block_of_a_page_from_its_record(tmp_path, monkeypatch):
    outputs.write_text(tmp_path / "r.json", make_record(0, monkeypatch).to_json())
    page = tmp_path / "page.md"
    page.write_text("# Page\n\nprose\n\n<!-- bench: r.json -->\nold\n<!-- /bench -->\n\nmore prose\n")
    assert tables.main([str(page), "--root", str(tmp_path), "--check"]) == 1
    assert tables.main([str(page), "--root", str(tmp_path)]) == 0
    text = page.read_text()
    assert text.startswith("# Page\n\nprose\n\n<!-- bench: r.json -->\n") and text.endswith("<!-- /bench -->\n\nmore prose\n")
    assert "| transformer | 1.01x [1.00-1.02] |" in text and "`mechlab bench hooks --repeats 3`" in text
    assert "old" not in text
    assert tables.main([str(page), "--root", str(tmp_path), "--check"]) == 0
    page.write_text("<!-- bench: missing.json -->\n<!-- /bench -->\n")
    assert tables.main([str(page), "--root", str(tmp_path), "--strict"]) == 2
    assert page.read_text() == "<!-- bench: missing.json -->\n<!-- /bench -->\n"
    assert tables.main([str(page), "--root", str(tmp_path)]) == 0
    assert "No record yet: `bash scripts/bench_quiet.sh` writes `missing.json`" in page.read_text()
    (tmp_path / "bad.json").write_text('{"schema": "other"}')
    page.write_text("<!-- bench: bad.json -->\n<!-- /bench -->\n")
    assert tables.main([str(page), "--root", str(tmp_path)]) == 2


def test_docs_benchmarks_tables_are_their_records():
    assert tables.main(["docs/benchmarks.md", "--check"]) == 0


def test_ratios_run_by_run_and_their_spread():
    assert quartiles([3.0]) == (3.0, 3.0, 3.0)
    a = timing_of("a", [2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    b = timing_of("b", [1.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert paired_ratio(a, b) == quartiles([2.0, 2.0, 3.0])
    assert paired_ratio(a, b, cpu=True)[1] == 2.0
    old = Timing("c", 2.0, 2.0, 2.0, 1)  # no samples kept: the medians' ratio
    assert paired_ratio(old, Timing("d", 1.0, 1.0, 1.0, 1)) == (2.0, 2.0, 2.0)
