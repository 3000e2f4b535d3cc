"""The groups of the state-tracking task (mechlab.tasks.state_tracking_groups): the S_5
numbering and composition order, and states against plain-Python group arithmetic."""

import itertools

import numpy as np

from mechlab.tasks.state_tracking import StateTrackingConfig
from mechlab.tasks.state_tracking_groups import S5_PERMUTATIONS, compose, identity, states_of


def _perm_states(xs):
    """S_5 states with permutations as numpy arrays: s_t = x_t o s_{t-1}, s_t[i] = x_t[s_{t-1}[i]]."""
    perms = [np.array(p) for p in itertools.permutations(range(5))]
    s = np.arange(5)
    out = []
    for x in xs:
        s = perms[x][s]
        out.append(next(k for k, p in enumerate(perms) if (p == s).all()))
    return out


def test_s5_numbering_and_composition_order():
    assert len(S5_PERMUTATIONS) == 120 and S5_PERMUTATIONS[0] == (0, 1, 2, 3, 4)
    assert S5_PERMUTATIONS[1] == (0, 1, 2, 4, 3) and S5_PERMUTATIONS[119] == (4, 3, 2, 1, 0)
    assert identity("s5") == 0 and identity("zm") == 0
    # a = the 3-cycle 0->1->2->0, b = the swap (0 1): a o b maps 0 -> a[b[0]] = a[1] = 2
    a = S5_PERMUTATIONS.index((1, 2, 0, 3, 4))
    b = S5_PERMUTATIONS.index((1, 0, 2, 3, 4))
    assert S5_PERMUTATIONS[compose("s5", a, b)] == (2, 1, 0, 3, 4)
    assert S5_PERMUTATIONS[compose("s5", b, a)] == (0, 2, 1, 3, 4)  # S_5 is not abelian
    for x in (a, b, 57):
        assert compose("s5", x, 0) == x == compose("s5", 0, x)
    assert compose("zm", 3, 4, m=5) == 2


def test_labels_against_plain_python():
    rng = np.random.default_rng(0)
    cfg = StateTrackingConfig(group="s5", L=5)
    xs = rng.integers(0, 120, size=(40, 9))
    got = states_of(cfg, xs)
    for row, want in zip(xs, got, strict=True):
        assert _perm_states(row) == want.tolist()
    cfg = StateTrackingConfig(group="zm", m=7)
    xs = rng.integers(0, 7, size=(40, 9))
    assert (states_of(cfg, xs) == np.cumsum(xs, axis=1) % 7).all()
