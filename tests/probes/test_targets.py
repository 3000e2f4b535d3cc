"""Probe targets on NiH traces (recall_targets, probe_positions) and control tasks."""

import numpy as np
import pytest
import torch
from sklearn.model_selection import GroupKFold

from mechlab.probes import (
    TARGETS,
    control_task,
    probe_positions,
    recall_targets,
)
from mechlab.tasks import OBS
from tests.probes.helpers import N, S, traces


def test_recall_targets_by_hand():
    t = traces(16, seed=3)
    B = torch.arange(len(t))
    p = t.query_position
    y, groups = recall_targets(t, "query_system", [p, p + 2])
    assert (y == t.query[:, None]).all()
    assert (groups == t.systems[B, t.query][:, None]).all()
    # open_label: in haystack segment h, the label of slot h; in the query segment, the query's
    positions = probe_positions(t, "open_label")
    y, groups = recall_targets(t, "open_label", positions)
    for j, i in enumerate(positions):
        h = (i - 1) // (S + 2)
        slot = t.query if h == N else torch.full_like(t.query, h)
        assert (y[:, j] == t.slot_labels[B, slot]).all() and (
            groups[:, j] == t.systems[B, slot]
        ).all()
    # state at i is the target of position i - 1; next_state at i is the target of i
    obs = probe_positions(t, "state")
    assert obs == (t.clean_batch.kind[0, : t.n_pos] == OBS).nonzero().flatten().tolist()
    y, _ = recall_targets(t, "state", obs)
    torch.testing.assert_close(y, t.truth[:, [i - 1 for i in obs]])
    nxt = probe_positions(t, "next_state")
    assert p in nxt and all(t.observed[:, i].all() for i in nxt)
    y, groups = recall_targets(t, "next_state", nxt)
    torch.testing.assert_close(y, t.truth[:, nxt])
    assert (groups[:, nxt.index(p)] == t.systems[B, t.query]).all()  # 1-after: the query system


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_group_splits_never_share_a_system(name):
    t = traces(120, seed=1)
    y, groups = recall_targets(t, name)
    X = np.zeros((len(t), 1))
    for train, test in GroupKFold(n_splits=5).split(X, groups=groups[:, 0].numpy()):
        assert not set(groups[train, 0].tolist()) & set(groups[test, 0].tolist())


def test_targets_reject_bad_input():
    t = traces(4)
    with pytest.raises(
        ValueError, match=r"unknown probe target 'query'; known targets: \['next_state'"
    ):
        recall_targets(t, "query")
    with pytest.raises(ValueError, match="defined only at observation tokens; not at positions"):
        recall_targets(t, "state", [0, 1])  # start and open tokens
    with pytest.raises(ValueError, match="not at positions"):
        recall_targets(t, "open_label", [S + 2])  # a close token
    with pytest.raises(ValueError, match="need mechlab.nih"):
        recall_targets(t.clean_batch, "state")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_control_task_is_a_fixed_random_target_per_type(seed):
    g = torch.Generator().manual_seed(seed)
    types = torch.randint(0, 2000, (20000,), generator=g)
    y = torch.multinomial(torch.tensor([0.6, 0.3, 0.1]), 20000, replacement=True, generator=g)
    control = control_task(y, types, seed)
    for value in types.unique()[:50]:
        assert control[types == value].unique().numel() == 1  # one label per type
    freq = torch.bincount(control, minlength=3).float() / len(y)  # 2000 types: std ~0.011
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.05, rtol=0)
    assert not torch.equal(control_task(y, types, seed + 10), control)
    states = torch.randn(len(y), 3, generator=g)
    vectors = control_task(states, types, seed)
    for value in types.unique()[:20]:
        rows = vectors[types == value]
        assert (rows == rows[0]).all()
        assert (states == rows[0]).all(-1).any()  # a target that occurs in the data
    with pytest.raises(ValueError, match="types must be"):
        control_task(y, types[:10])
