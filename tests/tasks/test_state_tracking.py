"""The state-tracking tasks: labels against plain-Python group arithmetic, token layouts and
loss masks per format, unique and disjoint sampling, sizes, OOD normalisation, bad input."""

import numpy as np
import pytest
import torch

from mechlab.tasks import TASK_CONFIGS
from mechlab.tasks.state_tracking import (
    FORMATS,
    IGNORE,
    SequenceSet,
    StateTrackingConfig,
    encode,
    generate_cot,
    make_data,
    masked_cross_entropy,
    normalised_accuracy,
    set_accuracy,
    set_loss,
    set_loss_by_length,
    states_of,
    training_sizes,
    validation_sizes,
)
from tests.tasks.test_state_tracking_groups import _perm_states


@pytest.mark.parametrize("group", ["zm", "s5"])
def test_data_states_match_inputs(group):
    cfg = StateTrackingConfig(group=group, m=3, L=4, n_train=60, n_val=30, n_ood=20)
    data = make_data(cfg)
    for seqs in (data.train, data.val, data.ood):
        for x, s, n in zip(seqs.inputs, seqs.states, seqs.lengths, strict=True):
            n = int(n)
            want = _perm_states(x[:n].tolist()) if group == "s5" else (np.cumsum(x[:n].numpy()) % 3).tolist()
            assert s[:n].tolist() == want


def _seqs(rows):
    """A SequenceSet of lists of inputs (Z_5)."""
    cfg = StateTrackingConfig(m=5)
    n_max = max(len(r) for r in rows)
    x = torch.tensor([r + [0] * (n_max - len(r)) for r in rows])
    s = torch.tensor(states_of(cfg, x.numpy()))
    return SequenceSet(x, s, torch.tensor([len(r) for r in rows]))


def test_token_layout_outcome_and_acot():
    seqs = _seqs([[1, 2, 3], [4, 4]])  # states [1, 3, 1] and [4, 3]
    BOS, PAD = 5, 7
    for fmt in ("outcome", "acot"):
        tokens, targets, mask = encode(StateTrackingConfig(m=5, format=fmt), seqs)
        assert tokens.tolist() == [[BOS, 1, 2, 3], [BOS, 4, 4, PAD]]
        if fmt == "outcome":
            assert mask.tolist() == [[False, False, False, True], [False, False, True, False]]
            assert targets.tolist() == [[IGNORE, IGNORE, IGNORE, 1], [IGNORE, IGNORE, 3, IGNORE]]
        else:
            assert mask.tolist() == [[False, True, True, True], [False, True, True, False]]
            assert targets.tolist() == [[IGNORE, 1, 3, 1], [IGNORE, 4, 3, IGNORE]]


def test_token_layout_cot():
    seqs = _seqs([[1, 2, 3], [4, 4]])
    BOS, SEP, PAD, X = 5, 6, 7, IGNORE
    tokens, targets, mask = encode(StateTrackingConfig(m=5, format="cot"), seqs)
    assert tokens.tolist() == [[BOS, 1, 2, 3, SEP, 1, 3], [BOS, 4, 4, SEP, 4, PAD, PAD]]
    assert targets.tolist() == [[X, X, X, X, 1, 3, 1], [X, X, X, 4, 3, X, X]]
    assert mask.tolist() == [[False] * 4 + [True] * 3, [False] * 3 + [True] * 2 + [False] * 2]


def test_vocabulary_and_context():
    cfg = StateTrackingConfig(group="s5", L=5, format="cot")
    assert (cfg.n_states, cfg.bos, cfg.sep, cfg.pad, cfg.d_vocab, cfg.d_vocab_out) == (120, 120, 121, 122, 123, 120)
    assert cfg.n_ctx == 2 * 10 + 1  # the OOD length 2L in CoT
    assert StateTrackingConfig(m=2, L=5).n_ctx == 11
    assert TASK_CONFIGS["state_tracking"] is StateTrackingConfig


def _rows(seqs):
    return {tuple(x[: int(n)].tolist()) for x, n in zip(seqs.inputs, seqs.lengths, strict=True)}


@pytest.mark.parametrize("lengths", ["fixed", "uniform", "short_to_long"])
def test_unique_disjoint_and_fixed_validation(lengths):
    cfg = StateTrackingConfig(group="zm", m=3, L=5, lengths=lengths, n_train=60, n_val=40, seed=4)
    data = make_data(cfg)
    train = [tuple(x[: int(n)].tolist()) for x, n in zip(data.train.inputs, data.train.lengths, strict=True)]
    assert len(train) == 60 == len(set(train))
    assert not set(train) & _rows(data.val)
    # the validation set is the same whatever n_train, and changes with the seed
    assert _rows(make_data(StateTrackingConfig(**{**cfg.to_dict(), "n_train": 100})).val) == _rows(data.val)
    assert _rows(make_data(StateTrackingConfig(**{**cfg.to_dict(), "seed": 5})).val) != _rows(data.val)
    lens = data.train.lengths.tolist()
    if lengths == "fixed":
        assert set(lens) == {5}
    elif lengths == "short_to_long":  # 9 - 1 of length 2 (1 validation), 27 - 5, then the rest of length 4
        assert [lens.count(n) for n in (2, 3, 4, 5)] == [8, 22, 30, 0]
    else:
        assert [lens.count(n) for n in (2, 3, 4, 5)] == [8, 18, 17, 17]


def test_huge_spaces_are_sampled_without_enumeration():
    cfg = StateTrackingConfig(group="s5", L=30, lengths="fixed", n_train=500, n_val=100, n_ood=10)
    data = make_data(cfg)  # 120**30 sequences of length 30, 120**60 at the OOD length
    assert data.train.inputs.shape == (500, 30) and data.ood.inputs.shape == (10, 60)
    assert len(_rows(data.train)) == 500 and not _rows(data.train) & _rows(data.val)
    assert int(data.train.inputs.max()) > 100  # every digit of the base-120 ranks is used


def test_sizes_and_n_too_large():
    cfg = StateTrackingConfig(group="zm", m=2, L=4, n_train=5)
    assert validation_sizes(cfg) == {2: 0, 3: 1, 4: 3}  # at most 20% of 4, 8, 16
    assert sum(training_sizes(cfg, 24).values()) == 24
    with pytest.raises(ValueError, match="n_train=25 is more than the 24 unique training sequences"):
        training_sizes(cfg, 25)
    with pytest.raises(ValueError, match="more than the"):
        make_data(StateTrackingConfig(group="zm", m=2, L=3, lengths="fixed", n_train=8))


@pytest.mark.parametrize(
    "fields, message",
    [({"m": 1}, "m must be at least 2"), ({"L": 1}, "L must be at least 2"),
     ({"format": "chain"}, "choose one of \\['outcome', 'acot', 'cot'\\]"),
     ({"lengths": "random"}, "choose one of \\['fixed', 'uniform', 'short_to_long'\\]"),
     ({"group": "a5"}, "unknown group"), ({"n_train": 0}, "n_train must be positive"),
     ({"val_frac": 1.5}, "val_frac"), ({"m": 2.5}, "m must be an integer")],
)  # fmt: skip
def test_bad_config(fields, message):
    with pytest.raises(ValueError, match=message):
        StateTrackingConfig(**fields)


def test_bad_config_dict_and_no_validation():
    with pytest.raises(ValueError, match="unknown StateTrackingConfig field"):
        StateTrackingConfig.from_dict({"modulus": 3})
    with pytest.raises(ValueError, match="no validation sequences"):
        make_data(StateTrackingConfig(m=2, L=2, lengths="fixed", n_train=2))


def test_normalised_accuracy():
    assert normalised_accuracy(0.2, 5) == pytest.approx(0.0)
    assert normalised_accuracy(1.0, 5) == pytest.approx(1.0)
    assert normalised_accuracy(0.6, 5) == pytest.approx(0.5)
    assert normalised_accuracy(0.5, 2) == pytest.approx(0.0)


class Oracle(torch.nn.Module):
    """Logits that put all mass on the right next state, read from the tokens (Z_m)."""

    def __init__(self, cfg, wrong_at=None):
        super().__init__()
        self.cfg, self.wrong_at = cfg, wrong_at
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, tokens):
        cfg, m = self.cfg, self.cfg.m
        B, T = tokens.shape
        logits = torch.zeros(B, T, m)
        for b in range(B):
            row = tokens[b].tolist()
            n = next((i for i, t in enumerate(row[1:], 1) if t >= m), T) - 1  # inputs before SEP/PAD
            s = 0
            for t in range(T):
                if 1 <= t <= n:
                    s = (s + row[t]) % m
                    pred = s
                else:
                    pred = (sum(row[1 : n + 1]) if cfg.format == "cot" else 0) % m
                    if cfg.format == "cot" and t > n:  # the next state of the chain of thought
                        k = t - n  # predicting s_k
                        pred = sum(row[1 : k + 1]) % m
                if self.wrong_at is not None and t == self.wrong_at:
                    pred = (pred + 1) % m
                logits[b, t, pred] = 30.0
        return logits


@pytest.mark.parametrize("fmt", FORMATS)
def test_accuracy_and_loss_of_an_oracle(fmt):
    cfg = StateTrackingConfig(m=3, L=3, format=fmt, n_train=20, n_val=20, n_ood=30)
    data = make_data(cfg)
    acc = set_accuracy(Oracle(cfg), cfg, data.ood)
    assert acc == {"token_acc": 1.0, "seq_acc": 1.0, "token_acc_norm": 1.0, "seq_acc_norm": 1.0}
    assert set_loss(Oracle(cfg), cfg, data.val) < 1e-10
    if fmt == "cot":  # generation feeds the model its own states
        x = data.ood.inputs[:5, :6]
        assert generate_cot(Oracle(cfg), cfg, x).tolist() == data.ood.states[:5, :6].tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_loss_by_length_is_each_lengths_own_loss_and_averages_to_the_whole(fmt):
    cfg = StateTrackingConfig(m=5, L=4, format=fmt, n_train=40, n_val=30, n_ood=10)
    seqs = make_data(cfg).val
    torch.manual_seed(0)
    proj = torch.randn(cfg.d_vocab, cfg.d_vocab_out)

    def model(tokens):  # a fixed random predictor: every loss differs from 0 and from the others
        return proj[tokens] + 0.1 * tokens[..., None].float()

    by_n = set_loss_by_length(model, cfg, seqs, chunk=7)  # chunks that cut across lengths
    assert list(by_n) == sorted(set(seqs.lengths.tolist())) == [2, 3, 4]
    counts = {}
    for n in by_n:  # independently: each length's sequences on their own
        part = seqs.subset(torch.nonzero(seqs.lengths == n).squeeze(1))
        assert by_n[n] == pytest.approx(set_loss(model, cfg, part), rel=1e-5)
        counts[n] = int(encode(cfg, part)[2].sum())
    mean = sum(by_n[n] * counts[n] for n in by_n) / sum(counts.values())
    assert mean == pytest.approx(set_loss(model, cfg, seqs), rel=1e-5)
    assert len(set(round(v, 6) for v in by_n.values())) == 3
    assert all(v < 1e-10 for v in set_loss_by_length(Oracle(cfg), cfg, seqs).values())


def test_accuracy_per_token_and_per_sequence():
    cfg = StateTrackingConfig(m=3, L=3, format="acot", n_train=20, n_val=20, n_ood=30)
    data = make_data(cfg)  # OOD: 30 sequences of 6 inputs, all scored
    acc = set_accuracy(Oracle(cfg, wrong_at=2), cfg, data.ood)  # the 2nd state always wrong
    assert acc["token_acc"] == pytest.approx(5 / 6) and acc["seq_acc"] == 0.0
    assert acc["token_acc_norm"] == pytest.approx((5 / 6 - 1 / 3) / (2 / 3))
    assert acc["seq_acc_norm"] == pytest.approx(-0.5)


def test_masked_cross_entropy_ignores_unscored_positions():
    logits = torch.randn(2, 4, 3)
    targets = torch.tensor([[IGNORE, 1, 2, IGNORE], [0, IGNORE, IGNORE, IGNORE]])
    mask = targets != IGNORE
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, 3), targets.reshape(-1), ignore_index=IGNORE)
    assert masked_cross_entropy(logits, targets, mask) == pytest.approx(float(want), rel=1e-6)


# --------------------------------------------------------------- sizes before work (issue 19)


def test_a_modulus_of_a_million_needs_no_composition_table():
    # Issue 19: Z_m with m = 10^6 built a [m, m] table (7 TiB) before anything else.
    import time

    from mechlab.tasks.state_tracking import composition_table, make_data, states_of

    cfg = StateTrackingConfig(m=10**6, L=3, n_train=50, n_val=10, n_ood=10)
    start = time.perf_counter()
    data = make_data(cfg)
    assert time.perf_counter() - start < 1.0
    x, states = data.train.inputs.numpy(), data.train.states.numpy()
    real = np.arange(x.shape[1])[None] < data.train.lengths.numpy()[:, None]  # not padding
    assert (states == np.cumsum(x, axis=1) % 10**6)[real].all()
    assert (states_of(cfg, x) == np.cumsum(x, axis=1) % 10**6).all()
    with pytest.raises(ValueError, match=r"the composition table of Z_m would hold rows \(m\) 1e\+06"):
        composition_table(cfg)  # asked for explicitly: refused by its size, not allocated


def test_data_sets_too_big_to_allocate_are_refused_before_sampling():
    from mechlab.tasks.state_tracking import make_data

    cfg = StateTrackingConfig(m=10**6, L=3, n_train=10**12, n_val=10, n_ood=10)
    with pytest.raises(ValueError, match=r"the task's sequences would hold .* 1e\+12 x elements 6") as err:
        make_data(cfg)
    assert "lower n_train, n_val or n_ood" in str(err.value)


def test_a_length_too_large_is_refused_before_any_sequence_is_counted():
    with pytest.raises(ValueError) as err:
        StateTrackingConfig(L=10**6)
    message = str(err.value)
    assert "L 1e+06 is more than mechlab's limit of 4,096 (checking the task counts" in message
    assert "\n" not in message


def test_a_modulus_too_large_for_a_model_is_refused_where_one_is_trained():
    from mechlab.tasks.state_tracking import check_model_vocabulary
    from mechlab.train.task import StateTrackingTask

    check_model_vocabulary(2**14)
    with pytest.raises(ValueError, match=r"m 1e\+06 is more than mechlab's limit of 16,384"):
        StateTrackingTask({"m": 10**6, "L": 3})


def test_an_evaluation_chunk_too_large_is_refused_before_a_forward_pass():
    cfg = StateTrackingConfig(m=5000, L=4000, lengths="fixed", n_train=1, n_val=1, n_ood=1)
    zeros = torch.zeros(600, 4000, dtype=torch.long)
    seqs = SequenceSet(zeros, zeros, torch.full((600,), 4000))

    def forward(tokens):
        raise AssertionError("a forward pass ran before the size check")

    for evaluate in (set_loss, set_accuracy, set_loss_by_length):
        with pytest.raises(ValueError, match=r"evaluation chunk's logits would hold sequences 512"):
            evaluate(forward, cfg, seqs)
