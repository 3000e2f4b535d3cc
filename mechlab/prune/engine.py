"""The search for a circuit: optimising hard-concrete masks, then choosing the edges.

:func:`prune` builds a :class:`~mechlab.prune.config.PruneConfig` from its keywords (or
takes one), prepares the search (:func:`prepare_search`: the graph, the countable edges,
the ablation, the reference outputs, the fully ablated loss), runs the one search core
(:func:`mechlab.prune.search.optimise_masks`, shared with the joint search), chooses the
circuit and scores it on the held-out traces (:func:`finish_circuit`). The preparation
lives in :mod:`mechlab.prune.setup`, the masks-to-circuit step (:func:`binarize`) in
:mod:`mechlab.prune.choose`; their names are re-exported here.

The default (docs/pruning.md, "Optimisation"): masks warm-started from an attribution
ranking (:func:`warm_start_scores`: exact single-edge ablation on graphs up to 1000
countable edges, EAP-IG above), the task loss divided by the fully ablated model's
(``1 - faithfulness`` of the batch), a budget constraint that holds the expected number
of open edges on its schedule at every step (no multipliers), and the circuit chosen on
the true objective (:func:`mechlab.prune.refine.select_edges`: backward elimination from
the search's and the warm start's best-ranked edges, against both rankings' own
complete-path circuits, then a fill up to the budget with edges that measurably lower the
loss). The metadata records the settings, the edges the
fill added, each kept edge's effect and the kept edges without a measurable one.

With ``select="rank"`` the circuit (:func:`binarize`) keeps only open edges
(deterministic mask > 0) on complete paths, at most ``round((1 - sparsity) n)`` of
highest mask among the ``n`` countable edges (those not from a writer that cannot
matter under the ablation, :func:`~mechlab.prune.graph.countable_edges`). A sparsity
that keeps no edge is refused before any work. The model is put in eval mode with its
parameters frozen for the duration (restored afterwards).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.prune import masks as hc
from mechlab.prune.choose import (  # re-exported: the engine's names before the split
    WARN_COMPLEMENT,
    WARN_FAITHFULNESS,
    BinaryMasks,
    binarize,
    check_sparsity,
    faithfulness_warning,
)
from mechlab.prune.circuit import Circuit
from mechlab.prune.config import NOISE_RUNS, PruneConfig, prune_config
from mechlab.prune.evaluate import evaluate_masks
from mechlab.prune.forward import frozen_eval
from mechlab.prune.graph import (
    EdgeGraph,
    countable_edges,
    inert_writers,
    target_windows,
    unreachable_edges,
)
from mechlab.prune.refine import (
    Selection,
    kept_log_alpha,
    loss_function,
    pair_disagreement,
    select_edges,
)
from mechlab.prune.search import MaskResult, optimise_masks, warm_logits
from mechlab.prune.setup import (  # re-exported: the engine's names before the split
    SearchSetup,
    ablated_loss,
    check_prune_args,
    check_prune_data,
    pool_method,
    prepare_search,
    warm_method,
    warm_start_scores,
)
from mechlab.traces import (
    PruneData,
    Target,
    check_target,
    target_name,
)

# ---------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------


def prune(
    model: nn.Module,
    data: PruneData,
    target: Target,
    sparsity: float | None = None,
    *,
    config: PruneConfig | None = None,
    seed: int = 0,
    progress: bool = True,
    checkpoint_sha256: str | None = None,
    position_aware: bool | None = None,
    **settings: Any,
) -> Circuit:
    """Find the circuit of ``model`` for a target by edge pruning (module docstring).

    Edges from writers that cannot matter under the ablation (the position table under
    interchange or mean ablation, :func:`mechlab.prune.graph.inert_writers`) are left
    out of the sparsity count and out of the circuit. The metadata records every
    setting, the held-out metrics, the edges the selection added and each kept edge's
    effect (``edge_effects``; ``edges_without_effect`` lists those below
    ``min_effect``). A ``UserWarning`` is issued when the held-out faithfulness is
    below 0.1 or the complement's above 0.9.

    Args:
        model: A mechlab model (transformer, LSTM, dense SSM, Mamba).
        data: Training and held-out traces (:func:`mechlab.tasks.lds_prune.nih_prune_data`).
        target: ``"k-after"``, ``"all"`` or a callable (:func:`mechlab.traces.target_mask`).
        sparsity: Fraction of the countable edges to remove, in (0, 1); it must keep at
            least one edge (None: the config's, 0.95 by default).
        config: The search settings (:class:`~mechlab.prune.config.PruneConfig`;
            default: the defaults); ``settings`` override single fields.
        seed: Seed of the masks' initialisation, noise and batches.
        progress: Show a progress bar for every stage that takes a while, each saying what
            it does: the references, the warm start (``warm start: exact single-edge
            ablation``), the selection's second ranking (``selection pool: ...``), the
            optimisation (``pruning <target> (seed k)``), the selection (``selection:
            ...``, one step per masked forward) and the held-out evaluation
            (``evaluation: ...``). Nothing is printed without it.
        checkpoint_sha256: Recorded in the circuit's metadata.
        position_aware: Graph of a recurrent model (:func:`~mechlab.prune.graph.pruning_graph`):
            None (default) prunes the windowed graph when the traces have windows
            (``Traces.windows``; edges from which no target window's read-out can be
            reached are then left out of the count and recorded as
            ``n_edges_excluded_unreachable``), False the plain graph, True insists on
            the windowed one.
        **settings: Any :class:`~mechlab.prune.config.PruneConfig` field (``steps``,
            ``lr``, ``ablation``, ``loss``, ``normalize_loss``, ``constraint``, ...).

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`, with its metrics on the held-out traces.

    Raises:
        ValueError: Bad target, sparsity (or one that keeps no edge), an unknown or bad
            setting, or traces that lack what the loss or the ablation needs.
    """
    config = prune_config(sparsity, config, **settings)
    check_target(target, data.train)
    started = time.perf_counter()
    with frozen_eval(model):
        setup = prepare_search(model, data, [target], config, position_aware, progress=progress)
        name = target if isinstance(target, str) else "custom target"
        refine = lambda results, cfg: [refine_result(model, setup, results[0], cfg, progress=progress)]  # noqa: E731
        run = run_searches(model, setup, config, refine, seed=seed, progress=progress,
                           desc=f"pruning {name} (seed {seed})")  # fmt: skip
        result, selection = run.results[0], run.selections[0]
        settings_record = {"checkpoint_sha256": checkpoint_sha256, "seed": seed,
                           **search_record(config, setup.norms[0]), **run.record(0),
                           "warm_start_method": warm_method(config, int(setup.countable[0].sum())),
                           "refine_pool_method": pool_method(config, int(setup.countable[0].sum()))}  # fmt: skip
        circuit = finish_circuit(
            model, setup.graph, data, target, config.ablation, result, config.sparsity,
            config.node_sparsity, setup.countable[0], setup.scored[0], settings_record, started,
            selection=selection, progress=progress,
        )  # fmt: skip
    warning = circuit.metadata["warnings"]
    if warning:
        warnings.warn(warning[0], UserWarning, stacklevel=2)
    return circuit


@dataclass
class SearchRun:
    """The chosen search of :func:`run_searches`, per target.

    Attributes:
        results: Per target, the masks (after the selection, its edges the open ones).
        selections: Per target, the selection (None with ``select="rank"``).
        noise: Per target, the noise of the search chosen.
        losses: Per target, noise -> the loss of that search's circuit on the selection's traces.
    """

    results: list[MaskResult]
    selections: list[Selection | None]
    noise: list[str]
    losses: list[dict[str, float]]

    def record(self, t: int) -> dict[str, Any]:
        """Target ``t``'s noise chosen and every search's loss (when there were several)."""
        if len(self.losses[t]) < 2:
            return {}
        return {"noise_chosen": self.noise[t], "noise_losses": dict(self.losses[t])}


def run_searches(
    model: nn.Module,
    setup: SearchSetup,
    config: PruneConfig,
    refine: Callable[[list[MaskResult], PruneConfig], list[tuple[MaskResult, Selection | None]]],
    *,
    share: float = 0.0,
    seed: int = 0,
    progress: bool = True,
    desc: str = "pruning",
) -> SearchRun:
    """Optimise and select, once per noise of ``config.noise`` (``"shared+mixed"``: one
    search with shared and one with mixed noise), and keep the circuits of lowest loss.

    The loss is the true objective on the selection's traces
    (:func:`~mechlab.prune.refine.loss_function`) of the circuit each search hands back;
    independent targets (``share = 0``) choose each on its own loss, otherwise the search
    of lowest summed loss (plus ``share`` times the circuits' disagreement) is kept.

    Args:
        model: The model (frozen, in eval mode).
        setup: :func:`prepare_search`'s.
        config: The settings.
        refine: ``(results, config) -> [(result, selection)]`` per target, the selection.
        share: The sharing weight of a joint search.
        seed: The seed (the same for every search).
        progress: Show progress bars.
        desc: What they say.
    """
    modes = NOISE_RUNS.get(config.noise, (config.noise,))
    n_t = len(setup.positions)
    loss_of = loss_function(model, setup.graph, setup.train, setup.positions, setup.reference,
                            setup.ablated, setup.norms, config.refine_traces)  # fmt: skip
    runs = []
    for mode in modes:
        cfg = dataclasses.replace(config, noise=mode)
        results = optimise_masks(
            model, setup.graph, setup.train, setup.positions, setup.reference, setup.ablated, cfg,
            countable=setup.countable, norms=setup.norms, share=share, n_keep=setup.n_keep,
            seed=seed, progress=progress, desc=desc if len(modes) == 1 else f"{desc}, {mode} noise",
            warm=None if setup.warm is None else [
                warm_logits(w, c) for w, c in zip(setup.warm, setup.countable, strict=True)
            ],
        )  # fmt: skip
        selections: list[Selection | None] = [None] * n_t
        if cfg.select == "refine":
            pairs = refine(results, cfg)
            results, selections = [r for r, _ in pairs], [s for _, s in pairs]
        edges = [binarize(setup.graph, r, cfg.sparsity, cfg.node_sparsity, setup.countable[t],
                          cfg.ablation).edges for t, r in enumerate(results)]  # fmt: skip
        losses = [s.loss if s is not None else loss_of([t])(edges[t]) for t, s in enumerate(selections)]
        runs.append((mode, results, selections, edges, losses))
    if share == 0 or len(runs) == 1:
        pick = [min(range(len(runs)), key=lambda i: (runs[i][4][t], i)) for t in range(n_t)]
    else:
        def objective(run) -> float:
            spread = 0.0 if math.isinf(share) else share * pair_disagreement(run[3], setup.n_keep)
            return sum(run[4]) + spread

        best = min(range(len(runs)), key=lambda i: (objective(runs[i]), i))
        pick = [best] * n_t
    return SearchRun(
        results=[runs[pick[t]][1][t] for t in range(n_t)],
        selections=[runs[pick[t]][2][t] for t in range(n_t)],
        noise=[runs[pick[t]][0] for t in range(n_t)],
        losses=[{run[0]: run[4][t] for run in runs} for t in range(n_t)],
    )


def search_record(config: PruneConfig, norm: float) -> dict[str, Any]:
    """The settings a circuit's metadata records (every field but the sparsities, which
    are recorded as asked and reached), and what the loss was divided by."""
    record = {k: v for k, v in config.to_dict().items() if k not in ("sparsity", "node_sparsity")}
    record["loss_normalized"] = config.normalize_loss  # the older name, kept for readers
    record["loss_normalized_by"] = norm  # the fully ablated model's training loss (or 1)
    return record


def refine_result(
    model: nn.Module, setup: SearchSetup, result: MaskResult, config: PruneConfig, target: int = 0,
    progress: bool = False,
) -> tuple[MaskResult, Selection]:
    """The one-target selection on the true objective (:func:`~mechlab.prune.refine.select_edges`),
    as masks whose open countable edges are the chosen ones (``progress``: its bar)."""
    loss_of = loss_function(model, setup.graph, setup.train, setup.positions, setup.reference,
                            setup.ablated, setup.norms, config.refine_traces)([target])  # fmt: skip
    countable = setup.countable[target]
    if result.node_log_alpha is not None:  # edges of closed writers cannot be chosen
        edge_writer = torch.tensor([setup.graph.writer_index[w] for w, _ in setup.graph.edges])
        countable = countable.cpu() & (hc.deterministic_mask(result.node_log_alpha.cpu()) > 0)[edge_writer]
    rankings = [scores[target].abs() for scores in (setup.warm, setup.pool)
                if scores is not None and scores[target] is not None]  # fmt: skip
    n_check = min(config.validate_traces, len(setup.train) - config.refine_traces)
    validate = None if n_check < 2 else loss_function(
        model, setup.graph, setup.train, setup.positions, setup.reference, setup.ablated, setup.norms,
        n_check, first=config.refine_traces, per_trace=True,
    )([target])  # fmt: skip
    selection = select_edges(setup.graph, result.edge_log_alpha, countable, setup.n_keep[target],
                             loss_of, config.ablation, config.refine_extra, config.min_effect,
                             rankings=rankings, progress=progress, validate=validate)  # fmt: skip
    la = kept_log_alpha(result.edge_log_alpha, selection.edges, setup.countable[target].cpu())
    return MaskResult(la, result.node_log_alpha, result.history), selection


def finish_circuit(
    model: nn.Module,
    graph: EdgeGraph,
    data: PruneData,
    target: Target,
    ablation: str,
    result: MaskResult,
    sparsity: float,
    node_sparsity: float | None,
    countable: Tensor,
    scored: list[int] | None,
    settings: dict[str, Any],
    started: float,
    selection: Selection | None = None,
    progress: bool = False,
) -> Circuit:
    """Choose the circuit from optimised masks, score it on the held-out traces, record how.

    The model must be frozen and in eval mode (:func:`~mechlab.prune.forward.frozen_eval`).

    Args:
        model: The model.
        graph: The graph pruned.
        data: The traces (the held-out set is scored).
        target: The target.
        ablation: The ablation.
        result: The optimised masks (after a selection: its edges the only open ones).
        sparsity: Edge sparsity asked.
        node_sparsity: Node sparsity asked, or None.
        countable: ``[n_edges]`` bool, the edges the sparsity counts.
        scored: The scored positions of a windowed graph, else None.
        settings: Search settings recorded in the metadata as they are (seed, lr, ...).
        started: ``time.perf_counter()`` when the search started.
        selection: The selection on the true objective, if one chose the edges.
        progress: Show the held-out evaluation's bar.

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`; ``metadata["warnings"]`` holds the
        :func:`faithfulness_warning`, if any (not issued here).
    """
    device = next(model.parameters()).device
    binary = binarize(graph, result, sparsity, node_sparsity, countable, ablation)
    mean_reference = data.train.inputs.to(device) if ablation == "mean" else None
    metrics = evaluate_masks(
        model, graph, data.test.to(device), target, ablation, binary.edges, binary.nodes,
        mean_reference=mean_reference, progress=progress,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    det = hc.deterministic_mask(result.edge_log_alpha.cpu())
    kept = binary.edges.nonzero().flatten().tolist()
    n_kept = len(kept)
    node_det = (
        None if result.node_log_alpha is None else hc.deterministic_mask(result.node_log_alpha.cpu())
    )
    warning = faithfulness_warning(metrics)
    metadata = {
        "checkpoint_sha256": settings.get("checkpoint_sha256"),
        "target": target_name(target),
        "ablation": ablation,
        **{k: v for k, v in settings.items() if k not in ("checkpoint_sha256", "ablation")},
        "sparsity_asked": sparsity,
        "sparsity_reached": 1.0 - n_kept / binary.n_countable,
        "n_edges_kept": n_kept,
        "n_edges_asked": binary.n_wanted,
        "n_open_edges": binary.n_open,
        "sparsity_limited_by_open_edges": binary.limited_by_open_edges,
        # open edges on a complete input -> read-out path; kept fewer when the next path
        # by log_alpha would not fit in the quota
        "n_open_edges_on_paths": binary.n_open_on_paths,
        "sparsity_limited_by_paths": binary.limited_by_paths,
        "n_edges_countable": binary.n_countable,
        "n_edges_excluded_inert": graph.n_edges - int(countable_edges(graph, ablation).sum()),
        "inert_writers": inert_writers(graph, ablation),
        "node_sparsity_asked": node_sparsity,
        "node_sparsity_reached": 1.0 - float(binary.nodes.float().mean()),
        "edge_threshold_log_alpha": binary.edge_threshold,
        # the smallest kept deterministic mask, in (0, 1]; None when nothing is kept
        "edge_threshold_mask": float(det[kept].min()) if kept else None,
        "node_threshold_mask": (
            float(node_det[binary.nodes].min()) if node_det is not None and binary.nodes.any()
            else None
        ),
        "data_seed": data.info.get("data_seed"),
        "graph": graph.summary(),
        "data": dict(data.info),
        "metrics": metrics,
        "warnings": [warning] if warning else [],
        "final_expected_sparsity": result.history[-1]["sparsity"],
        "history": result.history,  # every 10th step: loss, expected sparsity, target, ...
        "seconds": seconds,
    }
    if selection is not None:
        metadata.update(selection_record(graph, selection, settings.get("min_effect", 0.0)))
    if graph.windows:  # edges no scored read-out can be reached from: out of the count
        metadata["n_edges_excluded_unreachable"] = int(unreachable_edges(graph, scored).sum())
        metadata["target_windows"] = target_windows(graph, scored)
    edges = {graph.edges[i]: float(det[i]) for i in kept}
    log_alpha = {edge: float(result.edge_log_alpha[i]) for i, edge in enumerate(graph.edges)}
    return Circuit.from_edges(edges, metadata=metadata, log_alpha=log_alpha)


def selection_record(graph: EdgeGraph, selection: Selection, min_effect: float) -> dict[str, Any]:
    """What the selection measured, as plain data for the metadata: the loss of the
    chosen edges on the selection's traces, the pool, the edges the fill added, why it
    stopped and (stopped for want of effect) the candidates it rejected, each kept edge's
    effect, and the kept edges without a measurable effect."""
    effects = {f"{w} -> {r}": selection.effects[i]
               for i, (w, r) in enumerate(graph.edges) if i in selection.effects}  # fmt: skip
    return {
        "selection": {
            "loss": selection.loss,
            "n_pool": selection.n_pool,
            "added": [list(graph.edges[i]) for i in selection.added],
            "fill_stopped": selection.fill_stopped,
            # the fill's last candidates and the loss decrease each gave (below min_effect)
            "rejected": [[*graph.edges[i], v] for i, v in selection.rejected.items()],
            "validation": selection.validation,
        },
        "edge_effects": effects,
        "edges_without_effect": [
            list(graph.edges[i]) for i, v in selection.effects.items() if v < min_effect
        ],
    }


def prune_seeds(
    model: nn.Module,
    data: PruneData | Callable[[int], PruneData],
    targets: Sequence[Target],
    seeds: Sequence[int],
    **prune_kwargs: Any,
) -> dict[str, list[Circuit]]:
    """Prune every target with every seed (the input of :func:`seed_stability`).

    A seed baseline should vary the data as well as the optimiser: pass ``data`` as a
    function of the seed (e.g. ``lambda s: nih_prune_data(cfg, seed=s)``) and seed ``s``
    draws its own traces; its circuits record both seeds (``seed``, ``data_seed``).

    Args:
        model: The model.
        data: Traces, the same for every seed, or a function seed -> traces.
        targets: Targets.
        seeds: Seeds (at least two for a stability estimate).
        **prune_kwargs: Passed to :func:`prune` (``config=``, ``sparsity=`` or any setting).

    Returns:
        Target name -> circuits, in the order of ``seeds``.
    """
    check_prune_args(**prune_kwargs)
    found: dict[str, list[Circuit]] = {target_name(t): [] for t in targets}
    for s in seeds:
        seed_data = data(s) if callable(data) else data
        for t in targets:
            check_target(t, seed_data.train)
        for t in targets:
            circuit = prune(model, seed_data, t, seed=s, **prune_kwargs)
            if callable(data):
                circuit.metadata["data_seed"] = s
            found[target_name(t)].append(circuit)
    return found


__all__ = [
    "WARN_COMPLEMENT",
    "WARN_FAITHFULNESS",
    "BinaryMasks",
    "SearchRun",
    "SearchSetup",
    "ablated_loss",
    "binarize",
    "check_prune_args",
    "check_prune_data",
    "check_sparsity",
    "faithfulness_warning",
    "finish_circuit",
    "prepare_search",
    "prune",
    "prune_seeds",
    "refine_result",
    "run_searches",
    "search_record",
    "selection_record",
    "warm_method",
    "warm_start_scores",
]
