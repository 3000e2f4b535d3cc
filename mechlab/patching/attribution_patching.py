"""Attribution patching: the first-order (gradient) estimate of an activation-patching sweep.

For a cell with index ``i`` of hook activation ``a``, patching the base run's
``a[i]`` with the source run's is estimated as

    metric(patched) - metric(base)  ~=  sum_i (a_source[i] - a_base[i]) * dmetric/da[i]

with the gradient taken on the run being patched (Taylor expansion around it):

* ``direction="noise"``: base = clean, source = corrupted, gradient at the clean run:
  ``(a_corrupted - a_clean) . dmetric/da |clean``;
* ``direction="denoise"``: base = corrupted, source = clean, gradient at the corrupted
  run: ``(a_clean - a_corrupted) . dmetric/da |corrupted`` (the usual convention:
  positive when patching in the clean activation raises the metric).

``gradient_at="clean"`` (or ``"corrupted"``) takes the gradient on that run instead,
keeping the sign ``source - base``. Where the metric is linear in the activation, the
estimate is exact. Cost: one forward per run and one backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from mechlab.patching.grid import (
    DIRECTIONS,
    Cell,
    HookSpec,
    check_choice,
    check_inputs,
    check_model,
    components,
    metric_value,
    resolve_hooks,
    resolve_positions,
)
from mechlab.patching.result import PatchResult
from mechlab.progress import tqdm

GRADIENT_AT = ("base", "clean", "corrupted")


def hook_gradients(
    model, x: Tensor, metric: Callable[[Tensor], Tensor], names: Sequence[str]
) -> tuple[float, dict[str, Tensor], dict[str, Tensor]]:
    """One forward and one backward: metric, activations and their gradients.

    The parameters' ``.grad`` are left as they were.

    Args:
        model: A mechlab model.
        x: Its input.
        metric: ``metric(output) -> scalar tensor``.
        names: Hooks to cache.

    Returns:
        ``(metric value, {name: activation}, {name: dmetric/dactivation})``.
    """
    params = list(model.parameters())
    saved = [p.grad for p in params]
    value: list[Tensor] = []

    def scalar(out: Tensor) -> Tensor:
        value.append(metric_value(metric, out))
        return value[-1]

    try:
        with torch.enable_grad():
            _, cache = model.run_with_cache(
                x, names_filter=list(names), incl_bwd=True, metric=scalar
            )
    finally:
        for p, g in zip(params, saved, strict=True):
            p.grad = g
    acts = {n: cache[n].detach() for n in names}
    grads = {}
    for n in names:
        if n + "_grad" not in cache:  # nothing downstream of this hook reaches the metric
            grads[n] = torch.zeros_like(acts[n])
        else:
            grads[n] = cache[n + "_grad"].detach()
    return float(value[-1].detach()), acts, grads


def _wide(t: Tensor) -> Tensor:
    """``t`` in float32 at least (float64 stays)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def attribution_patch(
    model,
    clean: Tensor,
    corrupted: Tensor,
    metric: Callable[[Tensor], Tensor],
    hooks: HookSpec = None,
    positions: Sequence[int] | str | None = None,
    heads: bool | Sequence[int] = True,
    direction: str = "denoise",
    gradient_at: str = "base",
    progress: bool = True,
) -> PatchResult:
    """Estimate :func:`activation_patch` over the same grid from one backward pass.

    Args:
        model: A mechlab model.
        clean: Clean inputs.
        corrupted: Corrupted inputs of the same shape.
        metric: ``metric(output) -> scalar tensor``.
        hooks: As in :func:`activation_patch`.
        positions: As in :func:`activation_patch`.
        heads: As in :func:`activation_patch`.
        direction: ``"denoise"`` or ``"noise"``.
        gradient_at: ``"base"`` (the run being patched: corrupted when denoising,
            clean when noising), ``"clean"`` or ``"corrupted"``.
        progress: Show a progress bar over the cells.

    Returns:
        A :class:`PatchResult` (method ``"attribution"``) whose ``values`` are the
        estimated patched metrics, ``base metric + attribution``.
    """
    check_model(model)
    check_inputs(clean, corrupted)
    check_choice("direction", direction, DIRECTIONS)
    check_choice("gradient_at", gradient_at, GRADIENT_AT)
    names = resolve_hooks(model, hooks, heads)
    rows = components(model, names, heads)
    cols = resolve_positions(positions, clean.shape[1])
    if gradient_at == "base":
        gradient_at = "corrupted" if direction == "denoise" else "clean"

    runs = {}
    for run, x in (("clean", clean), ("corrupted", corrupted)):
        if run == gradient_at:
            runs[run] = hook_gradients(model, x, metric, names)
        else:
            with torch.no_grad():
                _, cache = model.run_with_cache(x, names_filter=list(names))
                runs[run] = (float(metric_value(metric, model(x))), cache, None)
    grads = runs[gradient_at][2]
    base, source = ("corrupted", "clean") if direction == "denoise" else ("clean", "corrupted")
    base_metric = runs[base][0]

    values = torch.empty(len(rows), len(cols))  # [component, pos]
    cells = tqdm(total=values.numel(), desc="attribution patching", disable=not progress)
    for i, (hook, head) in enumerate(rows):
        # [batch, ...] elementwise first-order effect of replacing base by source
        # in float32 at least: a bfloat16 model's activations and gradients, summed below
        contrib = (_wide(runs[source][1][hook]) - _wide(runs[base][1][hook])) * _wide(grads[hook])
        axes = model.hook_axes(hook)
        for j, pos in enumerate(cols):
            index = Cell(hook, pos, head).index(axes)
            values[i, j] = base_metric + float(contrib[index].sum())
            cells.update()
    cells.close()
    return PatchResult(
        values, rows, cols, runs["clean"][0], runs["corrupted"][0], direction, "attribution",
        meta={"gradient_at": gradient_at},
    )
