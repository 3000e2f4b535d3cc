"""Label-based vs observation-based recall, per offset after the query label.

The study (Daniels et al. 2025) finds that a model trained on interleaved linear systems
predicts the first observation after a query label ("1-after") from the symbolic label
(label-based recall), and the later ones ("2-after", ...) from the observations of the
continuation (observation-based recall). This module measures which input each
prediction follows, by patching needle-in-a-haystack traces (:func:`mechlab.tasks.nih`).
It works on a loaded model and opens no file: :func:`mechlab.pipelines.recall_checkpoint`
and :func:`mechlab.pipelines.recall_dynamics` run it on a checkpoint or a run.

With the query's open label at token ``p``, the "j-after" prediction is output ``p + j - 1``.
Three patched versions of every clean trace (each changes input tokens only):

* **label patch**: token ``p`` taken from the ``misdirect_incorrect`` twin: the label now
  names another haystack system, the observations are unchanged;
* **observation patch**: token ``p + 1`` (the first observation of the continuation) taken
  from the ``misdirect_restart`` twin: a state of a never-seen system, the label unchanged;
* **all-observations patch**: the ``misdirect_restart`` trace itself (every continuation
  observation from another system, the label unchanged).

For offset ``j``, ``E_label_j`` is the mean over traces of the squared change (summed over
state dims) of the prediction at ``p + j - 1`` under the label patch, ``E_obs_j`` the same
under the observation patch, and ``scale_j`` the mean squared norm of the true target
(about 1: the zero predictor's error). Then (:func:`recall_score`, :func:`verdict`)::

    score_j = E_label_j / (E_label_j + E_obs_j)        in [0, 1]
    "neither"      if max(E_label_j, E_obs_j) < min_effect * scale_j   (default 0.05)
    "label"        elif score_j >= label_at                            (default 2/3)
    "observation"  elif score_j <= observation_at                      (default 1/3)
    "mixed"        otherwise

``score_all`` / ``verdict_all`` use the all-observations patch instead. The 1-after
prediction is made before any observation of the continuation is read, so its
``E_obs`` is 0 by causality: its verdict is "label" or "neither".

A directly interpretable second score: under ``misdirect_incorrect``, ``follows_label_j`` is
the fraction of traces whose prediction is closer to the continuation of the system the
label names (slot ``other``, where its haystack segment stopped) than to the continuation
actually observed (the query system's).

Per component (:func:`component_sweep`): the output of each attention layer (``a{l}``),
each head (``a{l}.h{h}``, a slice of ``blocks.{l}.attn.hook_result``), each MLP (``m{l}``)
and each recurrent mixer (``l{l}``) at the patched position, taken from the corrupted run
into the clean one (``noise``) or from the clean run into the corrupted one (``denoise``);
``fraction`` is the share of the whole-token patch's effect the component alone carries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import Tensor, nn

from mechlab.models.base import predict_in_chunks
from mechlab.progress import tqdm
from mechlab.tasks.lds import LDSConfig, rollout
from mechlab.tasks.nih import NiH, default_haystack, nih

VERDICTS = ("label", "observation", "mixed", "neither")
PROBE_NAMES = ("misdirect_incorrect", "sync_rotations", "misdirect_unseen", "misdirect_restart")
DIRECTIONS = ("noise", "denoise")


@dataclass(frozen=True)
class VerdictRule:
    """Thresholds that turn ``E_label``/``E_obs`` into a verdict (see the module docstring).

    Args:
        min_effect: A patch "moves" the prediction when its mean squared change is at
            least this fraction of the target's mean squared norm.
        label_at: Scores at or above this are "label".
        observation_at: Scores at or below this are "observation".
    """

    min_effect: float = 0.05
    label_at: float = 2 / 3
    observation_at: float = 1 / 3

    def __post_init__(self) -> None:
        if not (isinstance(self.min_effect, (int, float)) and self.min_effect > 0):
            raise ValueError(f"min_effect must be a positive number, got {self.min_effect!r}")
        if not 0 <= self.observation_at < self.label_at <= 1:
            raise ValueError(
                "need 0 <= observation_at < label_at <= 1, got "
                f"observation_at={self.observation_at!r}, label_at={self.label_at!r}"
            )


def recall_score(e_label: float, e_obs: float) -> float:
    """``e_label / (e_label + e_obs)``: 1 = only the label moves the prediction, 0 = only
    the observation; NaN when neither moves it at all.

    Args:
        e_label: Mean squared change under the label patch (>= 0).
        e_obs: Mean squared change under the observation patch (>= 0).

    Returns:
        The score in [0, 1], or NaN.
    """
    if e_label < 0 or e_obs < 0 or math.isnan(e_label) or math.isnan(e_obs):
        raise ValueError(f"effects must be non-negative numbers, got {e_label!r} and {e_obs!r}")
    total = e_label + e_obs
    return e_label / total if total > 0 else math.nan


def verdict(e_label: float, e_obs: float, scale: float, rule: VerdictRule | None = None) -> str:
    """"label", "observation", "mixed" or "neither" for one offset (module docstring).

    Args:
        e_label: Mean squared change under the label patch.
        e_obs: Mean squared change under the observation patch.
        scale: Mean squared norm of the true target (what "a large change" is relative to).
        rule: Thresholds; default :class:`VerdictRule`.

    Returns:
        One of :data:`VERDICTS`.
    """
    rule = rule or VerdictRule()
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    score = recall_score(e_label, e_obs)
    if max(e_label, e_obs) < rule.min_effect * scale:
        return "neither"
    if score >= rule.label_at:
        return "label"
    if score <= rule.observation_at:
        return "observation"
    return "mixed"


def patch_token(inputs: Tensor, source: Tensor, position: int) -> Tensor:
    """A copy of ``inputs`` (``[batch, pos, d_in]``) whose token ``position`` is ``source``'s."""
    out = inputs.clone()
    out[:, position] = source[:, position]
    return out


def squared_change(a: Tensor, b: Tensor, positions: Tensor) -> Tensor:
    """``||a - b||^2`` summed over the last dim at ``positions``: ``[batch, n_positions]``."""
    index = positions.to(a.device)
    return (a[:, index].double() - b[:, index].double()).pow(2).sum(-1)


def label_continuation(traces: NiH, slot: Tensor) -> Tensor:
    """The states slot ``slot`` (``[batch]``) would show at the scored offsets had it
    continued where its haystack segment stopped (trajectory indices ``S + j - 1``).

    Returns:
        ``[batch, n_offsets, d_state]`` float64 states.
    """
    batch = traces.clean_batch
    rows = torch.arange(len(traces))
    U = traces.library.U[batch.systems[rows, slot]].double()  # [batch, d, d]
    x0 = batch.x0[rows, slot].double()  # [batch, d]
    states = rollout(U, x0, 2 * traces.seg_len)  # [batch, 2S, d]
    steps = torch.tensor([traces.seg_len + j - 1 for j in traces.offsets])
    return states[:, steps]


def _device(model: nn.Module) -> torch.device:
    return next(iter(model.parameters()), torch.zeros(0)).device


def _predict(model: nn.Module, inputs: Tensor, batch_size: int) -> Tensor:
    with torch.no_grad():
        return predict_in_chunks(model, inputs, batch_size).double().cpu()


def components_of(model: nn.Module) -> list[tuple[str, str, int | None]]:
    """Patchable components: ``(name, hook, head)`` for each attention layer output
    (``a{l}``), attention head (``a{l}.h{h}``), MLP (``m{l}``) and recurrent mixer (``l{l}``)
    the model has; empty for a model without ``blocks.{l}`` hooks.
    """
    hooks = getattr(model, "hook_dict", {})
    n_heads = getattr(getattr(model, "cfg", None), "n_heads", 0)
    out: list[tuple[str, str, int | None]] = []
    layer = 0
    while any(k.startswith(f"blocks.{layer}.") for k in hooks):
        if f"blocks.{layer}.hook_attn_out" in hooks:
            out.append((f"a{layer}", f"blocks.{layer}.hook_attn_out", None))
        if f"blocks.{layer}.attn.hook_result" in hooks:
            out.extend((f"a{layer}.h{h}", f"blocks.{layer}.attn.hook_result", h) for h in range(n_heads))
        if f"blocks.{layer}.hook_mlp_out" in hooks:
            out.append((f"m{layer}", f"blocks.{layer}.hook_mlp_out", None))
        if f"blocks.{layer}.hook_mixer_out" in hooks:
            out.append((f"l{layer}", f"blocks.{layer}.hook_mixer_out", None))
        layer += 1
    return out


def component_sweep(
    model: nn.Module,
    clean: Tensor,
    corrupted: Tensor,
    position: int,
    positions: Tensor,
    offsets: tuple[int, ...],
    direction: str = "noise",
    progress: bool = False,
) -> pd.DataFrame:
    """Patch one component's output at ``position`` at a time; how much of the whole-input
    effect does it carry at each scored position?

    ``noise``: the corrupted run's output into the clean run; ``shift`` is the mean squared
    change of the prediction from the clean one, ``fraction = shift / E_whole``.
    ``denoise``: the clean run's output into the corrupted run; ``shift`` is the mean squared
    distance left to the clean prediction, ``fraction = 1 - shift / E_whole``. ``E_whole``
    is the mean squared difference between the clean and the corrupted predictions.

    Args:
        model: A HookedRootModule (see :func:`components_of`).
        clean: ``[batch, pos, d_in]`` clean inputs.
        corrupted: ``[batch, pos, d_in]`` corrupted inputs (differing from ``clean`` at
            ``position``, and possibly later).
        position: The position whose component outputs are patched.
        positions: ``[n_offsets]`` output positions scored.
        offsets: The offsets those positions stand for (labels of the rows).
        direction: ``"noise"`` or ``"denoise"``.
        progress: Show a progress bar.

    Returns:
        One row per component and offset: ``direction, component, layer, head, offset,
        shift, fraction`` (``head`` is -1 for whole-layer components).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; choose one of {list(DIRECTIONS)}")
    comps = components_of(model)
    if not comps:
        return pd.DataFrame(columns=["direction", "component", "layer", "head", "offset", "shift", "fraction"])
    dev = _device(model)
    clean, corrupted = clean.to(dev), corrupted.to(dev)
    source, dest = (corrupted, clean) if direction == "noise" else (clean, corrupted)
    hook_names = sorted({hook for _, hook, _ in comps})
    rows = []
    with torch.no_grad():
        base = model(clean).double()  # [batch, pos, d_out]
        e_whole = squared_change(model(corrupted), base, positions).mean(0)  # [n_offsets]
        _, cache = model.run_with_cache(source, names_filter=lambda n: n in hook_names)
        for name, hook, head in tqdm(comps, disable=not progress, desc=f"{direction} sweep"):
            value = cache[hook][:, position] if head is None else cache[hook][:, position, head]

            def patch(act: Tensor, hook: Any, value: Tensor = value, head: int | None = head) -> Tensor:
                if head is None:
                    act[:, position] = value
                else:
                    act[:, position, head] = value
                return act

            pred = model.run_with_hooks(dest, fwd_hooks=[(hook, patch)]).double()
            shift = squared_change(pred, base, positions).mean(0)  # [n_offsets]
            ratio = torch.where(e_whole > 0, shift / e_whole.clamp(min=1e-300), torch.nan)
            carried = ratio if direction == "noise" else 1 - ratio  # NaN where nothing changes
            layer = int(hook.split(".")[1])
            for i, j in enumerate(offsets):
                rows.append({
                    "direction": direction, "component": name, "layer": layer,
                    "head": -1 if head is None else head, "offset": j,
                    "shift": float(shift[i]), "fraction": float(carried[i]),
                })  # fmt: skip
    return pd.DataFrame(rows)


def _summary(values: Tensor) -> dict[str, float]:
    q = torch.quantile(values.double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.double))
    return {"median": float(q[1]), "q1": float(q[0]), "q3": float(q[2]), "mean": float(values.double().mean())}


def _nan_to_none(x: float) -> float | None:
    return None if math.isnan(x) else x


@dataclass
class RecallReport:
    """What :func:`recall_analysis` measures; :meth:`to_dict` is JSON-ready.

    Attributes:
        offsets: The offsets ``j`` ("j-after").
        n_traces, n_haystack, seg_len, seed: The traces' settings.
        protocol: The NiH construction (``"study"`` or ``"uniform"``).
        query_position: Token ``p`` of the query label.
        errors: Probe (``clean`` and the four probes) -> offset -> median/q1/q3/mean of
            the squared error against that trace's own truth.
        e_label, e_obs, e_obs_all: Per offset, mean squared change of the prediction under
            the label / first-observation / all-observations patch.
        scale: Per offset, mean squared norm of the true target.
        score, verdict: Per offset, from ``e_label`` and ``e_obs``.
        score_all, verdict_all: Per offset, from ``e_label`` and ``e_obs_all``.
        follows_label: Per offset, fraction of ``misdirect_incorrect`` traces whose prediction
            is closer to the labelled system's continuation than to the observed one.
        rule: The verdict thresholds.
        components: Per-component patching (:func:`component_sweep`) of the label patch at
            ``p`` and the observation patch at ``p + 1``; column ``patch`` says which.
    """

    offsets: tuple[int, ...]
    n_traces: int
    n_haystack: int
    seg_len: int
    seed: int
    query_position: int
    errors: dict[str, dict[int, dict[str, float]]]
    e_label: list[float]
    e_obs: list[float]
    e_obs_all: list[float]
    scale: list[float]
    score: list[float]
    verdict: list[str]
    score_all: list[float]
    verdict_all: list[str]
    follows_label: list[float]
    rule: VerdictRule
    components: pd.DataFrame = field(default_factory=pd.DataFrame)
    protocol: str = "study"

    def label_heads(self, offset: int = 1, direction: str = "noise", top: int = 5) -> list[tuple[str, float]]:
        """The attention heads that carry most of the label patch at ``offset``.

        Returns:
            Up to ``top`` ``(head, fraction)`` pairs, largest fraction first.
        """
        df = self.components
        if df.empty:
            return []
        sel = df[(df.patch == "label") & (df.direction == direction) & (df.offset == offset) & (df["head"] >= 0)]
        sel = sel.sort_values("fraction", ascending=False).head(top)
        return [(str(c), float(f)) for c, f in zip(sel.component, sel.fraction, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (NaN scores become None)."""
        per_offset = {
            str(j): {
                "e_label": self.e_label[i], "e_obs": self.e_obs[i], "e_obs_all": self.e_obs_all[i],
                "scale": self.scale[i], "score": _nan_to_none(self.score[i]), "verdict": self.verdict[i],
                "score_all": _nan_to_none(self.score_all[i]), "verdict_all": self.verdict_all[i],
                "follows_label": self.follows_label[i],
            }
            for i, j in enumerate(self.offsets)
        }  # fmt: skip
        return {
            "offsets": list(self.offsets), "n_traces": self.n_traces, "n_haystack": self.n_haystack,
            "seg_len": self.seg_len, "seed": self.seed, "protocol": self.protocol,
            "query_position": self.query_position,
            "rule": {"min_effect": self.rule.min_effect, "label_at": self.rule.label_at,
                     "observation_at": self.rule.observation_at},
            "per_offset": per_offset,
            "errors": {p: {str(j): s for j, s in d.items()} for p, d in self.errors.items()},
            "label_heads": {d: self.label_heads(1, d) for d in DIRECTIONS},
            "components": [
                {k: _nan_to_none(v) if isinstance(v, float) else v for k, v in row.items()}
                for row in self.components.to_dict(orient="records")
            ],
        }  # fmt: skip


def _resolve_offsets(offsets: Any, seg_len: int) -> tuple[int, ...]:
    if offsets is None:
        return tuple(range(1, seg_len + 1))
    offsets = tuple(offsets)
    if not offsets:
        raise ValueError("offsets is empty; give at least one offset in 1..seg_len")
    for j in offsets:
        if not isinstance(j, int) or isinstance(j, bool) or j < 1:
            raise ValueError(f"offsets must be positive integers, got {j!r}")
        if j > seg_len:
            raise ValueError(
                f"offset {j} is beyond seg_len={seg_len} (the query segment has {seg_len} "
                f"observations); use offsets in 1..{seg_len} or a larger seg_len"
            )
    return tuple(sorted(set(offsets)))


def recall_analysis(
    source: Any,
    model: nn.Module | None = None,
    *,
    n_traces: int = 256,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    offsets: tuple[int, ...] | None = None,
    seed: int = 0,
    protocol: str = "study",
    rule: VerdictRule | None = None,
    components: bool = True,
    batch_size: int = 256,
    progress: bool = True,
) -> RecallReport:
    """Which input (label or observations) each prediction after the query label follows.

    Args:
        source: A :class:`~mechlab.checkpoint.Checkpoint` of a run on the ``lds`` task (its
            model, task and evaluation settings are used) or an :class:`LDSConfig`.
        model: The model; default the checkpoint's (required with an ``LDSConfig``).
        n_traces: NiH traces.
        n_haystack: Haystack systems (default: the run's evaluation setting).
        seg_len: Observations per segment (default: the run's evaluation setting).
        offsets: Offsets ``j`` to score; default every one of ``1..seg_len``.
        seed: Seed of the traces.
        protocol: NiH construction: ``"study"`` (oldest system queried, misdirection to
            the next) or ``"uniform"`` (both drawn uniformly).
        rule: Verdict thresholds (default :class:`VerdictRule`).
        components: Also patch each component (heads, layers) at the patched position.
        batch_size: Traces per forward pass of the whole-input runs.
        progress: Show progress bars.

    Returns:
        A :class:`RecallReport`.

    Raises:
        ValueError: A source without the task's metadata, no model, offsets beyond
            ``seg_len``, or settings that do not fit the task.
    """
    cfg = source if isinstance(source, LDSConfig) else getattr(source, "task_config", None)
    if model is None:
        model = getattr(source, "model", None)
    if not isinstance(cfg, LDSConfig):
        raise ValueError(
            f"recall analysis needs a checkpoint of an lds run or an LDSConfig, got {type(source).__name__}"
        )
    if not isinstance(model, nn.Module):
        raise ValueError("give the model to analyse: recall_analysis(cfg, model=...)")
    rule = rule or VerdictRule()
    train_cfg = getattr(source, "metadata", {}).get("train_cfg")
    default_n, default_s = default_haystack(cfg, train_cfg if isinstance(train_cfg, dict) else None)
    n_haystack = default_n if n_haystack is None else n_haystack
    seg_len = default_s if seg_len is None else seg_len
    if not isinstance(seg_len, int) or seg_len < 1:
        raise ValueError(f"seg_len must be a positive integer, got {seg_len!r}")
    offsets = _resolve_offsets(offsets, seg_len)
    kw = {"n_haystack": n_haystack, "seg_len": seg_len, "offsets": offsets, "seed": seed,
          "protocol": protocol}
    probed = {probe: nih(cfg, n_traces, probe=probe, **kw) for probe in PROBE_NAMES}
    t, restart = probed["misdirect_incorrect"], probed["misdirect_restart"]
    n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", t.n_pos)
    if t.n_pos > n_ctx:
        raise ValueError(
            f"{n_haystack} haystack segments of {seg_len} need {t.n_pos} positions, more than "
            f"the model's n_ctx={n_ctx}; use a smaller n_haystack or seg_len"
        )
    p, pos = t.query_position, t.positions

    was_training = model.training
    model.eval()
    try:
        pred = {"clean": _predict(model, t.clean, batch_size)}
        for probe, traces in probed.items():
            pred[probe] = _predict(model, traces.corrupted, batch_size)
        # the label patch (token p from the misdirected twin) is the misdirected trace
        # itself: the twins differ only at p within the model's inputs (tested)
        pred_label = pred["misdirect_incorrect"]
        obs_patched = patch_token(t.clean, restart.corrupted, p + 1)  # first observation swapped
        pred_obs = _predict(model, obs_patched, batch_size)
        sweep = pd.DataFrame()
        if components:
            parts = [
                component_sweep(model, t.clean, t.corrupted, p, pos, offsets, d, progress).assign(patch="label")
                for d in DIRECTIONS
            ] + [
                component_sweep(model, t.clean, obs_patched, p + 1,
                                pos, offsets, "noise", progress).assign(patch="observation")
            ]  # fmt: skip
            sweep = pd.concat(parts, ignore_index=True)
    finally:
        model.train(was_training)

    errors = {"clean": t.errors(pred["clean"])}  # each [n_traces, n_offsets]
    for probe, traces in probed.items():
        errors[probe] = traces.errors(pred[probe], truth=traces.corrupted_truth)
    e_label = squared_change(pred_label, pred["clean"], pos).mean(0)
    e_obs = squared_change(pred_obs, pred["clean"], pos).mean(0)
    e_obs_all = squared_change(pred["misdirect_restart"], pred["clean"], pos).mean(0)
    scale = t.truth[:, pos].double().pow(2).sum(-1).mean(0)
    label_target = label_continuation(t, t.other)  # [n_traces, n_offsets, d]
    wrong = pred["misdirect_incorrect"][:, pos]
    d_label = (wrong - label_target).pow(2).sum(-1)
    d_obs = (wrong - t.truth[:, pos].double()).pow(2).sum(-1)
    follows = (d_label < d_obs).double().mean(0)

    el, eo, ea, sc = e_label.tolist(), e_obs.tolist(), e_obs_all.tolist(), scale.tolist()
    return RecallReport(
        offsets=offsets, n_traces=n_traces, n_haystack=n_haystack, seg_len=seg_len, seed=seed,
        query_position=p,
        errors={k: {j: _summary(v[:, i]) for i, j in enumerate(offsets)} for k, v in errors.items()},
        e_label=el, e_obs=eo, e_obs_all=ea, scale=sc,
        score=[recall_score(a, b) for a, b in zip(el, eo, strict=True)],
        verdict=[verdict(a, b, s, rule) for a, b, s in zip(el, eo, sc, strict=True)],
        score_all=[recall_score(a, b) for a, b in zip(el, ea, strict=True)],
        verdict_all=[verdict(a, b, s, rule) for a, b, s in zip(el, ea, sc, strict=True)],
        follows_label=follows.tolist(), rule=rule, components=sweep, protocol=protocol,
    )  # fmt: skip
