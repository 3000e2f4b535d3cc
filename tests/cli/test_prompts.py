"""`mechlab pairs ioi` and `mechlab prune --model FOLDER --pairs FILE`: a model you bring
(a save_pretrained GPT-2 folder with its tokenizer) pruned on prompt pairs, and the issue's
bad input, each one line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest
import torch

from mechlab.cli import main
from mechlab.models.importers import from_pretrained
from mechlab.pipelines import prune_prompts
from mechlab.prune import Circuit
from mechlab.tasks.prompts import load_pairs

pytestmark = pytest.mark.usefixtures("one_thread")  # gpt2_folder, ioi_file: tests/cli/conftest.py


def test_pairs_ioi_writes_a_pair_file_and_keeps_an_existing_one(ioi_file, gpt2_folder, capsys):
    lines = ioi_file.read_text().splitlines()
    assert len(lines) == 12 and all({"clean", "corrupted", "answer", "wrong"} == set(json.loads(x)) for x in lines)
    before = ioi_file.read_text()
    code = main(["pairs", "ioi", "--tokenizer", str(gpt2_folder), "--out", str(ioi_file), "--n", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "exists; pass --force" in err and ioi_file.read_text() == before


def test_prune_a_model_folder_on_prompt_pairs(gpt2_folder, ioi_file, tmp_path, capsys):
    out = tmp_path / "c"
    code = main(["prune", "--model", str(gpt2_folder), "--pairs", str(ioi_file), "--steps", "5",
                 "--sparsity", "0.9", "--no-progress", "--out", str(out), "--threads", "1"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    printed = captured.out
    assert "ioi_seed0: " in printed and "logit difference: full" in printed
    circuit = Circuit.from_json(out / "ioi_seed0.json")
    meta = circuit.metadata
    assert meta["sparsity_limited_by_open_edges"] == ("the search closed every other edge" in captured.err)
    # had fewer edges been open than the budget allows, the same words as for a task's circuits
    from mechlab.cli.circuits import _print_prompt_circuit

    meta.update(sparsity_limited_by_open_edges=True, n_edges_asked=circuit.n_edges + 5)
    _print_prompt_circuit("ioi_seed0", circuit, out)
    note = capsys.readouterr().err
    assert f"ioi_seed0: kept {circuit.n_edges} edges where sparsity 0.9 allows {circuit.n_edges + 5}" in note
    assert meta["target"] == "all" and meta["metric"] == "logit-diff" and meta["model_kind"] == "hf-folder"
    assert meta["data"]["n_train"] == 6 and meta["data"]["n_test"] == 6
    for key in ("logit_diff_full", "logit_diff_circuit", "logit_diff_ablated", "logit_diff_recovered"):
        assert key in meta["metrics"]
    assert (out / "ioi_seed0.html").is_file()

    # the same in Python, and the full model's logit difference against a direct run
    run = prune_prompts(gpt2_folder, ioi_file, seeds=[0], out=tmp_path / "py", steps=5, sparsity=0.9,
                        progress=False)  # fmt: skip
    pairs = load_pairs(ioi_file, gpt2_folder)
    _, test = pairs.split(0.5, seed=0)
    model = from_pretrained(gpt2_folder)
    with torch.no_grad():
        logits = model(test.clean)[torch.arange(len(test)), test.position]
    direct = float(test.logit_difference(logits).mean())
    assert run.circuits[0].metadata["metrics"]["logit_diff_full"] == pytest.approx(direct, abs=1e-5)
    assert meta["metrics"]["logit_diff_full"] == pytest.approx(direct, abs=1e-5)


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    "case, message",
    [
        ("unsupported", "(BertForMaskedLM): mechlab imports GPT2LMHeadModel"),
        ("no-weights", "has a config.json but no weights"),
        ("no-tokenizer", "has no tokenizer"),
        ("too-large", "MECHLAB_MAX_ELEMENTS"),
        ("lengths", "line 2: the clean prompt has 3 tokens and the corrupted 4; the prompts of a pair must have equal token lengths"),
        ("answer", "line 1: 'answer' ' Mary Lucy' is 2 tokens"),
        ("no-model", "give exactly one of --ckpt PATH"),
        ("no-pairs", "--model prunes on prompt pairs: give --pairs"),
        ("target", "--target does not apply with --pairs"),
        ("metric", "unknown metric 'accuracy'"),
        ("sparsity", "sparsity must be in (0, 1)"),
        ("long-line", "(line 301 is the longest) would hold pairs 301 x bytes of the longest line"),
        ("many-lines", "holds more than mechlab's limit of 100,000 pairs"),
        ("deep", "line 2 nests more than 64 levels deep"),
        ("nan-weights", "holds non-finite weights: parameter 'blocks.1.attn.W_Q' has 2 NaN/inf"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, message, gpt2_folder, ioi_file, tmp_path,
                                                         capsys, monkeypatch):  # fmt: skip
    model, pairs, extra = gpt2_folder, ioi_file, []
    if case == "unsupported":
        model = tmp_path / "bert"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
        extra = ["--tokenizer", str(gpt2_folder)]
    elif case == "no-weights":
        model = tmp_path / "empty"
        model.mkdir()
        (model / "config.json").write_text((gpt2_folder / "config.json").read_text())
        extra = ["--tokenizer", str(gpt2_folder)]
    elif case == "no-tokenizer":
        model = tmp_path / "weights-only"
        model.mkdir()
        for name in ("config.json", "model.safetensors"):
            (model / name).write_bytes((gpt2_folder / name).read_bytes())
    elif case == "too-large":
        monkeypatch.setenv("MECHLAB_MAX_ELEMENTS", "1000")
    elif case == "lengths":
        pairs = _write(tmp_path / "p.jsonl", [{"clean": "Mary and John", "corrupted": "Lucy and Tom",
                                               "answer": " Mary", "wrong": " John"},
                                              {"clean": "Then, Mary", "corrupted": "Then, Mary and",
                                               "answer": " Mary", "wrong": " John"}])  # fmt: skip
    elif case == "answer":
        pairs = _write(tmp_path / "p.jsonl", [{"clean": "Mary and John", "corrupted": "Lucy and Tom",
                                               "answer": " Mary Lucy", "wrong": " John"}] * 2)  # fmt: skip
    elif case == "nan-weights":  # refused when the model is opened, before any pruning
        import transformers as T

        model = tmp_path / "nan"
        hf = T.GPT2LMHeadModel.from_pretrained(gpt2_folder)
        with torch.no_grad():
            hf.transformer.h[1].attn.c_attn.weight[0, 0] = float("nan")
            hf.transformer.h[1].attn.c_attn.weight[0, 1] = float("inf")
        hf.save_pretrained(model)
        extra = ["--tokenizer", str(gpt2_folder)]
        capsys.readouterr()  # the progress bars of transformers' own loading and saving
    elif case == "long-line":  # pads every pair to the longest line: refused before tokenizing
        ids = {"clean": [1, 2], "corrupted": [1, 3], "answer": 1, "wrong": 2}
        long = {"clean": [1] * 1_400_000, "corrupted": [2] * 1_400_000, "answer": 1, "wrong": 2}
        pairs = _write(tmp_path / "p.jsonl", [ids] * 300 + [long])
    elif case == "many-lines":
        pairs = tmp_path / "p.jsonl"
        pairs.write_text('{"clean": [1], "corrupted": [2]}\n' * 100_001)
    elif case == "deep":
        pairs = tmp_path / "p.jsonl"
        pairs.write_text(json.dumps({"clean": [1, 2], "corrupted": [1, 3], "answer": 1, "wrong": 2}) + "\n"
                         + '{"clean": ' + "[" * 100_000 + "]" * 100_000 + "}\n")  # fmt: skip
    args = ["prune", "--model", str(model), "--pairs", str(pairs), *extra]
    if case == "no-model":
        args = ["prune", "--pairs", str(pairs)]
    elif case == "no-pairs":
        args = ["prune", "--model", str(model)]
    elif case == "target":
        args += ["--target", "1-after"]
    elif case == "metric":
        args += ["--metric", "accuracy"]
    elif case == "sparsity":
        args += ["--sparsity", "1.5"]
    out = tmp_path / "out"
    code = main([*args, "--steps", "1", "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("mechlab: error: ") and message in err[0], err
    assert not out.exists()


def test_pairs_ioi_refuses_more_pairs_than_a_pair_file_may_hold(gpt2_folder, tmp_path, capsys):
    out = tmp_path / "new" / "ioi.jsonl"
    args = ["--tokenizer", str(gpt2_folder), "--out", str(out), "--n", "2000000000"]
    code = main(["pairs", "ioi", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["mechlab: error: --n 2e+09 is more than mechlab's limit of 100,000 (the most "
                                 "pairs a pair file may hold); lower --n"], err  # fmt: skip
    assert not out.parent.exists()


def test_a_prompt_prune_rerun_reads_back_or_refuses_by_settings(gpt2_folder, ioi_file, tmp_path, capsys):
    """Issue 19's output policy for --pairs: the same command reads its circuit back and
    rewrites nothing; other settings are refused naming them (nothing changed); --force
    recomputes; the pair file and the tokenizer are never written."""
    out = tmp_path / "c"
    args = ["prune", "--model", str(gpt2_folder), "--pairs", str(ioi_file), "--steps", "2", "--sparsity", "0.9",
            "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    written = (out / "ioi_seed0.json").read_bytes()
    assert main(args) == 0
    assert "read back 1 circuit(s) found before with the same settings: ioi_seed0" in capsys.readouterr().out
    assert (out / "ioi_seed0.json").read_bytes() == written
    other = [a if a != "0.9" else "0.8" for a in args]
    assert main(other) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was made with other settings: sparsity 0.9 (now 0.8)" in err[0] and "--force" in err[0]
    assert (out / "ioi_seed0.json").read_bytes() == written
    assert main([*other, "--force"]) == 0
    assert "recomputed 1 circuit(s) of other settings (--force): ioi_seed0" in capsys.readouterr().out
    assert Circuit.from_json(out / "ioi_seed0.json").metadata["settings"]["sparsity"] == 0.8
    before = ioi_file.read_bytes()
    assert main(["prune", "--model", str(gpt2_folder), "--pairs", str(ioi_file), "--out", str(ioi_file)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err and ioi_file.read_bytes() == before
    config = gpt2_folder / "config.json"
    for target in (config, gpt2_folder):
        code = main(["pairs", "ioi", "--tokenizer", str(gpt2_folder), "--out", str(target), "--n", "3", "--force"])
        assert code == 2 and "mechlab: error: " in capsys.readouterr().err
    assert json.loads(config.read_text())["n_layer"] == 2


@pytest.mark.slow  # 20 s on 2 shared cores: a fresh interpreter (5 s of imports), then the rerun's seed
def test_ctrl_c_during_a_prompt_prune_keeps_the_seeds_written_and_the_rerun_reads_them_back(tmp_path, capsys):
    """The prompt pipeline on a token checkpoint (the bundled induction model, id pairs):
    stopped while it prunes seed 1, it names seed 0's circuit, which the rerun reads back."""
    from pathlib import Path

    from tests.cli.conftest import write_repeat_pairs
    from tests.interrupt import interrupt, leftovers, stopped_line

    ckpt = Path(__file__).resolve().parents[2] / "examples" / "checkpoints" / "induction-cpu" / "last.pt"
    pairs, out = write_repeat_pairs(tmp_path / "repeats.jsonl", 12), tmp_path / "c"
    args = ["prune", "--ckpt", str(ckpt), "--pairs", str(pairs), "--seed", "0", "--seed", "1", "--steps", "30",
            "--threads", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    line = stopped_line(interrupt(args, out / "repeats_seed0.json"))
    assert line.startswith(f"mechlab: stopped by signal 2 (SIGINT, Ctrl-C) after 1 of 2 circuit(s); kept repeats_seed0 "
                           f"in '{out}'; resume with the same command"), line  # fmt: skip
    assert not (out / "repeats_seed1.json").exists() and not leftovers(out)
    assert main(args) == 0
    assert "read back 1 circuit(s) found before with the same settings: repeats_seed0" in capsys.readouterr().out
    assert (out / "repeats_seed0.html").is_file() and (out / "repeats_seed1.json").is_file()


def test_stability_of_a_prompt_circuit_is_the_methods_circuits_on_resampled_training_pairs(
    gpt2_folder, ioi_file, tmp_path, capsys
):
    """``--stability N`` with ``--pairs``: each replicate is the same method on the seed's
    training pairs resampled with the seed (recomputed here by hand), its Jaccard with the
    circuit recorded and printed; the replicates are part of the settings (a rerun without
    them is refused naming them; the same rerun reads back)."""
    from mechlab.prune.circuit import jaccard
    from mechlab.prune.methods import find_circuit
    from mechlab.prune.stability import bootstrap_samples
    from mechlab.tasks.prompts import TARGET

    out = tmp_path / "c"
    args = ["prune", "--model", str(gpt2_folder), "--pairs", str(ioi_file), "--method", "eap", "--edges", "6",
            "--seed", "3", "--stability", "3", "--no-progress", "--out", str(out), "--threads", "1"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    circuit = Circuit.from_json(out / "ioi_eap_seed3.json")
    measured = circuit.metadata["stability"]
    assert measured["n_boot"] == 3 and measured["seed"] == 3 and len(measured["jaccards"]) == 3
    assert circuit.metadata["settings"]["stability_boots"] == 3
    assert "bootstrap" in printed and f"{measured['mean_jaccard']:.2f}" in printed

    model = from_pretrained(gpt2_folder).eval()
    data = load_pairs(ioi_file, gpt2_folder).prune_data(0.5, seed=3)
    edges = {tuple(e) for e in circuit.edges}
    by_hand = []
    for replicate in bootstrap_samples(data, 3, seed=3):
        found = find_circuit(model, replicate, TARGET, "eap", None, n_edges=6)
        by_hand.append(jaccard(edges, {tuple(e) for e in found.edges}))
    assert measured["jaccards"] == pytest.approx(by_hand, abs=1e-12)
    assert measured["mean_jaccard"] == pytest.approx(sum(by_hand) / 3)

    written = (out / "ioi_eap_seed3.json").read_bytes()
    assert main(args) == 0 and "read back 1 circuit(s)" in capsys.readouterr().out
    at = args.index("--stability")
    without = args[:at] + args[at + 2 :]
    assert main(without) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stability_boots" in err[0] and (out / "ioi_eap_seed3.json").read_bytes() == written


def test_stability_is_refused_with_share(tmp_path, capsys):
    code = main(["prune", "--ckpt", "examples/checkpoints/recall-cpu/last.pt", "--target", "1-after",
                 "--target", "2-after", "--share", "1", "--stability", "2", "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["mechlab: error: --stability applies to circuits pruned one target at a time, "
                                 "not with --share"] and not (tmp_path / "o").exists()  # fmt: skip
