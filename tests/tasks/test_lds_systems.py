"""Tests of the recall task's systems (mechlab.tasks.lds_systems): orthogonal, Haar-distributed,
seeded and disjoint libraries, trajectories equal to plain float64 iteration ``x <- U x``."""

from __future__ import annotations

import pytest
import torch

from mechlab.tasks.lds import LDSConfig
from mechlab.tasks.lds_systems import SystemLibrary, haar_orthogonal, make_libraries
from tests.tasks.test_lds import SMALL, gen


@pytest.fixture(scope="module")
def default_libs():
    return make_libraries(LDSConfig())


@pytest.fixture(scope="module")
def small_libs():
    return make_libraries(LDSConfig(**SMALL))


def test_library_orthogonal_and_x0(default_libs):
    for lib in default_libs:
        U = lib.U.double()
        eye = torch.eye(5, dtype=torch.float64)
        assert (U.transpose(1, 2) @ U - eye).abs().max() < 1e-5
        assert (U @ U.transpose(1, 2) - eye).abs().max() < 1e-5
    train, test = default_libs
    assert train.U.shape == (40000, 5, 5) and test.U.shape == (100, 5, 5)
    # x0 ~ N(0, I/5): E||x0||^2 = 1, per-coordinate variance 1/5
    sq = train.x0.double().pow(2)
    assert abs(sq.sum(-1).mean().item() - 1.0) < 0.02
    assert (sq.mean(0) - 0.2).abs().max() < 0.01
    assert train.x0.double().mean(0).abs().max() < 0.01


def test_haar_statistics():
    # Haar on O(d): E[tr U] = 0, E[tr(U)^2] = 1, E[U_ij] = 0, E[U_ij^2] = 1/d, det = +-1
    # with equal probability. QR without the sign fix fails the first three.
    U = haar_orthogonal(40000, 5, gen(11))
    tr = U.diagonal(dim1=-2, dim2=-1).sum(-1)
    assert abs(tr.mean().item()) < 0.03
    assert abs(tr.pow(2).mean().item() - 1.0) < 0.05
    assert U.mean(0).abs().max() < 0.01
    assert (U.pow(2).mean(0) - 0.2).abs().max() < 0.01
    det = torch.linalg.det(U)
    assert (det.abs() - 1).abs().max() < 1e-9
    assert abs((det > 0).double().mean().item() - 0.5) < 0.02


def test_train_test_disjoint_and_seeded(default_libs):
    train, test = default_libs
    dist = torch.cdist(test.U.reshape(100, -1).double(), train.U.reshape(40000, -1).double())
    assert dist.min() > 1e-2
    again = make_libraries(LDSConfig())
    assert torch.equal(again[0].U, train.U) and torch.equal(again[1].x0, test.x0)
    other = make_libraries(LDSConfig(seed=1, n_train_systems=25, n_test_systems=5))
    assert not torch.allclose(other[0].U, train.U[:25])


def test_library_trajectories_match_iteration(small_libs):
    lib = small_libs[0]
    ids = torch.tensor([0, 7, 42])
    traj = lib.trajectories(ids, 30)
    for row, i in enumerate(ids.tolist()):
        x = lib.x0[i].double()
        for t in range(30):
            assert torch.allclose(traj[row, t], x, atol=1e-12)
            x = lib.U[i].double() @ x


def test_library_validation():
    with pytest.raises(ValueError, match="U must be"):
        SystemLibrary(U=torch.zeros(3, 4, 5), x0=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="x0 must be"):
        SystemLibrary(U=torch.zeros(3, 4, 4), x0=torch.zeros(3, 5))
