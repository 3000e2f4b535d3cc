"""Train many state-tracking trials as one batched ensemble.

The members' weights are stacked along a new leading axis
(``torch.func.stack_module_state``) and one forward pass runs every member on its own
batch (``torch.func.vmap`` over ``functional_call``). The members' losses are summed,
so each member's gradient is its own loss's, and Adam is applied to the stacked weights
with each member's learning rate: Adam works elementwise, so this is exactly each
member's own Adam. Each member draws the batches, and starts from the weights, that it
would alone (:func:`mechlab.train.trials.run_trial`), so its result matches the
one-by-one run's up to float rounding. A member whose validation loss goes below
``epsilon`` leaves the ensemble; the others go on. A model that cannot run under ``vmap``
(an operation without a batching rule) has its trials trained one after another, with a
warning.

Batches of different members are padded to the longest among them (PAD tokens, no
target): every model is causal, so the padding never reaches a scored position.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call, stack_module_state, vmap

from mechlab.devices import check_device
from mechlab.tasks.state_tracking import (
    IGNORE,
    StateTrackingConfig,
    encode,
    make_data,
    set_accuracy,
)
from mechlab.train.trials import (
    TrialSpec,
    as_spec,
    batch_generator,
    group_key,
    init_model,
    run_trial,
    trial_result,
)

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults
ADAM_EPS = 1e-8


def _pad_stack(parts: list[Tensor], value: int | bool) -> Tensor:
    """Stack ``[B, T_i]`` tensors into ``[E, B, max T_i]``, padding on the right with ``value``."""
    width = max(p.shape[1] for p in parts)
    return torch.stack([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=value) for p in parts])


class Ensemble:
    """Stacked weights and Adam state of several models of one architecture.

    Args:
        models: The members (same config), in order.
        lrs: Each member's learning rate.
    """

    def __init__(self, models: list[torch.nn.Module], lrs: list[float]):
        self.template = copy.deepcopy(models[0]).to("meta")
        for module in self.template.modules():
            if getattr(module, "fused", False):
                module.fused = False  # torch.nn.LSTM has no vmap rule; its unrolled form does
            if isinstance(getattr(module, "scan", None), str):
                module.scan = "loop"  # the chunked scans write into buffers (out=), which vmap cannot batch
        params, self.buffers = stack_module_state(models)  # name -> [E, ...]
        self.params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        self.exp_avg = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.lrs = torch.tensor(lrs, dtype=torch.float64)  # [E]
        self.n_steps = 0

    def _forward_one(self, params: dict, buffers: dict, tokens: Tensor) -> Tensor:
        return functional_call(self.template, (params, buffers), (tokens,))

    def forward(self, tokens: Tensor, shared: bool = False) -> Tensor:
        """Logits of every member: ``tokens`` ``[E, B, T]`` (or ``[B, T]`` for all with
        ``shared``) -> ``[E, B, T, V]``."""
        in_dims = (0, 0, None if shared else 0)
        return vmap(self._forward_one, in_dims=in_dims)(self.params, self.buffers, tokens)

    def losses(self, tokens: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
        """Each member's mean cross-entropy on its own batch: ``[E, B, T]`` inputs -> ``[E]``."""
        logp = torch.log_softmax(self.forward(tokens).float(), dim=-1)  # [E, B, T, V]
        picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [E, B, T]
        return -(picked * mask).sum((1, 2)) / mask.sum((1, 2)).clamp(min=1)

    @torch.no_grad()
    def adam_step(self, grads: dict[str, Tensor]) -> None:
        """One Adam step of every member (torch.optim.Adam's arithmetic, per-member lr)."""
        self.n_steps += 1
        beta1, beta2 = ADAM_BETAS
        bc1 = 1 - beta1**self.n_steps
        bc2_sqrt = math.sqrt(1 - beta2**self.n_steps)
        for name, p in self.params.items():
            g = grads[name]
            self.exp_avg[name].lerp_(g, 1 - beta1)
            self.exp_avg_sq[name].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (self.exp_avg_sq[name].sqrt() / bc2_sqrt).add_(ADAM_EPS)
            step_size = (self.lrs / bc1).to(p.dtype).to(p.device).view(-1, *[1] * (p.dim() - 1))
            p.sub_(step_size * self.exp_avg[name] / denom)

    def keep(self, index: list[int]) -> None:
        """Keep only the members at ``index`` (in that order)."""
        idx = torch.tensor(index, dtype=torch.long)
        for store in (self.exp_avg, self.exp_avg_sq, self.buffers):
            for k, v in store.items():
                store[k] = v[idx.to(v.device)]
        self.params = {k: v.detach()[idx.to(v.device)].requires_grad_(True) for k, v in self.params.items()}
        self.lrs = self.lrs[idx]

    def member_state(self, i: int) -> dict[str, Tensor]:
        """The state dict of member ``i``."""
        return {**{k: v[i].detach() for k, v in self.params.items()}, **{k: v[i] for k, v in self.buffers.items()}}


@torch.no_grad()
def ensemble_val_losses(
    ens: Ensemble, cfg: StateTrackingConfig, seqs: Any, chunk: int = 256
) -> tuple[list[float], list[dict[int, float]]]:
    """Every member's mean cross-entropy per scored token over a set (teacher forcing).

    Returns:
        The members' losses over the whole set, and each member's ``{n: loss}`` over the
        sequences of each length ``n`` (as :func:`mechlab.tasks.state_tracking.set_loss_by_length`).
    """
    total, count = None, 0
    by_n: dict[int, Tensor] = {}  # n -> [E] summed loss
    count_n: dict[int, int] = {}
    for i in range(0, len(seqs), chunk):
        part_seqs = seqs.subset(slice(i, i + chunk))
        tokens, targets, mask = encode(cfg, part_seqs)  # [B, T]
        logp = torch.log_softmax(ens.forward(tokens, shared=True).float(), dim=-1)  # [E, B, T, V]
        picked = logp.gather(-1, targets.clamp(min=0).expand(logp.shape[0], -1, -1).unsqueeze(-1)).squeeze(-1)
        nll = -(picked * mask)  # [E, B, T]
        part = nll.sum((1, 2))  # [E]
        total = part if total is None else total + part
        count += int(mask.sum())
        for n in part_seqs.lengths.unique().tolist():
            rows = part_seqs.lengths == n
            by_n[n] = nll[:, rows].sum((1, 2)) + (by_n[n] if n in by_n else 0.0)
            count_n[n] = count_n.get(n, 0) + int(mask[rows].sum())
    per_length = [{n: float(by_n[n][e]) / max(count_n[n], 1) for n in sorted(by_n)} for e in range(len(total))]
    return (total / max(count, 1)).tolist(), per_length


def train_ensemble(specs: list[TrialSpec | dict[str, Any]]) -> list[dict[str, Any]]:
    """Train trials of one group (see :func:`mechlab.train.trials.group_key`) as one ensemble.

    Args:
        specs: The trials; they may differ in ``n_train``, ``lr`` and ``seed`` only.

    Returns:
        One result per spec, in order, as :func:`mechlab.train.trials.run_trial` gives
        (plus ``ensemble``: the number of members); ``seconds`` is the ensemble's wall
        time divided by its size.

    Raises:
        ValueError: Specs of different groups.
    """
    specs = [as_spec(s) for s in specs]
    if not specs:
        return []
    if len({group_key(s) for s in specs}) > 1:
        raise ValueError("train_ensemble needs trials that differ only in n_train, lr and seed")
    start = time.perf_counter()
    first = specs[0]
    device = check_device(first.device)
    cache: dict[int, Any] = {}
    for s in specs:
        if s.n_train not in cache:
            cache[s.n_train] = make_data(s.task_config()).to(device)
    datas = [cache[s.n_train] for s in specs]
    cfg = specs[0].task_config()
    models = [init_model(s) for s in specs]
    ens = Ensemble(models, [s.lr for s in specs])
    active = list(range(len(specs)))  # spec index of each ensemble member
    best = [math.inf] * len(specs)
    best_by_length: list[dict[int, float] | None] = [None] * len(specs)
    results: list[dict[str, Any] | None] = [None] * len(specs)

    def finish(members: list[int], step: int) -> None:
        for pos, i in enumerate(active):
            if i not in members:
                continue
            model = models[i]
            model.load_state_dict({k: v for k, v in ens.member_state(pos).items() if k in model.state_dict()})
            model.eval()
            ood = set_accuracy(model, cfg, datas[i].ood)
            results[i] = trial_result(specs[i], best[i], best[i] < specs[i].epsilon, step, ood, 0.0, best_by_length[i])

    step = 0
    while active and step < first.steps:
        step += 1
        parts = [datas[i].batch(first.batch_size, batch_generator(specs[i].seed, step)) for i in active]
        tokens = _pad_stack([p[0] for p in parts], cfg.pad)  # [E, B, T]
        targets = _pad_stack([p[1] for p in parts], IGNORE)
        mask = _pad_stack([p[2] for p in parts], False)
        try:
            losses = ens.losses(tokens, targets, mask)  # [E]
        except RuntimeError as err:
            if step > 1 or "batching rule" not in str(err).lower():
                raise
            warnings.warn(
                f"the {models[0].cfg.arch} model cannot run under torch.func.vmap "
                f"({' '.join(str(err).split())[:100]}); its {len(specs)} trials are trained one after another",
                UserWarning,
                stacklevel=2,
            )
            return [run_trial(s) for s in specs]
        grads = torch.autograd.grad(losses.sum(), list(ens.params.values()))
        ens.adam_step(dict(zip(ens.params, grads, strict=True)))
        if step % first.eval_every == 0 or step == first.steps:
            vals, per_length = ensemble_val_losses(ens, cfg, datas[active[0]].val)
            for i, v, v_n in zip(active, vals, per_length, strict=True):
                if v < best[i]:
                    best[i], best_by_length[i] = v, v_n
            done = [i for i, v in zip(active, vals, strict=True) if v < specs[i].epsilon]
            if step == first.steps:
                done = list(active)
            if done:
                finish(done, step)
                keep = [pos for pos, i in enumerate(active) if i not in done]
                active = [active[pos] for pos in keep]
                if active:
                    ens.keep(keep)
    seconds = (time.perf_counter() - start) / len(specs)
    out = []
    for r in results:
        assert r is not None
        out.append({**r, "seconds": seconds, "ensemble": len(specs)})
    return out
