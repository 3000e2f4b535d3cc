"""Ground-truth recurrent models (mechlab.models.ground_truth): exact on Z_m and S_5 at any length.

Labels are computed here in plain Python, independently of the construction and of the
task module: Z_m running sums, and S_5 compositions ``s_t[i] = pi_t[s_{t-1}[i]]`` over
``itertools.permutations(range(5))``. Every model is checked at every position of random
sequences of up to 2000 elements (argmax and cross-entropy), and against the task
module's own data, encoding, loss and accuracy.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
import torch.nn.functional as F

from mechlab.checkpoint import load_checkpoint, save_checkpoint
from mechlab.models import build_model
from mechlab.models.dense_ssm import DenseSSM
from mechlab.models.ground_truth import (
    dense_ssm_group_model,
    group_order,
    lstm_group_model,
    lstm_on_value,
    permutation_state,
    token_duals,
)
from mechlab.models.lstm import LSTM
from mechlab.tasks import state_tracking as st

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PERMS = list(itertools.permutations(range(5)))
PERM_INDEX = {p: k for k, p in enumerate(PERMS)}
LONG = 2000


# ---------------------------------------------------------------------------------------
# Independent labels (plain Python)
# ---------------------------------------------------------------------------------------


def zm_states(xs: list[int], m: int) -> list[int]:
    """The running sums mod m; BOS / SEP / PAD (tokens >= m) leave the state unchanged."""
    s, out = 0, []
    for x in xs:
        if x < m:
            s = (s + x) % m
        out.append(s)
    return out


def s5_states(xs: list[int]) -> list[int]:
    """States after each input: s_t[i] = pi_t[s_{t-1}[i]] (tokens >= 120 leave s unchanged)."""
    s, out = tuple(range(5)), []
    for x in xs:
        if x < 120:
            pi = PERMS[x]
            s = tuple(pi[s[i]] for i in range(5))
        out.append(PERM_INDEX[s])
    return out


def labels(group: str, m: int | None, xs: list[int]) -> list[int]:
    return zm_states(xs, m) if group == "zm" else s5_states(xs)


def random_tokens(V: int, batch: int, n: int, seed: int, specials: bool = False) -> torch.Tensor:
    """``[batch, n + 1]``: BOS then ``n`` random element tokens (or any non-BOS token
    with ``specials``)."""
    rng = random.Random(seed)
    high = V + 3 if specials else V
    rows = [[V] + [rng.randrange(high) for _ in range(n)] for _ in range(batch)]
    return torch.tensor(rows)


def check_exact(model, group: str, m: int | None, tokens: torch.Tensor) -> torch.Tensor:
    """Argmax at every position equals the independent labels (BOS: the identity); the
    cross-entropy is below 1e-6. Returns the logits."""
    V = group_order(group, m)
    with torch.no_grad():
        logits = model(tokens)  # [batch, n + 1, V]
    assert logits.shape == (*tokens.shape, V)
    truth = torch.tensor([labels(group, m, row[1:]) for row in tokens.tolist()])  # [batch, n]
    pred = logits[:, 1:].argmax(-1)
    wrong = (pred != truth).nonzero()
    assert wrong.numel() == 0, f"first wrong (row, position): {wrong[:3].tolist()}"
    assert (logits[:, 0].argmax(-1) == 0).all()  # BOS: the identity
    loss = F.cross_entropy(logits[:, 1:].reshape(-1, V), truth.reshape(-1))
    assert float(loss) < 1e-6
    return logits


# ---------------------------------------------------------------------------------------
# Exact at long lengths
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [2, 3, 5, 10, 50])
def test_dense_ssm_tracks_zm_exactly_at_every_position(m):
    model = dense_ssm_group_model("zm", m)
    assert isinstance(model, DenseSSM) and model.cfg.io == "tokens"
    assert (model.cfg.d_vocab, model.cfg.d_vocab_out, model.cfg.d_state) == (m + 3, m, m)
    check_exact(model, "zm", m, random_tokens(m, 3, LONG, seed=m))


def test_dense_ssm_tracks_s5_exactly_in_the_5_dim_permutation_representation():
    model = dense_ssm_group_model("s5")
    assert model.cfg.d_state == 5 and model.cfg.d_model == 128
    check_exact(model, "s5", None, random_tokens(120, 3, LONG, seed=1))


def test_dense_ssm_tracks_s5_exactly_in_the_regular_representation():
    model = dense_ssm_group_model("s5", representation="regular")
    assert model.cfg.d_state == 120
    check_exact(model, "s5", None, random_tokens(120, 2, 200, seed=2))


@pytest.mark.slow
def test_dense_ssm_regular_s5_at_2000_positions():
    model = dense_ssm_group_model("s5", representation="regular")
    check_exact(model, "s5", None, random_tokens(120, 2, LONG, seed=3))


@pytest.mark.parametrize("m", [2, 3, 5, 10])
def test_lstm_tracks_zm_exactly_at_every_position(m):
    model = lstm_group_model(m)
    assert isinstance(model, LSTM)
    assert (model.cfg.d_vocab, model.cfg.d_vocab_out, model.cfg.d_hidden) == (m + 3, m, m * (m - 1))
    check_exact(model, "zm", m, random_tokens(m, 3, LONG, seed=10 + m))


def test_lstm_step_loop_equals_the_fused_kernel_and_its_units_stay_saturated():
    m = 5
    model = lstm_group_model(m)
    tokens = random_tokens(m, 2, 500, seed=4, specials=True)
    with torch.no_grad():
        fused = model(tokens)
        model.fused = False
        _, cache = model.run_with_cache(tokens, names_filter="blocks.0.lstm.hook_h")
        unrolled = model(tokens)
    assert (fused - unrolled).abs().max() < 1e-4
    check_exact(model, "zm", m, tokens)
    h = cache["blocks.0.lstm.hook_h"]  # [batch, pos, m (m - 1)]
    a = lstm_on_value()
    assert 0.76 < a < 0.762  # about tanh(1)
    # every unit is on (a) or off (0) to 1e-6, after 500 steps as after one
    assert float(torch.minimum(h.abs(), (h - a).abs()).max()) < 1e-6
    on = h > a / 2
    assert int(on.sum(-1).max()) <= 1  # at most one unit: none means state 0
    # the unit that is on is (state s, input x): s is the label, x the token read
    truth = torch.tensor([zm_states(row[1:], m) for row in tokens.tolist()])
    b, t, u = on.nonzero().unbind(1)
    assert torch.equal(u // m + 1, truth[b, t - 1])
    read = tokens[b, t]
    assert torch.equal(u % m, torch.where(read < m, read, 0))  # BOS / SEP / PAD act as 0
    assert int((on.sum(-1)[:, 1:] == 0).sum()) == int((truth == 0).sum())


def test_the_check_fails_on_a_model_that_is_wrong_for_one_token():
    """Negative control: token 1 of Z_5 made to act as 2 (and nothing else changed) is caught."""
    m = 5
    model = dense_ssm_group_model("zm", m)
    ssm = model.blocks[0].ssm
    with torch.no_grad():
        dual = token_duals(model)[:, 1].float()  # x_v . dual = [v == 1]
        shift = torch.roll(torch.eye(m), 2, dims=0) - torch.roll(torch.eye(m), 1, dims=0)
        ssm.W_A += torch.einsum("ij,k->ijk", shift, dual)
    tokens = random_tokens(m, 2, 50, seed=11)
    with pytest.raises(AssertionError, match="first wrong"):
        check_exact(model, "zm", m, tokens)
    tokens[tokens == 1] = 2  # the wrong model is right where token 1 never occurs
    check_exact(model, "zm", m, tokens)


def test_bos_sep_and_pad_leave_the_state_unchanged():
    for group, m, builder in (("zm", 7, dense_ssm_group_model), ("s5", None, dense_ssm_group_model),
                              ("zm", 4, None)):  # fmt: skip
        model = builder(group, m) if builder else lstm_group_model(m)
        V = group_order(group, m)
        tokens = random_tokens(V, 2, 300, seed=5, specials=True)
        assert (tokens[:, 1:] >= V).any()
        check_exact(model, group, m, tokens)


# ---------------------------------------------------------------------------------------
# The construction itself
# ---------------------------------------------------------------------------------------


def test_dense_ssm_transitions_are_the_permutation_matrices_of_the_tokens():
    m = 6
    model = dense_ssm_group_model("zm", m)
    tokens = torch.arange(m + 3).unsqueeze(0)  # every token once
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter="blocks.0.ssm.hook_A")
    A = cache["blocks.0.ssm.hook_A"][0]  # [m + 3, m, m]
    for v in range(m + 3):
        shift = v if v < m else 0
        expected = torch.zeros(m, m)
        for j in range(m):
            expected[(j + shift) % m, j] = 1.0  # state j -> j + v
        assert (A[v] - expected).abs().max() < 1e-5, f"token {v}"
    assert torch.equal(model.blocks[0].ssm.h_init, torch.eye(m)[0])


def test_s5_permutation_representation_composes_as_the_task_does():
    model = dense_ssm_group_model("s5")
    tokens = torch.arange(123).unsqueeze(0)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter="blocks.0.ssm.hook_A")
    A = cache["blocks.0.ssm.hook_A"][0].double()  # [123, 5, 5]
    rng = random.Random(6)
    for _ in range(200):
        pi, s = rng.randrange(120), rng.randrange(120)
        composed = PERM_INDEX[tuple(PERMS[pi][PERMS[s][i]] for i in range(5))]
        assert (A[pi] @ permutation_state(s) - permutation_state(composed)).abs().max() < 1e-5
    for v in (120, 121, 122):
        assert (A[v] - torch.eye(5, dtype=torch.float64)).abs().max() < 1e-5
    # the states of distinct elements are distinct
    states = torch.stack([permutation_state(s) for s in range(120)])
    assert len({tuple(r.tolist()) for r in states}) == 120


@pytest.mark.parametrize("margin", [10.0, 30.0])
def test_logit_margin_is_the_one_asked_for(margin):
    for model in (dense_ssm_group_model("zm", 5, margin=margin), lstm_group_model(5, margin=margin),
                  dense_ssm_group_model("s5", margin=margin)):  # fmt: skip
        V = model.cfg.d_vocab_out
        with torch.no_grad():
            logits = model(random_tokens(V, 2, 100, seed=7))
        top2 = logits.topk(2, dim=-1).values  # [batch, pos, 2]
        gap = top2[..., 0] - top2[..., 1]
        assert float((gap - margin).abs().max()) < 1e-3 * margin


def test_a_built_model_has_the_registry_models_parameters_and_round_trips(tmp_path):
    """Real mechlab models: a fresh build_model of the same config has the same state_dict
    keys and shapes, and a checkpoint reloads with weights_only=True to the same outputs."""
    for model in (dense_ssm_group_model("zm", 3), lstm_group_model(3)):
        fresh = build_model(model.cfg.to_dict())
        assert {k: v.shape for k, v in fresh.state_dict().items()} == {
            k: v.shape for k, v in model.state_dict().items()
        }
        path = save_checkpoint(model, tmp_path / f"{model.cfg.arch}.pt")
        loaded = load_checkpoint(path).model
        tokens = random_tokens(3, 2, 50, seed=8)
        with torch.no_grad():
            assert torch.equal(loaded(tokens), model(tokens))


def test_float_drift_of_the_dense_ssm_state_is_tiny():
    """The state stays within 1e-4 of an exact one-hot after 2000 steps (float32)."""
    m = 5
    model = dense_ssm_group_model("zm", m)
    tokens = random_tokens(m, 1, LONG, seed=9)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter="blocks.0.ssm.hook_h")
    h = cache["blocks.0.ssm.hook_h"][0]  # [pos, m]
    exact = torch.eye(m)[[0] + zm_states(tokens[0, 1:].tolist(), m)]
    assert float((h - exact).abs().max()) < 1e-4


# ---------------------------------------------------------------------------------------
# The task module's data, encoding, loss and accuracy
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "group, m, fmt, builder",
    [("zm", 2, "outcome", "dense_ssm"), ("zm", 5, "acot", "dense_ssm"), ("zm", 3, "acot", "lstm"),
     ("zm", 5, "outcome", "lstm"), ("s5", 2, "acot", "dense_ssm")],
)  # fmt: skip
def test_exact_on_the_task_modules_data(group, m, fmt, builder):
    """Loss ~0 and accuracy 1 on the task's validation and OOD (2L) sets, via its own
    encode / set_loss / set_accuracy (a check of the task code as much as of the models)."""
    cfg = st.StateTrackingConfig(group=group, m=m, L=6, format=fmt, lengths="uniform",
                                 n_train=50, n_val=100, n_ood=50, seed=0)  # fmt: skip
    data = st.make_data(cfg)
    zm_m = m if group == "zm" else None
    # the task config's m is ignored for S_5, here as there
    model = lstm_group_model(m) if builder == "lstm" else dense_ssm_group_model(group, cfg.m)
    assert (model.cfg.d_vocab, model.cfg.d_vocab_out) == (cfg.d_vocab, cfg.d_vocab_out)
    for seqs in (data.val, data.ood, data.train):
        assert st.set_loss(model, cfg, seqs) < 1e-6
        acc = st.set_accuracy(model, cfg, seqs)
        assert acc["token_acc"] == 1.0 and acc["seq_acc"] == 1.0
        assert acc["token_acc_norm"] == pytest.approx(1.0)
        # the task's labels agree with the independent ones of this file
        rows = zip(seqs.inputs.tolist(), seqs.states.tolist(), seqs.lengths.tolist(), strict=True)
        for inputs, states, n in rows:
            assert labels(group, zm_m, inputs[:n]) == states[:n]


# ---------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: dense_ssm_group_model("z5", 5), "unknown group"),
        (lambda: dense_ssm_group_model("zm"), "needs m"),
        (lambda: dense_ssm_group_model("zm", 1), "m must be an integer >= 2"),
        (lambda: dense_ssm_group_model("zm", 2.5), "m must be an integer"),
        (lambda: dense_ssm_group_model("zm", 5, representation="permutation"), "is for group 's5'"),
        (lambda: dense_ssm_group_model("s5", representation="dense"), "unknown representation"),
        (lambda: dense_ssm_group_model("zm", 5, margin=0), "margin must be positive"),
        (lambda: dense_ssm_group_model("zm", 5, margin=math.inf), "margin must be a finite"),
        (lambda: dense_ssm_group_model("zm", 5, n_ctx=0), "n_ctx must be an integer >= 1"),
        (lambda: lstm_group_model(1), "m must be an integer >= 2"),
        (lambda: lstm_group_model(3, gate_scale=-1.0), "gate_scale must be positive"),
        (lambda: permutation_state(120), "element must be an integer in 0..119"),
    ],
)
def test_bad_input_is_refused_in_one_line(call, match):
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_sequences_longer_than_n_ctx_are_refused_and_n_ctx_can_be_raised():
    model = dense_ssm_group_model("zm", 2, n_ctx=10)
    with pytest.raises(ValueError, match="exceeds n_ctx=10"):
        model(random_tokens(2, 1, 10, seed=0))
    check_exact(
        dense_ssm_group_model("zm", 2, n_ctx=6000), "zm", 2, random_tokens(2, 1, 5000, seed=0)
    )
