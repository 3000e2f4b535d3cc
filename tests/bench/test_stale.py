"""Records that cannot go stale silently: a record names the commit it measured, and
mechlab.bench.stale (with the page, mechlab.bench.tables) says which records' code paths
changed since, in a throwaway git repository; no commit, an unknown commit (a shallow
clone) or no checkout is "cannot tell", never current and never a crash."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mechlab.bench.record as record
from mechlab.bench import gitstate, stale, tables
from mechlab.bench.record import BenchRecord

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
MACHINE = {"cpu_model": "cpu", "cores": 2, "torch": "2", "blas": "mkl", "lapack": "mkl", "threads": 1,
           "interop_threads": 1, "device": "cpu"}  # fmt: skip


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def make(bench: str, commit: str | None, changes: dict | None = None) -> BenchRecord:
    machine = {**MACHINE, "mechlab_commit": commit, "mechlab_changes": changes}
    return BenchRecord(bench, f"mechlab bench {bench}", {}, machine, {}, "2026-12-02T18:00:00+00:00", 1.0, [])


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository holding a pruning engine file and the hooks benchmark, committed once."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    root = tmp_path / "repo"
    (root / "mechlab" / "prune").mkdir(parents=True)
    (root / "mechlab" / "bench").mkdir()
    (root / "mechlab" / "prune" / "forward.py").write_text("FAST = True\n")
    (root / "mechlab" / "bench" / "hooks.py").write_text("MODELS = []\n")
    git(root, "init", "-q")
    commit_all(root, "first")
    return root


def test_a_changed_file_makes_the_records_that_exercise_it_stale(repo):
    first = git(repo, "rev-parse", "HEAD")
    (repo / "mechlab" / "prune" / "forward.py").write_text("FAST = False\n")
    second = commit_all(repo, "second")
    found = stale.record_staleness(make("prune", first), repo)
    assert found.state == stale.STALE and found.files == ["mechlab/prune/forward.py"]
    assert found.summary() == f"older than the code: mechlab/prune/forward.py changed since {first[:12]}"
    assert stale.record_staleness(make("hooks", first), repo).state == stale.CURRENT  # hooks.py unchanged
    assert stale.record_staleness(make("prune", second), repo).state == stale.CURRENT


def test_uncommitted_changes_count_unless_they_are_what_the_run_measured(repo):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "mechlab" / "bench" / "hooks.py").write_text("MODELS = ['lstm']\n")
    assert stale.record_staleness(make("hooks", head), repo).files == ["mechlab/bench/hooks.py"]
    (repo / "mechlab" / "prune" / "mixing.py").write_text("new = 1\n")  # untracked, declared by prune
    assert stale.record_staleness(make("prune", head), repo).files == ["mechlab/prune/mixing.py"]
    # the run measured the uncommitted hooks.py: current while it is still that, and once committed
    measured = gitstate.uncommitted(repo, ["mechlab/bench/hooks.py"])
    assert list(measured) == ["mechlab/bench/hooks.py"]
    assert stale.record_staleness(make("hooks", head + "+changes", measured), repo).state == stale.CURRENT
    commit_all(repo, "hooks for lstm")
    assert stale.record_staleness(make("hooks", head + "+changes", measured), repo).state == stale.CURRENT
    (repo / "mechlab" / "bench" / "hooks.py").write_text("MODELS = []\n")  # back to the commit: not what ran
    assert stale.record_staleness(make("hooks", head + "+changes", measured), repo).files == ["mechlab/bench/hooks.py"]


def test_no_commit_an_unknown_commit_or_no_checkout_cannot_tell(repo):
    found = stale.record_staleness(make("prune", None), repo)
    assert found.state == stale.UNKNOWN and found.summary() == "no commit recorded: cannot tell; rerun"
    found = stale.record_staleness(make("prune", "f" * 40), repo)
    assert found.state == stale.UNKNOWN and found.summary().startswith("unknown commit ffffffffffff (a shallow clone?)")
    head = git(repo, "rev-parse", "HEAD")
    assert stale.record_staleness(make("prune", head), None).summary() == "not in a git checkout: cannot tell; rerun"
    assert "no code paths declared for benchmark 'other'" in stale.record_staleness(make("other", head), repo).reason


def test_the_command_lists_stale_records_and_says_so_in_its_status(repo, monkeypatch, capsys):
    first = git(repo, "rev-parse", "HEAD")
    folder = repo / "docs" / "bench"
    folder.mkdir(parents=True)
    (folder / "prune-1.json").write_text(make("prune", first).to_json())
    (folder / "hooks-1.json").write_text(make("hooks", first).to_json())
    git(repo, "add", "-A")  # the records themselves are not code
    monkeypatch.chdir(repo)
    assert stale.main(["docs/bench"]) == 0
    assert capsys.readouterr().out == "docs/bench: 2 record(s), none older than the code\n"
    (repo / "mechlab" / "prune" / "forward.py").write_text("FAST = False\n")
    commit_all(repo, "slower")
    assert stale.main(["docs/bench"]) == 1
    assert capsys.readouterr().out == (f"docs/bench/prune-1.json: older than the code: mechlab/prune/forward.py "
                                       f"changed since {first[:12]}\n")  # fmt: skip
    (folder / "prune-1.json").write_text(make("prune", None).to_json())
    assert stale.main(["docs/bench"]) == 2
    assert capsys.readouterr().out == "docs/bench/prune-1.json: no commit recorded: cannot tell; rerun\n"
    (folder / "hooks-1.json").write_text(make("hooks", "f" * 40).to_json())
    assert stale.main(["docs/bench"]) == 2
    assert "hooks-1.json: unknown commit ffffffffffff (a shallow clone?): cannot tell" in capsys.readouterr().out
    monkeypatch.chdir(repo.parent)  # no checkout (GIT_CEILING_DIRECTORIES stops the search)
    assert stale.main(["repo/docs/bench"]) == 2
    assert capsys.readouterr().out == "repo/docs/bench: not in a git checkout: cannot tell which records are older than the code\n"


def test_the_module_runs_as_a_command(repo):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    (repo / "empty").mkdir()
    for folder, status, out in (("empty", 0, "empty: 0 record(s), none older than the code\n"),
                                ("missing", 2, "missing: no such folder of records\n")):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "mechlab.bench.stale", folder], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert (done.returncode, done.stdout) == (status, out)


def test_the_page_says_which_tables_are_older_than_the_code(repo, monkeypatch):
    first = git(repo, "rev-parse", "HEAD")
    (repo / "prune-1.json").write_text(make("prune", first).to_json())
    page = repo / "page.md"
    page.write_text("<!-- bench: prune-1.json -->\n<!-- /bench -->\n")
    monkeypatch.chdir(repo)
    assert tables.main([str(page)]) == 0 and "Staleness" not in page.read_text()
    (repo / "mechlab" / "prune" / "forward.py").write_text("FAST = False\n")
    assert tables.main([str(page), "--check"]) == 0  # the staleness line follows the checkout, not the record
    assert tables.main([str(page)]) == 0
    assert (f"**Staleness:** older than the code: mechlab/prune/forward.py changed since {first[:12]}; rerun "
            "`ONLY=prune-1 bash scripts/bench_quiet.sh`.\n") in page.read_text()  # fmt: skip
    (repo / "prune-1.json").write_text(make("prune", None).to_json())
    assert tables.main([str(page)]) == 0
    text = page.read_text()
    assert "no commit recorded; 1 s." in text
    assert "**Staleness:** no commit recorded: cannot tell; rerun `ONLY=prune-1 bash scripts/bench_quiet.sh`." in text


def test_a_record_names_the_commit_it_ran_from_or_none_outside_a_checkout(monkeypatch):
    root = Path(record.__file__).resolve().parents[2]
    state = record.code_state("hooks")
    head = gitstate.head(root)
    if head is None:
        pytest.skip("mechlab does not run from a git checkout here")
    assert state["mechlab_commit"].removesuffix("+changes") == head
    assert state["mechlab_commit"].endswith("+changes") == bool(state["mechlab_changes"])
    monkeypatch.setattr(gitstate, "checkout_root", lambda where: None)
    assert record.code_state("hooks") == {"mechlab_commit": None, "mechlab_changes": None}
    assert "mechlab: no commit recorded (not run from a git checkout)" in make("hooks", None).text()
