"""The labelled result of a patching sweep: values per (component, position)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go
from torch import Tensor

from mechlab._deprecated import moved_names
from mechlab.models.names import graph_name
from mechlab.patching.grid import DIRECTIONS, Component, Position

PATCH_KINDS = ("activation", "path", "attribution")
"""The kinds of patching a :class:`PatchResult` holds (its ``method``); not circuit methods
(:data:`mechlab.circuit_methods.METHODS`). Was ``METHODS`` (deprecated alias until 0.2.0)."""


def component_label(component: Component) -> str:
    """``"blocks.0.attn.hook_result"`` or, with a head, ``"blocks.0.attn.hook_result[3]"``."""
    hook, head = component
    return hook if head is None else f"{hook}[{head}]"


@dataclass
class PatchResult:
    """Metric of the patched runs over a grid of components x positions.

    Args:
        values: ``[component, pos]`` metric of each patched run (attribution: the
            first-order estimate of it, ``base metric + attribution``).
        components: One ``(hook, head)`` per row; ``head`` is None for hooks without a
            head axis or patched over all heads at once.
        positions: One label per column: a position, or ``"all"``.
        clean_metric: The metric of the unpatched clean run.
        corrupted_metric: The metric of the unpatched corrupted run.
        direction: ``"denoise"`` (corrupted run, clean activations patched in) or
            ``"noise"`` (clean run, corrupted activations patched in).
        method: ``"activation"``, ``"path"`` or ``"attribution"``.
        meta: Free-form details (e.g. the receivers of a path patch).
    """

    values: Tensor  # [component, pos]
    components: list[Component]
    positions: list[Position]
    clean_metric: float
    corrupted_metric: float
    direction: str = "denoise"
    method: str = "activation"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        expected = (len(self.components), len(self.positions))
        if self.values.dim() != 2 or tuple(self.values.shape) != expected:
            raise ValueError(
                f"values must be [component, pos] = {list(expected)}, got {list(self.values.shape)}"
            )
        if self.direction not in DIRECTIONS:
            raise ValueError(f"unknown direction {self.direction!r}; choose one of {list(DIRECTIONS)}")
        if self.method not in PATCH_KINDS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {list(PATCH_KINDS)}")

    @property
    def labels(self) -> list[str]:
        """Row labels, e.g. ``"blocks.1.attn.hook_result[2]"``."""
        return [component_label(c) for c in self.components]

    @property
    def base_metric(self) -> float:
        """Metric of the run that was patched: corrupted (denoise) or clean (noise)."""
        return self.corrupted_metric if self.direction == "denoise" else self.clean_metric

    @property
    def effect(self) -> Tensor:
        """``[component, pos]`` change of the metric caused by each patch."""
        return self.values - self.base_metric

    @property
    def normalized(self) -> Tensor:
        """``[component, pos]`` ``(patched - corrupted) / (clean - corrupted)``.

        1 means the clean behaviour, 0 the corrupted one, in both directions (so a
        noising patch that changes nothing scores 1).

        Raises:
            ValueError: The clean and corrupted metrics are equal.
        """
        gap = self.clean_metric - self.corrupted_metric
        if gap == 0:
            raise ValueError(
                "clean and corrupted metrics are equal, so the normalised view is undefined; "
                "use .values or .effect"
            )
        return (self.values - self.corrupted_metric) / gap

    def get(self, hook: str, head: int | None = None) -> Tensor:
        """The ``[pos]`` row of one component.

        Args:
            hook: A hook name of the sweep.
            head: Its head, for per-head rows.
        """
        try:
            return self.values[self.components.index((hook, head))]
        except ValueError:
            raise ValueError(
                f"({hook!r}, head={head}) is not a row of this result; rows: {self.labels}"
            ) from None

    def top(self, k: int = 5) -> list[tuple[str, Position, float]]:
        """The ``k`` cells with the largest absolute effect, as (label, position, effect)."""
        effect = self.effect
        order = effect.abs().flatten().argsort(descending=True)[:k]
        n_pos = len(self.positions)
        return [
            (self.labels[i // n_pos], self.positions[i % n_pos], float(effect.flatten()[i]))
            for i in order.tolist()
        ]

    def to_dataframe(self) -> pd.DataFrame:
        """Long form: one row per cell with hook, head, pos, value, effect and normalized."""
        n_comp, n_pos = self.values.shape
        gap = self.clean_metric - self.corrupted_metric
        values = self.values.detach().cpu()
        return pd.DataFrame(
            {
                "hook": [c[0] for c in self.components for _ in range(n_pos)],
                "head": pd.array([c[1] for c in self.components for _ in range(n_pos)], dtype="Int64"),
                "pos": [p for _ in range(n_comp) for p in self.positions],
                "value": values.flatten().tolist(),
                "effect": (values - self.base_metric).flatten().tolist(),
                "normalized": ((values - self.corrupted_metric) / gap).flatten().tolist()
                if gap != 0
                else [float("nan")] * values.numel(),
                "method": self.method,
                "direction": self.direction,
            }
        )

    def plot(self, normalized: bool = True, title: str | None = None) -> go.Figure:
        """Heatmap of the grid: components down, positions across.

        Args:
            normalized: Plot ``normalized`` (when the clean and corrupted metrics
                differ) instead of ``effect``.
            title: Figure title; a default names the method and direction.

        Returns:
            A plotly heatmap.
        """
        use_norm = normalized and self.clean_metric != self.corrupted_metric
        z = (self.normalized if use_norm else self.effect).detach().cpu()
        bound = float(z.abs().max()) or 1.0
        # every row labelled, with the pruning graph's name beside the hook's (a0.h4)
        rows = [f"{h} · {g}" if (g := graph_name(h)) else h for h in self.labels]
        fig = go.Figure(
            go.Heatmap(
                z=z.tolist(),
                x=[str(p) for p in self.positions],
                y=rows,
                colorscale="RdBu",
                zmid=0,
                zmin=-bound,
                zmax=bound,
                colorbar={"title": "normalized" if use_norm else "effect"},
                hovertemplate="%{y}<br>position %{x}<br>%{z:.3f}<extra></extra>",
            )
        )
        fig.update_layout(
            title=title or f"{self.method} patching ({self.direction})",
            xaxis_title="position",
            yaxis={"title": "component", "autorange": "reversed", "type": "category",
                   "tickmode": "array", "tickvals": rows, "ticktext": rows, "automargin": True},
            xaxis={"type": "category"},
            height=int(max(450, 17 * len(rows) + 180)),
        )  # fmt: skip
        return fig

    def __repr__(self) -> str:
        return (
            f"PatchResult(method={self.method!r}, direction={self.direction!r}, "
            f"{len(self.components)} components x {len(self.positions)} positions, "
            f"clean={self.clean_metric:.4g}, corrupted={self.corrupted_metric:.4g})"
        )


__getattr__ = moved_names(__name__)  # METHODS, renamed PATCH_KINDS
