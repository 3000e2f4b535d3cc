"""Tests of the evaluation traces (uninterleaved, needle in a haystack and its probes)
and of the least-squares predictor (mechlab.tasks.lds_evals)."""

from __future__ import annotations

import math
import time

import pytest
import torch

from mechlab.tasks.lds import CLOSE, OBS, OPEN, START, LDSConfig, make_libraries
from mechlab.tasks.lds_evals import (
    NIH_OFFSETS,
    PROBES,
    least_squares_predict,
    needle_in_haystack,
    uninterleaved,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def cfg() -> LDSConfig:
    return LDSConfig(n_train_systems=200, n_test_systems=100, seed=5)


@pytest.fixture(scope="module")
def test_lib(cfg):
    return make_libraries(cfg)[1]


def label_of(tokens: torch.Tensor, cfg: LDSConfig) -> torch.Tensor:
    """Label index of label tokens, from the raw vectors (-1 elsewhere)."""
    part = tokens[..., : 2 * cfg.n_pairs]
    has = (part != 0).any(-1)
    return torch.where(has, part.abs().argmax(-1) // 2, -1)


def states(traces, cfg):
    return traces.batch.tokens[..., cfg.state_slice].double()


# ---------------------------------------------------------------------------------------
# uninterleaved + least squares
# ---------------------------------------------------------------------------------------


def test_uninterleaved_layout(cfg, test_lib):
    tr = uninterleaved(cfg, test_lib, 32, generator=gen(0))
    batch = tr.batch
    assert batch.tokens.shape == (32, 251, 57)
    kinds = torch.full((251,), OBS)
    kinds[0], kinds[1], kinds[-1] = START, OPEN, CLOSE
    assert torch.equal(batch.kind, kinds.expand(32, 251))
    assert torch.equal(tr.positions, torch.arange(1, 249))
    assert tr.offsets == tuple(range(1, 249))
    assert torch.equal(batch.mask, batch.kind[:, 1:] == OBS)
    # targets at the scored positions are the observations, in order
    assert torch.equal(tr.targets, batch.tokens[:, 2:250, cfg.state_slice])
    lab = label_of(batch.tokens, cfg)
    assert torch.equal(lab[:, 1], lab[:, -1]) and torch.equal(lab[:, 1], batch.slot_labels[:, 0])
    # y_t = U^t x0, by iteration
    ys = states(tr, cfg)[:, 2:250]
    for b in range(4):
        U = test_lib.U[batch.systems[b, 0]].double()
        x = batch.x0[b, 0].double()
        for t in range(248):
            assert (ys[b, t] - x).abs().max() < 1e-6
            x = U @ x
    short = uninterleaved(cfg, test_lib, 3, n_obs=20, generator=gen(0))
    assert short.batch.tokens.shape == (3, 23, 57)


def test_least_squares_matches_pinv_and_is_exact(cfg, test_lib):
    tr = uninterleaved(cfg, test_lib, 200, generator=gen(1))
    obs = tr.targets  # [200, 248, 5] float32 tokens
    pred = least_squares_predict(obs)
    assert pred.shape == obs.shape and pred.dtype == obs.dtype
    err = (pred.double() - obs.double()).pow(2).sum(-1)  # [traces, i]
    d = cfg.d_state
    assert err[:, d + 1 :].max() < 1e-4  # exact once d + 1 observations are seen
    assert (err[:, 2] > 1e-4).float().mean() > 0.9  # not before
    assert torch.equal(pred[:, :2], torch.zeros_like(pred[:, :2]))
    # independent check: U_hat = Y2 pinv(Y1) on the raw column stacks
    y = obs.double()
    for i in (2, 3, 4, 5, 6, 9, 40):
        Y1 = y[:, : i - 1].transpose(1, 2)  # [B, d, i-1]: y_0 .. y_{i-2}
        Y2 = y[:, 1:i].transpose(1, 2)  # y_1 .. y_{i-1}
        direct = (Y2 @ torch.linalg.pinv(Y1) @ y[:, i - 1].unsqueeze(-1)).squeeze(-1)
        assert (direct - pred[:, i].double()).abs().max() < 1e-5, i


def test_least_squares_short_input():
    obs = torch.randn(3, 2, 5)
    assert torch.equal(least_squares_predict(obs), torch.zeros_like(obs))


# ---------------------------------------------------------------------------------------
# needle in a haystack
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("N, S", [(1, 10), (7, 10), (19, 10), (3, 4)])
def test_nih_layout(cfg, test_lib, N, S):
    B = 16
    tr = needle_in_haystack(
        cfg,
        test_lib,
        B,
        n_haystack=N,
        seg_len=S,
        generator=gen(N),
        offsets=(1, 2, 3) if S < 8 else NIH_OFFSETS,
    )
    batch = tr.batch
    T = (S + 2) * (N + 1) + 1
    assert batch.tokens.shape == (B, T, cfg.d_in)
    p = 1 + N * (S + 2)
    assert tr.query_position == p
    assert torch.equal(tr.positions, torch.tensor([p + j - 1 for j in tr.offsets]))
    # kinds: start, then N + 1 blocks of (open, S obs, close)
    block = [OPEN] + [OBS] * S + [CLOSE]
    assert batch.kind[0].tolist() == [START] + block * (N + 1)
    lab = label_of(batch.tokens, cfg)
    y = states(tr, cfg)
    q = tr.query
    assert ((q >= 0) & (q < N)).all()
    for b in range(B):
        hay_labels = batch.slot_labels[b, :N]
        assert hay_labels.unique().numel() == N
        for h in range(N):
            base = 1 + h * (S + 2)
            assert lab[b, base] == hay_labels[h] and lab[b, base + S + 1] == hay_labels[h]
            assert (batch.slot[b, base : base + S + 2] == h).all()
            assert torch.equal(batch.step[b, base + 1 : base + S + 1], torch.arange(S))
        # the query: open label of system q, then its trajectory continued
        qq = int(q[b])
        assert lab[b, p] == hay_labels[qq] and lab[b, T - 1] == hay_labels[qq]
        U = test_lib.U[batch.systems[b, qq]].double()
        last_hay = y[b, 1 + qq * (S + 2) + S]  # last haystack observation of q
        cont = y[b, p + 1 : p + 1 + S]
        assert (cont[0] - U @ last_hay).abs().max() < 1e-5
        assert (cont[1:] - cont[:-1] @ U.T).abs().max() < 1e-5
        assert torch.equal(batch.step[b, p + 1 : p + 1 + S], torch.arange(S, 2 * S))
    # 1-after is the first continuation observation, predicted at the label position
    assert torch.equal(tr.targets[:, 0], batch.tokens[:, p + 1, cfg.state_slice])
    assert torch.equal(batch.mask, batch.kind[:, 1:] == OBS)


def test_nih_query_uniform_and_x0(cfg, test_lib):
    tr = needle_in_haystack(cfg, test_lib, 7000, generator=gen(3))
    counts = torch.bincount(tr.query, minlength=7).double()
    assert (counts / counts.mean() - 1).abs().max() < 0.1
    # fresh x0 ~ N(0, I/d) per trace; fixed x0 = the library's
    sq = tr.batch.x0.double().pow(2).sum(-1)
    assert abs(sq.mean().item() - 1) < 0.05
    fixed = needle_in_haystack(cfg, test_lib, 8, generator=gen(3), fresh_x0=False)
    first_obs = fixed.batch.tokens[:, 2, cfg.state_slice]
    assert torch.equal(first_obs, test_lib.x0[fixed.batch.systems[:, 0]])


def test_errors_metric(cfg, test_lib):
    tr = needle_in_haystack(cfg, test_lib, 10, generator=gen(4))
    perfect = tr.batch.targets.clone()
    assert torch.equal(tr.errors(perfect), torch.zeros(10, 5))
    zero = torch.zeros_like(perfect)
    expected = tr.batch.tokens[:, tr.positions + 1, cfg.state_slice].pow(2).sum(-1)
    assert torch.allclose(tr.errors(zero), expected)


# ---------------------------------------------------------------------------------------
# probes
# ---------------------------------------------------------------------------------------


def probe_pair(cfg, lib, probe, N=7, B=64, seed=7):
    clean = needle_in_haystack(cfg, lib, B, n_haystack=N, generator=gen(seed))
    probed = needle_in_haystack(cfg, lib, B, n_haystack=N, generator=gen(seed), probe=probe)
    return clean, probed


def test_misdirect_incorrect(cfg, test_lib):
    clean, probed = probe_pair(cfg, test_lib, "misdirect_incorrect")
    p = clean.query_position
    label_pos = torch.tensor([p, clean.batch.tokens.shape[1] - 1])
    others = torch.ones(clean.batch.tokens.shape[1], dtype=torch.bool)
    others[label_pos] = False
    # only the query's two label tokens change; the continuation is the true one
    assert torch.equal(clean.batch.tokens[:, others], probed.batch.tokens[:, others])
    assert torch.equal(clean.query, probed.query)
    lab_clean = label_of(clean.batch.tokens, cfg)[:, p]
    lab_probe = label_of(probed.batch.tokens, cfg)[:, p]
    assert (lab_probe != lab_clean).all()
    hay = probed.batch.slot_labels[:, :7]
    assert (hay == lab_probe[:, None]).any(1).all()  # another haystack system's label
    assert torch.equal(label_of(probed.batch.tokens, cfg)[:, -1], lab_probe)
    assert torch.equal(probed.batch.label[:, p], lab_probe)
    # the misdirected label points at every other haystack position about equally
    tr = needle_in_haystack(cfg, test_lib, 4000, generator=gen(8), probe="misdirect_incorrect")
    shown_slot = (
        (tr.batch.slot_labels[:, :7] == tr.batch.label[:, tr.query_position, None]).int().argmax(1)
    )
    delta = (shown_slot - tr.query) % 7
    counts = torch.bincount(delta, minlength=7).double()
    assert counts[0] == 0 and (counts[1:] / counts[1:].mean() - 1).abs().max() < 0.15


def test_misdirect_unseen(cfg, test_lib):
    clean, probed = probe_pair(cfg, test_lib, "misdirect_unseen")
    p = clean.query_position
    lab = label_of(probed.batch.tokens, cfg)
    # the query label appears nowhere before it (and is not a haystack label)
    assert (lab[:, :p] != lab[:, p, None]).all()
    assert (lab[:, p] >= 0).all()
    assert torch.equal(clean.batch.tokens[:, p + 1 : -1], probed.batch.tokens[:, p + 1 : -1])
    assert torch.equal(clean.batch.tokens[:, :p], probed.batch.tokens[:, :p])


def test_misdirect_restart(cfg, test_lib):
    clean, probed = probe_pair(cfg, test_lib, "misdirect_restart")
    p, S, N = clean.query_position, 10, 7
    # same haystack and same (true) query label, different continuation
    assert torch.equal(clean.batch.tokens[:, : p + 1], probed.batch.tokens[:, : p + 1])
    y = states(probed, cfg)
    cont = y[:, p + 1 : p + 1 + S]
    assert (cont - states(clean, cfg)[:, p + 1 : p + 1 + S]).abs().amax((1, 2)).min() > 1e-3
    systems = probed.batch.systems
    for b in range(len(probed.batch)):
        extra = int(systems[b, N])
        assert extra not in systems[b, :N].tolist()
        # not the continuation of any haystack system ...
        for h in range(N):
            U = test_lib.U[systems[b, h]].double()
            assert (cont[b, 0] - U @ y[b, 1 + h * (S + 2) + S]).abs().max() > 1e-3
        # ... but a trajectory of the unseen system
        U = test_lib.U[extra].double()
        assert (cont[b, 1:] - cont[b, :-1] @ U.T).abs().max() < 1e-5
        assert (probed.batch.system[b, p + 1 : p + 1 + S] == extra).all()


def test_sync_rotations(cfg, test_lib):
    clean, probed = probe_pair(cfg, test_lib, "sync_rotations")
    p, S, N = clean.query_position, 10, 7
    y = states(probed, cfg)
    systems = probed.batch.systems
    for b in range(len(probed.batch)):
        x_S = []
        for h in range(N):
            U = test_lib.U[systems[b, h]].double()
            seg = y[b, 2 + h * (S + 2) : 2 + h * (S + 2) + S]
            assert (seg[1:] - seg[:-1] @ U.T).abs().max() < 1e-5  # still a trajectory
            assert (seg[0] - probed.batch.x0[b, h].double()).abs().max() < 1e-6
            x_S.append(U @ seg[-1])  # state at the test index S
        x_S = torch.stack(x_S)
        assert (x_S - x_S[0]).abs().max() < 1e-5  # all systems meet there
        assert (y[b, p + 1] - x_S[0]).abs().max() < 1e-5  # = the 1-after target
        # the systems differ everywhere else
        assert (y[b, 2] - y[b, 2 + S + 2]).abs().max() > 1e-3
    assert torch.equal(clean.batch.label, probed.batch.label)
    assert not torch.allclose(clean.batch.tokens, probed.batch.tokens)


def test_probe_metadata(cfg, test_lib):
    for probe in PROBES:
        tr = needle_in_haystack(cfg, test_lib, 8, generator=gen(9), probe=probe)
        assert tr.probe == probe
        is_label = (tr.batch.kind == OPEN) | (tr.batch.kind == CLOSE)
        parsed = label_of(tr.batch.tokens, cfg)
        assert torch.equal(tr.batch.label[is_label], parsed[is_label])


# ---------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------


def test_eval_errors(cfg, test_lib):
    with pytest.raises(ValueError, match="n_pairs"):
        needle_in_haystack(LDSConfig(n_pairs=7, max_systems=7, n_train_systems=50), test_lib, 2)
    with pytest.raises(ValueError, match="n_ctx"):
        needle_in_haystack(cfg, test_lib, 2, n_haystack=20)
    with pytest.raises(ValueError, match="probe"):
        needle_in_haystack(cfg, test_lib, 2, probe="bogus")
    with pytest.raises(ValueError, match="misdirect_incorrect"):
        needle_in_haystack(cfg, test_lib, 2, n_haystack=1, probe="misdirect_incorrect")
    with pytest.raises(ValueError, match="offsets"):
        needle_in_haystack(cfg, test_lib, 2, seg_len=5)
    with pytest.raises(ValueError, match="distinct"):
        needle_in_haystack(cfg, test_lib.subset(torch.arange(7)), 2, n_haystack=7)
    with pytest.raises(ValueError, match="n_obs"):
        uninterleaved(cfg, test_lib, 2, n_obs=249)
    with pytest.raises(ValueError, match="n_traces"):
        uninterleaved(cfg, test_lib, 0)
    assert math.isfinite(float(uninterleaved(cfg, test_lib, 1, n_obs=248).targets.sum()))


# --------------------------------------------------------------- sizes before work (issue 19)


@pytest.mark.parametrize(
    "build, phrase",
    [(lambda c, lib: needle_in_haystack(c, lib, 10**12), r"n_traces 1e\+12 x positions"),
     (lambda c, lib: needle_in_haystack(c, lib, 10**12, trials=10**12),
      r"n_traces \(1 examples x 1000000000000 trials\) 1e\+12"),
     (lambda c, lib: needle_in_haystack(c, lib, 50 * 10**12, trials=10**12), r"\(50 examples x"),
     (lambda c, lib: uninterleaved(c, lib, 10**12), r"n_traces 1e\+12 x positions 251")],
    ids=["traces", "trials", "examples-x-trials", "uninterleaved"],
)  # fmt: skip
def test_trillions_of_traces_or_trials_are_refused_in_milliseconds(cfg, test_lib, build, phrase):
    # Issue 19: --traces, --trials and --eval-traces of 10^12 ended in a 32 TB allocation.
    start = time.thread_time()
    with pytest.raises(ValueError, match=phrase) as err:
        build(cfg, test_lib)
    assert time.thread_time() - start < 0.1
    assert "\n" not in str(err.value) and "MECHLAB_MAX_ELEMENTS" in str(err.value)
