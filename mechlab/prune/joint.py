"""Joint pruning: several targets pruned at once on one model, with a reward for sharing edges.

Two targets with little circuit overlap may use different mechanisms, or the model may
hold redundant routes and each pruning run may merely pick a different one. Pruning the
targets jointly, with a term that pays for using the same edges, tells these apart: if
the circuits can be made to share at no loss of faithfulness, the low overlap was
redundancy; if sharing costs faithfulness, the targets need different edges.

:func:`joint_prune` gives each target its own hard-concrete edge masks, task loss (as
:func:`~mechlab.prune.engine.prune`'s) and Lagrangian sparsity constraint. With
``share > 0`` each target's location parameters are a consensus plus a private part,

    log_alpha_t = log_alpha_0 + delta_t,
    penalty = share * mean over targets t of  sum_e |P_t(e) - P_0(e)| / k_t

(``P(e)`` the probability that a mask is non-zero, ``k_t`` the edges target ``t`` keeps),
so an edge that serves every target gathers every target's gradient in the consensus.
``share = "tied"`` (``math.inf``) is the limit: one mask set, its loss the sum of the
targets' losses. ``share = 0``: independent targets, each drawing the same batches and
mask noise as :func:`prune` with the same seed, so each circuit is :func:`prune`'s.

The search often ends with several equally useful routes still open (the masks
saturated, the sparsity not yet met); ranking them by ``log_alpha`` would break the tie
by optimiser noise. By default the circuits are chosen by backward elimination on the
joint objective (:mod:`mechlab.prune.refine`): the targets' losses plus ``share`` times
the circuits' pairwise disagreement ``|A xor B| / k``, or, tied, the summed losses of
one circuit. On the planted models of ``tests/prune/test_joint.py`` this makes
sharing pick the route both targets can use, every seed.

:func:`share_sweep` runs a small grid of ``share`` values over seeds and reports, per
target, faithfulness and complement faithfulness on held-out traces, the Jaccard of the
circuits, and how much faithfulness sharing costs against ``share = 0``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.models.base import predict_in_chunks
from mechlab.progress import tqdm
from mechlab.prune import masks as hc
from mechlab.prune.circuit import Circuit
from mechlab.prune.circuit import jaccard as jaccard_of
from mechlab.prune.engine import (
    LAMBDA_LR,
    LR,
    MaskResult,
    _lr_factor,
    ablated_loss,
    check_prune_args,
    check_sparsity,
    finish_circuit,
    loss_settings,
)
from mechlab.prune.forward import (
    divergence,
    frozen_eval,
    make_ablation,
    masked_forward,
    select_traces,
    truth_error,
)
from mechlab.prune.graph import countable_edges, pruning_graph
from mechlab.prune.refine import (
    REFINE_TRACES,
    greedy_eliminate,
    greedy_eliminate_joint,
    open_countable,
    refined_log_alpha,
)
from mechlab.traces import (
    PruneData,
    Target,
    check_target,
    target_mask,
    target_name,
    target_positions,
)

SHARES = (0.0, 0.3, 1.0, math.inf)  # the default sweep (inf: tied)
UNBALANCED = 2.0  # warn when the targets' fully ablated losses differ more than this


def check_share(share: Any) -> float:
    """Return ``share`` as a float, or raise a one-line ValueError.

    ``share`` is a number >= 0, or ``math.inf`` / ``"tied"`` (one circuit for every target).
    """
    if isinstance(share, str) and share.strip().lower() in ("tied", "inf"):
        return math.inf
    if isinstance(share, bool) or not isinstance(share, (int, float)) or math.isnan(share):
        raise ValueError(f"share must be a number >= 0 or 'tied', got {share!r}")
    if share < 0:
        raise ValueError(f"share must be >= 0 (0: independent targets), got {share!r}")
    return float(share)


def check_joint_targets(targets: Any, data: PruneData) -> list[Target]:
    """The targets as a list, or a one-line ValueError: at least two, distinct, known."""
    if isinstance(targets, str) or not isinstance(targets, Sequence):
        raise ValueError(f"targets must be a list of at least two targets, got {targets!r}")
    targets = list(targets)
    if len(targets) < 2:
        raise ValueError(f"joint pruning needs at least two targets, got {len(targets)}")
    names = [target_name(t) for t in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"targets must be distinct, got {names}")
    for t in targets:
        check_target(t, data.train)
    return targets


def consensus_penalty(p: Tensor, p0: Tensor, n_keep: Sequence[int]) -> Tensor:
    """``mean over targets t of sum_e |p[t, e] - p0[e]| / k_t``: distance from the consensus.

    Args:
        p: ``[n_targets, n_edges]`` probabilities that each target's mask is non-zero.
        p0: ``[n_edges]`` the same for the consensus masks.
        n_keep: Edges each target's sparsity keeps.

    Returns:
        A scalar: 0 when every target opens the consensus edges.
    """
    keep = torch.tensor([max(float(k), 1.0) for k in n_keep], device=p.device)
    return ((p - p0).abs().sum(-1) / keep).mean()


class _Lagrangians(nn.Module):
    """``lambda1[t] (s_t - t) + lambda2[t] (s_t - t)^2`` per target, all starting at zero."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.lambda1 = nn.Parameter(torch.zeros(n))
        self.lambda2 = nn.Parameter(torch.zeros(n))

    def forward(self, s: Tensor, t: float) -> Tensor:
        gap = s - t
        return (self.lambda1 * gap + self.lambda2 * gap * gap).sum()


@dataclass
class JointResult:
    """What :func:`joint_prune` returns.

    Attributes:
        circuits: Target name -> its :class:`~mechlab.prune.circuit.Circuit` (metadata:
            ``joint=True``, ``share``, ``partners``, ``jaccard_with``).
        share: The sharing weight.
        jaccard: ``"a|b"`` -> Jaccard of the two circuits' edge sets.
    """

    circuits: dict[str, Circuit]
    share: float
    jaccard: dict[str, float] = field(default_factory=dict)


def pairwise_jaccard(circuits: dict[str, Circuit]) -> dict[str, float]:
    """``"a|b"`` -> the Jaccard of circuits ``a`` and ``b``'s edge sets, for every pair in order."""
    return {f"{a}|{b}": jaccard_of(circuits[a].edges, circuits[b].edges) for a, b in combinations(circuits, 2)}


def joint_prune(
    model: nn.Module,
    data: PruneData,
    targets: Sequence[Target],
    sparsity: float = 0.95,
    share: float = 0.0,
    *,
    ablation: str = "interchange",
    steps: int = 500,
    seed: int = 0,
    lr: float = LR,
    lambda_lr: float = LAMBDA_LR,
    warmup: int | None = None,
    lambda_warmup: int | None = None,
    batch_size: int = 64,
    loss: str = "model",
    loss_scale: float | None = None,
    normalize_loss: bool | None = None,
    init_mean: float = hc.INIT_MEAN,
    refine: bool = True,
    progress: bool = True,
    checkpoint_sha256: str | None = None,
) -> JointResult:
    """Prune several targets of one model at once, rewarding shared edges (module docstring).

    Args:
        model: A mechlab model.
        data: Training and held-out traces, the same for every target.
        targets: At least two distinct targets (``"k-after"``, ``"all"`` or callables).
        sparsity: Edge sparsity of every target's circuit, over the countable edges.
        share: Weight of the sharing term, >= 0 (0: independent targets), or
            ``math.inf`` / ``"tied"``: one circuit for every target, its loss the sum of
            the targets' losses.
        ablation: ``"interchange"``, ``"mean"`` or ``"zero"``.
        steps: Optimiser steps.
        seed: Seed of the masks' initialisation, noise and batches (the same for every
            target, and the same as :func:`~mechlab.prune.engine.prune`'s).
        lr: Adam learning rate of the masks.
        lambda_lr: Peak learning rate of the Lagrange multipliers.
        warmup: Steps of the sparsity ramp (default ``steps // 2``).
        lambda_warmup: Warm-up of the multipliers' learning rate (default ``steps // 10``).
        batch_size: Traces per step.
        loss: ``"model"`` or ``"truth"``.
        loss_scale: As :func:`~mechlab.prune.engine.prune` (default: normalised x 10).
        normalize_loss: As :func:`~mechlab.prune.engine.prune`.
        init_mean: Mean of the initial ``log_alpha``.
        refine: When more edges stay open than the quota allows, choose among them by
            backward elimination on the objective (:mod:`mechlab.prune.refine`): each
            target's own loss, or, tied, the sum of every target's; ``False``: by
            ``log_alpha`` rank, as :func:`~mechlab.prune.engine.prune` does.
        progress: Show a progress bar.
        checkpoint_sha256: Recorded in the circuits' metadata.

    Returns:
        The :class:`JointResult`.

    Raises:
        ValueError: Fewer than two or repeated targets, an unknown target, a bad
            ``share`` or any of :func:`prune`'s bad arguments, before any work.
    """
    share = check_share(share)
    check_prune_args(
        sparsity, ablation=ablation, loss=loss, steps=steps, lr=lr, lambda_lr=lambda_lr,
        batch_size=batch_size, loss_scale=loss_scale, normalize_loss=normalize_loss,
    )  # fmt: skip
    targets = check_joint_targets(targets, data)
    loss_scale, normalize_loss = loss_settings(loss_scale, normalize_loss)
    if loss == "truth" and (data.train.truth is None or data.test.truth is None):
        raise ValueError("loss 'truth' needs traces with ground truth (Traces.truth)")
    if ablation == "interchange" and (data.train.corrupted is None or data.test.corrupted is None):
        raise ValueError("ablation 'interchange' needs corrupted traces (Traces.corrupted)")
    graph = pruning_graph(model, data.train.windows, None)
    scored = [target_positions(t, data.train) if graph.windows else None for t in targets]
    n_keep = [check_sparsity(graph, ablation, sparsity, s) for s in scored]
    countable = [countable_edges(graph, ablation, s) for s in scored]

    device = next(model.parameters()).device
    train = data.train.to(device)
    started = time.perf_counter()
    with frozen_eval(model), torch.no_grad():
        ablated = make_ablation(model, ablation, train, graph=graph)
        positions = [target_mask(t, train) for t in targets]
        reference = train.truth if loss == "truth" else predict_in_chunks(model, train.inputs)
        # the fully ablated losses: the normalisation, or the balance check of a shared search
        ablated_losses = (
            [ablated_loss(model, graph, train, pos, reference, ablated) for pos in positions]
            if normalize_loss or share > 0 else [1.0] * len(targets)
        )  # fmt: skip
    norms = ablated_losses if normalize_loss else [1.0] * len(targets)
    spread = max(ablated_losses) / max(min(ablated_losses), 1e-12)
    if share > 0 and not normalize_loss and spread > UNBALANCED:
        warnings.warn(
            f"the targets' fully ablated losses differ {spread:.1f}x ("
            + ", ".join(f"{target_name(t)} {v:.3g}" for t, v in zip(targets, ablated_losses, strict=True))
            + "): the summed raw loss favours the larger; normalize_loss=True weighs the targets equally",
            UserWarning, stacklevel=2,
        )  # fmt: skip
    settings = {
        "seed": seed, "steps": steps, "warmup": steps // 2 if warmup is None else warmup,
        "lambda_warmup": max(1, steps // 10) if lambda_warmup is None else lambda_warmup,
        "lr": lr, "lambda_lr": lambda_lr, "batch_size": batch_size, "init_mean": init_mean,
    }  # fmt: skip
    with frozen_eval(model):
        results = _optimise_joint(
            model, graph, train, positions, reference, ablated, sparsity, share, countable,
            n_keep, norms, loss_scale, progress=progress, **settings,
        )  # fmt: skip
        if refine:
            results = _refine(model, graph, train, positions, reference, ablated, results,
                              countable, n_keep, norms, ablation, share)  # fmt: skip
        names = [target_name(t) for t in targets]
        circuits: dict[str, Circuit] = {}
        for i, t in enumerate(targets):
            recorded = {
                "checkpoint_sha256": checkpoint_sha256, "loss": loss, "loss_scale": loss_scale,
                "loss_normalized": normalize_loss, "loss_normalized_by": norms[i], **settings,
                "joint": True, "share": "tied" if math.isinf(share) else share,
                "refined": refine, "partners": [n for n in names if n != names[i]],
            }  # fmt: skip
            circuits[names[i]] = finish_circuit(
                model, graph, data, t, ablation, results[i], sparsity, None, countable[i],
                scored[i], recorded, started,
            )  # fmt: skip
    jaccard = pairwise_jaccard(circuits)
    for name, circuit in circuits.items():
        circuit.metadata["jaccard_with"] = {
            other: jaccard_of(circuit.edges, circuits[other].edges) for other in names if other != name
        }
        for warning in circuit.metadata["warnings"]:
            warnings.warn(warning, UserWarning, stacklevel=2)
    return JointResult(circuits=circuits, share=share, jaccard=jaccard)


def _refine(
    model: nn.Module,
    graph,
    traces,
    positions: list[Tensor],
    reference: Tensor,
    ablated,
    results: list[MaskResult],
    countable: list[Tensor],
    n_keep: list[int],
    norms: list[float],
    ablation: str,
    share: float,
) -> list[MaskResult]:
    """The masks after backward elimination (:mod:`mechlab.prune.refine`): tied, one set
    scored by the summed losses; otherwise one set per target, scored by each target's
    loss plus ``share`` times their disagreement."""
    tied = math.isinf(share)
    io = model.cfg.io
    n = min(len(traces), REFINE_TRACES)
    index = torch.arange(n, device=reference.device)
    x = traces.inputs[index]
    abl = select_traces(ablated, index)
    dtype = next(model.parameters()).dtype

    def loss_of(targets: list[int]):
        def loss(kept: Tensor) -> float:
            with torch.no_grad():
                pred = masked_forward(model, graph, x, abl, kept.to(x.device, dtype))
                total = 0.0
                for t in targets:
                    mask, ref = positions[t][index], reference[index][positions[t][index]]
                    if io == "tokens" and ref.dtype == torch.long:
                        err = truth_error(pred[mask], ref, io).mean()
                    else:
                        err = divergence(pred[mask], ref, io).mean()
                    total += float(err) / norms[t]
            return total if math.isfinite(total) else math.inf

        return loss

    out = []
    if tied:
        la = results[0].edge_log_alpha
        counted = torch.stack(countable).any(0).cpu()
        kept = greedy_eliminate(graph, open_countable(la, counted, min(n_keep)), min(n_keep),
                                loss_of(list(range(len(results)))), ablation)  # fmt: skip
        for r in results:
            out.append(MaskResult(refined_log_alpha(r.edge_log_alpha, kept, counted),
                                  r.node_log_alpha, r.history))  # fmt: skip
        return out
    counted = [c.cpu() for c in countable]
    kept = greedy_eliminate_joint(
        graph, [open_countable(r.edge_log_alpha, c, k)
                for r, c, k in zip(results, counted, n_keep, strict=True)],
        n_keep, [loss_of([t]) for t in range(len(results))], share, ablation,
    )  # fmt: skip
    return [
        MaskResult(refined_log_alpha(r.edge_log_alpha, k, c), r.node_log_alpha, r.history)
        for r, k, c in zip(results, kept, counted, strict=True)
    ]


def _optimise_joint(
    model: nn.Module,
    graph,
    traces,
    positions: list[Tensor],
    reference: Tensor,
    ablated,
    sparsity: float,
    share: float,
    countable: list[Tensor],
    n_keep: list[int],
    norms: list[float],
    loss_scale: float,
    *,
    seed: int,
    steps: int,
    warmup: int,
    lambda_warmup: int,
    lr: float,
    lambda_lr: float,
    batch_size: int,
    init_mean: float,
    progress: bool,
) -> list[MaskResult]:
    """The optimisation of :func:`joint_prune`: one mask set per target, one Adam.

    Each target's masks, noise and batches follow :func:`~mechlab.prune.engine.optimise_masks`
    with the same seed, so at ``share = 0`` every target's run is that function's run.
    """
    device = reference.device
    io = model.cfg.io
    n_t = len(positions)
    gen = torch.Generator().manual_seed(seed)
    init = hc.init_log_alpha(graph.n_edges, gen, init_mean)  # [n_edges], as optimise_masks
    counted = torch.stack(countable).to(device)  # [n_targets, n_edges]
    shared_counted = counted.all(0)  # the sharing term looks at edges every target counts
    tied = math.isinf(share)
    if share == 0:  # independent: each target's masks are prune()'s
        consensus = None
        private = nn.Parameter(init.repeat(n_t, 1).to(device))  # [n_targets, n_edges]
    elif tied:  # one mask set for every target
        consensus = nn.Parameter(init.to(device))  # [n_edges]
        private = torch.zeros(n_t, graph.n_edges, device=device)
    else:  # log_alpha_t = consensus + private_t; sharing pulls P_t towards the consensus
        consensus = nn.Parameter(init.to(device))
        private = nn.Parameter(torch.zeros(n_t, graph.n_edges, device=device))
    mask_params = [p for p in (consensus, private) if isinstance(p, nn.Parameter)]
    lag = _Lagrangians(n_t).to(device)
    opt = torch.optim.Adam(
        [{"params": mask_params, "lr": lr},
         {"params": list(lag.parameters()), "lr": lambda_lr, "maximize": True}]
    )  # fmt: skip
    factors = [lambda i: 1.0, lambda i: _lr_factor(i, steps, lambda_warmup)]
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, factors)
    n = len(traces)
    order, cursor = torch.randperm(n, generator=gen), 0
    histories: list[list[dict[str, float]]] = [[] for _ in range(n_t)]
    bar = tqdm(range(1, steps + 1), disable=not progress, desc="joint pruning", unit="step",
               dynamic_ncols=True)  # fmt: skip
    for step in bar:
        if batch_size >= n:
            index = torch.arange(n)
        else:
            if cursor + batch_size > n:
                order, cursor = torch.randperm(n, generator=gen), 0
            index = order[cursor : cursor + batch_size]
            cursor += batch_size
        index_d = index.to(device)
        x = traces.inputs[index_d]
        abl = select_traces(ablated, index_d)
        u = hc.uniform_noise(graph.n_edges, gen).to(device)  # the same noise for every target
        edge_la = private if consensus is None else consensus + private  # [n_targets, n_edges]
        tasks = []
        pred = None
        for t in range(n_t):
            if pred is None or not tied:  # tied: one masked forward serves every target
                z = hc.sample_mask(edge_la[t], u)  # [n_edges]
                pred = masked_forward(model, graph, x, abl, z)
            mask, ref = positions[t][index_d], reference[index_d][positions[t][index_d]]
            if io == "tokens" and ref.dtype == torch.long:
                tasks.append(truth_error(pred[mask], ref, io).mean())
            else:
                tasks.append(divergence(pred[mask], ref, io).mean())
        target = hc.target_schedule(step, sparsity, warmup)
        s = torch.stack([hc.expected_sparsity(edge_la[t][counted[t]]) for t in range(n_t)])
        task_total = sum(loss_scale * task / norm for task, norm in zip(tasks, norms, strict=True))
        total = task_total + lag(s, target)
        penalty = torch.zeros((), device=device)
        if consensus is not None and not tied:
            p = hc.prob_nonzero(edge_la[:, shared_counted])  # [n_targets, n_shared]
            p0 = hc.prob_nonzero(consensus[shared_counted])  # [n_shared]
            penalty = consensus_penalty(p, p0, n_keep)
            total = total + share * penalty
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        schedule.step()
        if step == 1 or step % 10 == 0 or step == steps:
            for t in range(n_t):
                histories[t].append({
                    "step": step, "loss": tasks[t].item(), "sparsity": s[t].item(),
                    "target": target, "lambda1": lag.lambda1[t].item(),
                    "lambda2": lag.lambda2[t].item(), "sharing": penalty.item(),
                })  # fmt: skip
            bar.set_postfix(sharing=f"{penalty.item():.3f}")
    bar.close()
    la = (private if consensus is None else consensus + private).detach().clone()
    return [MaskResult(la[t], None, histories[t]) for t in range(n_t)]


@dataclass
class ShareSweep:
    """A :func:`share_sweep`: per share and seed, each target's metrics and the overlap.

    Attributes:
        targets: Target names.
        rows: One dict per (share, seed): ``share``, ``seed``, per target
            ``faithfulness`` / ``complement_faithfulness`` / ``n_edges``, and ``jaccard``
            (mean over target pairs).
        results: The :class:`JointResult` of every row, in the same order.
    """

    targets: list[str]
    rows: list[dict[str, Any]]
    results: list[JointResult] = field(repr=False, default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        """Per share: means over seeds, and the cost of sharing against ``share = 0``.

        ``cost[t] = mean faithfulness at share 0 - mean faithfulness at this share``
        (positive: sharing costs faithfulness); None when share 0 was not run.
        """
        shares = sorted({r["share"] for r in self.rows})
        mean = {}
        for sh in shares:
            rows = [r for r in self.rows if r["share"] == sh]
            entry: dict[str, Any] = {"share": sh, "n_seeds": len(rows),
                                     "jaccard": sum(r["jaccard"] for r in rows) / len(rows)}  # fmt: skip
            for t in self.targets:
                for key in ("faithfulness", "complement_faithfulness", "n_edges"):
                    entry[f"{t}.{key}"] = sum(r[t][key] for r in rows) / len(rows)
            mean[sh] = entry
        for entry in mean.values():
            for t in self.targets:
                base = mean.get(0.0)
                entry[f"{t}.cost"] = (
                    None if base is None else base[f"{t}.faithfulness"] - entry[f"{t}.faithfulness"]
                )
        return [mean[sh] for sh in shares]

    def table(self) -> str:
        """A plain-text table: one line per (share, seed), then the means per share."""
        head = ["share", "seed", "jaccard"] + [
            f"{t} {k}" for t in self.targets for k in ("edges", "faith", "compl")
        ]
        lines = ["  ".join(f"{h:>14}" for h in head)]
        for r in self.rows:
            cells = [f"{r['share']:.3g}", str(r["seed"]), f"{r['jaccard']:.3f}"]
            for t in self.targets:
                cells += [str(r[t]["n_edges"]), f"{r[t]['faithfulness']:.3f}",
                          f"{r[t]['complement_faithfulness']:.3f}"]  # fmt: skip
            lines.append("  ".join(f"{c:>14}" for c in cells))
        lines.append("")
        lines.append("means over seeds; cost = faithfulness at share 0 minus at this share")
        head = ["share", "jaccard"] + [f"{t} {k}" for t in self.targets for k in ("faith", "cost")]
        lines.append("  ".join(f"{h:>14}" for h in head))
        for e in self.summary():
            cells = [f"{e['share']:.3g}", f"{e['jaccard']:.3f}"]
            for t in self.targets:
                cost = e[f"{t}.cost"]
                cells += [f"{e[f'{t}.faithfulness']:.3f}", "-" if cost is None else f"{cost:+.3f}"]
            lines.append("  ".join(f"{c:>14}" for c in cells))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON; a tied share is written ``"tied"``): targets, rows and the summary."""

        def plain(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{**e, "share": "tied" if math.isinf(e["share"]) else e["share"]} for e in entries]

        return {"targets": self.targets, "rows": plain(self.rows), "summary": plain(self.summary())}


def check_shares(shares: Any) -> list[float]:
    """The shares as a non-empty list of floats, or a one-line ValueError."""
    if isinstance(shares, (str, bytes)) or not isinstance(shares, Sequence) or not shares:
        raise ValueError(f"shares must be a non-empty list of numbers >= 0, got {shares!r}")
    return [check_share(s) for s in shares]


def share_sweep(
    model: nn.Module,
    data: PruneData | Any,
    targets: Sequence[Target],
    shares: Sequence[float] = SHARES,
    seeds: Sequence[int] = (0,),
    *,
    load: Callable[[float, int], JointResult | None] | None = None,
    save: Callable[[JointResult, int], None] | None = None,
    **kwargs: Any,
) -> ShareSweep:
    """Run :func:`joint_prune` for every ``share`` and seed and tabulate the cost of sharing.

    Args:
        model: The model.
        data: Traces, or a function seed -> traces (so seeds vary the data too).
        targets: At least two targets.
        shares: Sharing weights (include 0 for the cost column).
        seeds: Seeds.
        load: ``(share, seed)`` -> a result finished before (a resumed sweep), or None.
        save: Called with each new result and its seed as soon as it is found.
        **kwargs: Passed to :func:`joint_prune`.

    Returns:
        The :class:`ShareSweep`.
    """
    shares = check_shares(shares)
    if not seeds:
        raise ValueError("seeds must not be empty")
    check_prune_args(**{"sparsity": kwargs.get("sparsity", 0.95), **kwargs})
    rows, results = [], []
    names = [target_name(t) for t in targets]
    for seed in seeds:
        seed_data = None
        for sh in shares:
            res = load(sh, seed) if load is not None else None
            if res is None:
                if seed_data is None:
                    seed_data = data(seed) if callable(data) else data
                    check_joint_targets(targets, seed_data)
                res = joint_prune(model, seed_data, targets, share=sh, seed=seed, **kwargs)
                if callable(data):
                    for circuit in res.circuits.values():
                        circuit.metadata["data_seed"] = seed
                if save is not None:
                    save(res, seed)
            row: dict[str, Any] = {"share": sh, "seed": seed}
            for name, circuit in res.circuits.items():
                m = circuit.metadata["metrics"]
                row[name] = {"faithfulness": m["faithfulness"],
                             "complement_faithfulness": m["complement_faithfulness"],
                             "n_edges": circuit.n_edges}  # fmt: skip
            row["jaccard"] = sum(res.jaccard.values()) / len(res.jaccard)
            rows.append(row)
            results.append(res)
    return ShareSweep(targets=names, rows=rows, results=results)
