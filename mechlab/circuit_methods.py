"""The circuit-method registry: edge pruning and every attribution method, one entry each.

A :class:`CircuitMethod` says what the code around a method needs of it: its name and CLI
help (``mechlab prune --method``), how it is run (``kind``: learned edge masks, ranked
scores or a search), what it refuses (an ablation other than interchange, edge pruning's
own options, a graph above an edge limit) and what it records (integration points, EAP's
run). :mod:`mechlab.prune.methods`, :mod:`mechlab.pipelines`, the CLI and
:mod:`mechlab.bench` read it instead of comparing method names.

This module imports nothing of mechlab's analyses (the CLI reads it before torch loads);
the scoring functions of the built-in attribution methods are attached by
:mod:`mechlab.prune.attribution`, which implements them. A new method is one
:func:`register` call (``docs/architecture.md``, "How to add a method").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("masks", "scores", "search")
"""How a method finds its circuit: ``masks``, edge pruning's learned masks
(:func:`mechlab.prune.engine.prune`); ``scores``, a score per edge (its :attr:`CircuitMethod.scorer`)
ranked into the budget; ``search``, ACDC's greedy search (:mod:`mechlab.prune.acdc`)."""

EDGE_PRUNING_OPTIONS = ("steps", "lr", "lambda_lr", "node_sparsity", "normalize_loss", "share")
"""Options of edge pruning alone on the command line (its optimiser, node masks, joint
pruning): any other method refuses them (``loss`` other than ``model`` too)."""

SHARED_SETTINGS = ("ablation", "seed", "progress", "batch_size", "position_aware")
"""Settings every method takes (``seed`` only seeds edge pruning; every seed draws its own
traces); a method other than edge pruning refuses the others."""

DEFAULT_METHOD = "prune"
"""The method a circuit without a recorded one was found by, and ``--method``'s default."""

SHARED_HELP = ("Every method keeps whole input-to-read-out paths within the budget (--sparsity or --edges) "
               "and is scored on the same held-out traces.")  # fmt: skip


@dataclass(frozen=True)
class CircuitMethod:
    """One circuit method of the registry.

    Attributes:
        name: What ``--method`` and ``metadata["method"]`` say.
        help: Its part of ``mechlab prune --help`` (``<name>: <help>``).
        kind: One of :data:`KINDS`.
        integrates: Takes integration points (``--ig-steps``; ``steps`` and ``rule``
            recorded).
        interchange_only: Why the method needs interchange ablation (``"takes the gradient
            on the corrupted run"``), or None when it takes every ablation.
        checks_as: The scoring method whose argument checks apply (ACDC: ``exact``), or
            None for its own.
        edge_limit: Refuses graphs above an edge limit (``--acdc-max-edges``).
        signed: Its scores are ranked signed, not by ``|score|``.
        takes_at: Scores on one run, chosen by ``at`` (EAP: ``corrupted`` or ``clean``).
        scorer: ``scorer(objective, *, steps, at, batch_size, progress, desc=...)`` -> a
            tensor of one score per edge, for a ``scores`` method.
    """

    name: str
    help: str
    kind: str = "scores"
    integrates: bool = False
    interchange_only: str | None = None
    checks_as: str | None = None
    edge_limit: bool = False
    signed: bool = False
    takes_at: bool = False
    scorer: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown method kind {self.kind!r}; choose one of {', '.join(KINDS)}")

    @property
    def prunes(self) -> bool:
        """Edge pruning (learned masks): takes its optimiser's options and a seed."""
        return self.kind == "masks"

    @property
    def scores(self) -> bool:
        """Ranks a score per edge (an attribution method)."""
        return self.kind == "scores"


METHODS: dict[str, CircuitMethod] = {}
"""Method name -> its entry, in the order registered (the order of ``--help`` and the bench)."""


def register(method: CircuitMethod, *, replace: bool = False) -> CircuitMethod:
    """Add a method to the registry; returns it.

    Args:
        method: The entry.
        replace: Replace an entry of the same name (else that is a ValueError).

    Raises:
        ValueError: A method of that name is registered already.
    """
    if method.name in METHODS and not replace:
        raise ValueError(f"method {method.name!r} is registered already")
    METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method from the registry (a test's toy method); unknown names are ignored."""
    METHODS.pop(name, None)


def attach_scorer(name: str, scorer: Callable[..., Any]) -> None:
    """Give a registered method its scoring function (the module that implements it calls this)."""
    METHODS[name] = dataclasses.replace(METHODS[name], scorer=scorer)


def method_names() -> tuple[str, ...]:
    """Every registered method's name, in the order registered."""
    return tuple(METHODS)


def scoring_names() -> tuple[str, ...]:
    """The registered methods that rank a score per edge (the attribution methods)."""
    return tuple(name for name, m in METHODS.items() if m.scores)


def integrating_names() -> tuple[str, ...]:
    """The registered methods that integrate (take ``--ig-steps``)."""
    return tuple(name for name, m in METHODS.items() if m.integrates)


def get_method(name: str) -> CircuitMethod:
    """The entry of a method; one-line ValueError for one not registered."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[name]


def get_scoring(name: str) -> CircuitMethod:
    """The entry of an attribution method (a ``scores`` one); one-line ValueError otherwise."""
    if name not in METHODS or not METHODS[name].scores:
        raise ValueError(f"unknown attribution method {name!r}; choose one of {', '.join(scoring_names())}")
    return METHODS[name]


def is_edge_pruning(name: str | None) -> bool:
    """Whether ``name`` is edge pruning's (a name not registered is not; None means the default)."""
    name = DEFAULT_METHOD if name is None else name
    return name in METHODS and METHODS[name].prunes


def method_tag(name: str) -> str:
    """What a circuit's file stem says of its method: nothing for edge pruning, else ``_<name>``."""
    return "" if is_edge_pruning(name) else "_" + name


def method_help() -> str:
    """``mechlab prune --method``'s help: every method's line, then what they share."""
    return "; ".join(f"{m.name}: {m.help}" for m in METHODS.values()) + ". " + SHARED_HELP


register(CircuitMethod("prune", "differentiable edge pruning (default)", kind="masks"))
register(CircuitMethod("eap", "edge attribution patching (gradient on the corrupted run)",
                       interchange_only="takes the gradient on the corrupted run", takes_at=True))  # fmt: skip
register(CircuitMethod("eap-ig", "integrated gradients over the edge masks", integrates=True))
register(CircuitMethod("eap-ig-inputs", "integrated gradients over the inputs (interchange only)", integrates=True,
                       interchange_only="interpolates the corrupted and the clean inputs"))  # fmt: skip
register(CircuitMethod("exact", "every edge ablated alone"))
register(CircuitMethod("acdc", "greedy ACDC search (graphs up to --acdc-max-edges)", kind="search",
                       checks_as="exact", edge_limit=True, signed=True))  # fmt: skip
