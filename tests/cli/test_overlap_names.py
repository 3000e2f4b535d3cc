"""One number, one name, everywhere: `mechlab prune`, `overlap`, `view` and the report print
and show the overlap statistics under the names and the interval rule defined once in
mechlab.prune.circuit (edge / cross-target / seed-baseline Jaccard; an interval only from
three seeds per target), and agree on their values."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mechlab.cli import main
from mechlab.pipelines import ReportConfig, make_report
from mechlab.pipelines.circuits import report_overlap_line
from mechlab.prune.circuit import (
    CROSS_TARGET_JACCARD,
    EDGE_JACCARD,
    MIN_SEEDS_FOR_INTERVAL,
    SEED_BASELINE_JACCARD,
    SHOWN_JACCARD,
    no_interval,
)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # tests/conftest.py
    pytest.mark.filterwarnings("ignore:circuit for .* the search likely failed"),
]

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "circuits" / "recall-cpu"
NUMBER = r"(\d\.\d{3})"


def cross_target(text: str) -> list[str]:
    return re.findall(rf"{CROSS_TARGET_JACCARD}(?: of)? {NUMBER}", text)


def overlap_out(capsys, files) -> str:
    assert main(["overlap", *map(str, files), "--boot", "20", "--null", "20", "--no-progress"]) == 0
    return capsys.readouterr().out


def test_two_seeds_give_no_interval_and_three_do(capsys):
    assert MIN_SEEDS_FOR_INTERVAL == 3
    two = overlap_out(
        capsys, [COMMITTED / f"{t}_seed{s}.json" for t in ("1-after", "2-after") for s in (0, 1)]
    )
    assert "CI" not in two and "interval [" not in two
    assert f"1-after vs 2-after: {CROSS_TARGET_JACCARD} " in two and no_interval(2) in two
    assert re.search(
        rf"1-after: {SEED_BASELINE_JACCARD} {NUMBER}, {re.escape(no_interval(2))}", two
    )
    three = overlap_out(
        capsys, [COMMITTED / f"{t}_seed{s}.json" for t in ("1-after", "2-after") for s in (0, 1, 2)]
    )
    assert re.search(
        rf"1-after vs 2-after: {CROSS_TARGET_JACCARD} {NUMBER}, 95% interval \[{NUMBER}, {NUMBER}\]",
        three,
    )
    assert "no interval" not in three


def test_prune_and_overlap_print_the_same_statistics_under_the_same_names(
    tiny_lds_checkpoint, tmp_path, capsys
):
    out = tmp_path / "c"
    args = ["prune", "--ckpt", str(tiny_lds_checkpoint), "--target", "1-after", "--target", "2-after",
            "--seed", "0", "--seed", "1", "--steps", "2", "--traces", "8", "--test-traces", "8",
            "--sparsity", "0.5", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    # the first seeds' pair: named as one pair's edge Jaccard, with its seeds
    assert re.search(rf"1-after vs 2-after, seed 0 vs seed 0: {EDGE_JACCARD} ", printed), printed
    # the means over seeds: the seed-baseline and the cross-target Jaccard
    assert SEED_BASELINE_JACCARD.capitalize() in printed
    pruned = cross_target(printed)
    files = sorted(out.glob("*_seed*.json"))
    assert len(files) == 4
    shown = overlap_out(capsys, files)
    assert cross_target(shown)[:1] == pruned[:1] and pruned
    for name in ("1-after", "2-after"):  # the seed baselines agree too
        mine = re.search(
            rf"{name} {NUMBER}", printed.split(SEED_BASELINE_JACCARD.capitalize() + ":")[1]
        )
        theirs = re.search(rf"{name}: {SEED_BASELINE_JACCARD} {NUMBER}", shown)
        assert mine and theirs and mine.group(1) == theirs.group(1)
    assert "interval [" not in printed + shown and "CI" not in printed + shown


def test_the_report_page_and_its_printed_summary_agree_with_overlap(
    tiny_lds_checkpoint, tmp_path, capsys
):
    cfg = ReportConfig(eval_traces=8, prune_traces=8, recall_traces=8, steps=2, n_boot=20, n_null=20,
                       seeds=(0, 1), components=False)  # fmt: skip
    report = make_report(tiny_lds_checkpoint, cfg, progress=False)
    page = report.write(tmp_path / "r").read_text()
    summary = json.loads((tmp_path / "r" / "report.json").read_text())["summary"]
    value = f"{summary['overlap']['1-after vs 2-after']['jaccard']:.3f}"
    section = page.split("<section id='overlap'>")[1].split("</table>")[0]
    assert f"<td>{CROSS_TARGET_JACCARD}</td><td>{value}</td><td>{no_interval(2)}</td>" in section
    assert f"<td>{SEED_BASELINE_JACCARD}</td>" in section and "interval [" not in section
    line = report_overlap_line(
        "1-after vs 2-after", summary["overlap"]["1-after vs 2-after"], summary["within"]
    )
    assert cross_target(line) == [value] and no_interval(2) in line
    # `mechlab overlap` of the report's own circuit files prints the same number, the same way
    shown = overlap_out(capsys, sorted((tmp_path / "r" / "circuits").glob("*.json")))
    assert cross_target(shown)[0] == value and no_interval(2) in shown
    # the explorer's number is named as what it is: one pair's, over the edges shown
    assert SHOWN_JACCARD in page and "(this pair only)" in page
    assert f"{SHOWN_JACCARD} of the one pair it compares" in page


def test_view_names_its_jaccard_as_one_pairs(tmp_path):
    files = [COMMITTED / f"{t}_seed0.json" for t in ("1-after", "2-after")]
    assert main(["view", *map(str, files), "--out", str(tmp_path / "v.html")]) == 0
    page = (tmp_path / "v.html").read_text()
    assert (
        f'"jaccard_name": "{SHOWN_JACCARD}"' in page and "Jaccard of the edges shown ${" not in page
    )


def test_a_file_written_before_the_counts_were_recorded_prints_the_same_way():
    from mechlab.pipelines.circuits import overlap_lines

    saved = json.loads((COMMITTED / "stats" / "overlap.json").read_text())  # 5 seeds
    saved.pop("n_circuits", None)  # as a file written before the counts were recorded
    lines = overlap_lines(saved)
    within, across = saved["within"]["1-after"], saved["across"]["1-after vs 2-after"]["jaccard"]
    assert lines[0] == (f"1-after: {SEED_BASELINE_JACCARD} {within['value']:.3f}, "
                        f"95% interval [{within['low']:.3f}, {within['high']:.3f}]")  # fmt: skip
    assert lines[2] == (f"1-after vs 2-after: {CROSS_TARGET_JACCARD} {across['value']:.3f}, "
                        f"95% interval [{across['low']:.3f}, {across['high']:.3f}]")  # fmt: skip
    two = {**saved, "n_circuits": {"1-after": 2, "2-after": 2}}
    assert all("interval [" not in line for line in overlap_lines(two))
