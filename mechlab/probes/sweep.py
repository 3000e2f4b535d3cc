"""Probe sweeps over hooks x positions, with a random-model and a control-task baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from sklearn.base import BaseEstimator, clone, is_classifier
from sklearn.model_selection import GroupKFold, cross_val_score
from threadpoolctl import threadpool_limits
from torch import Tensor
from transformer_lens import HookedRootModule

from mechlab.models.base import ModelConfig
from mechlab.models.registry import build_model
from mechlab.probes.activations import check_hooks, collect_activations, position_dim
from mechlab.probes.estimators import ClassifierProbe, RegressorProbe
from mechlab.probes.targets import (
    control_task,
    probe_positions,
    recall_targets,
    target_spec,
)
from mechlab.progress import tqdm
from mechlab.tasks.nih import NiH

VALUES = ("score", "selectivity", "random_model_score", "control_score")


@dataclass
class ProbeSweep:
    """Cross-validated probe scores over hooks x positions, with their controls.

    Scores are accuracy (classification) or R^2 (regression) on held-out systems, averaged
    over the folds of a split by system.

    Attributes:
        target: The probed target.
        metric: ``"accuracy"`` or ``"r2"``.
        hooks: Row labels.
        positions: Column labels (input positions).
        query_position: The query label's position ``p`` of the traces.
        scores: ``[n_hooks, n_positions]`` mean score over folds.
        score_std: ``[n_hooks, n_positions]`` their standard deviation over folds.
        control_scores: The same probe on the control task.
        random_model_scores: The same probe on a randomly initialised model (None if skipped).
        chance: ``[n_positions]`` majority-class frequency (accuracy) or 0 (R^2).
        n_samples: Samples per probe (traces).
    """

    target: str
    metric: str
    hooks: list[str]
    positions: list[int]
    query_position: int
    scores: np.ndarray  # [hook, pos]
    score_std: np.ndarray  # [hook, pos]
    control_scores: np.ndarray  # [hook, pos]
    random_model_scores: np.ndarray | None  # [hook, pos]
    chance: np.ndarray  # [pos]
    n_samples: int

    @property
    def selectivity(self) -> np.ndarray:
        """``[n_hooks, n_positions]`` score minus control-task score."""
        return self.scores - self.control_scores

    def to_dataframe(self) -> Any:
        """One row per (hook, position): score, its std, the control scores, selectivity.

        Returns:
            A ``pandas.DataFrame``.
        """
        random = self.random_model_scores
        rows = [
            {
                "target": self.target,
                "metric": self.metric,
                "hook": hook,
                "position": pos,
                "score": self.scores[h, j],
                "score_std": self.score_std[h, j],
                "random_model_score": np.nan if random is None else random[h, j],
                "control_score": self.control_scores[h, j],
                "selectivity": self.selectivity[h, j],
                "chance": self.chance[j],
                "n_samples": self.n_samples,
            }
            for h, hook in enumerate(self.hooks)
            for j, pos in enumerate(self.positions)
        ]
        return pd.DataFrame(rows)

    def plot(self, value: str = "score") -> go.Figure:
        """Heatmap of one value over hooks (rows) x positions (columns).

        Args:
            value: ``"score"``, ``"selectivity"``, ``"random_model_score"`` or
                ``"control_score"``.

        Returns:
            A plotly figure.
        """
        if value not in VALUES:
            raise ValueError(f"unknown value {value!r}; choose one of {list(VALUES)}")
        z = {"score": self.scores, "selectivity": self.selectivity,
             "control_score": self.control_scores,
             "random_model_score": self.random_model_scores}[value]  # fmt: skip
        if z is None:
            raise ValueError("this sweep ran without the random-model control (random_model=False)")
        fig = go.Figure(
            go.Heatmap(
                z=z, x=[str(p) for p in self.positions], y=self.hooks, colorscale="Viridis",
                colorbar={"title": self.metric}, hovertemplate="%{y}<br>position %{x}<br>%{z:.3f}",
            )
        )  # fmt: skip
        fig.update_layout(
            title=f"{self.target}: {value} ({self.metric}; query label at {self.query_position})",
            xaxis_title="input position",
            yaxis={"title": "hook", "autorange": "reversed", "tickmode": "array", "tickvals": self.hooks,
                   "ticktext": self.hooks, "automargin": True},
            height=int(max(450, 17 * len(self.hooks) + 180)),
        )  # fmt: skip
        return fig


def default_hooks(model: HookedRootModule) -> list[str]:
    """The residual stream: ``blocks.0.hook_resid_pre`` and every ``hook_resid_post``.

    Raises:
        ValueError: A model without these hooks (e.g. ``mechlab.hooked(module)``).
    """
    names = [
        name
        for name in model.hook_dict
        if name == "blocks.0.hook_resid_pre" or name.endswith("hook_resid_post")
    ]
    if not names:
        raise ValueError("this model has no residual-stream hooks; pass hooks=[...] by name")
    return names


def random_twin(model: HookedRootModule, seed: int = 0) -> HookedRootModule:
    """A randomly initialised model of the same config, on the same device, in eval mode.

    Args:
        model: A mechlab model (it has a ``cfg``).
        seed: Seed of the initialisation (the global RNG state is left as it was).

    Raises:
        ValueError: A model without a mechlab config.
    """
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise ValueError("the random-model control needs a mechlab model; pass random_model=False")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        twin = build_model(cfg)
    return twin.to(next(model.parameters()).device).eval()


def _features(acts: dict[str, Tensor], model: HookedRootModule, hook: str) -> Tensor:
    """``[batch, n_positions, n_features]``: position axis to dim 1, the rest flattened."""
    act = acts[hook].movedim(position_dim(model, hook), 1)
    return act.flatten(2).float()


def _cv(probe: BaseEstimator, X: Tensor, y: Tensor, groups: Tensor, cv: Any) -> np.ndarray:
    # A probe's fit is a small problem: multi-threaded BLAS only adds overhead (8x slower
    # measured for 240 x 16 logistic regressions on 2 cores).
    with threadpool_limits(limits=1, user_api="blas"):
        return cross_val_score(clone(probe), X.numpy(), y.numpy(), groups=groups.numpy(), cv=cv)


def probe_sweep(
    model: HookedRootModule,
    traces: NiH,
    target: str,
    hooks: str | Sequence[str] | None = None,
    positions: int | Sequence[int] | Tensor | None = None,
    *,
    probe: BaseEstimator | None = None,
    cv: int | Any = 5,
    random_model: bool = True,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool = True,
) -> ProbeSweep:
    """Fit a probe for ``target`` at every (hook, position) and score it on held-out systems.

    Beside every score: the same probe on a randomly initialised model of the same config
    (``build_model(model.cfg)`` under ``seed``) and on the Hewitt-Liang control task
    (:func:`~mechlab.probes.targets.control_task`), and the selectivity (score minus
    control-task score).

    Args:
        model: The model (on ``traces.clean``).
        traces: Needle-in-a-haystack traces (:func:`mechlab.nih`).
        target: ``"query_system"``, ``"open_label"``, ``"state"`` or ``"next_state"``.
        hooks: Hook names; default the residual stream (:func:`default_hooks`).
        positions: Input positions; default where the target is defined (``query_system``:
            from the query label on).
        probe: An unfitted estimator; default :class:`ClassifierProbe` or
            :class:`RegressorProbe` according to the target.
        cv: Number of ``GroupKFold`` folds (split by system), or any splitter that takes
            ``groups``.
        random_model: Also probe a randomly initialised twin of the model.
        seed: Seed of the random model and of the control task.
        batch_size: Traces per forward pass.
        progress: Show progress bars.

    Returns:
        The :class:`ProbeSweep`.

    Raises:
        ValueError: Unknown target or hooks, positions where the target is undefined, a
            probe of the wrong kind, or ``cv`` below 2.
    """
    spec = target_spec(target)
    classify = spec.kind == "classification"
    probe = (ClassifierProbe() if classify else RegressorProbe()) if probe is None else probe
    if is_classifier(probe) != classify:
        raise ValueError(f"target {target!r} is {spec.kind}; give a probe of that kind")
    if isinstance(cv, int) and not isinstance(cv, bool):
        if cv < 2:
            raise ValueError(f"cv must be at least 2 folds, got {cv}")
        cv = GroupKFold(n_splits=cv)
    hooks = default_hooks(model) if hooks is None else check_hooks(model, hooks)
    positions = probe_positions(traces, target, positions)
    y, groups = recall_targets(traces, target, positions)  # [batch, n_pos(, d_state)]
    y_control = control_task(y.flatten(0, 1), groups.flatten(), seed).view_as(y)
    if classify:
        chance = np.array([np.bincount(col).max() / len(col) for col in y.T.numpy()])
    else:
        chance = np.zeros(len(positions))

    models = {"score": model}
    if random_model:
        models["random"] = random_twin(model, seed)
    features = {}  # model -> hook -> [batch, n_positions, n_features]
    for name, m in models.items():
        acts = collect_activations(m, traces.clean, hooks, positions, batch_size, progress)
        features[name] = {hook: _features(acts, m, hook) for hook in hooks}
    shape = (len(hooks), len(positions))
    out = {key: np.full(shape, np.nan) for key in ("score", "std", "control", "random")}
    cells = [(h, j) for h in range(len(hooks)) for j in range(len(positions))]
    for h, j in tqdm(cells, desc=f"probes ({target})", disable=not progress):
        X = features["score"][hooks[h]][:, j]  # [batch, n_features]
        fold_scores = _cv(probe, X, y[:, j], groups[:, j], cv)
        out["score"][h, j], out["std"][h, j] = fold_scores.mean(), fold_scores.std()
        out["control"][h, j] = _cv(probe, X, y_control[:, j], groups[:, j], cv).mean()
        if random_model:
            X_random = features["random"][hooks[h]][:, j]
            out["random"][h, j] = _cv(probe, X_random, y[:, j], groups[:, j], cv).mean()
    return ProbeSweep(
        target=target,
        metric="accuracy" if classify else "r2",
        hooks=list(hooks),
        positions=positions,
        query_position=traces.query_position,
        scores=out["score"],
        score_std=out["std"],
        control_scores=out["control"],
        random_model_scores=out["random"] if random_model else None,
        chance=chance,
        n_samples=len(traces),
    )
