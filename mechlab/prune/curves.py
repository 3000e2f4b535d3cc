"""Faithfulness curves across edge budgets, and their areas CPR and CMD (MIB's circuit track).

A single circuit at one sparsity says little; MIB (Mueller et al. 2025) scores a
circuit-finding method by the faithfulness of its circuits across *edge budgets*. At
budget ``b`` the circuit ``C_b`` is the ``floor(b * n)`` edges of highest score,
and its faithfulness is

    f(C_b) = (m(C_b) - m(empty)) / (m(full) - m(empty)),

with ``m = -d(., full model)`` at the target positions (``d`` the squared error summed
over output dims; KL(full || circuit) for token models), so ``f = 1 - d(C_b) / d(empty)``:
the ``faithfulness`` of :func:`mechlab.prune.evaluate.evaluate_masks` (``empty``: every
edge ablated). The *complement* ``N \\ C_b`` (the circuit's edges ablated, every other
edge kept) is scored the same way: a circuit that is also necessary leaves a complement
near 0.

Choices, as in MIB's ``evaluate_area_under_curve`` (``MIB-circuit-track``):

* budgets :data:`MIB_BUDGETS` = 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50 % plus the 100 %
  anchor (the full model, ``f = 1``); ``k = floor(b * n)`` (a 1e-9 guard keeps
  ``0.29 * 100`` from flooring to 28) with ``n`` the edges that can matter under the
  ablation (:func:`mechlab.prune.graph.countable_edges`: the position table's edges are
  left out under interchange and mean ablation, as the engine's sparsity leaves them
  out; MIB's graphs have one input node, embeddings and positions together); the 0 %
  anchor (``f = 0``, complement 1) is in the curve but, as in MIB, not in the areas;
* CPR = trapezoid area under ``f`` and CMD = trapezoid area of ``|1 - f|``, both over
  the budget as a *linear* fraction from the smallest budget to 1 (MIB's default
  ``log_scale=False``): the widest intervals (20-50 %, 50-100 %) weigh most, and a
  perfect curve has CPR = 1 - min budget (0.999) and CMD = 0;
* the complement areas (``cpr_complement``, ``cmd_complement``) are the same formulas on
  the complement curve (ours; MIB has no complement curve): lower ``cpr_complement`` is
  a more necessary circuit;
* edges are ranked by a score, signed (MIB ranks by ``|score|`` for CMD; edge pruning's
  ``log_alpha`` is a keep-propensity, so its sign is meaningful), ties broken by edge
  order; the circuits of a score are nested. MIB also drops edges not connected to both
  the input and the output before evaluating; we keep them (under interchange ablation
  a writer none of whose inputs are kept reproduces its ablated output, so its edges
  carry nothing).

Scores: the ``log_alpha`` of one pruning run (:func:`sweep`, ``ranking="log_alpha"``, the
default), any ``[n_edges]`` tensor (:func:`faithfulness_curve`), or a pruning run per
budget (``ranking="reprune"``: slower; each circuit is cut to at most ``k`` edges by its
own ``log_alpha``, and may have fewer when the engine keeps only open edges).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.io import atomic_write_text
from mechlab.progress import tqdm
from mechlab.prune.circuit import Circuit
from mechlab.prune.engine import prune
from mechlab.prune.evaluate import circuit_edge_mask, evaluate_masks
from mechlab.prune.forward import ABLATIONS
from mechlab.prune.graph import EdgeGraph, countable_edges, pruning_graph
from mechlab.schema import load_json
from mechlab.traces import (
    PruneData,
    Target,
    Traces,
    check_target,
    target_name,
    target_positions,
)

MIB_BUDGETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
"""MIB's edge budgets (fractions of the graph's edges); 1.0 is always added as the anchor."""
RANKINGS = ("log_alpha", "reprune")
FORMAT = "mechlab-faithfulness-curves"
_SILENT = 1e-10  # d(empty, full) at or below this is float round-off: no ablation effect
VERSION = 1


# ---------------------------------------------------------------------------------------
# Budgets, rankings, areas
# ---------------------------------------------------------------------------------------


def check_budgets(budgets: Sequence[float]) -> list[float]:
    """Validate edge budgets; return them sorted, without duplicates, with the 1.0 anchor.

    Args:
        budgets: Fractions of the graph's edges, each in (0, 1].

    Returns:
        The sorted distinct budgets, ending with 1.0.

    Raises:
        ValueError: No budget, or one that is not a finite number in (0, 1].
    """
    values = list(budgets)
    if not values:
        raise ValueError("give at least one edge budget, e.g. 0.01 (1% of the edges)")
    for b in values:
        ok = isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b)
        if not (ok and 0 < b <= 1):
            raise ValueError(
                f"edge budget {b!r} is not in (0, 1]: give fractions of the edges, e.g. 0.05 for 5%"
            )
    return sorted({float(b) for b in values} | {1.0})


def budget_counts(budgets: Sequence[float], n_edges: int) -> list[int]:
    """Edges kept at each budget: ``floor(b * n_edges)`` as in MIB (1e-9 round-off guard)."""
    return [min(n_edges, math.floor(b * n_edges + 1e-9)) for b in budgets]


def top_k_mask(scores: Tensor, k: int) -> Tensor:
    """``[n_edges]`` bool: the ``k`` edges of highest score (ties: lower edge index first)."""
    order = torch.sort(-scores.detach().double().cpu(), stable=True).indices
    mask = torch.zeros(scores.shape[0], dtype=torch.bool)
    mask[order[:k]] = True
    return mask


def curve_areas(budgets: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """MIB's areas of a curve: ``(CPR, CMD)``.

    Args:
        budgets: Increasing budgets (fractions of the edges; the area's x, linear).
        values: Faithfulness at each budget.

    Returns:
        ``CPR`` = trapezoid integral of ``f`` and ``CMD`` = trapezoid integral of ``|1 - f|``
        over ``[budgets[0], budgets[-1]]``.
    """
    x = torch.tensor(list(budgets), dtype=torch.float64)
    y = torch.tensor(list(values), dtype=torch.float64)
    if x.shape != y.shape or x.numel() < 2:
        raise ValueError(f"need >= 2 budgets and as many values, got {x.numel()} and {y.numel()}")
    if not bool((x[1:] > x[:-1]).all()):
        raise ValueError(f"budgets must increase, got {list(budgets)}")
    return float(torch.trapezoid(y, x)), float(torch.trapezoid((1.0 - y).abs(), x))


def circuit_scores(circuit: Circuit, graph: EdgeGraph) -> Tensor:
    """``[n_edges]`` the circuit's ``log_alpha`` (its pruning run's) in the graph's edge order."""
    if circuit.log_alpha is None:
        raise ValueError("the circuit carries no log_alpha; prune it again with this mechlab")
    missing = [e for e in graph.edges if e not in circuit.log_alpha]
    if missing:
        raise ValueError(
            f"the circuit's log_alpha misses {len(missing)} edges of the model's graph, "
            f"e.g. {missing[0]}"
        )
    return torch.tensor([circuit.log_alpha[e] for e in graph.edges], dtype=torch.float64)


# ---------------------------------------------------------------------------------------
# The curve
# ---------------------------------------------------------------------------------------


@dataclass
class FaithfulnessCurve:
    """Faithfulness and complement faithfulness of nested circuits across edge budgets.

    Attributes:
        target: Target name.
        ablation: ``interchange``, ``mean`` or ``zero``.
        ranking: How circuits were chosen (``log_alpha``, ``reprune``, ``scores``).
        n_edges: Edges in the model's graph.
        n_countable: Edges that can matter under the ablation (budgets are fractions of these).
        budgets: ``0.0`` (anchor), the budgets, ``1.0`` (anchor).
        n_kept: Edges in the circuit at each budget.
        faithfulness: ``f(C_b)`` at each budget.
        complement_faithfulness: ``f(N \\ C_b)`` at each budget.
        circuit_vs_full: ``d(C_b, full)`` at each budget.
        complement_vs_full: ``d(N \\ C_b, full)`` at each budget.
        ablated_vs_full: ``d(empty, full)``, the normaliser.
        divergence: ``mse`` or ``kl``.
        metadata: Plain values (the scoring run's settings, data, timings).
    """

    target: str
    ablation: str
    ranking: str
    n_edges: int
    n_countable: int
    budgets: list[float]
    n_kept: list[int]
    faithfulness: list[float]
    complement_faithfulness: list[float]
    circuit_vs_full: list[float]
    complement_vs_full: list[float]
    ablated_vs_full: float
    divergence: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.budgets)
        for name in ("n_kept", "faithfulness", "complement_faithfulness", "circuit_vs_full",
                     "complement_vs_full"):  # fmt: skip
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"FaithfulnessCurve.{name} has {len(getattr(self, name))} values "
                    f"for {n} budgets"
                )
        if n < 3 or self.budgets[0] != 0.0 or self.budgets[-1] != 1.0:
            raise ValueError(
                "FaithfulnessCurve.budgets must run from the 0.0 anchor to the 1.0 anchor"
            )

    def _areas(self, values: list[float]) -> tuple[float, float]:
        return curve_areas(self.budgets[1:], values[1:])  # MIB: from the smallest budget to 1

    @property
    def cpr(self) -> float:
        """Area under the faithfulness curve (higher is better; 1 - min budget at best)."""
        return self._areas(self.faithfulness)[0]

    @property
    def cmd(self) -> float:
        """Area between the faithfulness curve and 1 (lower is better; 0 at best)."""
        return self._areas(self.faithfulness)[1]

    @property
    def cpr_complement(self) -> float:
        """Area under the complement's curve (lower: the circuit is more necessary)."""
        return self._areas(self.complement_faithfulness)[0]

    @property
    def cmd_complement(self) -> float:
        """Area between the complement's curve and 1."""
        return self._areas(self.complement_faithfulness)[1]

    def summary(self) -> str:
        """One line: CPR, CMD and their complement versions."""
        return (
            f"{self.target} / {self.ablation}: CPR {self.cpr:.3f}  CMD {self.cmd:.3f}  "
            f"complement CPR {self.cpr_complement:.3f}  CMD {self.cmd_complement:.3f}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the areas included)."""
        out = asdict(self)
        out.update(cpr=self.cpr, cmd=self.cmd, cpr_complement=self.cpr_complement,
                   cmd_complement=self.cmd_complement)  # fmt: skip
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> FaithfulnessCurve:
        """Inverse of :meth:`to_dict` (the areas are recomputed)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in values.items() if k in names})


def evaluate_curve(
    model: nn.Module,
    traces: Traces,
    target: Target,
    ablation: str,
    masks: Sequence[Tensor],
    budgets: Sequence[float],
    *,
    ranking: str = "scores",
    mean_reference: Tensor | None = None,
    batch_size: int = 128,
    progress: bool = True,
) -> FaithfulnessCurve:
    """Score one circuit per budget (and the anchors) on held-out traces.

    Args:
        model: The model.
        traces: Held-out traces.
        target: Positions to score.
        ablation: ``interchange``, ``mean`` or ``zero``.
        masks: ``[n_edges]`` bool circuit per budget (same order as ``budgets``).
        budgets: Increasing budgets in (0, 1) (the 0 and 1 anchors are added).
        ranking: Recorded in the curve.
        mean_reference: Inputs of a ``mean`` ablation (default ``traces.inputs``).
        batch_size: Traces per pass.
        progress: Show a progress bar.

    Returns:
        The :class:`FaithfulnessCurve`.
    """
    graph = pruning_graph(model, traces.windows)
    n_countable = int(countable_edges(graph, ablation, _scored(graph, target, traces)).sum())
    if len(masks) != len(budgets):
        raise ValueError(f"got {len(masks)} circuits for {len(budgets)} budgets")

    # The 1.0 anchor scores the full model (f ~ 1) and the empty complement (f = 0); the
    # 0.0 anchor is its mirror image (circuit empty, complement full), so one pass gives both.
    n_batches = math.ceil(len(traces) / batch_size)
    bar = tqdm(total=(1 + len(masks)) * n_batches, disable=not progress, unit="batch",
               desc=f"curve {target_name(target)}, {ablation}: the full model, then {len(masks)} budgets")  # fmt: skip

    def score(mask: Tensor) -> dict[str, Any]:
        return evaluate_masks(model, graph, traces, target, ablation, mask, mean_reference=mean_reference,
                              batch_size=batch_size, on_batch=bar.update)  # fmt: skip

    with bar:
        full = score(torch.ones(graph.n_edges, dtype=torch.bool))  # first: is there a gap at all?
        gap = full["ablated_vs_full"]
        if not gap > _SILENT:
            raise ValueError(
                f"ablating every edge ({ablation}) changes the output at target "
                f"{target_name(target)!r} by only {gap:.1e}: faithfulness is undefined; "
                "use another ablation or target"
            )
        rows = [score(mask) for mask in masks]
    rows.append(full)
    return FaithfulnessCurve(
        target=target_name(target),
        ablation=ablation,
        ranking=ranking,
        n_edges=graph.n_edges,
        n_countable=n_countable,
        budgets=[0.0, *map(float, budgets), 1.0],
        n_kept=[0, *(int(m.sum()) for m in masks), n_countable],
        faithfulness=[0.0, *(r["faithfulness"] for r in rows)],
        complement_faithfulness=[
            full["faithfulness"],
            *(r["complement_faithfulness"] for r in rows),
        ],
        circuit_vs_full=[gap, *(r["circuit_vs_full"] for r in rows)],
        complement_vs_full=[full["circuit_vs_full"], *(r["complement_vs_full"] for r in rows)],
        ablated_vs_full=gap,
        divergence=full["divergence"],
        metadata={"n_traces": full["n_traces"], "n_positions": full["n_positions"]},
    )


def _check_ablation(ablation: str) -> None:
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}; choose one of {', '.join(ABLATIONS)}")


def faithfulness_curve(
    model: nn.Module,
    traces: Traces,
    target: Target,
    ablation: str,
    scores: Tensor,
    budgets: Sequence[float] = MIB_BUDGETS,
    *,
    mean_reference: Tensor | None = None,
    batch_size: int = 128,
    progress: bool = True,
) -> FaithfulnessCurve:
    """The faithfulness curve of the top-scored edges (nested circuits) across budgets.

    Args:
        model: The model.
        traces: Held-out traces.
        target: Positions to score (``"k-after"``, ``"all"`` or a callable).
        ablation: ``interchange``, ``mean`` or ``zero``.
        scores: ``[n_edges]`` edge scores in the graph's edge order (higher: kept first),
            e.g. :func:`circuit_scores` of a pruned circuit.
        budgets: Fractions of the edges in (0, 1] (default :data:`MIB_BUDGETS`).
        mean_reference: Inputs of a ``mean`` ablation (default ``traces.inputs``).
        batch_size: Traces per pass.
        progress: Show a progress bar.

    Returns:
        The :class:`FaithfulnessCurve` (``ranking="scores"``).

    Raises:
        ValueError: Bad budgets, ablation, target or scores.
    """
    _check_ablation(ablation)
    grid = check_budgets(budgets)[:-1]
    check_target(target, traces)
    graph = pruning_graph(model, traces.windows)
    if tuple(scores.shape) != (graph.n_edges,) or not bool(torch.isfinite(scores).all()):
        raise ValueError(
            f"scores must be {graph.n_edges} finite numbers (one per edge), "
            f"got shape {list(scores.shape)}"
        )
    masks = _ranked_masks(scores, graph, ablation, grid, _scored(graph, target, traces))
    return evaluate_curve(
        model, traces, target, ablation, masks, grid, mean_reference=mean_reference,
        batch_size=batch_size, progress=progress,
    )  # fmt: skip


def _scored(graph: EdgeGraph, target: Target, traces: Traces) -> list[int] | None:
    """The scored positions when the graph is windowed (they decide which edges can matter)."""
    return target_positions(target, traces) if graph.windows else None


def _ranked_masks(
    scores: Tensor,
    graph: EdgeGraph,
    ablation: str,
    budgets: Sequence[float],
    scored: list[int] | None = None,
) -> list[Tensor]:
    """Top-k circuits of the edges that can matter under ``ablation`` (the others never enter)."""
    countable = countable_edges(graph, ablation, scored)
    ranked = scores.detach().double().cpu().masked_fill(~countable, -math.inf)
    return [top_k_mask(ranked, k) for k in budget_counts(budgets, int(countable.sum()))]


_RUN_KEYS = ("sparsity_asked", "sparsity_reached", "n_edges_kept", "seed", "steps", "warmup",
             "lr", "lambda_lr", "init_mean", "batch_size", "loss", "seconds")  # fmt: skip


def _run_info(circuit: Circuit) -> dict[str, Any]:
    meta = circuit.metadata
    info = {k: meta[k] for k in _RUN_KEYS if k in meta}
    info["faithfulness"] = meta.get("metrics", {}).get("faithfulness")
    return info


def _reprune_masks(
    model: nn.Module,
    data: PruneData,
    target: Target,
    ablation: str,
    counts: list[int],
    graph: EdgeGraph,
    seed: int,
    progress: bool,
    prune_kwargs: dict[str, Any],
) -> tuple[list[Tensor], list[dict[str, Any]]]:
    """One pruning run per budget; each circuit cut to at most ``k`` edges by its log_alpha."""
    masks, runs = [], []
    for k in tqdm(counts, disable=not progress, desc=f"re-pruning {ablation}", unit="budget"):
        if k == 0:  # nothing to prune for
            masks.append(torch.zeros(graph.n_edges, dtype=torch.bool))
            runs.append({"n_edges_kept": 0})
            continue
        n_countable = int(countable_edges(graph, ablation, _scored(graph, target, data.train)).sum())
        circuit = prune(model, data, target, 1.0 - k / n_countable, ablation=ablation,
                        seed=seed, progress=False, **prune_kwargs)  # fmt: skip
        mask = circuit_edge_mask(circuit, graph)
        if int(mask.sum()) > k:  # MIB: at most k edges at budget k
            scores = circuit_scores(circuit, graph).masked_fill(~mask, -math.inf)
            mask = top_k_mask(scores, k)
        masks.append(mask)
        runs.append(_run_info(circuit))
    return masks, runs


def sweep(
    model: nn.Module,
    data: PruneData,
    target: Target,
    ablations: Sequence[str] = ("interchange",),
    budgets: Sequence[float] = MIB_BUDGETS,
    *,
    ranking: str = "log_alpha",
    sparsity: float = 0.95,
    seed: int = 0,
    eval_batch_size: int = 128,
    progress: bool = True,
    **prune_kwargs: Any,
) -> dict[str, FaithfulnessCurve]:
    """Prune, then trace the faithfulness curve on the held-out traces, per ablation.

    Args:
        model: The model.
        data: Training traces (pruned on; the reference of a ``mean`` ablation) and
            held-out traces (scored on).
        target: ``"k-after"``, ``"all"`` or a callable.
        ablations: Any of ``interchange``, ``mean``, ``zero``: each is pruned and scored
            under its own ablation.
        budgets: Fractions of the edges in (0, 1] (default :data:`MIB_BUDGETS`).
        ranking: ``log_alpha`` (one pruning run at ``sparsity``; its ``log_alpha`` ranks
            the edges) or ``reprune`` (one run per budget, at sparsity ``1 - k / n``).
        sparsity: Sparsity of the single scoring run (``log_alpha`` ranking).
        seed: Pruning seed.
        eval_batch_size: Held-out traces per evaluation pass.
        progress: Show progress bars.
        **prune_kwargs: Passed to :func:`mechlab.prune.engine.prune` (``steps``, ``lr``,
            ``batch_size``, ...).

    Returns:
        Ablation -> :class:`FaithfulnessCurve`.

    Raises:
        ValueError: Bad budgets, ablation, ranking or target (before any pruning).
    """
    ablations = list(dict.fromkeys(ablations))
    if not ablations:
        raise ValueError(f"give at least one ablation of {', '.join(ABLATIONS)}")
    for ablation in ablations:
        _check_ablation(ablation)
    if ranking not in RANKINGS:
        raise ValueError(f"unknown ranking {ranking!r}; choose one of {', '.join(RANKINGS)}")
    grid = check_budgets(budgets)[:-1]
    check_target(target, data.train)
    graph = pruning_graph(model, data.train.windows, prune_kwargs.get("position_aware"))
    scored = _scored(graph, target, data.train)
    device = next(model.parameters()).device
    curves = {}
    for ablation in ablations:
        if ranking == "log_alpha":
            circuit = prune(model, data, target, sparsity, ablation=ablation, seed=seed,
                            progress=progress, **prune_kwargs)  # fmt: skip
            masks = _ranked_masks(circuit_scores(circuit, graph), graph, ablation, grid, scored)
            runs = [_run_info(circuit)]
        else:
            n_countable = int(countable_edges(graph, ablation, scored).sum())
            masks, runs = _reprune_masks(
                model, data, target, ablation, budget_counts(grid, n_countable), graph, seed,
                progress, prune_kwargs,
            )  # fmt: skip
        reference = data.train.inputs.to(device) if ablation == "mean" else None
        curve = evaluate_curve(
            model, data.test.to(device), target, ablation, masks, grid, ranking=ranking,
            mean_reference=reference, batch_size=eval_batch_size, progress=progress,
        )  # fmt: skip
        curve.metadata.update(pruning_runs=runs, data=dict(data.info))
        curves[ablation] = curve
    return curves


def curves_to_dict(
    curves: Mapping[str, FaithfulnessCurve] | Sequence[FaithfulnessCurve],
    info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Curves as the JSON-ready dict :func:`write_curves` writes and :func:`read_curves` reads.

    Args:
        curves: Curves (a mapping's keys are ignored; each curve knows its ablation).
        info: Plain values recorded beside them (checkpoint, command line, ...).
    """
    items = list(curves.values()) if isinstance(curves, Mapping) else list(curves)
    return {
        "format": FORMAT,
        "version": VERSION,
        "protocol": "MIB circuit track: k = floor(b n) top-scored of the n edges that can "
        "matter; CPR, CMD = "
        "trapezoid areas of f and |1 - f| over the budget (linear) from the smallest budget to 1",
        "info": dict(info or {}),
        "curves": [c.to_dict() for c in items],
    }


def write_curves(
    curves: Mapping[str, FaithfulnessCurve] | Sequence[FaithfulnessCurve],
    path: str | Path,
    info: Mapping[str, Any] | None = None,
) -> Path:
    """Write curves as one JSON file, atomically (:func:`curves_to_dict`); returns the path."""
    return atomic_write_text(path, json.dumps(curves_to_dict(curves, info), indent=1, allow_nan=True))


def read_curves(path: str | Path) -> list[FaithfulnessCurve]:
    """Read curves written by :func:`write_curves`."""
    values = load_json(path, "curves file", 256 << 20, 32)  # size and depth before parsing
    if not isinstance(values, dict) or values.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a mechlab faithfulness-curves file")
    try:
        return [FaithfulnessCurve.from_dict(c) for c in values["curves"]]
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(
            f"{str(path)!r} is not a valid faithfulness-curves file ({type(err).__name__}: {err}); "
            "re-create it with mechlab curve"
        ) from None
