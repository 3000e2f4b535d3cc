"""ClassifierProbe and RegressorProbe: planted directions found, sklearn conventions, coefficients in the input space."""

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.decomposition import PCA
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, GroupKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import check_estimator

from mechlab.probes import (
    ClassifierProbe,
    RegressorProbe,
)


def planted(n: int, d: int, seed: int, strength: float) -> tuple[np.ndarray, ...]:
    """``(X, y, u)``: Gaussian activations moved by +-strength along a random unit vector u."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    y = rng.integers(0, 2, size=n)
    X = rng.normal(size=(n, d)) + strength * (2 * y[:, None] - 1) * u
    return X, y, u


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_probe_finds_a_planted_direction_and_nothing_where_it_is_absent(seed):
    X, y, u = planted(400, 32, seed, strength=2.0)
    groups = np.arange(400) // 4
    cv = GroupKFold(n_splits=4)
    found = cross_val_score(ClassifierProbe(), X, y, groups=groups, cv=cv).mean()
    absent = cross_val_score(ClassifierProbe(), X - (X @ u)[:, None] * u, y, groups=groups, cv=cv)
    assert found > 0.95  # Bayes accuracy Phi(2) = 0.977
    assert absent.mean() < 0.62  # chance 0.5, 100 test samples per fold
    coef = ClassifierProbe().fit(X, y).coef_[0]
    # the probe's direction is the planted one (measured cosines 0.89-0.91; the other 31
    # dimensions pick up finite-sample noise)
    assert coef @ u / np.linalg.norm(coef) > 0.85


def test_probes_follow_sklearn_conventions():
    X, y, _ = planted(120, 6, 0, strength=1.5)
    for probe in (ClassifierProbe(C=0.5), RegressorProbe(alpha=2.0)):
        assert not hasattr(probe, "coef_") and not hasattr(probe, "n_features_in_")
        with pytest.raises(NotFittedError):
            probe.predict(X)
        twin = clone(probe)
        assert twin.get_params() == probe.get_params() and twin is not probe
        twin.set_params(standardize=False)
        assert twin.get_params()["standardize"] is False and probe.standardize is True
        probe.fit(X, y)
        assert probe.n_features_in_ == 6 and probe.coef_.shape[-1] == 6
        with pytest.raises(ValueError, match="features"):
            probe.predict(X[:, :5])
    assert list(ClassifierProbe().fit(X, y).classes_) == [0, 1]
    # inside a Pipeline, a grid search and a cross-validation
    pipe = make_pipeline(PCA(n_components=4), ClassifierProbe())
    assert cross_val_score(pipe, X, y, cv=3).mean() > 0.7
    grid = GridSearchCV(ClassifierProbe(), {"C": [0.01, 1.0]}, cv=3).fit(X, y)
    assert grid.best_params_["C"] in (0.01, 1.0)


def test_hyperparameters_are_stored_verbatim_and_checked_in_fit():
    X, y, _ = planted(40, 3, 0, strength=1.0)
    probe = ClassifierProbe(C=-1.0)  # no error at construction (sklearn convention)
    assert probe.C == -1.0
    with pytest.raises(ValueError, match="C must be a positive finite number"):
        probe.fit(X, y)
    with pytest.raises(ValueError, match="alpha must be"):
        RegressorProbe(alpha=0).fit(X, y.astype(float))
    with pytest.raises(ValueError, match="standardize must be True or False"):
        RegressorProbe(standardize="yes").fit(X, y.astype(float))
    with pytest.raises(ValueError, match="max_iter"):
        ClassifierProbe(max_iter=0).fit(X, y)
    with pytest.raises(ValueError, match="class"):
        ClassifierProbe().fit(X, np.zeros(40))  # one class


@pytest.mark.parametrize("standardize", [True, False])
def test_coefficients_live_in_the_input_space(standardize):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 5)) * [1, 10, 0.1, 3, 1] + [5, -2, 0, 1, 7]
    y3 = rng.integers(0, 3, 80)
    clf = ClassifierProbe(standardize=standardize).fit(X, y3)
    np.testing.assert_allclose(
        X @ clf.coef_.T + clf.intercept_, clf.decision_function(X), atol=1e-8
    )
    Y = X @ rng.normal(size=(5, 2)) + rng.normal(size=(80, 2))
    reg = RegressorProbe(standardize=standardize).fit(X, Y)
    np.testing.assert_allclose(X @ reg.coef_.T + reg.intercept_, reg.predict(X), atol=1e-8)
    # a torch tensor is accepted and gives the same fit as the numpy array
    reg_t = RegressorProbe(standardize=standardize).fit(torch.tensor(X), torch.tensor(Y))
    np.testing.assert_allclose(reg_t.coef_, reg.coef_)
    np.testing.assert_allclose(reg_t.predict(torch.tensor(X)), reg.predict(X))


def test_regressor_probe_recovers_a_planted_linear_map():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 8))
    W = rng.normal(size=(3, 8))
    Y = X @ W.T + 0.5 + 0.01 * rng.normal(size=(300, 3))
    reg = RegressorProbe(alpha=1e-3).fit(X, Y)
    np.testing.assert_allclose(reg.coef_, W, atol=0.01)
    np.testing.assert_allclose(reg.intercept_, 0.5, atol=0.01)
    assert reg.score(X, Y) > 0.999


@pytest.mark.parametrize("probe", [ClassifierProbe(), RegressorProbe()], ids=type)
def test_sklearn_check_estimator_passes(probe):
    """Every check of scikit-learn's check_estimator (55 for the classifier, 52 for the
    regressor; only check_array_api_input is skipped: array_api_compat is not installed)."""
    results = check_estimator(probe, on_fail=None, on_skip=None)
    failed = [r["check_name"] for r in results if r["status"] == "failed"]
    assert not failed
    assert sum(r["status"] == "passed" for r in results) >= 50
