"""One circuit request: the data, search and method settings of a circuit, resolved once.

A :class:`CircuitRequest` is what ``mechlab prune`` (and :func:`~mechlab.pipelines.prune_checkpoint`,
:func:`~mechlab.pipelines.prune_targets`, the report, the pruning through training) asks
for: its recipe's settings with the options the user gave on top
(:meth:`CircuitRequest.resolve`), validated when it is made, so that a bad setting fails
with one line before a checkpoint is opened. It builds a circuit's traces
(:meth:`CircuitRequest.traces`; :class:`TraceCache` builds them once per target and seed
of an opened checkpoint) and the settings record the circuit keeps
(:meth:`CircuitRequest.record`: ``metadata["settings"]``, which a rerun compares to read
a circuit back).
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from mechlab.checkpoint import Checkpoint
from mechlab.circuit_methods import DEFAULT_METHOD, is_edge_pruning
from mechlab.pipelines.data import checkpoint_task, task_data, task_haystack
from mechlab.pipelines.methods import check_method
from mechlab.pipelines.records import with_defaults
from mechlab.prune.config import RECIPES, RUN_ARGUMENTS, config_record
from mechlab.prune.engine import check_prune_args, prune
from mechlab.tasks.registry import DEFAULT_CORRUPTION
from mechlab.traces import PruneData, Target, target_name

NIH_OF_RECIPE = {
    "default": "study",
    "uniform": "uniform",
    "fast": "study",
    "thorough": "study",
    "study": "study",
}
PRUNE_RECIPES: dict[str, dict[str, Any]] = {
    name: {"nih": NIH_OF_RECIPE[name], "sparsity": cfg.sparsity, **cfg.overrides()}
    for name, cfg in RECIPES.items()
}
"""The pruning recipes (``--recipe``): each one's NiH construction (``nih``, the data
side) and its search settings (the :class:`~mechlab.prune.config.PruneConfig` instances
of :data:`mechlab.prune.config.RECIPES`, as the fields that differ from the defaults).
``default``: mechlab's default search at 95% edge sparsity on the study's NiH (oldest
system queried, misdirection to the next); ``uniform``: the same on uniformly drawn NiH
traces; ``fast``: the default search without its second ranking (no exact scores) and
``thorough``: the exact warm start, EAP-IG's ranking in the pool, 200 steps of 64 traces, both
on the study's NiH; ``study``: the recall study's settings (99% edge sparsity, node masks at
80%, loss 1000 x raw MSE to the ground truth, 3000 steps, the Lagrangian) on the study's NiH. A
circuit records its recipe as ``metadata["protocol"]``."""

DATA_KEYS = ("n_train", "n_test", "n_haystack", "seg_len", "corruption", "data_seed", "length")
"""The data settings of a request (the traces a circuit is found and scored on)."""
METHOD_KEYS = ("method", "n_edges", "ig_steps", "acdc_max_edges")
"""The settings that choose the method and its budget (not edge pruning's)."""


def prune_recipe(recipe: str, **given: Any) -> dict[str, Any]:
    """The settings a recipe prunes with, explicit settings on top.

    Args:
        recipe: A key of :data:`PRUNE_RECIPES`.
        **given: Settings asked for explicitly (``sparsity`` or any :func:`prune` keyword);
            ``None`` means "not given".

    Returns:
        ``nih`` (the NiH construction), ``sparsity`` and the :func:`prune` keywords to use.
    """
    if recipe not in PRUNE_RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {list(PRUNE_RECIPES)}")
    return {**PRUNE_RECIPES[recipe], **{k: v for k, v in given.items() if v is not None}}


def check_stability(stability: Any) -> None:
    """One-line ValueError unless ``stability`` is 0 (off) or bootstrap replicates >= 2."""
    if (
        isinstance(stability, bool)
        or not isinstance(stability, int)
        or stability < 0
        or stability == 1
    ):
        raise ValueError(
            f"--stability must be 0 (off) or a number of bootstrap resamples >= 2, got {stability!r}"
        )


def _count(name: str, value: Any, *, optional: bool = False, minimum: int = 1) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"{name} must be an integer >= {minimum}{' or None' if optional else ''}, got {value!r}"
        )


@dataclass(frozen=True)
class CircuitRequest:
    """Every setting of a circuit request, resolved (the recipe's, the user's on top).

    Make one with :meth:`resolve` (the recipe's settings, then the options given); the
    fields are what the circuit is found with.

    Args:
        recipe: The pruning recipe (:data:`PRUNE_RECIPES`).
        sparsity: Edge sparsity in (0, 1) (the recipe's unless given).
        nih: The recipe's NiH construction (``"study"`` or ``"uniform"``).
        search: :func:`~mechlab.prune.engine.prune`'s keywords besides the sparsity: the
            recipe's settings with the given ones on top, and the run's (``seed``,
            ``progress``, ...); read-only.
        n_train: Training traces.
        n_test: Held-out traces.
        n_haystack: Haystack systems (None: the run's, for a task with a haystack).
        seg_len: Observations per haystack segment (None: the run's).
        corruption: How interchange-ablation traces are corrupted (the recall default
            means the task's own default).
        data_seed: Seed of the traces (None: the pruning ``seed``).
        length: Elements per sequence of a state-tracking checkpoint (None: the run's).
        method: ``prune`` (edge pruning) or an attribution method
            (:mod:`mechlab.circuit_methods`).
        n_edges: Keep at most this many countable edges instead of ``sparsity``.
        ig_steps: Integration points of the integrating methods.
        acdc_max_edges: ACDC's limit on countable edges.
        stability: Bootstrap replicates of the circuit's stability (0: not measured).

    Raises:
        ValueError: One line for any bad setting (the search's through
            :class:`~mechlab.prune.config.PruneConfig`, the method's, the data's).
    """

    recipe: str = "default"
    sparsity: float = PRUNE_RECIPES["default"]["sparsity"]
    nih: str = PRUNE_RECIPES["default"]["nih"]
    search: Mapping[str, Any] = field(default_factory=dict)
    n_train: int = 256
    n_test: int = 512
    n_haystack: int | None = None
    seg_len: int | None = None
    corruption: str = DEFAULT_CORRUPTION
    data_seed: int | None = None
    length: int | None = None
    method: str = DEFAULT_METHOD
    n_edges: int | None = None
    ig_steps: int | None = None
    acdc_max_edges: int | None = None
    stability: int = 0

    def __post_init__(self) -> None:
        if self.recipe not in PRUNE_RECIPES:
            raise ValueError(
                f"unknown recipe {self.recipe!r}; choose one of {list(PRUNE_RECIPES)}"
            )
        if self.nih not in NIH_OF_RECIPE.values():
            raise ValueError(
                f"unknown NiH construction {self.nih!r}; choose one of {sorted(set(NIH_OF_RECIPE.values()))}"
            )
        object.__setattr__(self, "search", types.MappingProxyType(dict(self.search)))
        for key in (
            "sparsity",
            "nih",
            *DATA_KEYS,
            *METHOD_KEYS,
            "stability",
            "recipe",
            "protocol",
            "device",
        ):
            if key in self.search:
                raise ValueError(
                    f"{key!r} is not a search setting of a circuit request; give it as its own field"
                )
        check_stability(self.stability)
        # the search's PruneConfig, resolved once (what the settings record holds)
        object.__setattr__(self, "_config", check_prune_args(self.sparsity, **self.search))
        check_method(self.method, dict(self.search), ig_steps=self.ig_steps, n_edges=self.n_edges,
                     acdc_max_edges=self.acdc_max_edges)  # fmt: skip
        _count("n_train", self.n_train)
        _count("n_test", self.n_test)
        _count("n_haystack", self.n_haystack, optional=True)
        _count("seg_len", self.seg_len, optional=True)
        _count("data_seed", self.data_seed, optional=True, minimum=0)
        _count("length", self.length, optional=True)
        if not isinstance(self.corruption, str):
            raise ValueError(
                f"corruption must be a name (e.g. {DEFAULT_CORRUPTION!r}), got {self.corruption!r}"
            )

    @classmethod
    def resolve(
        cls, recipe: str = "default", *, given: Collection[str] | None = None, **options: Any
    ) -> CircuitRequest:
        """The request of a recipe and the options asked for, resolved once.

        Args:
            recipe: A key of :data:`PRUNE_RECIPES`.
            given: The options the user gave explicitly (a command line's): every other
                option that the recipe sets takes the recipe's value. None: every option
                not ``None`` counts as given.
            **options: The request's data and method fields (:data:`DATA_KEYS`,
                :data:`METHOD_KEYS`, ``stability``), ``sparsity`` and any
                :func:`~mechlab.prune.engine.prune` keyword; ``None`` means "not given".

        Returns:
            The :class:`CircuitRequest`.

        Raises:
            ValueError: An unknown recipe or any bad setting, one line.
        """
        if recipe not in PRUNE_RECIPES:
            raise ValueError(f"unknown recipe {recipe!r}; choose one of {list(PRUNE_RECIPES)}")
        if given is not None:  # a recipe's setting applies unless the option was given
            options = {
                k: (None if k in PRUNE_RECIPES[recipe] and k not in given else v)
                for k, v in options.items()
            }
        own = {k: options.pop(k) for k in (*DATA_KEYS, *METHOD_KEYS, "stability") if k in options}
        own = {k: v for k, v in own.items() if v is not None}  # not given: the field's default
        settings = prune_recipe(recipe, **options)
        sparsity, nih = settings.pop("sparsity"), settings.pop("nih")
        return cls(recipe=recipe, sparsity=sparsity, nih=nih, search=settings, **own)

    def with_seed(self, seed: int) -> CircuitRequest:
        """The same request pruned (and, unless ``data_seed`` is set, drawn) with ``seed``
        (a run argument: nothing else is resolved again)."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        if self.search.get("seed") == seed:
            return self
        seeded = copy.copy(self)  # validated already; the seed is no search setting
        object.__setattr__(seeded, "search", types.MappingProxyType({**self.search, "seed": seed}))
        return seeded

    def with_sparsity(self, sparsity: float) -> CircuitRequest:
        """The same request at another edge sparsity."""
        return dataclasses.replace(self, sparsity=sparsity)

    @property
    def seed(self) -> int:
        """The pruning seed (``search``'s, default 0)."""
        return self.search.get("seed", 0)

    @property
    def trace_seed(self) -> int:
        """The seed the traces are drawn with: ``data_seed``, else the pruning seed."""
        return self.seed if self.data_seed is None else self.data_seed

    @property
    def method_settings(self) -> dict[str, Any]:
        """``method``, ``n_edges``, ``ig_steps`` and ``acdc_max_edges``."""
        return {k: getattr(self, k) for k in METHOD_KEYS}

    @property
    def by_method(self) -> bool:
        """Whether the circuit is found by an attribution method (or at a budget in edges),
        not by edge pruning at a sparsity."""
        return not is_edge_pruning(self.method) or self.n_edges is not None

    def keywords(self) -> dict[str, Any]:
        """The request as the keywords of :func:`~mechlab.pipelines.prune_checkpoint`
        (``recipe``, ``sparsity``, the data settings, the search's; the method's and
        ``stability`` when they are not the defaults), ``None`` values left out."""
        data = {k: getattr(self, k) for k in DATA_KEYS if getattr(self, k) is not None}
        method = self.method_settings if self.by_method else {}
        extra = {"stability": self.stability} if self.stability else {}
        return {"recipe": self.recipe, "sparsity": self.sparsity, **data, **self.search,
                **{k: v for k, v in method.items() if v is not None}, **extra}  # fmt: skip

    def traces(self, ckpt: Checkpoint, target: Target) -> tuple[PruneData, Target]:
        """The pruning traces of ``target`` on an opened checkpoint's own task, and the
        target resolved on them (:func:`~mechlab.pipelines.data.task_data`)."""
        return task_data(ckpt, target, length=self.length, n_train=self.n_train, n_test=self.n_test,
                         n_haystack=self.n_haystack, seg_len=self.seg_len, nih=self.nih,
                         corruption=self.corruption, data_seed=self.trace_seed)  # fmt: skip

    def settings(
        self, ckpt: Checkpoint, target: Target, resolved: Target | None = None
    ) -> dict[str, Any] | None:
        """What :func:`~mechlab.pipelines.prune.prune_settings` returns: every setting that
        shapes the circuit, resolved, with the checkpoint's sha256; None for a callable
        target. ``resolved``: the target as the traces resolved it (a task that names its
        targets by their traces; built here when not given)."""
        if callable(target):
            return None
        # resolved through PruneConfig (its defaults, the effective warm-ups) and prune's run
        # defaults (seed, position_aware), so a default and the same value given record alike
        given = {k: v for k, v in self.search.items() if k in RUN_ARGUMENTS}
        run = with_defaults(prune, given)
        settings = {**{k: v for k, v in run.items() if k != "config"},
                    **config_record(self._config, given)}  # fmt: skip
        sparsity = settings.pop("sparsity")
        data: dict[str, Any] = {"n_train": self.n_train, "n_test": self.n_test, "corruption": self.corruption,
                                "data_seed": settings["seed"] if self.data_seed is None else self.data_seed}  # fmt: skip
        task = checkpoint_task(ckpt)
        if task.resolves_targets:  # named on its traces (state tracking: <target>_n<length>)
            if resolved is None:
                _, resolved = task_data(ckpt, target, length=self.length, n_train=1, n_test=1,
                                        corruption=self.corruption)  # fmt: skip
            name = target_name(resolved)
        else:
            name = target_name(target)
        if task.takes_length:
            data["length"] = self.length
        if task.haystack is not None:
            data.update(nih=self.nih, **task_haystack(task, ckpt, self.n_haystack, self.seg_len))
        return {"analysis": "prune", "checkpoint_sha256": ckpt.sha256, "target": name, "recipe": self.recipe,
                "sparsity": sparsity, **data, **settings}  # fmt: skip

    def record(
        self, ckpt: Checkpoint, target: Target, resolved: Target | None = None
    ) -> dict[str, Any] | None:
        """The settings record a circuit of this request keeps (``metadata["settings"]``):
        :meth:`settings` with the method's settings (when not edge pruning's defaults) and
        the bootstrap replicates (when measured). None for a callable target."""
        return with_stability(with_method(self.settings(ckpt, target, resolved), self.method_settings),
                              self.stability)  # fmt: skip


class TraceCache:
    """The traces of one opened checkpoint under one request, built once per target and
    seed: the check of a target, its name and its pruning all use the same traces.

    Args:
        ckpt: The opened checkpoint.
        request: The request (its data settings; each seed drawn by :meth:`get`).
    """

    def __init__(self, ckpt: Checkpoint, request: CircuitRequest) -> None:
        self.ckpt, self.request = ckpt, request
        self._built: dict[tuple[Any, int], tuple[PruneData, Target]] = {}

    def get(self, target: Target, seed: int) -> tuple[PruneData, Target]:
        """``(traces, resolved target)`` of ``target`` pruned with ``seed`` (built on the first call)."""
        request = self.request.with_seed(seed)
        key = (target if isinstance(target, str) else id(target), request.trace_seed)
        if key not in self._built:
            self._built[key] = request.traces(self.ckpt, target)
        return self._built[key]

    def clear(self) -> None:
        """Let the traces go (their circuits are found)."""
        self._built.clear()


def with_stability(record: dict[str, Any] | None, stability: int) -> dict[str, Any] | None:
    """A settings record with the bootstrap replicates when stability is measured (so that a
    circuit made without it is not read back as one with it, nor the other way round; a
    run without it records what it did before)."""
    if record is None or not stability:
        return record
    return {**record, "stability_boots": stability}


def with_method(
    record: dict[str, Any] | None, method_settings: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A settings record with the method's settings when they are not edge pruning's
    defaults (so that a plain pruning run's record stays what it was)."""
    method = method_settings.get("method") or DEFAULT_METHOD
    if record is None or (is_edge_pruning(method) and method_settings.get("n_edges") is None):
        return record
    return {
        **record,
        **{k: v for k, v in method_settings.items() if v is not None},
        "method": method,
    }
