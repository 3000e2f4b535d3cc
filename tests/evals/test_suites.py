"""The NiH evaluation suites (mechlab.evals.suites) on a model and a task config."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from mechlab.evals import evaluate_model, nih_errors, summarize
from mechlab.models import build_model
from mechlab.tasks.lds import LDSConfig, make_libraries
from mechlab.tasks.lds_evals import PROBES, needle_in_haystack

TASK = {
    "d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
    "n_train_systems": 200, "n_test_systems": 50,
}


MODEL = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2}


CHI2_3_MEDIAN = 2.365974


@pytest.fixture(scope="module")
def cfg() -> LDSConfig:
    return LDSConfig(**TASK)


@pytest.fixture(scope="module")
def test_lib(cfg):
    return make_libraries(cfg)[1]


@pytest.fixture(scope="module")
def model(cfg):
    torch.manual_seed(0)
    return build_model({**MODEL, "io": "continuous", "d_in": cfg.d_in, "d_out": cfg.d_out, "n_ctx": cfg.n_ctx})


class Replay(nn.Module):
    """Returns fixed outputs for fixed inputs, chunk after chunk, checking the inputs."""

    def __init__(self, inputs: torch.Tensor, outputs: torch.Tensor):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))  # the evaluation asks for the device
        self.inputs, self.outputs, self.cursor = inputs.float(), outputs.float(), 0
        self.chunks = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        assert torch.equal(x, self.inputs[self.cursor : self.cursor + n])
        out = self.outputs[self.cursor : self.cursor + n]
        self.cursor += n
        self.chunks.append(n)
        return out


class Zero(nn.Module):
    def __init__(self, d_out: int):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.d_out = d_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*x.shape[:2], self.d_out)


def test_a_model_that_predicts_the_truth_scores_zero(cfg, test_lib):
    n = 300  # more than one chunk of 256
    traces = needle_in_haystack(cfg, test_lib, n, n_haystack=2, seg_len=4,
                                generator=torch.Generator().manual_seed(7), offsets=(1, 2, 3))
    oracle = Replay(traces.batch.inputs, traces.batch.targets)
    errs = nih_errors(oracle, cfg, test_lib, n_traces=n, n_haystack=2, seg_len=4,
                      generator=torch.Generator().manual_seed(7), protocol="uniform")
    assert oracle.chunks == [256, 44]
    assert sorted(errs) == [1, 2, 3]  # offsets 7 and 8 do not fit a segment of 4
    for e in errs.values():
        assert e.shape == (n,)
        assert e.abs().max() < 1e-10
    # One wrong coordinate at the 2-after position of trace 0 shows up there only.
    shifted = traces.batch.targets.clone()
    shifted[0, traces.positions[1], 0] += 0.5
    errs = nih_errors(Replay(traces.batch.inputs, shifted), cfg, test_lib, n_traces=n, n_haystack=2,
                      seg_len=4, generator=torch.Generator().manual_seed(7), protocol="uniform")
    assert errs[2][0].item() == pytest.approx(0.25, abs=1e-6)
    assert errs[1].abs().max() < 1e-10 and errs[2][1:].abs().max() < 1e-10


def test_zero_predictor_scores_the_squared_state_norm():
    cfg = LDSConfig(**{**TASK, "n_ctx": 32})  # room for segments of 8: offsets 7 and 8 too
    test_lib = make_libraries(cfg)[1]
    errs = nih_errors(Zero(cfg.d_out), cfg, test_lib, n_traces=3000, n_haystack=2, seg_len=8,
                      generator=torch.Generator().manual_seed(1))
    assert sorted(errs) == [1, 2, 3, 7, 8]
    first = errs[1]
    for e in errs.values():
        # Orthogonal dynamics keep ||y|| fixed: the same error at every offset of a trace.
        torch.testing.assert_close(e, first, rtol=1e-5, atol=1e-6)
    # x0 ~ N(0, I/d): E||y||^2 = 1 (the "zero predictor scores 1"), median chi2_3 median / 3.
    assert first.mean().item() == pytest.approx(1.0, abs=0.08)
    assert first.median().item() == pytest.approx(CHI2_3_MEDIAN / 3, abs=0.06)


def test_nih_refuses_a_haystack_longer_than_the_model_context(cfg, test_lib):
    short = build_model({**MODEL, "io": "continuous", "d_in": cfg.d_in, "d_out": cfg.d_out, "n_ctx": 10})
    with pytest.raises(ValueError, match=r"needs 18 positions.*n_ctx=10"):
        nih_errors(short, cfg, test_lib, n_traces=4, n_haystack=2, seg_len=4)


def test_summarize_against_torch_quantiles():
    errors = torch.tensor([4.0, 1.0, 3.0, 2.0, 10.0])
    assert summarize(errors) == {"median": 3.0, "q1": 2.0, "q3": 4.0, "mean": 4.0}


def test_evaluate_model_nih_and_ood_keys(cfg, test_lib, model):
    nih = evaluate_model(model, cfg, test_lib, "nih", n_traces=40, n_haystack=2, seg_len=4, seed=3)
    assert set(nih) == {"n_haystack", "seg_len", "n_traces", "offsets", "protocol"}
    assert (nih["n_haystack"], nih["seg_len"], nih["n_traces"]) == (2, 4, 40)
    assert list(nih["offsets"]) == ["1", "2", "3"]
    for s in nih["offsets"].values():
        assert set(s) == {"median", "q1", "q3", "mean"}
        assert 0 <= s["q1"] <= s["median"] <= s["q3"]
    json.dumps(nih)  # JSON-ready

    ood = evaluate_model(model, cfg, test_lib, "ood", n_traces=40, n_haystack=2, seg_len=4, seed=3)
    assert set(ood) == {"n_haystack", "seg_len", "n_traces", "probes", "protocol"}
    assert set(ood["probes"]) == {"clean", *PROBES}
    # Same seed: the clean probe is exactly the nih suite.
    assert ood["probes"]["clean"] == nih["offsets"]
    assert all(list(p) == ["1", "2", "3"] for p in ood["probes"].values())
    # The probes change the traces, so at least one of them changes the numbers.
    assert any(ood["probes"][p] != nih["offsets"] for p in PROBES)
    json.dumps(ood)


def test_the_ood_bar_counts_the_clean_run_and_each_probe(cfg, test_lib, model, capsys):
    kw = {"n_traces": 8, "n_haystack": 2, "seg_len": 4, "seed": 3}
    quiet = evaluate_model(model, cfg, test_lib, "ood", **kw)
    assert capsys.readouterr().err == ""  # no bar unless asked
    shown = evaluate_model(model, cfg, test_lib, "ood", progress=True, **kw)
    assert shown == quiet  # the bar changes nothing
    n = 1 + len(PROBES)
    err = capsys.readouterr().err
    assert f"ood: clean and {len(PROBES)} probes, 8 traces: 100%|██████████| {n}/{n}" in err, err


def test_evaluate_model_uninterleaved_keys(cfg, test_lib, model):
    r = evaluate_model(model, cfg, test_lib, "uninterleaved", n_traces=30, seed=0)
    assert set(r) == {"n_traces", "model_median", "lstsq_median", "model_q1", "model_q3"}
    assert r["n_traces"] == 30
    n_obs = cfg.n_ctx - 3  # the longest segment that fits
    for key in ("model_median", "lstsq_median", "model_q1", "model_q3"):
        assert len(r[key]) == n_obs
    assert all(q1 <= m <= q3 for q1, m, q3 in zip(r["model_q1"], r["model_median"], r["model_q3"], strict=True))
    # Noiseless 3-d dynamics: least squares is exact once d + 1 observations are seen.
    assert max(r["lstsq_median"][5:]) < 1e-8
    assert r["lstsq_median"][0] > 0.1
    json.dumps(r)


def test_evaluate_model_unknown_suite(cfg, test_lib, model):
    with pytest.raises(ValueError, match="unknown suite 'nope'"):
        evaluate_model(model, cfg, test_lib, "nope")
