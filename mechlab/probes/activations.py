"""Collect a model's activations over a dataset, batch by batch, without gradients."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import torch
from torch import Tensor
from transformer_lens import HookedRootModule

from mechlab.progress import tqdm

# Hooks whose position axis is the query axis (dim 2): [batch, head, query_pos, key_pos].
ATTENTION_HOOKS = ("hook_attn_scores", "hook_pattern")


def position_dim(model: HookedRootModule, hook: str) -> int:
    """The axis of a hook's activation that indexes positions.

    Args:
        model: The model (a mechlab model answers through ``model.pos_dim``).
        hook: A hook name.

    Returns:
        2 for attention scores and patterns (their query axis), 1 for every other hook.
    """
    if hasattr(model, "pos_dim"):
        return model.pos_dim(hook)
    return 2 if hook.endswith(ATTENTION_HOOKS) else 1


def resolve_positions(positions: int | Sequence[int] | Tensor | None, n_pos: int) -> Tensor | None:
    """Positions as a 1-D long tensor in ``0..n_pos-1`` (negative ones count from the end).

    Args:
        positions: None (every position), one int, or a sequence / 1-D tensor of ints.
        n_pos: Length of the position axis.

    Returns:
        ``[n_selected]`` indices, or None for every position.

    Raises:
        ValueError: Empty, non-integer or out-of-range positions.
    """
    if positions is None:
        return None
    index = torch.as_tensor([positions] if isinstance(positions, int) else positions)
    if (
        index.dim() != 1
        or index.numel() == 0
        or index.is_floating_point()
        or index.dtype == torch.bool
    ):
        raise ValueError(
            f"positions must be an int or a non-empty 1-D sequence of ints, got {positions!r}"
        )
    index = index.long()
    if ((index < -n_pos) | (index >= n_pos)).any():
        raise ValueError(
            f"positions {index.tolist()} out of range for {n_pos} positions (0..{n_pos - 1})"
        )
    return index % n_pos


def check_hooks(model: HookedRootModule, hooks: str | Sequence[str]) -> list[str]:
    """Hook names as a list, each checked against ``model.hook_dict``.

    Raises:
        ValueError: No hook given, or a name the model does not have.
    """
    names = [hooks] if isinstance(hooks, str) else list(hooks)
    if not names:
        raise ValueError(
            "hooks is empty; give at least one hook name, e.g. 'blocks.0.hook_resid_post'"
        )
    for name in names:
        if name not in model.hook_dict:
            close = difflib.get_close_matches(str(name), list(model.hook_dict), n=3)
            hint = f"did you mean {close}?" if close else "see list(model.hook_dict)"
            raise ValueError(f"unknown hook {name!r}; {hint}")
    return names


@torch.no_grad()
def collect_activations(
    model: HookedRootModule,
    inputs: Tensor,
    hooks: str | Sequence[str],
    positions: int | Sequence[int] | Tensor | None = None,
    batch_size: int = 256,
    progress: bool = True,
) -> dict[str, Tensor]:
    """Activations of ``hooks`` over ``inputs``, ``batch_size`` rows per forward pass.

    Runs ``model.run_with_cache(..., names_filter=hooks)`` in eval mode without gradients
    (the model's train/eval mode is restored afterwards) and keeps only the selected
    positions of each activation, on the CPU.

    Args:
        model: A ``HookedRootModule`` (every mechlab model, or ``mechlab.hooked(module)``).
        inputs: ``[batch, pos, ...]`` model inputs.
        hooks: One hook name or several.
        positions: Positions to keep (None: all). The position axis is dim 1, except
            attention scores and patterns (``[batch, head, query_pos, key_pos]``), where it
            is the query axis, dim 2.
        batch_size: Rows per forward pass.
        progress: Show a progress bar.

    Returns:
        Hook name -> activation with the position axis cut to ``positions``, e.g.
        ``[batch, n_selected, d_model]`` for ``blocks.0.hook_resid_post``.

    Raises:
        ValueError: Unknown hooks, bad positions or batch size.
    """
    names = check_hooks(model, hooks)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(inputs, Tensor) or inputs.dim() < 2 or inputs.shape[0] == 0:
        raise ValueError("inputs must be a non-empty [batch, pos, ...] tensor")
    index = resolve_positions(positions, inputs.shape[1])
    dims = {name: position_dim(model, name) for name in names}
    device = next(model.parameters()).device
    chunks: dict[str, list[Tensor]] = {name: [] for name in names}
    was_training = model.training
    model.eval()
    try:
        starts = range(0, inputs.shape[0], batch_size)
        for start in tqdm(starts, desc="activations", disable=not progress):
            batch = inputs[start : start + batch_size].to(device)
            _, cache = model.run_with_cache(batch, names_filter=names)
            for name in names:
                if name not in cache:
                    raise ValueError(
                        f"hook {name!r} did not fire on these inputs; choose another hook"
                    )
                act = cache[name]
                if index is not None:
                    act = act.index_select(dims[name], index.to(act.device))
                chunks[name].append(act.detach().cpu())
    finally:
        model.train(was_training)
    return {name: torch.cat(parts) for name, parts in chunks.items()}
