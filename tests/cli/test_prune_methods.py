"""`mechlab prune --method ...`: attribution methods beside edge pruning from the command line,
their circuit files read by `mechlab view` and `mechlab overlap`, and their bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mechlab.cli import main
from mechlab.prune import Circuit

pytestmark = pytest.mark.usefixtures("one_thread")
CHECKPOINTS = Path(__file__).resolve().parents[2] / "examples" / "checkpoints"
SMALL = ["--traces", "8", "--test-traces", "8", "--no-progress", "--threads", "1"]


def _prune(ckpt, out, *extra):
    return main(["prune", "--ckpt", str(ckpt), *extra, *SMALL, "--out", str(out)])


@pytest.mark.parametrize(
    "method, extra, settings",
    [
        ("eap", [], {}),
        ("eap-ig", ["--ig-steps", "3"], {"ig_steps": 3}),
        ("eap-ig-inputs", [], {"ig_steps": 10}),
        ("exact", ["--ablation", "mean"], {"ablation": "mean"}),
        ("acdc", [], {"acdc_max_edges": 400}),
        ("prune", ["--steps", "3"], {}),
    ],
)
def test_every_method_writes_a_circuit_file_at_an_edge_budget(tiny_lds_checkpoint, tmp_path, capsys,
                                                               method, extra, settings):  # fmt: skip
    out = tmp_path / "c"
    code = _prune(tiny_lds_checkpoint, out, "--method", method, "--edges", "4", *extra)
    assert code == 0, capsys.readouterr().err
    stem = "1-after_seed0" if method == "prune" else f"1-after_{method}_seed0"
    assert sorted(p.name for p in out.iterdir()) == [f"{stem}.html", f"{stem}.json", "plotly.min.js"]
    circuit = Circuit.from_json(out / f"{stem}.json")
    meta = circuit.metadata
    assert meta["method"] == method and meta["checkpoint"] == str(tiny_lds_checkpoint)
    assert meta["n_edges_asked"] == 4 and 0 < circuit.n_edges <= 4
    assert meta["method_settings"]["n_edges"] == 4 and meta["method_settings"]["sparsity"] is None
    for key, value in {"ablation": "interchange", **settings}.items():
        assert meta["method_settings"][key] == value, key
    if method != "prune":  # every edge's score is kept, the circuit's edges are among the best
        assert len(meta["attribution"]["scores"]) == meta["graph"]["n_edges"]
    printed = capsys.readouterr().out
    assert f"{stem}: {circuit.n_edges} edges" in printed and f"faithfulness {meta['metrics']['faithfulness']:.3f}" in printed


def test_method_circuits_are_viewed_and_compared_as_their_own_groups(tiny_lds_checkpoint, tmp_path, capsys):
    out = tmp_path / "c"
    for method in ("eap-ig", "exact"):
        assert _prune(tiny_lds_checkpoint, out, "--method", method, "--seed", "0", "--seed", "1") == 0
    files = sorted(out.glob("*.json"))
    assert [f.name for f in files] == ["1-after_eap-ig_seed0.json", "1-after_eap-ig_seed1.json",
                                       "1-after_exact_seed0.json", "1-after_exact_seed1.json"]  # fmt: skip
    assert main(["view", *map(str, files), "--out", str(tmp_path / "v.html")]) == 0
    page = (tmp_path / "v.html").read_text()
    assert "1-after · eap-ig · seed 1" in page and "1-after · exact · seed 0" in page
    assert '{"start": 0, "compare": 2}' in page  # opens on eap-ig seed 0 against exact seed 0: the methods
    capsys.readouterr()
    report = tmp_path / "o.json"
    code = main(["overlap", *map(str, files), "--boot", "20", "--null", "20", "--json", str(report),
                 "--ckpt", str(tiny_lds_checkpoint)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    result = json.loads(report.read_text())
    assert set(result["within"]) == {"1-after eap-ig", "1-after exact"}  # seeds of one method, not of two
    assert "1-after eap-ig vs 1-after exact" in result["across"]
    own = [c for c in result["cross_evaluation"] if c["own"]]
    assert len(own) == 4 and all(-1 <= c["faithfulness"] <= 1 for c in own)


@pytest.mark.parametrize(
    "folder, target, method, budget",
    [("st-transformer-cpu", "final", "eap-ig", ["--sparsity", "0.9"]),
     ("st-dense-ssm-cpu", "final", "exact", ["--sparsity", "0.9"]),
     ("induction-cpu", "all", "eap", ["--sparsity", "0.9"]),
     ("recall-lstm-cpu", "2-after", "eap-ig-inputs", ["--edges", "2"])],
)  # fmt: skip
def test_methods_run_on_every_bundled_family_and_task(folder, target, method, budget, tmp_path, capsys):
    ckpt = CHECKPOINTS / folder / "last.pt"
    out = tmp_path / "c"
    code = _prune(ckpt, out, "--method", method, "--target", target, *budget)
    assert code == 0, capsys.readouterr().err
    (found,) = out.glob("*.json")
    meta = Circuit.from_json(found).metadata
    assert meta["method"] == method and meta["target"].startswith(target) and f"_{method}_seed0" in found.name
    assert 0 < meta["n_edges_kept"] <= meta["n_edges_asked"]
    if budget[0] == "--sparsity":
        assert meta["sparsity_asked"] == 0.9
    else:
        assert meta["n_edges_asked"] == 2 and meta["graph"]["arch"] == "lstm"


def test_a_method_on_prompt_pairs(tmp_path, capsys):
    """--ckpt with --pairs (token ids): EAP-IG on the induction model's logit difference."""
    from tests.cli.conftest import write_repeat_pairs

    pairs = write_repeat_pairs(tmp_path / "repeats.jsonl", 8)
    out = tmp_path / "c"
    code = main(["prune", "--ckpt", str(CHECKPOINTS / "induction-cpu" / "last.pt"), "--pairs", str(pairs),
                 "--method", "eap-ig", "--ig-steps", "4", "--edges", "20", "--no-progress", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    meta = Circuit.from_json(out / "repeats_eap-ig_seed0.json").metadata
    assert meta["method"] == "eap-ig" and meta["method_settings"]["ig_steps"] == 4 and meta["n_edges_asked"] == 20
    assert meta["metrics"]["logit_diff_full"] > 10 and "logit_diff_circuit" in meta["metrics"]
    assert "method eap-ig (ablation interchange, ig_steps 4)" in capsys.readouterr().out


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory):
    """Finite weights whose outputs overflow to inf (and NaN after the final LayerNorm)."""
    import torch

    from mechlab.checkpoint import save_checkpoint
    from mechlab.models import build_model
    from tests.conftest import TINY_LDS_TASK

    torch.manual_seed(0)
    model = build_model({"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2,
                         "io": "continuous", "d_in": 2 * 4 + 2 + 3, "d_out": 3, "n_ctx": 24})  # fmt: skip
    with torch.no_grad():
        model.blocks[1].mlp.W_out.fill_(1e38)
    path = tmp_path_factory.mktemp("nan") / "nan.pt"
    save_checkpoint(model, path, task="lds", task_cfg=TINY_LDS_TASK,
                    train_cfg={"eval_haystack": 2, "eval_seg_len": 4})  # fmt: skip
    return path


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "eapig"], "unknown method 'eapig'; choose one of prune, eap, eap-ig"),
        (["--method", "eap", "--ablation", "mean"], "needs interchange ablation, not 'mean'"),
        (["--method", "eap-ig-inputs", "--ablation", "zero"], "needs interchange ablation, not 'zero'"),
        (["--method", "eap-ig", "--ig-steps", "0"], "--ig-steps must be an integer >= 1, got 0"),
        (
            ["--method", "eap-ig", "--ig-steps", str(10**12)],
            "--ig-steps 1e+12 is more than mechlab's limit of 10,000 (each point is a forward",
        ),
        (["--method", "eap", "--ig-steps", "3"], "method 'eap' does not integrate"),
        (["--method", "eap", "--edges", "0"], "the budget keeps no edge"),
        (["--method", "exact", "--edges", "100000"], "the budget asks for 100000 edges, but only"),
        (["--method", "eap-ig", "--sparsity", "0.99999"], "the budget keeps no edge"),
        (["--edges", "100000"], "the budget asks for 100000 edges, but only"),
        (["--edges", "4", "--sparsity", "0.9"], "give the budget once"),
        (["--method", "eap", "--steps", "10"], "--steps is edge pruning's option"),
        (["--method", "eap", "--loss", "truth"], "--loss truth is edge pruning's"),
        (["--method", "exact", "--recipe", "study"], "are edge pruning's (method 'prune')"),
        (["--method", "eap", "--target", "2-after", "--share", "0"], "--share is edge pruning's option"),
        (["--method", "acdc", "--acdc-max-edges", "5"], "above its limit of 5"),
        (["--method", "eap", "--acdc-max-edges", "5"], "--acdc-max-edges applies to --method acdc only"),
        (["--method", "eap", "--target", "9-after"], "9-after"),
    ],
)
def test_bad_method_input_is_one_line_exit_2_and_writes_nothing(tiny_lds_checkpoint, tmp_path, capsys,
                                                                 extra, message):  # fmt: skip
    out = tmp_path / "c"
    code = _prune(tiny_lds_checkpoint, out, *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0] and "Traceback" not in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("method", ["eap", "eap-ig", "exact", "acdc", "prune"])
def test_nan_scores_are_one_line_exit_2_and_write_nothing(nan_checkpoint, tmp_path, capsys, method):
    out = tmp_path / "c"
    code = _prune(nan_checkpoint, out, "--method", method, *(["--steps", "2"] if method == "prune" else []))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and ("NaN" in err[0] or "nan" in err[0]), err
    assert not out.exists()


def test_a_method_on_a_model_folder(gpt2_folder, ioi_file, tmp_path, capsys):
    """--model FOLDER --pairs: exact ablation on an imported GPT-2's IOI pairs."""
    out = tmp_path / "c"
    code = main(["prune", "--model", str(gpt2_folder), "--pairs", str(ioi_file), "--method", "exact",
                 "--edges", "10", "--no-progress", "--out", str(out), "--threads", "1"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    circuit = Circuit.from_json(out / "ioi_exact_seed0.json")
    meta = circuit.metadata
    assert meta["method"] == "exact" and meta["model_kind"] == "hf-folder" and 0 < circuit.n_edges <= 10
    assert "logit_diff_full" in meta["metrics"] and meta["metrics"]["divergence"] == "kl"


@pytest.mark.parametrize("method, extra", [("eap", ["--edges", "4"]), ("prune", ["--steps", "3"])])
def test_stability_is_measured_recorded_shown_and_part_of_the_settings(tiny_lds_checkpoint, tmp_path, capsys,
                                                                        method, extra):  # fmt: skip
    import torch

    from mechlab.pipelines import checkpoint_prune_data
    from mechlab.prune import method_stability

    out = tmp_path / "c"
    code = _prune(tiny_lds_checkpoint, out, "--method", method, *extra, "--stability", "2")
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    stem = "1-after_seed0" if method == "prune" else f"1-after_{method}_seed0"
    meta = Circuit.from_json(out / f"{stem}.json").metadata
    stability = meta["stability"]
    assert stability["n_boot"] == 2 and len(stability["jaccards"]) == 2 and stability["bar"] == 0.8
    assert stability["meets_bar"] == (stability["mean_jaccard"] >= 0.8)
    assert meta["settings"]["stability_boots"] == 2
    assert f"  {stability['summary']}" in printed.splitlines()
    assert "bootstrap stability: mean edge Jaccard" in (out / f"{stem}.html").read_text()
    if method == "eap":  # the same as the library on the same traces
        torch.manual_seed(0)
        ckpt, data = checkpoint_prune_data(tiny_lds_checkpoint, n_train=8, n_test=8)
        by_library = method_stability(ckpt.model, data, "1-after", "eap", n_boot=2, seed=0, n_edges=4)
        assert stability["jaccards"] == pytest.approx(list(by_library.jaccards), abs=1e-12)
    # the same settings are read back; without --stability, or with another N, they are not
    assert _prune(tiny_lds_checkpoint, out, "--method", method, *extra, "--stability", "2") == 0
    assert f"read back 1 circuit(s) found before with the same settings: {stem}" in capsys.readouterr().out
    for other in ([], ["--stability", "3"]):
        code = _prune(tiny_lds_checkpoint, out, "--method", method, *extra, *other)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "stability_boots" in err[0] and "--force" in err[0], err
    assert Circuit.from_json(out / f"{stem}.json").metadata["stability"] == stability


def test_a_plain_prune_records_no_stability(tiny_lds_checkpoint, tmp_path, capsys):
    out = tmp_path / "c"
    assert _prune(tiny_lds_checkpoint, out, "--method", "eap", "--edges", "4") == 0, capsys.readouterr().err
    meta = Circuit.from_json(out / "1-after_eap_seed0.json").metadata
    assert "stability" not in meta and "stability_boots" not in meta["settings"]
    assert "bootstrap" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--stability", "1"], "--stability must be 0 (off) or at least 2"),
        (["--stability", "2", "--share", "0"], "--stability applies to circuits pruned one target at a time, not with --share"),
    ],
)
def test_bad_stability_is_one_line_exit_2(tiny_lds_checkpoint, tmp_path, capsys, extra, message):
    out = tmp_path / "c"
    code = _prune(tiny_lds_checkpoint, out, "--target", "1-after", "--target", "2-after", *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()
