"""Tests of the interleaved linear-systems data (mechlab.tasks.lds).

Every check recomputes what it checks independently: token parsing from raw vectors,
trajectories by plain float64 iteration ``x <- U x``, the Zipf law from ``k^-a``.
"""

from __future__ import annotations

import math
import re
import time

import pytest
import torch

from mechlab.tasks.lds import (
    CLOSE,
    OBS,
    OPEN,
    START,
    LDSConfig,
    make_libraries,
    sample_batch,
    sample_num_systems,
)

SMALL = dict(
    d_state=4,
    n_pairs=10,
    n_ctx=61,
    max_systems=8,
    max_cuts=30,
    n_train_systems=300,
    n_test_systems=40,
    seed=3,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def default_cfg() -> LDSConfig:
    return LDSConfig()


@pytest.fixture(scope="module")
def default_libs(default_cfg):
    return make_libraries(default_cfg)


@pytest.fixture(scope="module")
def default_batch(default_cfg, default_libs):
    return sample_batch(default_cfg, default_libs[0], 64, gen(0))


@pytest.fixture(scope="module")
def small_cfg() -> LDSConfig:
    return LDSConfig(**SMALL)


@pytest.fixture(scope="module")
def small_libs(small_cfg):
    return make_libraries(small_cfg)


@pytest.fixture(scope="module")
def small_batch(small_cfg, small_libs):
    return sample_batch(small_cfg, small_libs[0], 256, gen(1))


# ---------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------


def test_default_config_and_layout(default_cfg):
    cfg = default_cfg
    assert (cfg.d_state, cfg.n_pairs, cfg.n_ctx, cfg.max_systems, cfg.max_cuts) == (
        5,
        25,
        251,
        25,
        125,
    )
    assert (cfg.n_train_systems, cfg.n_test_systems, cfg.zipf_a, cfg.cut_rate) == (
        40000,
        100,
        1.5,
        2.0,
    )
    assert cfg.d_in == 57 and cfg.d_out == 5
    assert cfg.start_dim == 50 and cfg.payload_dim == 51
    assert cfg.state_slice == slice(52, 57)
    assert (cfg.open_dim(3), cfg.close_dim(3)) == (6, 7)
    assert LDSConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(d_state=0), "d_state"),
        (dict(n_ctx=2), "n_ctx"),
        (dict(max_systems=26), "n_pairs"),
        (dict(min_systems=5, max_systems=4), "min_systems"),
        (dict(n_train_systems=10), "n_train_systems"),
        (dict(zipf_a=-1.0), "zipf_a"),
        (dict(cut_rate=float("nan")), "cut_rate"),
        (dict(max_cuts=-1), "max_cuts"),
        (dict(n_pairs=2.5), "n_pairs"),
        (dict(resample_x0="yes"), "resample_x0"),
    ],
)
def test_bad_config(fields, message):
    with pytest.raises(ValueError, match=message):
        LDSConfig(**fields)


def test_from_dict_rejects_unknown():
    with pytest.raises(ValueError, match="unknown"):
        LDSConfig.from_dict({"d_state": 5, "bogus": 1})


# ---------------------------------------------------------------------------------------
# token layout
# ---------------------------------------------------------------------------------------


def parse_kinds(tokens: torch.Tensor, cfg: LDSConfig) -> torch.Tensor:
    """Token kinds read from the raw vectors only."""
    P = cfg.n_pairs
    labels = tokens[..., : 2 * P]
    is_open = (labels[..., 0::2] != 0).any(-1)
    is_close = (labels[..., 1::2] != 0).any(-1)
    is_start = tokens[..., cfg.start_dim] != 0
    is_obs = tokens[..., cfg.payload_dim] != 0
    assert ((is_open.int() + is_close.int() + is_start.int() + is_obs.int()) == 1).all()
    kind = torch.full(tokens.shape[:2], -1)
    kind[is_start], kind[is_open], kind[is_obs], kind[is_close] = START, OPEN, OBS, CLOSE
    return kind


@pytest.mark.parametrize("which", ["small", "default"])
def test_token_layout(which, request):
    cfg = request.getfixturevalue(f"{which}_cfg")
    batch = request.getfixturevalue(f"{which}_batch")
    tok = batch.tokens
    B, T, D = tok.shape
    assert (T, D) == (cfg.n_ctx, cfg.d_in) and tok.dtype == torch.float32
    s2 = math.sqrt(2.0)
    # start token: only position 0, only the start dim
    expected0 = torch.zeros(D)
    expected0[cfg.start_dim] = s2
    assert torch.equal(tok[:, 0], expected0.expand(B, D))
    assert (tok[:, 1:, cfg.start_dim] == 0).all()

    kind = parse_kinds(tok, cfg)
    assert torch.equal(kind, batch.kind)
    label_part = tok[..., : 2 * cfg.n_pairs]
    is_label = (kind == OPEN) | (kind == CLOSE)
    # label tokens: one entry, sqrt(2), at 2*label (open) or 2*label+1 (close); nothing else
    assert ((label_part != 0).sum(-1)[is_label] == 1).all()
    dim = label_part.abs().argmax(-1)
    assert torch.equal(dim[kind == OPEN], 2 * batch.label[kind == OPEN])
    assert torch.equal(dim[kind == CLOSE], 2 * batch.label[kind == CLOSE] + 1)
    assert torch.allclose(label_part.abs().amax(-1)[is_label], torch.tensor(s2))
    assert (tok[..., 2 * cfg.n_pairs :][is_label] == 0).all()
    # observation tokens: payload flag exactly 1, label and start dims 0, a non-zero state
    obs = kind == OBS
    assert torch.equal(tok[..., cfg.payload_dim] == 1, obs)
    assert torch.equal(tok[..., cfg.payload_dim] != 0, obs)
    assert (label_part[obs] == 0).all()
    assert (tok[..., cfg.state_slice][obs].norm(dim=-1) > 0).all()
    assert (tok[..., cfg.state_slice][~obs] == 0).all()
    # shown label = the label assigned to the segment's slot
    body = batch.kind > START
    assert torch.equal(
        batch.label[body], batch.slot_labels.gather(1, batch.slot.clamp(min=0))[body]
    )
    # metadata at position 0
    for name in ("slot", "system", "label", "segment", "step"):
        assert (getattr(batch, name)[:, 0] == -1).all()


def test_segment_grammar(small_batch, default_batch, small_cfg, default_cfg):
    """After the start token a trace is a sequence of segments ``open obs* close`` with
    one label, or lone ``close`` tokens (one-token chunks); it ends with a close."""
    for batch in (small_batch, default_batch):
        letters = {START: "S", OPEN: "O", OBS: "B", CLOSE: "C"}
        for b in range(len(batch)):
            kinds = batch.kind[b].tolist()
            text = "".join(letters[k] for k in kinds)
            assert re.fullmatch(r"S(?:OB*C|C)+", text), text
            seg = batch.segment[b]
            # a segment's tokens share label, slot and segment index; segment ids count up
            for m in re.finditer(r"OB*C|C", text[1:]):
                span = slice(1 + m.start(), 1 + m.end())
                for name in ("label", "slot", "segment", "system"):
                    values = getattr(batch, name)[b, span]
                    assert (values == values[0]).all()
            assert torch.equal(seg[1:], torch.cummax(seg[1:], 0).values)
            starts = [m.start() for m in re.finditer(r"OB*C|C", text[1:])]
            assert seg[1:].unique().numel() == len(starts)


def test_segment_counts_and_short_chunks(default_cfg, default_libs):
    """Segments = distinct boundaries in {0} U cuts; short chunks (lone close, open+close)
    occur; segment starts are uniform over the body."""
    batch = sample_batch(default_cfg, default_libs[0], 1024, gen(5))
    n_seg = batch.segment.max(1).values + 1
    m = batch.n_cuts.double()
    assert (n_seg <= batch.n_cuts + 1).all()
    # E[# distinct of {0} U m iid uniform positions in 0..249] = 1 + 249 (1 - (249/250)^m)
    expected = 1 + 249 * (1 - (249 / 250) ** m)
    assert (
        abs(n_seg.double().mean().item() - expected.mean().item()) < 0.05 * expected.mean().item()
    )
    text = ["".join("SOBC"[k] for k in row) for row in batch.kind.tolist()]
    lone_close = sum(len(re.findall(r"(?<=C)C", t)) for t in text)
    empty_pair = sum(t.count("OC") for t in text)
    assert lone_close > 0 and empty_pair > 0
    # a segment starts at body offset j >= 1 iff j is a cut: uniform over 1..249
    first = torch.zeros_like(batch.segment, dtype=torch.bool)
    first[:, 2:] = batch.segment[:, 2:] != batch.segment[:, 1:-1]
    counts = first[:, 2:].sum(0).double().view(-1, 83).sum(1)  # 3 bins of 83 offsets
    assert (counts / counts.mean() - 1).abs().max() < 0.1


def test_mask_and_targets(small_batch, default_batch, small_cfg, default_cfg):
    for batch, cfg in ((small_batch, small_cfg), (default_batch, default_cfg)):
        assert batch.mask.shape == (len(batch), cfg.n_ctx - 1)
        assert torch.equal(batch.mask, batch.tokens[:, 1:, cfg.payload_dim] == 1)
        assert torch.equal(batch.inputs, batch.tokens[:, :-1])
        assert torch.equal(batch.targets, batch.tokens[:, 1:, -cfg.d_state :])
        assert (batch.targets[~batch.mask] == 0).all()
        assert (batch.targets[batch.mask].norm(dim=-1) > 0).all()


# ---------------------------------------------------------------------------------------
# trajectories
# ---------------------------------------------------------------------------------------


def check_trajectories(batch, library, cfg, fixed_x0: bool, n_traces: int | None = None):
    """Every system's observations, in position order, are x0, U x0, U^2 x0, ... of its
    own system, across its segments (reconstructed from the metadata)."""
    states = batch.tokens[..., cfg.state_slice].double()
    for b in range(n_traces or len(batch)):
        obs = batch.kind[b] == OBS
        for s in batch.slot[b][obs].unique().tolist():
            where = (obs & (batch.slot[b] == s)).nonzero().squeeze(1)  # position order
            steps = batch.step[b, where]
            assert torch.equal(steps, torch.arange(len(where)))
            sys_id = int(batch.systems[b, s])
            assert (batch.system[b, where] == sys_id).all()
            U = library.U[sys_id].double()
            x = batch.x0[b, s].double()
            if fixed_x0:
                assert torch.equal(batch.x0[b, s], library.x0[sys_id])
            ys = states[b, where]
            for t in range(len(where)):
                assert (ys[t] - x).abs().max() < 1e-5, (b, s, t)
                x = U @ x
            # one step at a time, straight from the tokens
            if len(where) > 1:
                assert (ys[1:] - ys[:-1] @ U.T).abs().max() < 1e-5


def test_trajectories_exact(
    small_batch, small_libs, small_cfg, default_batch, default_libs, default_cfg
):
    check_trajectories(small_batch, small_libs[0], small_cfg, fixed_x0=True)
    check_trajectories(default_batch, default_libs[0], default_cfg, fixed_x0=True, n_traces=16)


def test_segments_continue_across_cuts(default_batch):
    """The first observation of a later segment of a system continues where the
    system's previous segment stopped (not a restart at step 0)."""
    resumed = 0
    for b in range(len(default_batch)):
        kind, slot, seg, step = (
            getattr(default_batch, n)[b] for n in ("kind", "slot", "segment", "step")
        )
        obs = kind == OBS
        for s in slot[obs].unique().tolist():
            segs = seg[obs & (slot == s)].unique().tolist()
            for prev, nxt in zip(segs[:-1], segs[1:], strict=True):
                last_prev = step[obs & (seg == prev)].max()
                first_next = step[obs & (seg == nxt)].min()
                assert first_next == last_prev + 1
                resumed += 1
    assert resumed > 50


def test_resample_x0(small_libs):
    cfg = LDSConfig(**{**SMALL, "resample_x0": True})
    lib = small_libs[0]
    batch = sample_batch(cfg, lib, 64, gen(2))
    check_trajectories(batch, lib, cfg, fixed_x0=False)
    used = batch.systems >= 0
    assert not torch.allclose(batch.x0[used], lib.x0[batch.systems[used]])
    sq = batch.x0[used].double().pow(2).sum(-1)
    assert 0.7 < sq.mean().item() < 1.3


def test_zero_predictor_error_is_one(default_batch):
    sq = default_batch.targets[default_batch.mask].double().pow(2).sum(-1)
    assert abs(sq.mean().item() - 1.0) < 0.1


# ---------------------------------------------------------------------------------------
# labels, systems per trace, cuts
# ---------------------------------------------------------------------------------------


def test_label_shuffling():
    cfg = LDSConfig(**{**SMALL, "n_train_systems": 12})
    lib = make_libraries(cfg)[0]
    batch = sample_batch(cfg, lib, 4000, gen(4))
    used = batch.systems >= 0
    # labels within a trace are distinct
    for b in range(200):
        labels = batch.slot_labels[b][used[b]]
        assert labels.unique().numel() == labels.numel()
    # the same system gets every label, about equally often
    labels_of_0 = batch.slot_labels[used & (batch.systems == 0)]
    counts = torch.bincount(labels_of_0, minlength=cfg.n_pairs).double()
    assert (counts > 0).all()
    expected = counts.sum() / cfg.n_pairs
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 30  # 9 degrees of freedom: P(chi2 > 30) ~ 4e-4
    # label frequencies over all used slots ~ uniform
    counts = torch.bincount(batch.slot_labels[used], minlength=cfg.n_pairs).double()
    assert (counts / counts.mean() - 1).abs().max() < 0.05
    # systems of a trace are distinct and all systems get used
    for b in range(200):
        ids = batch.systems[b][used[b]]
        assert ids.unique().numel() == ids.numel()
    assert torch.bincount(batch.systems[used], minlength=12).min() > 0


def truncated_zipf(a: float, lo: int, hi: int) -> torch.Tensor:
    k = torch.arange(lo, hi + 1, dtype=torch.float64)
    w = k ** (-a)
    return w / w.sum()


def test_zipf_sampler():
    cfg = LDSConfig()
    k = sample_num_systems(cfg, 400_000, gen(6))
    assert k.min() >= 1 and k.max() <= 25
    freq = torch.bincount(k - 1, minlength=25).double() / k.numel()
    tv = 0.5 * (freq - truncated_zipf(1.5, 1, 25)).abs().sum().item()
    assert tv < 0.005
    cfg = LDSConfig(zipf_a=0.5, min_systems=3, max_systems=9)
    k = sample_num_systems(cfg, 200_000, gen(7))
    freq = torch.bincount(k - 3, minlength=7).double() / k.numel()
    assert 0.5 * (freq - truncated_zipf(0.5, 3, 9)).abs().sum().item() < 0.005


def test_systems_per_trace_and_cuts_in_batches(default_libs):
    cfg = LDSConfig(n_ctx=11)  # short traces, default process otherwise
    lib = default_libs[0]
    g = gen(8)
    batches = [sample_batch(cfg, lib, 5000, g) for _ in range(2)]
    k = torch.cat([b.n_systems for b in batches])
    cuts = torch.cat([b.n_cuts for b in batches]).double()
    freq = torch.bincount(k - 1, minlength=25).double() / k.numel()
    assert 0.5 * (freq - truncated_zipf(1.5, 1, 25)).abs().sum().item() < 0.03
    # cuts ~ Poisson(2k) (the cap 125 is far): mean and variance 2k
    for kk in (1, 2, 3):
        c = cuts[k == kk]
        assert abs(c.mean().item() - 2 * kk) < 0.06 * 2 * kk + 0.05
        assert abs(c.var().item() - 2 * kk) < 0.15 * 2 * kk
    assert abs(cuts.mean().item() - 2 * k.double().mean().item()) < 0.05 * cuts.mean().item()
    # systems actually shown are among the k drawn
    for b in batches[:1]:
        shown = b.slot[:, 1:]
        assert (shown < b.n_systems[:, None]).all()


def test_cut_cap():
    cfg = LDSConfig(**{**SMALL, "cut_rate": 30.0, "max_cuts": 12})
    lib = make_libraries(cfg)[0]
    batch = sample_batch(cfg, lib, 300, gen(9))
    assert batch.n_cuts.max() == 12
    assert (batch.n_cuts == 12).double().mean() > 0.99
    assert (batch.segment.max(1).values <= 12).all()


# ---------------------------------------------------------------------------------------
# determinism, errors, speed
# ---------------------------------------------------------------------------------------


def test_same_seed_same_batch(small_cfg, small_libs):
    a = sample_batch(small_cfg, small_libs[0], 32, gen(10))
    b = sample_batch(small_cfg, small_libs[0], 32, gen(10))
    for name in a.__dataclass_fields__:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    c = sample_batch(small_cfg, small_libs[0], 32, gen(11))
    assert not torch.equal(a.tokens, c.tokens)
    assert not torch.equal(a.kind, c.kind)


def test_batch_to_device(small_batch):
    moved = small_batch.to("cpu")
    assert torch.equal(moved.tokens, small_batch.tokens) and len(moved) == len(small_batch)


def test_sample_batch_errors(small_cfg, small_libs):
    lib = small_libs[0]
    with pytest.raises(ValueError, match="batch"):
        sample_batch(small_cfg, lib, 0, gen(0))
    with pytest.raises(ValueError, match="d_state"):
        sample_batch(LDSConfig(**{**SMALL, "d_state": 3}), lib, 4, gen(0))
    with pytest.raises(ValueError, match="distinct"):
        sample_batch(small_cfg, lib.subset(torch.arange(5)), 4, gen(0))


def test_generation_speed(default_cfg, default_libs):
    """Vectorised generation: a 2048-trace batch of the default task must be a small
    fraction of a training step (seconds on 2 CPU cores); generous bound for busy CI."""
    start = time.perf_counter()
    batch = sample_batch(default_cfg, default_libs[0], 2048, gen(1))
    elapsed = time.perf_counter() - start
    assert batch.tokens.shape == (2048, 251, 57)
    assert elapsed < 10.0, f"sample_batch(2048) took {elapsed:.2f} s"


# --------------------------------------------------------------- sizes before work (issue 19)


@pytest.mark.parametrize(
    "fields, phrase",
    [({"n_pairs": 10**12, "max_systems": 3}, "one LDS trace would hold positions 251 x width 2e+12"),
     ({"n_ctx": 10**12}, "one LDS trace would hold positions 1e+12"),
     ({"n_train_systems": 10**12}, "the LDS task's system library would hold systems 1e+12")],
)  # fmt: skip
def test_a_config_too_big_to_allocate_is_refused_at_once(fields, phrase):
    start = time.thread_time()
    with pytest.raises(ValueError) as err:
        LDSConfig(**fields)
    assert time.thread_time() - start < 0.1
    assert phrase in str(err.value) and "\n" not in str(err.value)


def test_a_batch_of_a_trillion_traces_is_refused_before_anything_is_drawn(small_cfg, small_libs):
    start = time.thread_time()
    with pytest.raises(ValueError, match=r"the traces' tokens would hold batch 1e\+12 x .*; lower batch"):
        sample_batch(small_cfg, small_libs[0], 10**12, gen(0))
    assert time.thread_time() - start < 0.1
