"""The one search core: hard-concrete masks optimised for one or several targets.

:func:`~mechlab.prune.engine.prune` (one target) and :func:`~mechlab.prune.joint.joint_prune`
(several, optionally sharing edges) both run :func:`optimise_masks`: one Adam optimiser,
one task loss (:func:`task_loss`), one batch sampler (:class:`BatchSampler`), one
noise draw per step shared by the targets. With one target and no sharing it is
``prune``'s search; with ``share = 0`` every target's run is the one-target run.

Per step, for target ``t`` with logits ``log_alpha_t`` (its own, the consensus plus its
own, or, tied, the one set):

* the **budget** constraint (default) shifts the logits by a common threshold
  ``tau_t`` solved (bisection, no gradient) so that the expected number of open
  countable edges, ``sum_e P(z_e > 0)`` at ``log_alpha_t - tau_t``, is exactly the
  scheduled count: every countable edge at step 0, falling linearly to the asked count
  over ``warmup`` steps, then held. The masks then move by the task gradient alone, and
  Adam makes that step independent of the loss's scale;
* the **lagrangian** constraint leaves the logits as they are and adds, per target,
  ``lambda1 (s - t) + lambda2 (s - t)^2`` (``s`` the expected sparsity, ``t`` the
  target ramped over ``warmup``), the multipliers maximised at their own learning rate
  (warm-up over ``lambda_warmup`` steps, then linear decay);
* the loss is ``sum_t loss_scale * task_t / norm_t`` (``norm_t`` the fully ablated
  loss when normalising, else 1), plus ``share`` times the consensus penalty of
  :func:`consensus_penalty` when the targets share a consensus.

The mask **noise** (``config.noise``): ``"independent"``, one uniform draw per edge and
step (Edge Pruning's); ``"shared"``, one draw for every edge per step, so each sampled
circuit is a top set of the current ranking (edges with equal logits switch on and off
together: a query and a key that only help together are tried together, the failure of
independent noise on Q/K-composition circuits); ``"mixed"``, shared on even steps and
independent on odd ones. Each edge's noise is uniform either way, so ``P(z > 0)`` and the
budget are exact. (``"shared+mixed"``, the default, runs two searches:
:func:`mechlab.prune.engine.run_searches`.)

Node masks (one target only) get their own threshold (or Lagrangian) at the node
sparsity, and each edge's ``P(z > 0)`` counts times its writer's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mechlab.progress import tqdm
from mechlab.prune import masks as hc
from mechlab.prune.config import NOISE_RUNS, PruneConfig
from mechlab.prune.forward import divergence, masked_forward, select_traces, truth_error
from mechlab.prune.graph import EdgeGraph

_SHIFT = hc.BETA * math.log(-hc.LIMIT_LEFT / hc.LIMIT_RIGHT)  # P(z > 0) = sigmoid(la - _SHIFT)
WARM_SPREAD = 3.0  # a warm start's logits span init_mean +- this, best-ranked edge highest


@dataclass
class MaskResult:
    """What the optimisation leaves: location parameters and a history.

    Attributes:
        edge_log_alpha: ``[n_edges]``, with the budget's threshold already subtracted
            (so the deterministic masks are the ones the budget left open).
        node_log_alpha: ``[n_writers]`` or None.
        history: Per logged step (1, every 10th, the last): ``step``, ``loss`` (the task
            loss, before normalising), ``sparsity`` (expected, over the countable edges),
            ``target``, and ``shift`` (budget) or ``lambda1``, ``lambda2`` (lagrangian);
            ``sharing`` in a joint search.
    """

    edge_log_alpha: Tensor
    node_log_alpha: Tensor | None
    history: list[dict[str, float]]


class BatchSampler:
    """Seeded batches: a random order of the traces taken in slices, redrawn when spent.

    Args:
        n: Traces.
        batch_size: Traces per batch (every trace each time when ``batch_size >= n``).
        generator: The search's generator (the first order is drawn at construction).
    """

    def __init__(self, n: int, batch_size: int, generator: torch.Generator):
        self.n, self.batch_size, self.generator = n, batch_size, generator
        self.order, self.cursor = torch.randperm(n, generator=generator), 0

    def __call__(self) -> Tensor:
        """The next batch's trace indices (CPU)."""
        if self.batch_size >= self.n:
            return torch.arange(self.n)
        if self.cursor + self.batch_size > self.n:
            self.order, self.cursor = torch.randperm(self.n, generator=self.generator), 0
        index = self.order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return index


def task_loss(pred: Tensor, reference: Tensor, io: str) -> Tensor:
    """Mean loss of predictions at the target positions: the error against token ids
    (a truth loss on a token model), else the divergence from the reference outputs.

    Args:
        pred: ``[n, d_output]`` predictions at the target positions.
        reference: ``[n, d_output]`` reference outputs, or ``[n]`` token ids.
        io: ``"continuous"`` or ``"tokens"``.
    """
    return row_losses(pred, reference, io).mean()


def row_losses(pred: Tensor, reference: Tensor, io: str) -> Tensor:
    """``[n]`` :func:`task_loss`'s terms, one per target position (their mean is the loss)."""
    if io == "tokens" and reference.dtype == torch.long:
        return truth_error(pred, reference, io)
    return divergence(pred, reference, io)


class SharedScaleAdam:
    """Adam whose second moment is one number per parameter tensor row (per target), not per edge.

    Per-edge Adam divides every edge's gradient by its own running RMS, so an edge with a
    tiny but steady gradient moves as fast as the edge that matters most, and an edge
    whose gradient is exactly zero (one of two redundant paths into a saturated
    component, while the other is open) stands still while those side edges overtake it.
    Here the first moment is per edge and the second is the mean of ``g^2`` over a row's
    entries: the steps keep the ratio of the gradients (an edge with a hundredth of the
    gradient moves a hundredth as far) and stay invariant to the loss's scale, as Adam's are.

    A plain class with an optimiser's ``step`` and ``zero_grad``, not a
    ``torch.optim.Optimizer``: the first Optimizer made in a process imports
    ``torch._dynamo`` (about a second on one core), and the budget constraint needs no
    learning-rate schedule.
    """

    def __init__(self, params, lr: float = 0.1, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-12):
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.state: dict[int, dict] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the parameters' gradients (``set_to_none``: as None, else zeroed)."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        b1, b2 = self.betas
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad
            state = self.state.setdefault(i, {})
            if not state:
                state["t"], state["m"] = 0, torch.zeros_like(p)
                state["v"] = torch.zeros(p.shape[:-1] + (1,), dtype=p.dtype, device=p.device)
            state["t"] += 1
            t, m, v = state["t"], state["m"], state["v"]
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).add_(g.pow(2).mean(-1, keepdim=True), alpha=1 - b2)
            m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))


class Lagrangians(nn.Module):
    """``lambda1[t] (s_t - t) + lambda2[t] (s_t - t)^2`` per target, all starting at zero."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.lambda1 = nn.Parameter(torch.zeros(n))
        self.lambda2 = nn.Parameter(torch.zeros(n))

    def forward(self, s: Tensor, t: float) -> Tensor:
        gap = s - t
        return (self.lambda1 * gap + self.lambda2 * gap * gap).sum()


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Multiplier of the multipliers' learning rate at (0-based) ``step``: linear warm-up
    over ``warmup`` steps, then linear decay to ``1 / (steps - warmup)`` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    return (steps - step) / max(1, steps - warmup)


@torch.no_grad()
def budget_shift(log_alpha: Tensor, counted: Tensor, n_open: Tensor, weight: Tensor | None = None) -> Tensor:
    """Thresholds ``tau`` with ``sum_{e counted} w_e P(z_e > 0 | log_alpha - tau) = n_open``.

    Args:
        log_alpha: ``[T, n]`` logits.
        counted: ``[T, n]`` bool, the edges the budget counts.
        n_open: ``[T]`` expected open edges wanted (clipped to what is reachable).
        weight: ``[T, n]`` factors of each ``P`` (node masks), or None.

    Returns:
        ``[T]``; bisection in float64 to 1e-9 (``P`` is monotone in ``tau``).
    """
    la = log_alpha.double()
    w = counted.double() if weight is None else counted.double() * weight.double()
    lo = (la.masked_fill(~counted, math.inf).amin(1) - _SHIFT - 40.0).clamp(max=1e6)
    hi = (la.masked_fill(~counted, -math.inf).amax(1) - _SHIFT + 40.0).clamp(min=-1e6)
    want = n_open.double()
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        count = (w * torch.sigmoid(la - mid[:, None] - _SHIFT)).sum(1)
        above = count > want  # too many open: raise the threshold
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
        if float((hi - lo).max()) < 1e-9:
            break
    return (0.5 * (lo + hi)).to(log_alpha.dtype)


def warm_logits(scores: Tensor, countable: Tensor, spread: float = WARM_SPREAD) -> Tensor:
    """Offsets of the initial logits from attribution scores (a warm start).

    The countable edges are ranked by ``|score|`` (ties: graph order) and given offsets
    falling linearly from ``+spread`` (the best) to ``-spread`` (the worst); the others
    get 0. Only the order is used, so the start does not depend on the scores' scale,
    and under the budget constraint (a common threshold) only the order and spacing of
    the logits matter.

    Args:
        scores: ``[n_edges]`` attribution scores (NaN counts as 0).
        countable: ``[n_edges]`` bool.
        spread: Half the range of the offsets.

    Returns:
        ``[n_edges]`` float32 offsets.
    """
    magnitude = torch.nan_to_num(scores.detach().double().cpu().abs(), nan=0.0)
    index = countable.cpu().bool().nonzero().flatten()
    out = torch.zeros(scores.numel(), dtype=torch.float32)
    if len(index) == 0:
        return out
    order = index[torch.sort(-magnitude[index], stable=True).indices]
    steps = torch.linspace(spread, -spread, len(order)) if len(order) > 1 else torch.tensor([spread])
    out[order] = steps.float()
    return out


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


def optimise_masks(
    model: nn.Module,
    graph: EdgeGraph,
    traces,
    positions: Sequence[Tensor],
    reference: Tensor,
    ablated,
    config: PruneConfig,
    *,
    countable: Sequence[Tensor],
    norms: Sequence[float] | None = None,
    share: float = 0.0,
    n_keep: Sequence[int] | None = None,
    seed: int = 0,
    progress: bool = True,
    desc: str = "pruning",
    warm: Sequence[Tensor] | None = None,
) -> list[MaskResult]:
    """Optimise hard-concrete masks for one or more targets (module docstring).

    The model must be frozen and in eval mode.

    Args:
        model: The model.
        graph: Its edge graph.
        traces: Training traces (``inputs`` used).
        positions: Per target, ``[batch, pos]`` bool target positions.
        reference: ``[batch, pos, d_output]`` what the circuit should output (the full
            model's predictions or the truth; token ids for a truth loss on tokens).
        ablated: Ablated writer outputs (:func:`~mechlab.prune.forward.make_ablation`).
        config: The search settings (sparsity, constraint, lr, steps, ...).
        countable: Per target, ``[n_edges]`` bool, the edges the sparsity counts.
        norms: Per target, the task loss is divided by it (default 1).
        share: Sharing weight: 0 (independent targets), > 0 (consensus + private
            logits, :func:`consensus_penalty`), ``math.inf`` (one mask set).
        n_keep: Per target, the edges the sparsity keeps (the penalty's ``k_t``;
            default from ``config.sparsity``).
        seed: Seeds the initial masks, the noise and the batches.
        progress: Show a tqdm bar.
        desc: What the bar says.
        warm: Per target, ``[n_edges]`` offsets of the initial logits
            (:func:`warm_logits`), or None (every edge starts at ``init_mean``). Shared
            masks (``share > 0``) start from the targets' mean offset.

    Returns:
        One :class:`MaskResult` per target.
    """
    if config.noise in NOISE_RUNS:
        raise ValueError(f"noise {config.noise!r} runs several searches: use engine.run_searches")
    device = reference.device
    io = model.cfg.io
    n_t = len(positions)
    if config.node_sparsity is not None and n_t > 1:
        raise ValueError("node masks are supported for one target only")
    norms = [1.0] * n_t if norms is None else list(norms)
    counted = torch.stack([c.to(device).bool() for c in countable])  # [T, n_edges]
    n_counted = counted.sum(1).double()
    if n_keep is None:
        n_keep = [hc.keep_count(int(n), config.sparsity) for n in n_counted.tolist()]
    budget = config.constraint == "budget"
    steps, warmup = config.steps, config.warmup_steps
    tied = math.isinf(share)

    gen = torch.Generator().manual_seed(seed)
    init = hc.init_log_alpha(graph.n_edges, gen, config.init_mean)  # [n_edges]
    starts = init.repeat(n_t, 1)  # [T, n_edges]
    if warm is not None:
        if len(warm) != n_t:
            raise ValueError(f"warm has {len(warm)} entries for {n_t} targets")
        starts = starts + torch.stack([w.detach().float().cpu() for w in warm])
        init = starts.mean(0)
    node_la = None
    if config.node_sparsity is not None:
        node_la = nn.Parameter(hc.init_log_alpha(graph.n_writers, gen, config.init_mean).to(device))
    if share == 0:  # independent: each target's masks are the one-target search's
        consensus, private = None, nn.Parameter(starts.to(device))
    elif tied:  # one mask set for every target
        consensus = nn.Parameter(init.to(device))
        private = torch.zeros(n_t, graph.n_edges, device=device)
    else:  # log_alpha_t = consensus + private_t
        consensus = nn.Parameter(init.to(device))
        private = nn.Parameter(torch.zeros(n_t, graph.n_edges, device=device))
    mask_params = [p for p in (consensus, private, node_la) if isinstance(p, nn.Parameter)]
    groups = [{"params": mask_params, "lr": config.lr}]
    lag = lag_node = None
    if not budget:
        lag, lag_node = Lagrangians(n_t).to(device), Lagrangians(1).to(device)  # fresh lambdas
        groups.append({"params": [*lag.parameters(), *lag_node.parameters()],
                       "lr": config.lambda_lr, "maximize": True})  # fmt: skip
    if config.optimizer == "shared-adam" and budget:
        opt = SharedScaleAdam(mask_params, lr=config.lr)
    else:
        opt = torch.optim.Adam(groups)
    schedule = None if budget else torch.optim.lr_scheduler.LambdaLR(  # the multipliers' warm-up and decay
        opt, [lambda i: 1.0, lambda i: lr_factor(i, steps, config.lambda_warmup_steps)]
    )
    edge_writer = torch.tensor([graph.writer_index[w] for w, _ in graph.edges], device=device)
    shared_counted = counted.all(0)  # the sharing term looks at edges every target counts
    sampler = BatchSampler(len(traces), config.batch_size, gen)

    def logits() -> Tensor:
        return private if consensus is None else consensus + private  # [T, n_edges]

    def shifted(step: int) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """Effective edge logits, node logits, their thresholds (budget; else zeros)."""
        target = hc.target_schedule(step, config.sparsity, warmup)
        la, nodes = logits(), node_la
        tau_node = None
        if nodes is not None and budget:
            node_target = hc.target_schedule(step, config.node_sparsity, warmup)
            want = torch.tensor([graph.n_writers * (1.0 - node_target)], device=device)
            ones = torch.ones(1, graph.n_writers, dtype=torch.bool, device=device)
            tau_node = budget_shift(nodes.detach()[None], ones, want)
            nodes = nodes - tau_node[0]
        if not budget:
            return la, nodes, torch.zeros(n_t, device=device), tau_node
        weight = None
        if nodes is not None:
            weight = hc.prob_nonzero(nodes.detach())[edge_writer][None].expand(n_t, -1)
        tau = budget_shift(la.detach(), counted, n_counted * (1.0 - target), weight)
        return la - tau[:, None], nodes, tau, tau_node

    histories: list[list[dict[str, float]]] = [[] for _ in range(n_t)]
    bar = tqdm(range(1, steps + 1), disable=not progress, desc=desc, unit="step", dynamic_ncols=True)
    for step in bar:
        index = sampler().to(device)
        x = traces.inputs[index]
        abl = select_traces(ablated, index)
        u = hc.uniform_noise(graph.n_edges, gen).to(device)  # the same noise for every target
        if config.noise == "shared" or (config.noise == "mixed" and step % 2 == 0):
            u = u[:1].expand(graph.n_edges)  # one draw for every edge: a top set of the ranking
        u_node = hc.uniform_noise(graph.n_writers, gen).to(device) if node_la is not None else None
        la, nodes, tau, _ = shifted(step)
        z_node = None if nodes is None else hc.sample_mask(nodes, u_node)
        tasks, pred = [], None
        for t in range(n_t):
            if pred is None or not tied:  # tied: one masked forward serves every target
                pred = masked_forward(model, graph, x, abl, hc.sample_mask(la[t], u), z_node)
            mask = positions[t][index]
            tasks.append(task_loss(pred[mask], reference[index][mask], io))
        target = hc.target_schedule(step, config.sparsity, warmup)
        weight = None if nodes is None else hc.prob_nonzero(nodes)[edge_writer]
        s = torch.stack([
            hc.expected_sparsity(la[t][counted[t]], None if weight is None else weight[counted[t]])
            for t in range(n_t)
        ])  # fmt: skip
        total = sum(config.loss_scale * task / norm for task, norm in zip(tasks, norms, strict=True))
        if lag is not None:
            total = total + lag(s, target)
            if nodes is not None:
                node_target = hc.target_schedule(step, config.node_sparsity, warmup)
                total = total + lag_node(hc.expected_sparsity(nodes)[None], node_target)
        penalty = torch.zeros((), device=device)
        if consensus is not None and not tied and share > 0:
            p = hc.prob_nonzero(la[:, shared_counted])  # [T, n_shared]
            p0 = hc.prob_nonzero((consensus - tau.mean())[shared_counted])
            penalty = consensus_penalty(p, p0, n_keep)
            total = total + share * penalty
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        if schedule is not None:
            schedule.step()
        if step == 1 or step % 10 == 0 or step == steps:
            for t in range(n_t):
                record = {"step": step, "loss": tasks[t].item(), "sparsity": s[t].item(), "target": target}
                if lag is None:
                    record["shift"] = float(tau[t])
                else:
                    record["lambda1"], record["lambda2"] = lag.lambda1[t].item(), lag.lambda2[t].item()
                if n_t > 1:
                    record["sharing"] = penalty.item()
                histories[t].append(record)
            bar.set_postfix(loss=f"{tasks[0].item():.4g}", sparsity=f"{s[0].item():.3f}")
    bar.close()
    with torch.no_grad():
        la, nodes, _, _ = shifted(steps)  # the final parameters at the final budget
    la = la.detach().clone()
    nodes = None if nodes is None else nodes.detach().clone()
    return [MaskResult(la[t], nodes, histories[t]) for t in range(n_t)]


__all__ = [
    "BatchSampler",
    "Lagrangians",
    "MaskResult",
    "SharedScaleAdam",
    "budget_shift",
    "consensus_penalty",
    "lr_factor",
    "optimise_masks",
    "task_loss",
    "warm_logits",
]
