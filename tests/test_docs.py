"""The code in docs/analysis.md runs as written (on the bundled checkpoint)."""

import os
import re
import warnings
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
        with warnings.catch_warnings():  # random models (the page says so): the search fails, on purpose
            warnings.filterwarnings("ignore", message="circuit for .* the search likely failed")
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


def test_the_docs_overlap_numbers_are_the_committed_circuits():
    """concepts.md, quickstart.md and pruning.md quote the overlap of the committed circuits
    (circuits/recall-cpu/stats/overlap.json): each number is checked against the file."""
    import json

    saved = json.loads((ROOT / "circuits" / "recall-cpu" / "stats" / "overlap.json").read_text())
    e = saved["across"]["1-after vs 2-after"]
    cross, degree, uniform = (f"{v:.3f}" for v in (e["jaccard_observed"], e["null_degree"]["mc_mean"],
                                                   e["null_uniform"]["mc_mean"]))  # fmt: skip
    within = {t: f"{saved['within'][t]['value']:.3f}" for t in ("1-after", "2-after")}
    docs = {p: (ROOT / "docs" / p).read_text() for p in ("concepts.md", "quickstart.md", "pruning.md")}
    concepts = " ".join(docs["concepts.md"].split())
    assert (f"cross-target Jaccard **{cross}** beside a degree null of **{degree}** "
            f"(uniform null **{uniform}**)") in concepts  # fmt: skip
    assert f"{within['1-after']} for 1-after, {within['2-after']} for 2-after, against the cross-target {cross}" in concepts
    quick = " ".join(docs["quickstart.md"].split())
    assert f"the cross-target Jaccard is {cross} against a degree null of {degree} (uniform null {uniform})" in quick
    row = re.search(r"^\| 1-after vs 2-after \(25 pairs\) \| cross-target Jaccard \| (\S+) \| \[(\S+), (\S+)\] "
                    r"\| (\S+) \(exact\).*\| (\S+) \+- (\S+), at the (\d+)th percentile \|$",
                    docs["pruning.md"], flags=re.M)  # fmt: skip
    assert row, "pruning.md's overlap table"
    ci = e["jaccard"]
    assert row.groups() == (cross, f"{ci['low']:.3f}", f"{ci['high']:.3f}", f"{e['null_uniform']['expected_exact']:.3f}",
                            degree, f"{e['null_degree']['mc_std']:.3f}",
                            f"{100 * e['null_degree']['percentile']:.0f}")  # fmt: skip
    for t in ("1-after", "2-after"):
        w = saved["within"][t]
        assert re.search(rf"^\| {t} \(10 pairs\) \| seed-baseline Jaccard \| {within[t]} \| "
                         rf"\[{w['low']:.3f}, {w['high']:.3f}\] \|", docs["pruning.md"], flags=re.M), t  # fmt: skip
    # no stale overlap number is quoted as the bundled checkpoint's
    assert "0.157 beside 0.157" not in concepts and "0.19 against 0.19" not in quick
