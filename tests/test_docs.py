"""The code in docs/analysis.md runs as written (on the bundled checkpoint)."""

import os
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), flags=re.S)


@pytest.fixture
def in_tmp_with_examples(tmp_path, monkeypatch):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)


def test_the_custom_patching_experiment_is_short_uses_top_level_imports_and_runs(in_tmp_with_examples):
    first = python_blocks("analysis.md")[0]
    code_lines = [line for line in first.splitlines() if line.strip() and not line.startswith("#")]
    assert len(code_lines) < 20
    assert [line for line in code_lines if "import" in line] == ["import mechlab"]
    namespace: dict = {}
    exec(compile(first, "docs/analysis.md", "exec"), namespace)
    top = namespace["result"].top(6)
    labels = [cell for cell, _, _ in top]
    assert labels[0] == "blocks.0.attn.hook_result[4]"
    assert "blocks.2.hook_mlp_out" in labels and "blocks.2.attn.hook_result[4]" in labels
    assert (in_tmp_with_examples / "patch.html").stat().st_size > 0


@pytest.mark.slow
def test_every_block_of_the_analysis_page_runs(in_tmp_with_examples):
    namespace: dict = {}
    for block in python_blocks("analysis.md"):
        exec(compile(block, "docs/analysis.md", "exec"), namespace)
    assert os.path.exists("patch.html")


def test_every_block_of_the_models_page_runs_pasted_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the page promises no network
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        blocks = python_blocks("models.md")
        assert len(blocks) >= 9
        for block in blocks:
            exec(compile(block, "docs/models.md", "exec"), {})
    finally:
        torch.set_num_threads(threads)


def test_the_induction_page_runs_and_prints_what_it_says(in_tmp_with_examples, capsys):
    blocks = python_blocks("induction.md")
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/induction.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "0 3 [3]"  # the page's comment
    assert float(lines[1]) > 0.8
