"""Activation patching: one hook at one position (and head) from the other run."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from mechlab.patching.backends import Patch, make_backend
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


def make_patch(model, cell: Cell, source: Tensor) -> Patch:
    """The patch that writes ``source`` at ``cell`` (per-step hooks at the cell's step)."""
    step = cell.pos if model.is_step_hook(cell.hook) and isinstance(cell.pos, int) else None
    return Patch(cell.hook, cell.index(model.hook_axes(cell.hook)), source, step)


def activation_patch(
    model,
    clean: Tensor,
    corrupted: Tensor,
    metric: Callable[[Tensor], Tensor],
    hooks: HookSpec = None,
    positions: Sequence[int] | str | None = None,
    heads: bool | Sequence[int] = True,
    direction: str = "denoise",
    backend: str = "hooks",
    progress: bool = True,
) -> PatchResult:
    """Patch each (hook, position[, head]) cell from one run into the other; record the metric.

    ``direction="denoise"`` runs the corrupted input with one clean activation patched
    in; ``"noise"`` runs the clean input with one corrupted activation patched in. One
    forward pass per cell. On a per-time-step hook (``blocks.0.lstm.hook_h``) a patch
    at position ``t`` is what the recurrence carries on from step ``t``, so it reaches
    every later step.

    Args:
        model: A mechlab model.
        clean: ``[batch, pos, d_in]`` (or ``[batch, pos]`` token) clean inputs.
        corrupted: Corrupted inputs of the same shape.
        metric: ``metric(output) -> scalar tensor`` on the ``[batch, pos, d_out]`` output.
        hooks: Hook names, one name, a predicate on names, or None for every block's
            ``hook_resid_pre``, attention (``attn.hook_result`` per head, or
            ``hook_attn_out``), ``hook_mlp_out``, recurrent state and ``hook_mixer_out``.
        positions: Positions to sweep (None: each position; ``"all"``: every position
            at once, one column).
        heads: On hooks with a head axis: True sweeps each head, False patches all
            heads at once, a list sweeps those heads.
        direction: ``"denoise"`` or ``"noise"``.
        backend: ``"hooks"`` (TransformerLens hooks) or ``"nnsight"``.
        progress: Show a progress bar.

    Returns:
        A :class:`PatchResult` with the metric of every patched run.
    """
    check_model(model)
    check_inputs(clean, corrupted)
    check_choice("direction", direction, DIRECTIONS)
    engine = make_backend(backend, model)
    names = resolve_hooks(model, hooks, heads)
    rows = components(model, names, heads)
    cols = resolve_positions(positions, clean.shape[1])

    with torch.no_grad():
        clean_out, clean_acts = engine.run(clean, save=names)
        corrupted_out, corrupted_acts = engine.run(corrupted, save=names)
    clean_metric = float(metric_value(metric, clean_out))
    corrupted_metric = float(metric_value(metric, corrupted_out))
    base, source = (corrupted, clean_acts) if direction == "denoise" else (clean, corrupted_acts)

    values = torch.empty(len(rows), len(cols))  # [component, pos]
    bar = tqdm(total=values.numel(), desc="activation patching", disable=not progress)
    with torch.no_grad():
        for i, (hook, head) in enumerate(rows):
            for j, pos in enumerate(cols):
                patch = make_patch(model, Cell(hook, pos, head), source[hook])
                out, _ = engine.run(base, [patch])
                values[i, j] = float(metric_value(metric, out))
                bar.update()
    bar.close()
    engine.close()
    return PatchResult(
        values, rows, cols, clean_metric, corrupted_metric, direction, "activation"
    )
