"""The circuit-finding method of ``mechlab prune --method``: its settings checked, then run.

``prune`` (the default) is edge pruning (:func:`mechlab.prune.prune`); the others are
:func:`mechlab.prune.methods.find_circuit`'s (``eap``, ``eap-ig``, ``eap-ig-inputs``,
``exact``, ``acdc``), on the same edge graph, budget and held-out evaluation. A budget is
a sparsity of the countable edges or an edge count (``n_edges``, ``--edges N``).

:func:`check_method` refuses, in one line and before any work, an unknown method, a
method that does not support the settings (an ablation, edge pruning's own loss or node
masks, integration points for a method that has none), a budget above the countable
edges or below one edge, and ACDC on a graph above its edge limit; :func:`run_method`
finds the circuit (NaN scores are refused there, before anything is written) and records
the method and its settings in the circuit's metadata.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from mechlab.circuit_methods import SHARED_SETTINGS, get_method, integrating_names
from mechlab.limits import MAX_IG_STEPS, check_at_most
from mechlab.prune.acdc import ACDC_MAX_EDGES, check_acdc_size
from mechlab.prune.attribution import DEFAULT_STEPS, IG_STEPS_COST, check_attribution_args
from mechlab.prune.circuit import Circuit
from mechlab.prune.graph import pruning_graph
from mechlab.prune.methods import METHODS, edge_budget, find_circuit
from mechlab.traces import PruneData, Target, target_positions

__all__ = ["IG_METHODS", "METHODS", "SHARED_SETTINGS", "check_budget", "check_finite", "check_method", "run_method"]

IG_METHODS = integrating_names()
"""The built-in methods that integrate (``ig_steps`` points of the midpoint rule); the
registry (:func:`mechlab.circuit_methods.integrating_names`) has every one."""



def check_method(
    method: str,
    settings: dict[str, Any],
    *,
    ig_steps: int | None = None,
    n_edges: int | None = None,
    acdc_max_edges: int | None = None,
) -> None:
    """One-line ValueError unless ``method`` can run with these settings (before any data).

    Args:
        method: One of :data:`~mechlab.prune.methods.METHODS`.
        settings: The other settings asked for (``ablation``, edge pruning's ``steps``,
            ``loss``, ``node_sparsity``, ...; ``None`` values count as not given).
        ig_steps: Integration points of ``eap-ig`` and ``eap-ig-inputs`` (default 10).
        n_edges: The budget as an edge count (checked against the graph by :func:`check_budget`).
        acdc_max_edges: ACDC's limit on countable edges (default
            :data:`~mechlab.prune.acdc.ACDC_MAX_EDGES`).
    """
    spec = get_method(method)
    if ig_steps is not None and not spec.integrates:
        raise ValueError(
            f"--ig-steps sets the integration points of {' and '.join(integrating_names())}; "
            f"method {method!r} does not integrate"
        )
    if ig_steps is not None and (isinstance(ig_steps, bool) or not isinstance(ig_steps, int) or ig_steps < 1):
        raise ValueError(f"--ig-steps must be an integer >= 1, got {ig_steps!r}")
    if ig_steps is not None:
        check_at_most("--ig-steps", ig_steps, MAX_IG_STEPS, IG_STEPS_COST)
    if n_edges is not None and (isinstance(n_edges, bool) or not isinstance(n_edges, int)):
        raise ValueError(f"--edges must be an integer, got {n_edges!r}")
    if acdc_max_edges is not None and not spec.edge_limit:
        raise ValueError(f"--acdc-max-edges applies to --method acdc only, not {method!r}")
    if acdc_max_edges is not None:
        check_acdc_size(0, acdc_max_edges)  # a positive integer
    if spec.prunes:
        return
    given = {k: v for k, v in settings.items() if v is not None}
    prune_only = sorted(k for k in given if k not in SHARED_SETTINGS and (k != "loss" or given[k] != "model"))
    if prune_only:
        what = ", ".join(f"{k} {given[k]!r}" if k == "loss" else k for k in prune_only)
        raise ValueError(
            f"{what} {'is' if len(prune_only) == 1 else 'are'} edge pruning's (method 'prune'); method "
            f"{method!r} scores edges by the loss to the full model and takes none of them (recipes other "
            "than default and uniform set them): leave them out or use method 'prune'"
        )
    ablation = given.get("ablation", "interchange")
    if spec.interchange_only is not None and ablation in ("mean", "zero"):
        raise ValueError(
            f"method {method!r} {spec.interchange_only} and needs interchange ablation, not {ablation!r}: use method "
            "'eap-ig' (over the edge masks), 'exact', 'acdc' or 'prune'"
        )
    check_attribution_args(
        spec.checks_as or method,
        ablation=ablation,
        steps=DEFAULT_STEPS if ig_steps is None else ig_steps,
    )


def check_budget(
    model: nn.Module,
    data: PruneData,
    target: Target,
    method: str,
    sparsity: float | None,
    *,
    n_edges: int | None = None,
    ablation: str = "interchange",
    acdc_max_edges: int | None = None,
    position_aware: bool | None = None,
) -> int:
    """The edges a budget keeps on ``model``'s graph for ``target`` (a trace or two of ``data``
    suffice); one-line ValueError for a budget above the countable edges or below one edge,
    or ACDC above its edge limit."""
    graph = pruning_graph(model, data.train.windows, position_aware)
    scored = target_positions(target, data.train) if graph.windows else None
    n_keep, n_countable = edge_budget(graph, ablation, sparsity, n_edges, scored)
    if get_method(method).edge_limit:
        try:
            check_acdc_size(n_countable, acdc_max_edges)
        except ValueError:
            limit = ACDC_MAX_EDGES if acdc_max_edges is None else acdc_max_edges
            raise ValueError(
                f"ACDC runs one forward pass per edge and pass; this graph has {n_countable} countable "
                f"edges, above its limit of {limit}: use --method exact or eap-ig, or raise the "
                "limit with --acdc-max-edges"
            ) from None
    return n_keep


def run_method(
    model: nn.Module,
    data: PruneData,
    target: Target,
    method: str,
    sparsity: float | None,
    *,
    n_edges: int | None = None,
    ig_steps: int | None = None,
    acdc_max_edges: int | None = None,
    checkpoint_sha256: str | None = None,
    **settings: Any,
) -> Circuit:
    """The circuit of ``method`` (checked by :func:`check_method` and :func:`check_budget`).

    ``metadata["method"]`` names the method and ``metadata["method_settings"]`` holds what
    it ran with (the budget, the integration points, ACDC's limit, the ablation).
    """
    settings = {k: v for k, v in settings.items() if v is not None}
    check_method(method, settings, ig_steps=ig_steps, n_edges=n_edges, acdc_max_edges=acdc_max_edges)
    spec = get_method(method)
    seed = settings.pop("seed", 0)
    kwargs: dict[str, Any] = {"n_edges": n_edges, "checkpoint_sha256": checkpoint_sha256}
    if spec.prunes:
        kwargs.update(seed=seed, **settings)
    else:
        kwargs.update(settings)
        if spec.integrates:
            kwargs["steps"] = DEFAULT_STEPS if ig_steps is None else ig_steps
        if spec.edge_limit:
            kwargs["max_edges"] = acdc_max_edges
    circuit = find_circuit(model, data, target, method, None if n_edges is not None else sparsity, **kwargs)
    meta = circuit.metadata
    meta["method"] = method
    meta["seed"] = seed
    meta["method_settings"] = {
        "sparsity": None if n_edges is not None else sparsity,
        "n_edges": n_edges,
        "ablation": settings.get("ablation", "interchange"),
        **({"ig_steps": kwargs["steps"]} if spec.integrates else {}),
        **({"acdc_max_edges": acdc_max_edges or ACDC_MAX_EDGES} if spec.edge_limit else {}),
    }
    return circuit


def check_finite(circuit: Circuit) -> Circuit:
    """The circuit, unless edge pruning's masks ended NaN or infinite (a model whose outputs
    or loss are not finite): then a one-line ValueError, so that nothing is written."""
    values = list((circuit.log_alpha or {}).values())
    bad = sum(1 for v in values if not math.isfinite(v))
    if bad:
        raise ValueError(
            f"{bad} of edge pruning's {len(values)} mask logits are NaN or infinite: the model's "
            "outputs or the loss are not finite; check the model's outputs and the traces"
        )
    return circuit
