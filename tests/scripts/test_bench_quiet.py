"""scripts/bench_quiet.sh: QUICK=1 runs the benchmarks at tiny sizes into a temp folder and
renders the page's tables there from the new records (docs/ untouched); a busy machine is
refused before anything runs. The full run is the lead's, on a quiet machine (~20 min)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_quiet.sh"


def run_script(env_extra: dict[str, str], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "MECHLAB": f"{sys.executable} -m mechlab", **env_extra}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def snapshot() -> dict[str, bytes]:
    docs = [ROOT / "docs" / "benchmarks.md", *sorted((ROOT / "docs" / "bench").glob("*"))]
    return {str(p): p.read_bytes() for p in docs}


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_quick_mode_renders_the_tables_from_the_new_records_in_a_temp_folder(tmp_path):
    # hooks-2 fails (a stand-in `mechlab` exits 3 for it): the steps after it still run
    fake = tmp_path / "mechlab"
    fake.write_text('#!/bin/sh\ncase "$*" in *"--threads 2"*) echo "hooks broke" >&2; exit 3;; esac\n'
                    f'exec {sys.executable} -m mechlab "$@"\n')  # fmt: skip
    fake.chmod(0o755)
    out = tmp_path / "out"
    before = snapshot()
    done = run_script({"QUICK": "1", "ONLY": "hooks-1 hooks-2 scan-1", "MECHLAB": str(fake)}, str(out))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "== hooks-2: FAILED" in done.stderr and "bench_quiet: FAILED: hooks-2" in done.stderr
    assert not (out / "docs" / "bench" / "hooks-2.json").exists() and (out / "docs" / "bench" / "scan-1.json").is_file()
    record = json.loads((out / "docs" / "bench" / "hooks-1.json").read_text())
    assert record["settings"]["batch"] == 2 and record["machine"]["threads"] == 1
    assert len(record["load"]["before"]) == 3 and "provisional" in record
    page = (out / "docs" / "benchmarks.md").read_text()
    block = page.split("<!-- bench: docs/bench/hooks-1.json -->\n", 1)[1].split("<!-- /bench -->", 1)[0]
    assert block.startswith("`mechlab bench hooks --batch 2 --pos 8 --repeats 1 --threads 1 --json")
    assert "1 intra-op" in block and "load average" in block
    rows = [line for line in block.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| family |") and rows[0].endswith("| goal |")
    body = rows[1:]
    assert [r.split(" | ")[0] for r in body] == ["| transformer", "| lstm", "| dense_ssm", "| mamba"]
    assert all(re.search(r"\| (\(provisional\) )?<= 1\.\d\dx", r) for r in body)
    assert "`mechlab bench scan --batch 2 --pos 8 --repeats 1 --threads 1 --json" in page
    assert "<!-- bench: docs/bench/hooks-2.json -->\n*No record yet" in page
    assert snapshot() == before  # the repository's page and records are left alone


@pytest.mark.slow
def test_quick_mode_runs_every_step_the_page_shows(tmp_path):
    done = run_script({"QUICK": "1"}, str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    names = re.findall(r"<!-- bench: docs/bench/(\S+)\.json -->", page)
    missing = [n for n in names if not (tmp_path / "docs" / "bench" / f"{n}.json").is_file()]
    assert missing == ["prune-reference-1"]  # needs REFERENCE= (an Edge Pruning checkout)
    assert page.count("No record yet") == 1


def test_a_busy_machine_is_refused_before_anything_runs(tmp_path):
    fake = tmp_path / "python"  # the load check says busy; everything else is the real Python
    fake.write_text(f'#!/bin/sh\nif [ "$2" = mechlab.bench.quiet ]; then echo "busy: load average 7.00" >&2; '
                    f'exit 2; fi\nexec {sys.executable} "$@"\n')  # fmt: skip
    fake.chmod(0o755)
    before = snapshot()
    done = run_script({"PYTHON": str(fake), "WAIT": "0", "ALLOW_LOAD": "0", "QUICK": "0"})
    assert done.returncode == 2
    assert "busy: load average 7.00" in done.stderr and "refused" in done.stderr and "==" not in done.stdout
    assert "bench_quiet: records older than the code, before the benchmarks" in done.stdout  # listed first
    assert snapshot() == before

