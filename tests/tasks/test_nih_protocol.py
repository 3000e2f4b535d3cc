"""The study's NiH construction (oldest system queried, misdirection to the next) and
per-example trials, in needle_in_haystack, mechlab.nih and nih_prune_data."""

from __future__ import annotations

import pytest
import torch

from mechlab.tasks.lds import LDSConfig, make_libraries
from mechlab.tasks.lds_evals import NIH_PROTOCOLS, needle_in_haystack, nih_protocol
from mechlab.tasks.lds_prune import nih_prune_data
from mechlab.tasks.nih import nih

torch.set_num_threads(1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def cfg() -> LDSConfig:
    return LDSConfig(d_state=3, n_pairs=6, n_ctx=64, max_systems=4, n_train_systems=50, n_test_systems=40)


@pytest.fixture(scope="module")
def lib(cfg):
    return make_libraries(cfg)[1]


def query_labels(tr, cfg) -> torch.Tensor:
    """Label shown by the query segment's open token, read from the raw token vectors."""
    p = tr.query_position
    return tr.batch.tokens[:, p, : 2 * cfg.n_pairs].abs().argmax(-1) // 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_study_queries_the_oldest_system_and_misdirects_to_the_next(cfg, lib, seed):
    N, S, B = 4, 8, 64
    tr = needle_in_haystack(cfg, lib, B, n_haystack=N, seg_len=S, generator=gen(seed),
                            query="oldest", misdirect="next")
    assert (tr.query == 0).all() and (tr.other == 1).all()
    # By hand: the 1-after target is U_0 applied to the last state of the first segment.
    b = tr.batch
    U0 = lib.U[b.systems[:, 0]].double()  # [B, d, d]
    last_hay = b.tokens[:, 1 + S, -cfg.d_state:].double()  # token S of segment 0: y^0_{S-1}
    want = (U0 @ last_hay.unsqueeze(-1)).squeeze(-1)
    got = b.targets[:, tr.positions[0]].double()
    assert torch.allclose(got, want, atol=1e-5)
    assert (query_labels(tr, cfg) == b.slot_labels[:, 0]).all()
    bad = needle_in_haystack(cfg, lib, B, n_haystack=N, seg_len=S, generator=gen(seed),
                             probe="misdirect_incorrect", query="oldest", misdirect="next")
    assert (query_labels(bad, cfg) == b.slot_labels[:, 1]).all()  # the next system's label
    assert torch.equal(bad.batch.targets, b.targets)  # the continuation stays the true one


def test_next_wraps_around_and_the_options_change_nothing_else(cfg, lib):
    N, B = 4, 200
    uni = needle_in_haystack(cfg, lib, B, n_haystack=N, seg_len=8, generator=gen(3))
    nxt = needle_in_haystack(cfg, lib, B, n_haystack=N, seg_len=8, generator=gen(3), misdirect="next")
    assert torch.equal(nxt.query, uni.query)  # the same draws, in the same order
    assert torch.equal(nxt.other, (uni.query + 1) % N)
    assert set(uni.query.tolist()) == set(range(N))  # uniform by default, as before
    old = needle_in_haystack(cfg, lib, B, n_haystack=N, seg_len=8, generator=gen(3), query="oldest")
    for name in ("systems", "slot_labels", "x0"):
        assert torch.equal(getattr(old.batch, name), getattr(uni.batch, name))
    # Traces already querying slot 0 are the same trace under both constructions.
    same = uni.query == 0
    assert same.any() and torch.equal(old.batch.tokens[same], uni.batch.tokens[same])


@pytest.mark.parametrize("protocol", ["uniform", "study"])
def test_trials_share_the_example_and_redraw_initial_states(cfg, lib, protocol):
    E, K = 5, 4
    tr = needle_in_haystack(cfg, lib, E * K, n_haystack=3, seg_len=8, generator=gen(7), trials=K,
                            **nih_protocol(protocol))
    b = tr.batch
    for name, t in (("systems", b.systems), ("labels", b.slot_labels), ("query", tr.query),
                    ("other", tr.other)):
        grouped = t.reshape(E, K, *t.shape[1:])
        assert (grouped == grouped[:, :1]).all(), name
    x0 = b.x0.reshape(E, K, *b.x0.shape[1:])
    assert not torch.isclose(x0[:, 0], x0[:, 1]).all()  # fresh states per trial
    assert not (b.systems.reshape(E, K, -1)[:, 0] == b.systems.reshape(E, K, -1)[0, 0]).all()
    one = needle_in_haystack(cfg, lib, 12, n_haystack=3, seg_len=8, generator=gen(7), trials=1)
    plain = needle_in_haystack(cfg, lib, 12, n_haystack=3, seg_len=8, generator=gen(7))
    assert torch.equal(one.batch.tokens, plain.batch.tokens)


def test_bad_options_raise_one_line_errors(cfg, lib):
    with pytest.raises(ValueError, match="unknown query choice 'newest'"):
        needle_in_haystack(cfg, lib, 4, n_haystack=3, seg_len=5, query="newest")
    with pytest.raises(ValueError, match="unknown misdirect choice"):
        needle_in_haystack(cfg, lib, 4, n_haystack=3, seg_len=5, misdirect="prev")
    with pytest.raises(ValueError, match="trials must be a positive integer dividing n_traces=10"):
        needle_in_haystack(cfg, lib, 10, n_haystack=3, seg_len=5, trials=4)
    with pytest.raises(ValueError, match="unknown NiH protocol"):
        nih_protocol("paper")
    with pytest.raises(ValueError, match="unknown NiH protocol"):
        nih(cfg, 4, protocol="paper")
    with pytest.raises(ValueError, match="unknown NiH protocol"):
        nih_prune_data(cfg, n_train=4, n_test=4, protocol="paper")
    assert set(NIH_PROTOCOLS) == {"uniform", "study"}


def test_nih_and_prune_data_pass_the_protocol_through(cfg):
    t = nih(cfg, 16, n_haystack=3, seg_len=5, protocol="study", seed=4)
    assert t.protocol == "study" and (t.query == 0).all() and (t.other == 1).all()
    p = t.query_position
    assert (t.corrupted_batch.label[:, p] == t.slot_labels[:, 1]).all()
    u = nih(cfg, 16, n_haystack=3, seg_len=5, protocol="uniform", seed=4)
    assert u.protocol == "uniform" and torch.equal(u.systems, t.systems)
    assert not (u.query == 0).all()  # uniform draws the queried slot
    default = nih(cfg, 16, n_haystack=3, seg_len=5, seed=4)  # the study's NiH is the default
    assert default.protocol == "study" and torch.equal(default.clean, t.clean)

    data = nih_prune_data(cfg, n_train=8, n_test=8, n_haystack=3, seg_len=5, protocol="study")
    assert data.info["nih_protocol"] == "study"
    lab = data.train.inputs[:, p, : 2 * cfg.n_pairs].argmax(-1) // 2
    first = data.train.inputs[:, 1, : 2 * cfg.n_pairs].argmax(-1) // 2  # slot 0's open label
    second = data.train.inputs[:, 1 + 7, : 2 * cfg.n_pairs].argmax(-1) // 2  # slot 1's
    bad = data.train.corrupted[:, p, : 2 * cfg.n_pairs].argmax(-1) // 2
    assert torch.equal(lab, first) and torch.equal(bad, second)
    default = nih_prune_data(cfg, n_train=8, n_test=8, n_haystack=3, seg_len=5)
    assert default.info["nih_protocol"] == "study"
    assert torch.equal(default.train.corrupted, data.train.corrupted)
    uniform = nih_prune_data(cfg, n_train=8, n_test=8, n_haystack=3, seg_len=5, protocol="uniform")
    assert uniform.info["nih_protocol"] == "uniform"
