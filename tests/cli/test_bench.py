"""`mechlab bench methods`: the methods table of docs/pruning.md, at a tiny size."""

from __future__ import annotations

import json
import textwrap

import pytest

from mechlab.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["--traces", "8", "--test-traces", "8", "--tracr-seeds", "none", "--no-progress", "--threads", "1",
        "--stability-boots", "0", "--redundant", "none"]  # fmt: skip


@pytest.fixture()
def one_planted(tmp_path, monkeypatch):
    """A planted generator module (one case: value-61, its data seed 1) importable by name."""
    (tmp_path / "one_planted.py").write_text(textwrap.dedent("""
        from mechlab.bench.methods import PlantedCase
        from tests.prune.test_planted import PLANTED, planted_data

        def cases(seeds):
            model, truth = PLANTED["value-61"]()
            return [PlantedCase(f"value-61 seed {s}", model, set(truth), planted_data(s), seed=s) for s in seeds]
    """))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    return "one_planted:cases"


def test_bench_methods_writes_the_table_and_its_json(tiny_lds_checkpoint, one_planted, tmp_path, capsys):
    import torch

    from mechlab.pipelines import checkpoint_prune_data
    from mechlab.prune.methods import find_circuit

    out = tmp_path / "methods.json"
    code = main(["bench", "methods", "--ckpt", str(tiny_lds_checkpoint), "--methods", "eap,exact",
                 "--planted", one_planted, "--seeds", "1", "--out", str(out), *TINY])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert printed.startswith("| method | 1-after CPR | 1-after CMD | 1-after f (edges) |")
    rows = {line.split(" | ")[0].strip("| "): line for line in printed.splitlines() if line.startswith("| e")}
    assert set(rows) == {"eap", "exact"} and all(r.endswith("| 1/1 | - |") for r in rows.values())
    table = json.loads(out.read_text())
    assert table["methods"] == ["eap", "exact"] and table["targets"] == ["1-after", "2-after"]
    info = table["info"]
    assert info["checkpoint"] == str(tiny_lds_checkpoint) and info["n_train"] == 8 and info["torch_threads"] == 1
    assert info["command"].startswith("mechlab bench methods --ckpt") and "--methods eap,exact" in info["command"]
    assert len(info["loadavg_start"]) == 3 and info["planted_cases"] == ["value-61 seed 1"]
    # each row is the circuit find_circuit returns on the same traces, at the same budget
    torch.manual_seed(0)
    ckpt, data = checkpoint_prune_data(tiny_lds_checkpoint, n_train=8, n_test=8)
    for method in ("eap", "exact"):
        for target in ("1-after", "2-after"):
            meta = find_circuit(ckpt.model, data, target, method, 0.95).metadata
            row = table["model"][method][target]
            assert row["faithfulness"] == pytest.approx(meta["metrics"]["faithfulness"], abs=1e-9)
            assert row["n_edges_kept"] == meta["n_edges_kept"] and 0 <= row["cpr"] <= 1.5
            assert row["seconds"] > 0 and f"{row['faithfulness']:.3f} ({row['n_edges_kept']})" in rows[method]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--methods", "eap,magic"], "unknown method 'magic'"),
        (["--targets", "9-after"], "9-after"),
        (["--planted", "no_such_module_xyz:cases"], "cannot import 'no_such_module_xyz'"),
        (["--planted", "justaname"], "--planted must be MODULE:FUNCTION or none"),
        (["--seeds", "0,x"], "--seeds '0,x': not comma-separated integers or none"),
        (["--sparsity", "1.5"], "--sparsity must be in (0, 1)"),
        (["--stability-boots", "1"], "--stability-boots must be 0 (off) or at least 2"),
        (["--redundant", "no_such_module_xyz:cases"], "--redundant no_such_module_xyz:cases: cannot import"),
        (["--redundant", "one_planted:nothing"], "'one_planted' has no 'nothing'"),
    ],
)
def test_bad_bench_methods_input_is_one_line_exit_2(tiny_lds_checkpoint, one_planted, tmp_path, capsys, extra,
                                                   message):  # fmt: skip
    out = tmp_path / "methods.json"
    code = main(["bench", "methods", "--ckpt", str(tiny_lds_checkpoint), "--methods", "eap",
                 "--planted", "none", *TINY, "--out", str(out), *extra])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_bench_methods_keeps_an_existing_table(tiny_lds_checkpoint, tmp_path, capsys):
    out = tmp_path / "methods.json"
    out.write_text("{}")
    code = main(["bench", "methods", "--ckpt", str(tiny_lds_checkpoint), "--out", str(out), *TINY])
    assert code == 2 and "exists; pass --force" in capsys.readouterr().err and out.read_text() == "{}"


@pytest.fixture()
def one_redundant(tmp_path, monkeypatch):
    """A redundant generator module: value-61 per seed, budgets the truth's size, goal 0.9."""
    (tmp_path / "one_redundant.py").write_text(textwrap.dedent("""
        from mechlab.bench.methods import PlantedCase
        from tests.prune.test_planted import PLANTED, planted_data

        def cases(seeds):
            model, truth = PLANTED["value-61"]()
            budgets = {"minimal": len(truth), "planted": len(truth)}
            return [(PlantedCase(f"value-61 seed {s}", model, set(truth), planted_data(s), seed=s), budgets, 0.9)
                    for s in seeds]
    """))  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    return "one_redundant:cases"


def test_bench_methods_stability_and_redundant_columns(tiny_lds_checkpoint, one_redundant, tmp_path, capsys):
    out = tmp_path / "methods.json"
    code = main(["bench", "methods", "--ckpt", str(tiny_lds_checkpoint), "--methods", "eap", "--planted", "none",
                 *TINY, "--stability-boots", "2", "--redundant", one_redundant, "--redundant-seeds", "0,1",
                 "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    head = printed.splitlines()[0]
    assert "| 1-after MB | 1-after stability | 2-after CPR |" in head
    assert head.endswith("| 2-after stability | planted exact | Tracr exact | redundant found (minimal) "
                         "| redundant found (planted) |")  # fmt: skip
    row = next(line for line in printed.splitlines() if line.startswith("| eap |"))
    assert row.endswith("| - | - | 2/2 | 2/2 |")
    table = json.loads(out.read_text())
    for target in ("1-after", "2-after"):
        result = table["model"]["eap"][target]
        detail = result["stability_detail"]
        assert detail["n_boot"] == 2 and result["stability"] == pytest.approx(sum(detail["jaccards"]) / 2)
        assert f"{result['stability']:.3f}" in row
    assert table["redundant"]["eap"]["found"] == {"minimal": 2, "planted": 2}
    assert len(table["redundant"]["eap"]["cases"]) == 4 and table["info"]["stability_boots"] == 2


def test_the_default_redundant_generator_is_skipped_where_it_does_not_exist():
    from mechlab.bench.methods import DEFAULT_REDUNDANT, redundant_cases

    assert redundant_cases("no_such_module_xyz:cases", [0], missing_ok=True) == []
    assert redundant_cases(DEFAULT_REDUNDANT.replace(":", ":no_such_function_"), [0], missing_ok=True) == []
    with pytest.raises(ValueError, match="has no 'no_such_function_"):
        redundant_cases(DEFAULT_REDUNDANT.replace(":", ":no_such_function_"), [0])


# --------------------------------------------------------------------------- issue 34: the output policy
# Every bench subcommand writes its --json (--out for methods) under the output policy of
# mechlab.pipelines.outputs: an existing file only with --force, never a checkpoint, an input,
# a folder, a device node or a pipe (not even with --force); refused before anything runs,
# in one line, exit 2, nothing written.

BENCHES = {
    "startup": ["bench", "startup", "--repeats", "1"],
    "prune": ["bench", "prune", "--presets", "tiny", "--batch", "2", "--pos", "4", "--repeats", "1", "--threads", "1"],
    "hooks": ["bench", "hooks", "--families", "mamba", "--batch", "2", "--pos", "4", "--repeats", "1",
              "--threads", "1"],
    "scan": ["bench", "scan", "--families", "mamba", "--batch", "2", "--pos", "4", "--repeats", "1"],
    "train": ["bench", "train", "--repeats", "1", "--threads", "1"],
    "ensemble": ["bench", "ensemble", "--presets", "st_transformer_small", "--steps", "1", "--n-train", "4",
                 "--repeats", "1"],
    "methods": ["bench", "methods", "--methods", "eap", "--planted", "none", *TINY],
}  # fmt: skip


def bench_args(name: str, ckpt, target) -> list[str]:
    args = list(BENCHES[name])
    if name == "methods":
        args += ["--ckpt", str(ckpt)]
    return [*args, "--out" if name == "methods" else "--json", str(target)]


@pytest.mark.parametrize("name", sorted(BENCHES))
@pytest.mark.parametrize("place", ["checkpoint", "fifo", "folder", "exists", "input"])
def test_issue_34_no_bench_output_replaces_what_it_must_not(tiny_lds_checkpoint, tmp_path, capsys, name, place):
    import os
    import shutil
    import stat

    ckpt = tmp_path / "run" / "last.pt"
    ckpt.parent.mkdir()
    shutil.copyfile(tiny_lds_checkpoint, ckpt)
    force = place != "exists"
    if place == "checkpoint":  # `bench startup --json .../last.pt --force` made the checkpoint JSON
        target = tmp_path / "other" / "last.pt"
        target.parent.mkdir()
        shutil.copyfile(tiny_lds_checkpoint, target)
    elif place == "fifo":
        target = tmp_path / "record.json"
        os.mkfifo(target)
    elif place == "folder":
        target = tmp_path / "records"
        target.mkdir()
    elif place == "exists":
        target = tmp_path / "record.json"
        target.write_text("{}")
    else:  # the checkpoint bench methods reads, by another name that is no checkpoint's
        if name != "methods":
            pytest.skip("only bench methods reads a checkpoint")
        target = tmp_path / "run" / "weights"
        os.link(ckpt, target)
    before = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() and not stat.S_ISFIFO(p.stat().st_mode) else b"")
              for p in tmp_path.rglob("*")}  # fmt: skip
    code = main([*bench_args(name, ckpt, target), *(["--force"] if force else [])])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("mechlab: error: "), err
    assert "Traceback" not in err and "record written" not in out
    message = {"checkpoint": "is a checkpoint", "fifo": "is not a regular file", "folder": "is a folder",
               "exists": "exists; pass --force", "input": "input"}[place]  # fmt: skip
    assert message in lines[0], lines[0]
    after = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() and not stat.S_ISFIFO(p.stat().st_mode) else b"")
             for p in tmp_path.rglob("*")}  # fmt: skip
    assert after == before


def test_ctrl_c_during_bench_methods_says_nothing_was_written(tiny_lds_checkpoint, tmp_path):
    """The table is written only at the end: stopped while a method runs, one line says so
    and no file (or temporary file) is left."""
    from tests.interrupt import interrupt, stopped_line

    out = tmp_path / "methods.json"
    args = ["bench", "methods", "--ckpt", str(tiny_lds_checkpoint), "--methods", "prune", "--prune-steps", "100000",
            "--planted", "none", "--seeds", "none", "--out", str(out), *[a for a in TINY if a != "--no-progress"]]  # fmt: skip
    line = stopped_line(interrupt(args, "methods:"))  # its progress bar: the methods run
    assert line.startswith(f"mechlab: stopped by signal 2 (SIGINT, Ctrl-C) before the end; nothing was written "
                           f"('{out}' is written only at the end) and no partial file is left; run the same "
                           "command again to start over: python -m mechlab bench methods"), line  # fmt: skip
    assert list(tmp_path.iterdir()) == []
