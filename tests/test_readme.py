"""The README tells the truth: its test command is the one CI runs, with every extra the
suite exercises; each Python snippet runs pasted alone (a fresh process) and prints what its
closing comments promise; each ``mechlab`` command of its shell blocks parses (the cheap one
runs); git ignores what those commands write into the clone."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def commands() -> list[list[str]]:
    """Every ``mechlab ...`` command of the shell blocks (after ``&&``; comments dropped)."""
    out = []
    for block in blocks("bash"):
        for line in block.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words and words[0] == "mechlab":
                    out.append(words[1:])
    return out


def test_the_test_command_is_ci_s_last_line_and_installs_every_extra():
    command = next(line for b in blocks("bash") for line in b.splitlines() if "python -m pytest" in line)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    assert ci[-1] == command, ".ci/run must end with exactly the README's test command"
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11 or newer")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    asked = re.search(r"pip install -e '\.\[([^\]]+)\]'", command)[1].split(",")
    assert sorted(asked) == sorted(extras), "the README's test command installs every extra"


def promised(block: str) -> list[str]:
    """The closing comment lines of a snippet: what it prints (``(...)`` remarks and ``...`` aside)."""
    lines = block.rstrip().splitlines()
    tail = []
    while lines and lines[-1].startswith("# "):
        tail.insert(0, lines.pop()[2:])
    return [" ".join(re.sub(r"\s+\(.*\)$", "", t).split()) for t in tail if t.strip() != "..."]


@pytest.fixture(scope="module")
def snippet_runs(tmp_path_factory):
    """Every Python snippet in its own fresh process, all at once, in a folder that has the
    repository's examples (as the clone's root has)."""
    folder = tmp_path_factory.mktemp("readme")
    (folder / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=folder, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for code in blocks("python")]  # fmt: skip
    return folder, [(p.communicate(timeout=600), p.returncode) for p in procs]


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_every_python_snippet_runs_pasted_alone_and_prints_what_it_promises(snippet_runs, index):
    folder, runs = snippet_runs
    (stdout, stderr), code = runs[index]
    assert code == 0, f"README snippet {index + 1} failed pasted alone:\n{stderr[-3000:]}"
    wanted = promised(blocks("python")[index])
    assert wanted, f"README snippet {index + 1} says nothing about what it prints"
    printed = [" ".join(line.split()) for line in stdout.splitlines()]
    for line in wanted:
        assert any(p.startswith(line) for p in printed), f"snippet {index + 1} promised {line!r}, printed {printed}"


def test_every_mechlab_command_parses_and_info_runs(capsys):
    from typer.main import get_command

    from mechlab.cli import main
    from mechlab.cli.app import app

    group = get_command(app)
    found = commands()
    assert {c[0] for c in found} >= {"report", "train", "info", "eval", "prune", "overlap", "view", "curve", "recall"}
    for args in found:
        ctx = group.make_context("mechlab", [args[0]])
        group.get_command(ctx, args[0]).make_context(args[0], args[1:], parent=ctx)  # raises on a bad option
    info = next(c for c in found if c[0] == "info")
    assert main(info) == 0
    out = capsys.readouterr().out
    assert "blocks.0.attn.hook_result" in out and "a0.h0 .. a0.h5 (by head)" in out


def test_git_ignores_what_the_readme_commands_write():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git clone: nothing to check the .gitignore against")
    written = ["run.pt", "report/index.html", "report/plotly.min.js", "circuits/mine/1-after_seed0.json",
               "circuits/mine/plotly.min.js", "overlap.html", "runs/recall-cpu/last.pt",
               "examples/checkpoints/recall-cpu/eval/nih.html", "examples/checkpoints/recall-cpu/eval/plotly.min.js",
               "examples/checkpoints/recall-cpu/recall/recall.html",
               "examples/checkpoints/recall-cpu/curves/curve_1-after.json"]  # fmt: skip
    result = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT, capture_output=True, text=True)
    ignored = set(result.stdout.split())
    assert ignored == set(written), f"not ignored: {sorted(set(written) - ignored)}"

