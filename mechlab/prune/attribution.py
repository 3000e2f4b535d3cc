"""Edge attribution on the pruning graph: EAP, EAP-IG and exact single-edge ablation.

Every method scores the edges of the same :class:`~mechlab.prune.graph.EdgeGraph` through
the same masked forward (:func:`~mechlab.prune.forward.masked_forward`), in which reader
``r`` receives ``sum_w z_wr X_w + (1 - z_wr) X~_w``. Write ``m(z)`` for the *metric*, a
mean over the target positions of the training traces (:class:`Objective`):

* ``metric="loss"`` (default): the task loss edge pruning minimises, ``d(f(z), f(1))``
  with ``d`` the squared error summed over output dims (KL(full || circuit) for token
  models) and ``f(1)`` the full model's output;
* ``metric="projection"``: ``<g(f(1)) - g(f(z)), g(f(1)) - g(f(0))>``, how far the output
  has moved from the full model's towards the fully ablated one (``g`` the identity for
  continuous outputs, the logits centred over the vocabulary for token models: a
  softmax-invariant analogue of the logit difference). It is linear in the output, so
  for a model linear in the masks every method below gives the exact effect.

Both are 0 at ``z = 1`` and grow as edges are ablated. A *score* is the increase of ``m``
when one edge is ablated (higher: the edge matters more); scores of edges that cannot
matter (:func:`~mechlab.prune.graph.countable_edges`) are 0.

Methods (:func:`attribute`):

* ``exact``: ``m(1 - e_k) - m(1)``, every edge ablated alone (batched: :mod:`mechlab.prune.exact`);
* ``eap`` (edge attribution patching, Nanda 2023; Syed et al. 2023): the first-order
  estimate ``-(d m / d z_k)`` for the fixed writer differences ``D_w = X_w - X~_w``,
  taken either on the *corrupted* run (``at="corrupted"``, the default; TransformerLens'
  ``attribution_patching`` convention, interchange ablation only) or on the *clean* run
  (``at="clean"``, the mask gradient at ``z = 1``). The loss has its minimum at the full
  model, so its gradient at ``z = 1`` is zero (only float round-off is left, and ranking
  round-off is no method): ``at="clean"`` needs ``metric="projection"``;
* ``eap-ig`` (EAP with integrated gradients over the edge masks, after Hanna et al.
  2024): ``-(1/S) sum_s (d m / d z)(t_s 1)`` at the midpoints ``t_s = (s + 1/2) / S`` of
  ``S = steps`` intervals of ``[0, 1]``: every mask moves from ablated to clean together,
  and the scores sum to the total effect ``m(0) - m(1)`` up to the midpoint rule's
  ``O(1 / S^2)`` error (completeness);
* ``eap-ig-inputs`` (Hanna et al.'s EAP-IG, interchange only): the read-in's output (the
  embedding, or the continuous input's projection) is interpolated from the corrupted to
  the clean run, ``E_a = E~ + a (E - E~)``, and at each midpoint ``a_s`` every edge is
  scored with its fixed clean-minus-corrupted difference ``D_w`` against the gradient at
  that run; only the embedding edges are integrated exactly, so there is no
  completeness. At ``S = 1`` point ``a = 0`` this is ``eap`` at the corrupted run.

Fixed differences through the masked forward. The masked forward computes ``D_w`` from
its own pass, so its mask gradient at ``z = 1`` is ``D_w . g_r`` at the clean run. For a
run at interpolation ``a`` (``a = 0``: the corrupted run) pass the ablated values
``X'_w = X_w(a) - D_w`` (``X_w(a)`` the writer's output on that run) and the masks
``z = 1`` on every edge but the embedding's (``z = a`` there, with ``X'_embed = X~_embed``):
every reader then receives exactly what it receives on run ``a``, each writer's
difference is ``X_w(a) - X'_w = D_w``, and the mask gradient is ``D_w . g_r(a)``
(recurrent states of a windowed graph likewise). The ACDC search is
:mod:`mechlab.prune.acdc`; circuits from scores are built by
:func:`mechlab.prune.methods.find_circuit`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.circuit_methods import attach_scorer, get_scoring
from mechlab.limits import MAX_IG_STEPS, check_at_most
from mechlab.progress import tqdm
from mechlab.prune.exact import exact_scores
from mechlab.prune.forward import (
    ABLATIONS,
    Ablation,
    WindowedAblation,
    frozen_eval,
    masked_forward,
    select_traces,
    window_states,
    writer_outputs,
)
from mechlab.prune.graph import EdgeGraph, pruning_graph
from mechlab.prune.objective import (  # noqa: F401  (re-exported)
    ATTRIBUTION_METHODS,
    DEFAULT_BATCH_SIZE,
    DEFAULT_STEPS,
    EAP_POINTS,
    METRICS,
    Objective,
    build_objective,
    exact_loop_scores,
    metric_value,
    writer_kind_mask,
)
from mechlab.traces import PruneData, Target, Traces, check_target, target_name


def _gradient(obj: Objective, z: Tensor, batch_size: int, ablated_of=None) -> Tensor:
    """``d m / d z`` at masks ``z`` (float64, on the CPU), traces in chunks of ``batch_size``
    (fewer where memory is short: :meth:`~mechlab.prune.objective.Objective.gradient_chunk`).

    ``ablated_of(index)`` gives the ablated values of a chunk (default: the objective's).
    """
    z = z.to(obj.device, obj.reference.dtype)
    grad = torch.zeros(obj.graph.n_edges, dtype=torch.float64)
    for index in obj.chunks(obj.gradient_chunk(batch_size)):
        abl = select_traces(obj.ablated, index) if ablated_of is None else ablated_of(index)
        leaf = z.clone().requires_grad_(True)
        out = masked_forward(obj.model, obj.graph, obj.traces.inputs[index], abl, leaf)
        value = obj.metric_sum(out, index) / obj.n_positions
        (g,) = torch.autograd.grad(value, leaf)
        grad += g.detach().double().cpu()
    return grad


@torch.no_grad()
def _run_outputs(model: nn.Module, x: Tensor, embed: Tensor, windows) -> tuple[Tensor, list | None]:
    """Writer outputs (and window states) of the run whose read-in outputs ``embed``."""
    handle = model.read_in.register_forward_hook(lambda _m, _i, _o: embed)
    try:
        writers = writer_outputs(model, x, batch_size=x.shape[0])
        states = window_states(model, x, windows, batch_size=x.shape[0]) if windows else None
    finally:
        handle.remove()
    return writers, states


def _fixed_difference_ablation(obj: Objective, alpha: float):
    """``index -> X'``: ablated values whose masked forward at the embedding masks ``alpha``
    (every other mask 1) runs the model at read-in ``E~ + alpha (E - E~)`` with every
    writer's difference fixed at its clean-minus-corrupted value (module docstring)."""

    @torch.no_grad()
    def ablated_of(index: Tensor) -> Ablation:
        x = obj.traces.inputs[index]
        abl = select_traces(obj.ablated, index)
        windows = obj.graph.windows
        plain = abl.writers if isinstance(abl, WindowedAblation) else abl  # [n_w, b, pos, d]
        clean, clean_states = _run_outputs(obj.model, x, obj.model.read_in(x), windows)
        embed = plain[0] + alpha * (clean[0] - plain[0])
        at_alpha, states = _run_outputs(obj.model, x, embed, windows)
        writers = at_alpha - (clean - plain)
        writers[0] = plain[0]
        if not windows:
            return writers
        moved = [
            s_a - (s - s_abl)
            for s_a, s, s_abl in zip(states, clean_states, abl.states, strict=True)
        ]
        return WindowedAblation(writers, moved)

    return ablated_of


def fixed_difference_gradient(
    obj: Objective, alpha: float, batch_size: int = DEFAULT_BATCH_SIZE
) -> Tensor:
    """``D_w . g_r`` summed over positions, per edge, at the run interpolated at ``alpha``.

    ``alpha = 0``: the corrupted run (TransformerLens' attribution patching), ``1``: the
    clean run (the plain mask gradient at ``z = 1``). Interchange ablation only.

    Returns:
        ``[n_edges]`` float64 ``d m / d z`` with the writer differences held fixed.
    """
    if obj.ablation != "interchange":
        raise ValueError("fixed-difference gradients need interchange ablation (a corrupted run)")
    z = torch.ones(obj.graph.n_edges)
    z[writer_kind_mask(obj.graph, "embed")] = alpha
    return _gradient(obj, z, batch_size, _fixed_difference_ablation(obj, alpha))


# ---------------------------------------------------------------------------------------
# The methods
# ---------------------------------------------------------------------------------------


def _midpoints(steps: int) -> list[float]:
    return [(s + 0.5) / steps for s in range(steps)]


def eap_scores(
    obj: Objective, at: str = "corrupted", batch_size: int = DEFAULT_BATCH_SIZE
) -> Tensor:
    """EAP: ``-(d m / d z)`` for fixed writer differences, on the corrupted or the clean run."""
    if at == "clean":
        return -_gradient(obj, torch.ones(obj.graph.n_edges), batch_size)
    return -fixed_difference_gradient(obj, 0.0, batch_size)


def _eap_pass(obj: Objective, at: str, batch_size: int, progress: bool, desc: str = "eap") -> Tensor:
    """:func:`eap_scores` under a bar of one step (its one pass: nothing finer to count)."""
    with tqdm(total=1, disable=not progress, desc=desc, unit="pass") as bar:
        scores = eap_scores(obj, at, batch_size)
        bar.update()
    return scores


def _integrate(gradient_at, steps: int, desc: str, progress: bool) -> Tensor:
    """``-(1/S) sum_s gradient_at(t_s)`` over the midpoints ``t_s`` of ``[0, 1]``."""
    total = None
    for t in tqdm(_midpoints(steps), disable=not progress, desc=desc, unit="step"):
        g = gradient_at(t)
        total = -g if total is None else total - g
    return total / steps


def eap_ig_scores(
    obj: Objective, steps: int = DEFAULT_STEPS, batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False, desc: str = "eap-ig",
) -> Tensor:  # fmt: skip
    """EAP-IG over the edge masks: ``-(1/S) sum_s (d m / d z)(t_s 1)``, ``t_s`` the midpoints."""
    n = obj.graph.n_edges
    return _integrate(
        lambda t: _gradient(obj, torch.full((n,), t), batch_size), steps, desc, progress
    )


def eap_ig_input_scores(
    obj: Objective, steps: int = DEFAULT_STEPS, batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False, desc: str = "eap-ig-inputs",
) -> Tensor:  # fmt: skip
    """EAP-IG over the inputs: fixed differences against gradients along the read-in path."""
    return _integrate(lambda a: fixed_difference_gradient(obj, a, batch_size), steps,
                      desc, progress)  # fmt: skip


# ---------------------------------------------------------------------------------------
# attribute(): validation, dispatch, the result
# ---------------------------------------------------------------------------------------


@dataclass
class EdgeScores:
    """Scores of every edge of a graph by one attribution method.

    Attributes:
        method: ``eap``, ``eap-ig``, ``eap-ig-inputs``, ``exact`` or ``acdc``.
        graph: The edge graph the scores are in the order of.
        scores: ``[n_edges]`` float64: the increase of the metric when the edge is
            ablated (estimated, or exact); 0 for edges that cannot matter.
        countable: ``[n_edges]`` bool, the edges that can matter.
        target: Target name.
        ablation: The ablation.
        metric: ``loss`` or ``projection``.
        total_effect: ``m(0) - m(1)``, the effect of ablating every edge.
        settings: The method's settings (steps, at, ...).
        seconds: Wall time of the scoring.
    """

    method: str
    graph: EdgeGraph
    scores: Tensor
    countable: Tensor
    target: str
    ablation: str
    metric: str
    total_effect: float
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def by_edge(self) -> dict[tuple[str, str], float]:
        """Edge -> score."""
        return {
            edge: float(s) for edge, s in zip(self.graph.edges, self.scores.tolist(), strict=True)
        }

    def ranking(self, absolute: bool = True) -> Tensor:
        """``[n_edges]`` ranking scores: ``|score|`` (default) or the signed score."""
        return self.scores.abs() if absolute else self.scores.clone()

    def top(self, k: int = 10, absolute: bool = True) -> list[tuple[tuple[str, str], float]]:
        """The ``k`` countable edges of highest ranking score, with their (signed) scores."""
        rank = self.ranking(absolute).masked_fill(~self.countable, -math.inf)
        order = torch.sort(-rank, stable=True).indices[: min(k, int(self.countable.sum()))]
        return [(self.graph.edges[i], float(self.scores[i])) for i in order.tolist()]

    def summary(self) -> dict[str, Any]:
        """Plain values for a circuit's metadata (the scores as ``[writer, reader, score]``)."""
        return {
            "method": self.method, "target": self.target, "ablation": self.ablation,
            "metric": self.metric, "total_effect": self.total_effect,
            "score_sum": float(self.scores.sum()), "settings": dict(self.settings),
            "seconds": self.seconds,
            "scores": [[w, r, float(s)] for (w, r), s in zip(self.graph.edges, self.scores.tolist(), strict=True)],
        }  # fmt: skip


IG_STEPS_COST = "each point is a forward and backward pass over every trace; the default is 10"


def _check_int(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def check_attribution_args(
    method: str,
    *,
    ablation: str = "interchange",
    metric: str = "loss",
    steps: int = DEFAULT_STEPS,
    at: str = "corrupted",
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> None:
    """Validate :func:`attribute`'s settings (one-line ValueError), before any work."""
    spec = get_scoring(method)
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}; choose one of {', '.join(ABLATIONS)}")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    _check_int("batch_size", batch_size)
    if spec.integrates:
        _check_int("steps (integration points)", steps)
        check_at_most("steps (integration points)", steps, MAX_IG_STEPS, IG_STEPS_COST)
    if spec.takes_at:  # EAP: its run's own checks
        if at not in EAP_POINTS:
            raise ValueError(f"unknown EAP point at={at!r}; choose one of {', '.join(EAP_POINTS)}")
        if at == "corrupted" and ablation != "interchange":
            raise ValueError(
                f"EAP on the corrupted run needs interchange ablation, not {ablation!r}; under "
                "mean or zero ablation use at='clean' with metric='projection', or method='eap-ig'"
            )
        if at == "clean" and metric == "loss":
            raise ValueError(
                "EAP on the clean run (at='clean') has zero gradient for metric 'loss' (the full "
                "model is the loss's minimum); use at='corrupted', metric='projection' or method='eap-ig'"
            )
    if spec.interchange_only is not None and not spec.takes_at and ablation != "interchange":
        raise ValueError(
            f"{method} {spec.interchange_only} and needs interchange "
            f"ablation, not {ablation!r}; use method='eap-ig' (over the edge masks)"
        )


def check_scores(scores: Tensor, graph: EdgeGraph) -> Tensor:
    """``scores`` as ``[n_edges]`` float64; one-line ValueError unless there is one finite score per edge."""
    if not isinstance(scores, Tensor) or tuple(scores.shape) != (graph.n_edges,):
        shape = list(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(
            f"scores must be a tensor of {graph.n_edges} numbers (one per edge), got {shape}"
        )
    scores = scores.detach().double().cpu()
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        first = graph.edges[int(bad.nonzero()[0])]
        raise ValueError(
            f"{int(bad.sum())} edge score(s) are NaN or infinite (first: {first[0]} -> {first[1]}); "
            "check the model's outputs and the traces"
        )
    return scores


def score_edges(
    obj: Objective,
    method: str,
    *,
    steps: int = DEFAULT_STEPS,
    at: str = "corrupted",
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = False,
    desc: str | None = None,
) -> Tensor:
    """The scores of ``method`` on an objective (the model frozen and in eval mode).

    ``progress`` shows a bar (``eap``: one step, its one pass), ``desc`` what it says
    (default: the method's name).

    Returns:
        ``[n_edges]`` float64, 0 on the edges that cannot matter.
    """
    run = obj.truncated()
    named = {} if desc is None else {"desc": desc}
    scorer = get_scoring(method).scorer
    if scorer is None:
        raise ValueError(f"attribution method {method!r} has no scoring function (mechlab.circuit_methods.attach_scorer)")
    scores = scorer(run, steps=steps, at=at, batch_size=batch_size, progress=progress, **named)
    return check_scores(scores.masked_fill(~obj.countable, 0.0), obj.graph)


def attribute(
    model: nn.Module,
    data: PruneData | Traces,
    target: Target,
    method: str = "eap-ig",
    *,
    ablation: str = "interchange",
    metric: str = "loss",
    steps: int = DEFAULT_STEPS,
    at: str = "corrupted",
    batch_size: int = DEFAULT_BATCH_SIZE,
    position_aware: bool | None = None,
    progress: bool = False,
) -> EdgeScores:
    """Score every edge of ``model``'s pruning graph for a target (module docstring).

    Args:
        model: A mechlab model (transformer, LSTM, dense SSM, Mamba; tokens or continuous).
        data: Traces, or :class:`~mechlab.traces.PruneData` (its training traces are
            scored on and are the reference of a ``mean`` ablation).
        target: ``"k-after"``, ``"all"`` or a callable.
        method: ``eap``, ``eap-ig`` (default), ``eap-ig-inputs`` or ``exact``.
        ablation: ``interchange`` (default), ``mean`` or ``zero``.
        metric: ``loss`` (default: edge pruning's task loss) or ``projection``.
        steps: Integration points of the EAP-IG methods (midpoint rule).
        at: EAP's run: ``corrupted`` (default) or ``clean``.
        batch_size: Traces per pass.
        position_aware: The graph of a recurrent model, as in :func:`~mechlab.prune.engine.prune`.
        progress: Show a progress bar.

    Returns:
        The :class:`EdgeScores`.

    Raises:
        ValueError: Unknown method, ablation or metric, a method that does not support
            the ablation or metric, ``steps < 1``, a bad target, NaN scores.
    """
    check_attribution_args(method, ablation=ablation, metric=metric, steps=steps, at=at,
                           batch_size=batch_size)  # fmt: skip
    traces = data.train if isinstance(data, PruneData) else data
    check_target(target, traces)
    if ablation == "interchange" and traces.corrupted is None:
        raise ValueError("ablation 'interchange' needs corrupted traces (Traces.corrupted)")
    graph = pruning_graph(model, traces.windows, position_aware)
    started = time.perf_counter()
    with frozen_eval(model):
        obj = build_objective(model, traces, target, ablation, metric, graph, batch_size=batch_size)
        scores = score_edges(
            obj, method, steps=steps, at=at, batch_size=batch_size, progress=progress
        )
        total = metric_value(obj, torch.zeros(graph.n_edges), batch_size) - metric_value(
            obj, torch.ones(graph.n_edges), batch_size
        )
    settings = scoring_settings(method, batch_size=batch_size, n_traces=len(traces), steps=steps, at=at)
    return EdgeScores(method, graph, scores, obj.countable.cpu(), target_name(target), ablation,
                      metric, total, settings, time.perf_counter() - started)  # fmt: skip


def scoring_settings(method: str, *, batch_size: int, n_traces: int, steps: int, at: str) -> dict[str, Any]:
    """What an attribution method's scores record of how they were made: the batch and the
    traces, an integrating method's points and rule, EAP's run."""
    spec = get_scoring(method)
    settings: dict[str, Any] = {"batch_size": batch_size, "n_traces": n_traces}
    if spec.integrates:
        settings.update(steps=steps, rule="midpoint")
    if spec.takes_at:
        settings["at"] = at
    return settings


# The built-in attribution methods' scores (mechlab.circuit_methods names them): each takes
# the (truncated) objective and the settings score_edges passes, and uses those it needs.
attach_scorer("eap", lambda run, *, at, batch_size, progress, steps=None, **named:
              _eap_pass(run, at, batch_size, progress, **named))  # fmt: skip
attach_scorer("eap-ig", lambda run, *, steps, batch_size, progress, at=None, **named:
              eap_ig_scores(run, steps, batch_size, progress, **named))  # fmt: skip
attach_scorer("eap-ig-inputs", lambda run, *, steps, batch_size, progress, at=None, **named:
              eap_ig_input_scores(run, steps, batch_size, progress, **named))  # fmt: skip
attach_scorer("exact", lambda run, *, batch_size, progress, steps=None, at=None, **named:
              exact_scores(run, batch_size, progress, **named))  # fmt: skip
