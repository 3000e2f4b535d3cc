"""Pruning settings: one frozen, validated :class:`PruneConfig` for every search.

:func:`~mechlab.prune.engine.prune`, :func:`~mechlab.prune.joint.joint_prune`, the
sweeps and the pipelines all take their search settings from a :class:`PruneConfig`
(``prune()``'s keywords build one). It is validated when it is made, so a bad value or
an unknown setting fails with one line before any work. The named protocols
(:data:`RECIPES`) are instances; the data each protocol prunes on (the NiH
construction) is the data side's business and lives with the pipelines.

The default search (docs/pruning.md, "Optimisation"):

* **warm start** ``"eap-ig"``: the masks start from EAP-IG's ranking on the training
  traces (:func:`~mechlab.prune.search.warm_logits`: only the order is used). Integrated
  gradients pass through the states where one of two redundant paths is half open, so
  they score edges that matter only together, which single-edge ablation scores 0;
* **loss**: the task loss divided by the fully ablated model's (``normalize_loss``), so
  it reads ``1 - faithfulness`` of the batch whatever the scale of the outputs;
* **constraint** ``"budget"``: no Lagrange multipliers. At every step the masks'
  logits are shifted by one common threshold, solved so that the expected number of
  open countable edges is exactly the scheduled budget (linear from all edges to the
  asked count over the first ``warmup`` steps). The masks move only by the task
  gradient (Adam: invariant to the loss's scale), the budget is met at every step and
  at the end, and nothing can wind up and close the circuit;
* **noise** ``"mixed"``: the masks' noise shared by every edge on even steps (each
  sampled circuit a top set of the ranking: groups of edges that only help together,
  a query and a key, are tried together) and independent on odd ones; 50 steps of 32
  traces;
* **select** ``"refine"``: the circuit is chosen on the true objective (binary masks,
  :mod:`mechlab.prune.refine`): backward elimination from the search's ``n_keep +
  refine_extra`` best edges, the warm start's ``n_keep`` best and those of a second
  ranking (``refine_pool="auto"``: exact single-edge ablation on the first
  ``pool_traces`` training traces up to :data:`EXACT_WARM_MAX` countable edges, EAP
  above), against the search's and both rankings' own complete paths, the lowest loss
  kept; then filled up to the budget with the edges that reduce the loss most, while
  any does measurably. The circuit is therefore never worse, on the selection's traces,
  than either ranking's attribution circuit of the same size.

``noise="shared+mixed"`` runs two searches (shared and mixed noise) and keeps the circuit
of lower loss (:func:`~mechlab.prune.engine.run_searches`; the joint search's default).
``constraint="lagrangian"`` is Edge Pruning's (Bhaskar et al. 2024) Lagrangian
``lambda1 (s - t) + lambda2 (s - t)^2`` with the multipliers' learning rate warmed up
and decayed (mechlab's previous default; the ``study`` protocol uses it), and
``select="rank"`` keeps the edges of highest mask on complete paths.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from mechlab._deprecated import moved_names
from mechlab.prune.forward import ABLATIONS
from mechlab.prune.masks import INIT_MEAN

LOSSES = ("model", "truth")
CONSTRAINTS = ("budget", "lagrangian")
SELECTIONS = ("refine", "rank")
NOISES = ("shared+mixed", "shared", "independent", "mixed")
REFINE_POOLS = ("auto", "eap-ig", "eap", "exact", "none")  # a second ranking the selection draws from
OPTIMIZERS = ("shared-adam", "adam")  # the masks' optimiser (search.SharedScaleAdam, torch's Adam)
WARM_STARTS = ("auto", "eap-ig", "exact", "eap", "none")  # where a search's masks start
EXACT_WARM_MAX = 1000  # "auto": exact single-edge scores up to this many countable edges, else EAP-IG (EAP for the pool)
NOISE_RUNS = {"shared+mixed": ("shared", "mixed")}  # noise settings that run several searches
LR = 0.1  # learning rate of the masks (constant)
LAMBDA_LR = 1.0  # peak learning rate of the Lagrange multipliers (constraint "lagrangian")
# prune()'s keywords that are not search settings: they say which run this is
RUN_ARGUMENTS = ("seed", "progress", "checkpoint_sha256", "position_aware")


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _unit(name: str, value: Any, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    if not ((value >= 0 if allow_zero else value > 0) and value < 1):
        raise ValueError(f"{name} must be in {'[0, 1)' if allow_zero else '(0, 1)'}, got {value!r}")


def _positive(name: str, value: Any) -> None:
    if _number(name, value) <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


def _count(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {choices}")


@dataclass(frozen=True)
class PruneConfig:
    """Every setting of a pruning search (module docstring), validated when made.

    Args:
        sparsity: Fraction of the countable edges to remove, in (0, 1).
        node_sparsity: Also mask writer nodes, at this sparsity in [0, 1) (None: no node masks).
        ablation: ``"interchange"`` (corrupted traces), ``"mean"`` or ``"zero"``.
        loss: ``"model"`` (match the full model: MSE, or KL for token models) or
            ``"truth"`` (match the ground truth).
        normalize_loss: Divide the task loss by the fully ablated model's (default True).
        loss_scale: Multiplies the task loss (the study: 1000 x raw MSE). Under the
            ``"budget"`` constraint it changes nothing but the weight of a joint search's
            sharing term (Adam is invariant to the scale of the loss).
        constraint: ``"budget"`` (default) or ``"lagrangian"``.
        steps: Optimiser steps.
        warmup: Steps over which the budget (or the Lagrangian's target) goes from every
            edge to the asked sparsity (None: ``steps // 2``).
        lr: Adam learning rate of the masks.
        lambda_lr: Peak learning rate of the Lagrange multipliers (``"lagrangian"`` only).
        lambda_warmup: Warm-up of the multipliers' learning rate (None: ``steps // 10``).
        batch_size: Traces per step.
        init_mean: Mean of the initial ``log_alpha``.
        noise: Mask noise (:mod:`mechlab.prune.search`): ``"shared+mixed"`` (two searches,
            the better kept), ``"shared"``, ``"independent"`` or ``"mixed"``.
        select: ``"refine"`` (default: choose on the true objective) or ``"rank"``.
        refine_extra: The elimination starts from the quota plus this many edges.
        refine_traces: Training traces the selection scores each candidate on.
        pool_traces: The first training traces the ``refine_pool`` ranking is scored on
            (None: every one).
        validate_traces: Training traces after the selection's on which its circuit must
            beat the reference ranking's own circuit (the ``refine_pool``'s, else the warm
            start's) by two standard errors, or that circuit is taken instead
            (:func:`~mechlab.prune.refine.select_edges`, step 3; 0: no check; fewer when
            there are fewer traces, none below 2).
        min_effect: An edge whose removal (or addition) changes the normalised loss by
            less than this has no measurable effect: the fill stops there, and the
            circuit's metadata lists kept edges below it.
        warm_start: Start the masks from an attribution method's ranking
            (:data:`WARM_STARTS`; :func:`~mechlab.prune.search.warm_logits`) and let the
            selection also weigh that method's own circuit, or ``"none"`` (every mask
            starts at ``init_mean``). Default ``"eap-ig"``; ``"auto"``: exact single-edge
            ablation up to :data:`EXACT_WARM_MAX` countable edges (one replay per edge),
            EAP-IG above.
        warm_steps: Integration points of an ``"eap-ig"`` warm start (and of an
            ``"eap-ig"`` ``refine_pool``).
        optimizer: The masks' optimiser: ``"shared-adam"``
            (:class:`~mechlab.prune.search.SharedScaleAdam`: one second moment per
            target, so steps keep the gradients' ratio) or ``"adam"`` (torch's, per edge).
            With the ``"lagrangian"`` constraint torch's Adam is used.
        refine_pool: An attribution method whose ranking (on the first ``pool_traces``
            training traces) the selection also draws from (its best ``n_keep`` edges
            join the elimination's pool, its complete-path circuit is a candidate),
            besides the search's and the warm start's, or ``"none"``. ``"auto"`` (the
            default): exact single-edge ablation up to :data:`EXACT_WARM_MAX` countable
            edges, EAP above. Skipped when it is the warm start's method.
    """

    sparsity: float = 0.95
    node_sparsity: float | None = None
    ablation: str = "interchange"
    loss: str = "model"
    normalize_loss: bool = True
    loss_scale: float = 1.0
    constraint: str = "budget"
    steps: int = 50
    warmup: int | None = None
    lr: float = LR
    lambda_lr: float = LAMBDA_LR
    lambda_warmup: int | None = None
    batch_size: int = 32
    init_mean: float = INIT_MEAN
    noise: str = "mixed"
    select: str = "refine"
    refine_extra: int = 16
    refine_traces: int = 128
    pool_traces: int | None = 64
    validate_traces: int = 128
    min_effect: float = 1e-4
    warm_start: str = "eap-ig"
    warm_steps: int = 3
    optimizer: str = "shared-adam"
    refine_pool: str = "auto"

    def __post_init__(self) -> None:
        _unit("sparsity", self.sparsity)
        if self.node_sparsity is not None:
            _unit("node_sparsity", self.node_sparsity, allow_zero=True)
        _choice("ablation", self.ablation, ABLATIONS)
        _choice("loss", self.loss, LOSSES)
        if not isinstance(self.normalize_loss, bool):
            raise ValueError(f"normalize_loss must be True or False, got {self.normalize_loss!r}")
        _positive("loss_scale", self.loss_scale)
        _choice("constraint", self.constraint, CONSTRAINTS)
        _count("steps", self.steps)
        if self.warmup is not None:
            _count("warmup", self.warmup, minimum=0)
        _positive("lr", self.lr)
        _positive("lambda_lr", self.lambda_lr)
        if self.lambda_warmup is not None:
            _count("lambda_warmup", self.lambda_warmup)
        _count("batch_size", self.batch_size)
        _number("init_mean", self.init_mean)
        _choice("noise", self.noise, NOISES)
        _choice("select", self.select, SELECTIONS)
        _count("refine_extra", self.refine_extra, minimum=0)
        _count("refine_traces", self.refine_traces)
        if self.pool_traces is not None:
            _count("pool_traces", self.pool_traces)
        _count("validate_traces", self.validate_traces, minimum=0)
        if _number("min_effect", self.min_effect) < 0:
            raise ValueError(f"min_effect must be >= 0, got {self.min_effect!r}")
        _choice("warm_start", self.warm_start, WARM_STARTS)
        _count("warm_steps", self.warm_steps)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("refine_pool", self.refine_pool, REFINE_POOLS)
        for name in ("sparsity", "loss_scale", "lr", "lambda_lr", "init_mean", "min_effect"):
            object.__setattr__(self, name, float(getattr(self, name)))  # 1 -> 1.0 (JSON alike)

    @property
    def warmup_steps(self) -> int:
        return self.steps // 2 if self.warmup is None else self.warmup

    @property
    def lambda_warmup_steps(self) -> int:
        return max(1, self.steps // 10) if self.lambda_warmup is None else self.lambda_warmup

    @classmethod
    def from_settings(cls, base: PruneConfig | None = None, **settings: Any) -> PruneConfig:
        """``base`` (default: the defaults) with ``settings`` on top; ``None`` values mean
        "not given". Unknown settings are refused with one line naming them."""
        given = {k: v for k, v in settings.items() if v is not None}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(
                f"unknown pruning setting{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(known))}"
            )
        return dataclasses.replace(base or cls(), **given)

    def overrides(self) -> dict[str, Any]:
        """The settings that differ from the defaults."""
        default = PruneConfig()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Every setting, plain data (recorded in a circuit's metadata), with the
        effective ``warmup`` and ``lambda_warmup``."""
        out = dataclasses.asdict(self)
        out["warmup"], out["lambda_warmup"] = self.warmup_steps, self.lambda_warmup_steps
        return out


RECIPES: dict[str, PruneConfig] = {
    "default": PruneConfig(),
    "uniform": PruneConfig(),
    "fast": PruneConfig(refine_pool="none"),
    "thorough": PruneConfig(warm_start="auto", steps=200, batch_size=64, refine_pool="eap-ig", pool_traces=None,
                            validate_traces=0, warm_steps=5),
    "study": PruneConfig(
        sparsity=0.99, node_sparsity=0.8, loss="truth", normalize_loss=False, loss_scale=1000.0,
        steps=3000, constraint="lagrangian", noise="independent", select="rank", warm_start="none",
        batch_size=64,
    ),
}
"""The named protocols' search settings. ``default`` and ``uniform``: mechlab's default
search at 95% edge sparsity (they differ in their data: :data:`mechlab.pipelines.PRUNE_RECIPES`);
``fast``: the default without the second ranking (no exact scores at all: about 1.5x
EAP-IG's time on the bundled checkpoint, below exact ablation's circuit on 2-after,
docs/pruning.md); ``thorough``: the exact warm start (EAP-IG above
:data:`EXACT_WARM_MAX` countable edges) and EAP-IG's ranking on every training trace in
the pool, 200 steps of 64 traces (several times slower);
``study``: the recall study's Edge Pruning settings (99% edge sparsity, node masks at 80%,
1000 x raw MSE to the ground truth, 3000 steps of 64 traces, the Lagrangian, independent mask noise,
edges ranked by mask)."""


JOINT_CONFIG = PruneConfig(steps=500, noise="shared+mixed", warm_start="none", batch_size=64,
                           refine_traces=128, refine_pool="eap-ig", pool_traces=None, warm_steps=5)
""":func:`~mechlab.prune.joint.joint_prune`'s base settings: two 500-step searches (shared and
mixed noise) from a cold start, 64 traces a step, the selection on 128 with EAP-IG's ranking
(on every training trace) in its pool. A shared search
(``share > 0``) is the sum of the targets' losses plus the sharing term, which one target's
attribution ranking does not describe, so it starts cold. Its masks move by the shared-scale
Adam as the default's do: with per-edge Adam the shared-noise search of
``tests/prune/test_joint.py``'s gated model (seed 1, share 1) closed every edge, the small
gradients of the private paths taking full steps while the shared path's were zero."""


def prune_config(
    sparsity: float | None = None, config: PruneConfig | None = None, **settings: Any
) -> PruneConfig:
    """The :class:`PruneConfig` of :func:`~mechlab.prune.engine.prune`'s arguments.

    Args:
        sparsity: Overrides the config's (None: keep it).
        config: The base (default: the defaults).
        **settings: Any :class:`PruneConfig` field (``None``: not given); run arguments
            (:data:`RUN_ARGUMENTS`) are ignored, anything else is refused.
    """
    search = {k: v for k, v in settings.items() if k not in RUN_ARGUMENTS}
    return PruneConfig.from_settings(config, sparsity=sparsity, **search)



def resolved_settings(
    settings: dict[str, Any], base: PruneConfig | None = None, *, sparsity: bool = True
) -> dict[str, Any]:
    """The search settings of a run, resolved: every :class:`PruneConfig` field of
    ``base`` (default: the defaults) with ``settings`` on top (:meth:`PruneConfig.to_dict`,
    so the effective warm-ups), and the run arguments given (:data:`RUN_ARGUMENTS`; the
    progress bar and the digest left out). What a settings record holds, so that a setting
    left to its default and the same value given explicitly record alike.

    Args:
        settings: The settings given (``None``: not given); ``config`` (a base),
            ``device`` and ``threads`` are also taken.
        base: The base when ``settings`` has no ``config``.
        sparsity: Keep ``sparsity`` in the result (False: leave it out).
    """
    given = {k: v for k, v in settings.items() if k not in ("device", "threads", "progress")}
    config = given.pop("config", None) or base
    out = config_record(prune_config(given.pop("sparsity", None), config, **given), given)
    if not sparsity:
        out.pop("sparsity")
    return out


def config_record(config: PruneConfig, settings: dict[str, Any]) -> dict[str, Any]:
    """The record of a resolved search: the run arguments among ``settings``
    (:data:`RUN_ARGUMENTS`; the progress bar and the digest left out), then every field of
    ``config`` (:meth:`PruneConfig.to_dict`). :func:`resolved_settings` once the config is
    built (a caller that holds it already records it without building it again)."""
    run = {k: v for k, v in settings.items() if k in RUN_ARGUMENTS and k not in ("progress", "checkpoint_sha256")}
    return {**run, **config.to_dict()}


__all__ = [
    "CONSTRAINTS",
    "LAMBDA_LR",
    "LOSSES",
    "LR",
    "RECIPES",
    "NOISES",
    "NOISE_RUNS",
    "OPTIMIZERS",
    "PruneConfig",
    "REFINE_POOLS",
    "RUN_ARGUMENTS",
    "SELECTIONS",
    "EXACT_WARM_MAX",
    "JOINT_CONFIG",
    "WARM_STARTS",
    "config_record",
    "prune_config",
    "resolved_settings",
]

__getattr__ = moved_names(__name__)  # PROTOCOLS, renamed RECIPES
