"""Tests of mechlab.prune.masks: the hard-concrete sample, its gradient, the closed-form L0,
the deterministic mask, the sparsity schedule and the bisection threshold."""

from __future__ import annotations

import math

import pytest
import torch

from mechlab.prune import masks as hc


def test_constants_are_the_papers():
    assert hc.BETA == pytest.approx(2 / 3)
    assert (hc.LIMIT_LEFT, hc.LIMIT_RIGHT) == (-0.1, 1.1)
    for mean in (None, 10.0):  # ours (5) and the paper's (10)
        la = hc.init_log_alpha(20000, torch.Generator().manual_seed(0), mean)
        assert la.mean().item() == pytest.approx(mean or 5.0, abs=1e-3)
        assert la.std().item() == pytest.approx(0.01, rel=0.05)
        # fully open at initialisation
        assert bool((hc.deterministic_mask(la) == 1).all())
        assert hc.expected_sparsity(la).item() < 2e-3


def test_sample_formula():
    la = torch.tensor([0.3, -1.0, 2.0])
    u = torch.tensor([0.2, 0.7, 0.5])
    s = torch.sigmoid((torch.log(u) - torch.log(1 - u) + la) / (2 / 3))
    expected = (s * 1.2 - 0.1).clamp(0, 1)
    assert torch.allclose(hc.sample_mask(la, u), expected, atol=1e-7)


def test_gradcheck_sample_in_float64():
    # fixed noise, log_alpha values that keep every sample strictly inside (0, 1)
    la = torch.tensor([-0.5, 0.0, 0.4, 1.0], dtype=torch.float64, requires_grad=True)
    u = torch.tensor([0.6, 0.45, 0.3, 0.2], dtype=torch.float64)
    z = hc.sample_mask(la, u)
    assert bool(((z > 0) & (z < 1)).all())
    assert torch.autograd.gradcheck(lambda a: hc.sample_mask(a, u), (la,))
    # and the closed-form expected sparsity
    assert torch.autograd.gradcheck(lambda a: hc.expected_sparsity(a), (la,))


def test_clamped_samples_have_zero_gradient():
    la = torch.tensor([10.0, -10.0], requires_grad=True)
    z = hc.sample_mask(la, torch.tensor([0.5, 0.5]))
    assert z.tolist() == [1.0, 0.0]
    z.sum().backward()
    assert la.grad.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("log_alpha", [-3.0, -1.0, 0.0, 1.5])
def test_closed_form_l0_matches_monte_carlo(log_alpha):
    g = torch.Generator().manual_seed(1)
    n = 400_000
    z = hc.sample_mask(
        torch.full((n,), log_alpha, dtype=torch.float64), hc.uniform_noise(n, g, torch.float64)
    )
    empirical = (z > 0).double().mean().item()
    closed = hc.prob_nonzero(torch.tensor(log_alpha)).item()
    assert empirical == pytest.approx(closed, abs=4e-3)
    assert closed == pytest.approx(
        1 / (1 + math.exp(-(log_alpha - (2 / 3) * math.log(0.1 / 1.1)))), rel=1e-6
    )


def test_deterministic_mask_is_monotone_and_clamped():
    la = torch.linspace(-8, 8, 101)
    det = hc.deterministic_mask(la)
    assert bool((det[1:] >= det[:-1]).all())
    assert det[0].item() == 0.0 and det[-1].item() == 1.0
    assert hc.deterministic_mask(torch.tensor(0.0)).item() == pytest.approx(0.5)


def test_target_schedule_is_linear_then_flat():
    assert hc.target_schedule(0, 0.9, 100) == 0.0
    assert hc.target_schedule(50, 0.9, 100) == pytest.approx(0.45)
    assert hc.target_schedule(100, 0.9, 100) == pytest.approx(0.9)
    assert hc.target_schedule(500, 0.9, 100) == pytest.approx(0.9)
    assert hc.target_schedule(3, 0.9, 0) == 0.9


def test_bisection_keeps_exactly_the_requested_count():
    scores = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    for n_keep in (0, 1, 7, 500, 999, 1000):
        tau = hc.bisect_threshold(scores, n_keep)
        assert int((scores.double() >= tau).sum()) == n_keep
    eligible = torch.arange(1000) % 2 == 0
    tau = hc.bisect_threshold(scores, 100, eligible)
    assert int(((scores.double() >= tau) & eligible).sum()) == 100


def test_bisection_with_ties_never_keeps_more():
    scores = torch.tensor([3.0, 3.0, 3.0, 1.0, 0.0], dtype=torch.float64)  # compare in float64
    tau = hc.bisect_threshold(scores, 2)
    assert int((scores >= tau).sum()) == 0  # the three tied items cannot be split
    assert int((scores >= hc.bisect_threshold(scores, 4)).sum()) == 4
    assert hc.keep_count(1000, 0.95) == 50
