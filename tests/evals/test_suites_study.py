"""The study's protocol in the evaluations (per-example medians, the study's NiH) and in
`mechlab prune --recipe study` (settings resolved, explicit options on top)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mechlab import pipelines
from mechlab.checkpoint import save_checkpoint
from mechlab.cli import main
from mechlab.evals import evaluate_model, nih_errors
from mechlab.evals.suites import summarize_per_example
from mechlab.models import build_model
from mechlab.pipelines import run_suite
from mechlab.tasks.lds import LDSConfig, make_libraries

torch.set_num_threads(1)

TASK = {"d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
        "n_train_systems": 200, "n_test_systems": 50}  # fmt: skip


@pytest.fixture(scope="module")
def cfg() -> LDSConfig:
    return LDSConfig(**TASK)


@pytest.fixture(scope="module")
def model(cfg):
    torch.manual_seed(0)
    return build_model({"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2,
                        "io": "continuous", "d_in": cfg.d_in, "d_out": cfg.d_out, "n_ctx": cfg.n_ctx})


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory, cfg):
    torch.manual_seed(0)  # 3 layers x 4 heads: enough edges for the study's 99% sparsity
    model = build_model({"arch": "transformer", "d_model": 16, "n_layers": 3, "n_heads": 4,
                         "io": "continuous", "d_in": cfg.d_in, "d_out": cfg.d_out, "n_ctx": cfg.n_ctx})
    path = tmp_path_factory.mktemp("ckpt") / "lds.pt"
    save_checkpoint(model, path, task="lds", task_cfg=TASK,
                    train_cfg={"eval_haystack": 2, "eval_seg_len": 4})  # fmt: skip
    return path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_summarize_per_example_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    errors = rng.exponential(size=(7, 6))  # 7 examples x 6 trials (an even count: averaged middle)
    per = np.median(errors, axis=1)
    got = summarize_per_example(torch.tensor(errors.ravel()), trials=6)
    assert got["median"] == pytest.approx(np.median(per), rel=1e-12)
    assert got["q1"] == pytest.approx(np.quantile(per, 0.25), rel=1e-12)
    assert got["q3"] == pytest.approx(np.quantile(per, 0.75), rel=1e-12)
    assert got["mean"] == pytest.approx(per.mean(), rel=1e-12)
    assert (got["n_examples"], got["trials"]) == (7, 6)


def test_summarize_per_example_rejects_a_ragged_split():
    with pytest.raises(ValueError, match="trials must be a positive integer dividing the 10 errors"):
        summarize_per_example(torch.ones(10), trials=3)


def test_per_example_suite_equals_the_hand_aggregation(cfg, model):
    lib = make_libraries(cfg)[1]
    E, K = 5, 8
    report = evaluate_model(model, cfg, lib, "nih", n_traces=E, n_haystack=2, seg_len=4, seed=3,
                            protocol="study", trials=K)
    assert report["n_traces"] == E and report["trials"] == K and report["protocol"] == "study"
    errs = nih_errors(model, cfg, lib, E * K, 2, 4, torch.Generator().manual_seed(3),
                      protocol="study", trials=K)
    for j, e in errs.items():
        per = np.median(e.double().numpy().reshape(E, K), axis=1)
        assert report["offsets"][str(j)]["median"] == pytest.approx(np.median(per), rel=1e-9)
        assert report["offsets"][str(j)]["q3"] == pytest.approx(np.quantile(per, 0.75), rel=1e-9)
    ood = evaluate_model(model, cfg, lib, "ood", n_traces=E, n_haystack=2, seg_len=4, seed=3,
                         protocol="study", trials=K)
    assert ood["probes"]["clean"] == report["offsets"]
    plain = evaluate_model(model, cfg, lib, "nih", n_traces=E, n_haystack=2, seg_len=4, seed=3)
    assert plain["protocol"] == "study" and "trials" not in plain  # the study's NiH by default


def test_study_protocol_changes_the_misdirection_errors(cfg, model):
    lib = make_libraries(cfg)[1]
    g = torch.Generator
    uni = nih_errors(model, cfg, lib, 64, 2, 4, g().manual_seed(1), probe="misdirect_incorrect",
                     protocol="uniform")
    study = nih_errors(model, cfg, lib, 64, 2, 4, g().manual_seed(1), probe="misdirect_incorrect",
                       protocol="study")
    default = nih_errors(model, cfg, lib, 64, 2, 4, g().manual_seed(1), probe="misdirect_incorrect")
    assert not torch.equal(uni[1], study[1]) and torch.equal(default[1], study[1])


def test_run_suite_and_cli_validate_protocol_and_trials(ckpt_path, tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown NiH protocol"):
        run_suite(ckpt_path, "nih", n_traces=4, protocol="paper")
    with pytest.raises(ValueError, match="applies to the nih and ood suites"):
        run_suite(ckpt_path, "uninterleaved", n_traces=4, trials=2)
    report = run_suite(ckpt_path, "nih", n_traces=3, trials=4, protocol="study")
    assert report["result"]["offsets"]["1"]["n_examples"] == 3
    assert main(["eval", "--ckpt", str(ckpt_path), "--nih", "paper", "--out", str(tmp_path)]) == 2
    assert "unknown NiH protocol 'paper'" in capsys.readouterr().err
    assert main(["eval", "--ckpt", str(ckpt_path), "--suite", "nih", "--nih", "study",
                 "--traces", "3", "--trials", "4", "--out", str(tmp_path)]) == 0
    assert "1-after: median" in capsys.readouterr().out


def test_study_prune_protocol_resolves_to_the_studys_settings():
    study = pipelines.prune_recipe("study")
    # the study's Edge Pruning search, each setting that differs from mechlab's default
    assert study == {"nih": "study", "sparsity": 0.99, "node_sparsity": 0.8, "loss": "truth", "batch_size": 64,
                     "loss_scale": 1000.0, "steps": 3000, "normalize_loss": False,
                     "constraint": "lagrangian", "noise": "independent", "select": "rank",
                     "warm_start": "none"}  # fmt: skip
    mine = pipelines.prune_recipe("study", steps=20, sparsity=0.9, node_sparsity=None)
    assert mine["steps"] == 20 and mine["sparsity"] == 0.9 and mine["node_sparsity"] == 0.8
    assert pipelines.prune_recipe("uniform") == {"nih": "uniform", "sparsity": 0.95}
    assert pipelines.prune_recipe("default") == {"nih": "study", "sparsity": 0.95}
    with pytest.raises(ValueError, match="unknown recipe"):
        pipelines.prune_recipe("paper")


class Captured(Exception):
    pass


@pytest.fixture
def capture_prune(monkeypatch):
    """Replace the engine's prune() in the pipeline: record what it is called with."""
    calls = []

    def fake(model, data, target, sparsity, **kwargs):
        calls.append({"data": data, "target": target, "sparsity": sparsity, **kwargs})
        raise Captured

    monkeypatch.setattr("mechlab.pipelines.prune.prune", fake)
    return calls


def test_prune_checkpoint_applies_the_protocol(ckpt_path, capture_prune):
    with pytest.raises(Captured):
        pipelines.prune_checkpoint(ckpt_path, "1-after", n_train=4, n_test=4, recipe="study")
    call = capture_prune[-1]
    assert call["sparsity"] == 0.99 and call["steps"] == 3000 and call["loss"] == "truth"
    assert call["loss_scale"] == 1000.0 and call["node_sparsity"] == 0.8
    assert call["data"].info["nih_protocol"] == "study"
    with pytest.raises(Captured):
        pipelines.prune_checkpoint(ckpt_path, "1-after", 0.9, n_train=4, n_test=4, recipe="study",
                                   steps=7, loss="model")
    call = capture_prune[-1]
    assert (call["sparsity"], call["steps"], call["loss"], call["loss_scale"]) == (0.9, 7, "model", 1000.0)
    with pytest.raises(Captured):
        pipelines.prune_checkpoint(ckpt_path, "1-after", n_train=4, n_test=4)
    call = capture_prune[-1]
    assert call["sparsity"] == 0.95 and "loss_scale" not in call and "steps" not in call
    assert call["data"].info["nih_protocol"] == "study"  # the default: study NiH, mechlab's settings
    with pytest.raises(Captured):
        pipelines.prune_checkpoint(ckpt_path, "1-after", n_train=4, n_test=4, recipe="uniform")
    call = capture_prune[-1]
    assert call["sparsity"] == 0.95 and call["data"].info["nih_protocol"] == "uniform"


def test_cli_prune_protocol_explicit_options_override(ckpt_path, tmp_path, capture_prune, capsys):
    args = ["prune", "--ckpt", str(ckpt_path), "--traces", "4", "--test-traces", "4",
            "--out", str(tmp_path), "--no-progress"]
    with pytest.raises(Captured):
        main([*args, "--recipe", "study"])
    call = capture_prune[-1]
    assert (call["sparsity"], call["steps"], call["loss"], call["node_sparsity"]) == (0.99, 3000, "truth", 0.8)
    with pytest.raises(Captured):
        main([*args, "--recipe", "study", "--steps", "500", "--sparsity", "0.95"])
    call = capture_prune[-1]
    assert (call["sparsity"], call["steps"], call["loss"]) == (0.95, 500, "truth")
    with pytest.raises(Captured):
        main(args)  # the default recipe: the library's own search defaults
    call = capture_prune[-1]
    assert (call["sparsity"], call["loss"]) == (0.95, "model")
    assert "steps" not in call and "node_sparsity" not in call  # PruneConfig's: 200 steps, no node masks
    assert main([*args, "--recipe", "paper"]) == 2
    assert "unknown recipe 'paper'" in capsys.readouterr().err
