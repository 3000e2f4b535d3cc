"""`mechlab sweep`: bad input refused in one line before anything runs; a run, its outputs
and its resume, on the oracle and on real trials."""

import csv
import json
import re

import pytest

from mechlab.cli import main
from mechlab.sweep.oracle import OracleTrial

ORACLE = ["--trial", "mechlab.sweep.oracle:oracle_trial"]
slow_oracle = OracleTrial(sleep=0.3)  # a trial that takes time, for a sweep stopped between trials
TINY = ["--models", "st_lstm_small", "--formats", "acot", "--m", "3", "--L", "3", "--lrs", "1e-3",
        "--seeds", "10,20", "--n-val", "5", "--no-progress"]  # fmt: skip


@pytest.mark.parametrize("args, message", [
    (["--m", "1"], "m must be an integer >= 2"),
    (["--L", "1"], "L must be an integer >= 2"),
    (["--formats", "acot,essay"], "unknown format 'essay'"),
    (["--lengths", "random"], "unknown length distribution 'random'"),
    (["--models", "gpt5"], "unknown model 'gpt5'"),
    (["--group", "s7"], "unknown group 's7'"),
    (["--m", "two"], "is not a comma-separated list of int"),
    (["--n-min", "500"], "N_min 500 is larger than the 22 unique training samples that exist"),
    (["--ood-n", "10000"], "ood_n 10000 is larger than"),
    (["--m", "2", "--L", "2"], "no validation sequences"),
    (["--address", "127.0.0.1:1"], "cannot reach a Ray cluster at '127.0.0.1:1'"),
    (["--units", "batch"], "unknown --units 'batch'"),
    (["--local", "--address", "auto"], "--local or --address"),
    (["--trial", "mechlab.sweep.oracle:nothing"], "module 'mechlab.sweep.oracle' has no function 'nothing'"),
    (["--multiplier", "1"], "multiplier must be > 1"),
    (["--trial", "no_such_module:trial"], "cannot import 'no_such_module'"),
    (["--m", "7", "--L", "12", "--n-val", "1000000000"], "the task's sequences would hold sequences"),
    (["--m", "1000000"], "m 1e+06 is more than mechlab's limit of 16,384 (one token per element"),
    (["--L", "1000000"], "L 1e+06 is more than mechlab's limit of 4,096 (checking the task counts"),
    (["--L", "4000", "--m", "5000", "--batch-size", "1"], "an evaluation chunk's logits would hold sequences 512"),
    ({"device": "foo"}, "sweep settings: unknown device 'foo'"),
    ({"device": "cuda:99"}, "device 'cuda:99' asked for, but torch sees"),
    ({"models": [{"arch": "lstm", "d_model": 100000}]}, "lstm acot Z3 fixed L=3: the lstm config (d_model=100000"),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2_before_anything_runs(tmp_path, capsys, args, message):
    out = tmp_path / "sweep"
    tiny = TINY
    if isinstance(args, dict):  # settings only a config file gives (flags would override them)
        config = tmp_path / "sweep.yaml"
        config.write_text(json.dumps(args))
        tiny = TINY[2:] if "models" in args else TINY
        args = ["--config", str(config), "--local"]
    code = main(["sweep", "--out", str(out), *tiny, "--lengths", "fixed", "--no-kappa", *args])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2
    assert err.startswith("mechlab: error:") and message in err and len(err.splitlines()) == 1, err
    assert not captured.out and not out.exists()  # nothing written (no settings.json, no trials/)


def test_a_config_file_with_flags_over_it_runs_resumes_and_writes_the_tables(tmp_path, capsys):
    config = tmp_path / "sweep.yaml"
    config.write_text("models: [st_lstm_small]\nformats: [acot]\nms: [5]\nLs: [3]\nlengths: [uniform]\n"
                      "seeds: [10, 20]\nlrs: [1.0e-3]\nn_val: 10\nsearch: {n_max: 5000, multiplier: 10}\n")  # fmt: skip
    out = tmp_path / "sweep"
    args = ["sweep", "--config", str(config), "--out", str(out), "--local", "--no-progress", *ORACLE]
    assert main([*args, "--m", "3"]) == 0  # the flag replaces ms: [5]
    text = capsys.readouterr().out
    assert "3 N* searches" in text and "Z3" in text and "Z5" not in text
    with open(out / "searches.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["lengths"], r["n"]) for r in rows} == {("uniform", "2..3"), ("fixed", "2"), ("fixed", "3")}
    # the oracle's thresholds: m * L * factor, factor 1 + 0.1 (seed mod 7) at lr 1e-3:
    # seeds 10 and 20 give 1.3 and 1.6, so N* = ceil(m * L * 1.3) (Z_3, L = 3: 12)
    n_star = {(r["lengths"], r["n"]): r["n_star"] for r in rows}
    assert n_star == {("uniform", "2..3"): "12", ("fixed", "2"): "8", ("fixed", "3"): "12"}
    assert all(r["status"] == "found" for r in rows)
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == len(list((out / "trials").iterdir()))
    assert main([*args, "--m", "3"]) == 0
    assert f"trials: 0 run, {len(trials)} reused" in capsys.readouterr().out
    assert json.loads((out / "sweep.json").read_text())["ms"] == [3]


def test_a_tiny_real_sweep_runs_end_to_end_locally(tmp_path, capsys):
    out = tmp_path / "real"
    code = main(["sweep", "--out", str(out), "--models", "st_lstm_small", "--formats", "acot", "--m", "2",
                 "--L", "3", "--lengths", "uniform", "--no-kappa", "--lrs", "1e-2", "--seeds", "10",
                 "--steps", "30", "--eval-every", "10", "--n-val", "4", "--n-min", "2", "--multiplier", "4",
                 "--local", "--no-progress"])  # fmt: skip
    assert code == 0
    (row,) = json.loads((out / "searches.json").read_text())
    assert row["cap"] == 11  # Z_2: 4 + 8 sequences, one of length 3 for validation
    assert row["status"] in ("found", "at_min", "not_reached", "bracketed") and row["ood_n"] == 11
    trials = json.loads((out / "trials.json").read_text())
    assert trials and all(t["steps"] == 30 and t["steps_run"] <= 30 for t in trials)
    assert all(list(t["val_loss_by_length"]) == ["3"] for t in trials)  # Z_2: validation only of length 3
    assert (out / "nstar.html").exists() and "trials:" in capsys.readouterr().out


def test_ctrl_c_during_a_sweep_keeps_the_finished_trials_and_the_rerun_reuses_them(tmp_path, capsys):
    from tests.interrupt import interrupt, leftovers, stopped_line

    out = tmp_path / "sweep"
    args = ["sweep", "--out", str(out), *TINY, "--lengths", "fixed", "--no-kappa", "--no-ood", "--local",
            "--trial", "tests.cli.test_sweep:slow_oracle"]  # fmt: skip
    line = stopped_line(interrupt(args, lambda: any((out / "trials").glob("*.json"))))  # the next trial sleeps
    found = re.match(r"mechlab: stopped by signal 2 \(SIGINT, Ctrl-C\) after (\d+) trial\(s\); kept (.+) in '(.+)'; "
                     r"resume with the same command, which reads back what is kept", line)  # fmt: skip
    assert found, line
    trials = sorted(p.stem for p in (out / "trials").glob("*.json"))
    assert int(found[1]) == len(trials) >= 1 and found[2] == ", ".join(trials) and found[3] == str(out / "trials")
    assert not (out / "sweep.json").exists() and not leftovers(out)  # the tables come at the end
    assert main(args) == 0
    assert re.search(rf"trials: \d+ run, {len(trials)} reused", capsys.readouterr().out)
