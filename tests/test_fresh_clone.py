"""Issue 19: the README's commands, run in a fresh clone, leave ``git status`` clean.

Every ``mechlab ...`` line of the README's bash blocks is run, in its order, in a fresh
``git clone`` of this repository (the committed tree, as CI sees it), in the clone's root.
The fast test appends options that shrink each command's work (fewer traces and steps)
and change none of its paths; the slow one runs the lines exactly as written, except
``mechlab train`` (an hour), which is given ``--steps 2``. Both are marked slow (the fast
one took 170 s on two shared cores at load average 8). Afterwards no file git tracks
has changed and no file outside the ``.gitignore`` has appeared.
"""

from __future__ import annotations

import glob
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from mechlab.cli import main

ROOT = Path(__file__).resolve().parents[1]

# Per command: options that make it fast without moving what it writes.
FAST = {
    "train": ["--steps", "2", "--no-progress"],
    "report": ["--eval-traces", "8", "--prune-traces", "8", "--recall-traces", "8", "--steps", "2",
               "--no-components", "--no-progress"],  # fmt: skip
    "eval": ["--traces", "8"],
    "prune": ["--steps", "2", "--traces", "8", "--test-traces", "8", "--no-progress"],
    "overlap": ["--boot", "5", "--null", "5"],
    "curve": ["--steps", "2", "--traces", "8", "--test-traces", "8", "--budgets", "0.5", "--no-progress"],
    "recall": ["--traces", "8", "--offset", "1", "--no-components", "--no-progress"],
}
ALWAYS = {"train": ["--steps", "2", "--no-progress"]}  # an hour as written


def readme_commands(text: str) -> list[list[str]]:
    """The ``mechlab`` commands of the README's bash blocks, in order, as argument lists
    (comments dropped; a ``... && mechlab ...`` set-up line gives its mechlab part)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words[:1] == ["mechlab"]:
                    commands.append(words[1:])
    return commands


def fresh_clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of mechlab")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(clone)], check=True, timeout=300)
    return clone


def git_status(clone: Path) -> list[str]:
    done = subprocess.run(["git", "-C", str(clone), "status", "--porcelain", "--untracked-files=all"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.splitlines()


def run_readme(clone: Path, monkeypatch, capsys, extra: dict[str, list[str]]) -> list[list[str]]:
    monkeypatch.chdir(clone)
    commands = readme_commands((clone / "README.md").read_text())
    for words in commands:
        args = [w for word in words for w in (sorted(glob.glob(word)) if "*" in word else [word])]
        args += extra.get(args[0], [])
        code = main(args)
        err = capsys.readouterr().err
        assert code == 0, f"mechlab {' '.join(args)}: {err}"
    return commands


def test_readme_commands_are_found():
    commands = readme_commands((ROOT / "README.md").read_text())
    names = [c[0] for c in commands]
    assert {"report", "train", "info", "eval", "prune", "overlap", "view", "curve", "recall"} <= set(names)
    assert set(names) <= set(FAST) | {"info", "view"}  # a new README command needs its fast options here


@pytest.mark.slow  # 170 s on two shared cores at load average 8 (eval --suite all, train, report)
def test_the_readmes_commands_leave_git_status_clean(tmp_path, monkeypatch, capsys):
    clone = fresh_clone(tmp_path)
    assert git_status(clone) == []
    run_readme(clone, monkeypatch, capsys, FAST)
    assert git_status(clone) == []
    assert (clone / "report" / "index.html").is_file()  # the commands did write, where git ignores it


@pytest.mark.slow  # the README's report and pieces at full size: about 15 minutes on two cores
def test_the_readmes_commands_as_written_leave_git_status_clean(tmp_path, monkeypatch, capsys):
    clone = fresh_clone(tmp_path)
    run_readme(clone, monkeypatch, capsys, ALWAYS)
    assert git_status(clone) == []
