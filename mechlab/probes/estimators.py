"""Linear probes shaped like scikit-learn estimators.

:class:`ClassifierProbe` (logistic regression) and :class:`RegressorProbe` (ridge) are
a :class:`~sklearn.preprocessing.StandardScaler` followed by the linear model, wrapped so
that they accept torch tensors as well as numpy arrays. They follow scikit-learn's
conventions: hyperparameters are stored verbatim by ``__init__`` and checked in ``fit``,
learned attributes end in ``_``, and they work with ``clone``, ``Pipeline``,
``GridSearchCV`` and ``cross_val_score``.

``coef_`` and ``intercept_`` are those of the whole probe *in the input space* (the
scaler folded in), so ``X @ coef_.T + intercept_`` is the probe's decision function and
``coef_`` a direction in, e.g., the residual stream.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data


def to_numpy(values: Any) -> Any:
    """A torch tensor as a numpy array (detached, on the CPU); anything else unchanged."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return values


def _check_positive(name: str, value: Any) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


class _LinearProbe(BaseEstimator, ABC):
    """Shared machinery: a scaler + linear model pipeline, coefficients in input space."""

    @abstractmethod
    def _make_model(self) -> BaseEstimator:
        """The unfitted linear model (LogisticRegression, Ridge) with this probe's settings."""

    def _check_params(self) -> None:
        _check_flag("standardize", self.standardize)

    def _fit(self, X: Any, y: Any, multi_output: bool) -> tuple[np.ndarray, np.ndarray]:
        self._check_params()
        X, y = validate_data(
            self, to_numpy(X), to_numpy(y), multi_output=multi_output, y_numeric=multi_output
        )
        scaler = StandardScaler() if self.standardize else "passthrough"
        self.pipeline_: Pipeline = make_pipeline(scaler, self._make_model())
        return X, y

    def _fold_coefficients(self) -> None:
        """``coef_`` / ``intercept_`` of the linear model with the scaler folded in."""
        model = self.pipeline_[-1]
        coef, intercept = model.coef_, model.intercept_
        if self.standardize:
            scaler = self.pipeline_[0]
            coef = coef / scaler.scale_  # [.., n_features]
            intercept = intercept - coef @ scaler.mean_
        self.coef_ = np.asarray(coef)
        self.intercept_ = intercept

    def _transform_input(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return validate_data(self, to_numpy(X), reset=False)


class ClassifierProbe(ClassifierMixin, _LinearProbe):
    """A linear classification probe: standardisation + multinomial logistic regression.

    Args:
        C: Inverse strength of the L2 penalty (``LogisticRegression(C=...)``).
        standardize: Scale every feature to zero mean and unit variance first.
        class_weight: ``None`` or ``"balanced"`` (or a dict), as in ``LogisticRegression``.
        max_iter: Iterations of the L-BFGS solver.

    Attributes:
        classes_: ``[n_classes]`` the labels seen in ``fit``.
        coef_: ``[1 or n_classes, n_features]`` weights in the input space.
        intercept_: ``[1 or n_classes]`` biases in the input space.
        n_features_in_: Features seen in ``fit``.
        n_iter_: Solver iterations ``LogisticRegression`` ran.
        pipeline_: The fitted scaler + ``LogisticRegression`` pipeline.
    """

    def __init__(
        self,
        C: float = 1.0,
        standardize: bool = True,
        class_weight: dict | str | None = None,
        max_iter: int = 1000,
    ):
        self.C = C
        self.standardize = standardize
        self.class_weight = class_weight
        self.max_iter = max_iter

    def _make_model(self) -> LogisticRegression:
        return LogisticRegression(C=self.C, class_weight=self.class_weight, max_iter=self.max_iter)

    def _check_params(self) -> None:
        super()._check_params()
        _check_positive("C", self.C)
        if (
            not isinstance(self.max_iter, int)
            or isinstance(self.max_iter, bool)
            or self.max_iter <= 0
        ):
            raise ValueError(f"max_iter must be a positive integer, got {self.max_iter!r}")

    def fit(self, X: Any, y: Any) -> ClassifierProbe:
        """Fit the probe.

        Args:
            X: ``[n_samples, n_features]`` activations (numpy array or torch tensor).
            y: ``[n_samples]`` class labels (at least two distinct ones).

        Returns:
            self.
        """
        X, y = self._fit(X, y, multi_output=False)
        check_classification_targets(y)
        self.pipeline_.fit(X, y)
        self.classes_ = self.pipeline_.classes_
        self.n_iter_ = self.pipeline_[-1].n_iter_
        self._fold_coefficients()
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        """Logits: ``[n_samples]`` (two classes) or ``[n_samples, n_classes]``."""
        X = self._transform_input(X)
        return self.pipeline_.decision_function(X)

    def predict_proba(self, X: Any) -> np.ndarray:
        """``[n_samples, n_classes]`` class probabilities, columns in ``classes_`` order."""
        X = self._transform_input(X)
        return self.pipeline_.predict_proba(X)

    def predict(self, X: Any) -> np.ndarray:
        """``[n_samples]`` predicted labels."""
        X = self._transform_input(X)
        return self.pipeline_.predict(X)


class RegressorProbe(RegressorMixin, _LinearProbe):
    """A linear regression probe: standardisation + ridge regression (one or many outputs).

    ``score`` is the coefficient of determination R^2, averaged uniformly over outputs.

    Args:
        alpha: Strength of the L2 penalty (``Ridge(alpha=...)``, on the standardised inputs).
        standardize: Scale every feature to zero mean and unit variance first.

    Attributes:
        coef_: ``[n_features]`` (1-D ``y``) or ``[n_outputs, n_features]`` in input space.
        intercept_: A float (1-D ``y``) or ``[n_outputs]``.
        n_features_in_: Features seen in ``fit``.
        pipeline_: The fitted scaler + ``Ridge`` pipeline.
    """

    def __init__(self, alpha: float = 1.0, standardize: bool = True):
        self.alpha = alpha
        self.standardize = standardize

    def _make_model(self) -> Ridge:
        return Ridge(alpha=self.alpha)

    def _check_params(self) -> None:
        super()._check_params()
        _check_positive("alpha", self.alpha)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def fit(self, X: Any, y: Any) -> RegressorProbe:
        """Fit the probe.

        Args:
            X: ``[n_samples, n_features]`` activations (numpy array or torch tensor).
            y: ``[n_samples]`` or ``[n_samples, n_outputs]`` targets.

        Returns:
            self.
        """
        X, y = self._fit(X, y, multi_output=True)
        self.pipeline_.fit(X, y)
        self._fold_coefficients()
        return self

    def predict(self, X: Any) -> np.ndarray:
        """``[n_samples]`` or ``[n_samples, n_outputs]`` predictions."""
        X = self._transform_input(X)
        return self.pipeline_.predict(X)
