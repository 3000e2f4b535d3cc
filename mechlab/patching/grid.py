"""Which cells a patching sweep visits, and the checks on what the user passed in.

A *cell* is one hook, one position (or every position at once) and, on hooks with a
head axis, one head (or every head at once). A sweep is a list of *components*
(hook, head) crossed with a list of positions; each cell becomes one index into the
hook's ``[batch, ...]`` activation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mechlab.models.base import POSITION_AXES, hook_pattern

DIRECTIONS = ("denoise", "noise")
BACKENDS = ("hooks", "nnsight")
ALL = "all"  # the position label of a patch over every position at once

# Default components, in the order they appear inside a block; which exist depends on
# the family (the attention per head replaces hook_attn_out when heads are swept).
DEFAULT_PATTERNS = (
    "blocks.*.hook_resid_pre",
    "blocks.*.attn.hook_result",
    "blocks.*.hook_attn_out",
    "blocks.*.hook_mlp_out",
    "blocks.*.lstm.hook_h",
    "blocks.*.ssm.hook_h",
    "blocks.*.mixer.hook_ssm_state",
    "blocks.*.hook_mixer_out",
)
# Component outputs: what path patching freezes by default.
OUTPUT_PATTERNS = ("blocks.*.attn.hook_result", "blocks.*.hook_mlp_out", "blocks.*.hook_mixer_out")

HookSpec = Sequence[str] | Callable[[str], bool] | str | None
Component = tuple[str, int | None]  # (hook name, head or None for all heads / no head axis)
Position = int | str  # a position, or ALL


@dataclass(frozen=True)
class Cell:
    """One patch site: ``hook`` at ``pos`` (an int or ``"all"``) and ``head`` (or None)."""

    hook: str
    pos: Position
    head: int | None = None

    def index(self, axes: Sequence[str]) -> tuple:
        """The index of this cell into an activation whose axes are named ``axes``."""
        index: list = [slice(None)] * len(axes)
        if self.pos != ALL:
            index[_axis(axes, POSITION_AXES)] = self.pos
        if self.head is not None:
            index[_axis(axes, HEAD_AXES)] = self.head
        return tuple(index)


# Head axes: query heads, and the key/value heads of grouped-query attention (hook_k, hook_v).
HEAD_AXES = ("head", "kv_head")


def _axis(axes: Sequence[str], names: Sequence[str]) -> int:
    return next(i for i, axis in enumerate(axes) if axis in names)


def check_model(model: torch.nn.Module) -> None:
    """Refuse models that cannot name their hooks' axes."""
    if not hasattr(model, "hook_axes") or not hasattr(model, "is_step_hook"):
        raise ValueError(
            f"patching needs a mechlab model (a MechModel with hook_axes), got "
            f"{type(model).__name__}; build one with mechlab.build_model or load a checkpoint"
        )


def check_inputs(clean: Tensor, corrupted: Tensor) -> None:
    """Clean and corrupted inputs must be tensors of one shape and dtype."""
    if not isinstance(clean, Tensor) or not isinstance(corrupted, Tensor):
        raise ValueError("clean and corrupted must be tensors (model inputs [batch, pos, ...])")
    if clean.shape != corrupted.shape or clean.dtype != corrupted.dtype:
        raise ValueError(
            f"clean {list(clean.shape)} {clean.dtype} and corrupted {list(corrupted.shape)} "
            f"{corrupted.dtype} must have the same shape and dtype; pair each clean row with "
            "one corrupted row"
        )


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    """One-line error for an unknown option value."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {list(choices)}")


def metric_value(metric: Callable[[Tensor], Tensor], output: Tensor) -> Tensor:
    """Call the metric and check that it returned a scalar tensor.

    Args:
        metric: ``metric(output) -> scalar tensor``.
        output: The model's ``[batch, pos, d_out]`` output.

    Returns:
        The 0-dim (or one-element) tensor the metric returned, reshaped to 0-dim.
    """
    value = metric(output)
    if not isinstance(value, Tensor) or value.numel() != 1:
        got = list(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(
            f"metric must return a scalar tensor, got {got}; reduce it, e.g. with .mean()"
        )
    return value.reshape(())


def resolve_hooks(model, hooks: HookSpec, heads: bool | Sequence[int]) -> list[str]:
    """Hook names from a list, a single name, a predicate or None (the defaults).

    Args:
        model: A mechlab model.
        hooks: Hook names, one name, a predicate on names, or None for the components'
            outputs and states of every block (see ``DEFAULT_PATTERNS``).
        heads: The sweep's head setting: with heads swept, the default attention
            component is ``attn.hook_result`` (per head), else ``hook_attn_out``.

    Returns:
        Hook names in the model's registration order (defaults) or as given.
    """
    if hooks is None:
        skip = "blocks.*.hook_attn_out" if heads is not False else "blocks.*.attn.hook_result"
        wanted = [p for p in DEFAULT_PATTERNS if p != skip]
        n_layers = model.cfg.n_layers
        names = [
            p.replace("*", str(i)) for i in range(n_layers) for p in wanted
        ]
        return [n for n in names if n in model.hook_dict]
    if isinstance(hooks, str):
        hooks = [hooks]
    if callable(hooks):
        names = [n for n in model.hook_dict if hooks(n)]
        if not names:
            raise ValueError("the hook predicate matched no hook; list names with list(model.hook_dict)")
        return names
    names = list(hooks)
    if not names:
        raise ValueError("hooks is empty; pass hook names, a predicate, or None for the defaults")
    for name in names:
        if not isinstance(name, str) or name not in model.hook_dict:
            raise ValueError(
                f"unknown hook name {name!r}; list the valid names with list(model.hook_dict)"
            )
    return names


def components(model, names: Sequence[str], heads: bool | Sequence[int]) -> list[Component]:
    """Rows of a sweep: each hook, split per head where it has a head axis.

    Args:
        model: A mechlab model.
        names: Hook names.
        heads: True for every head, False for all heads at once, or a list of heads.

    Returns:
        ``(hook, head)`` pairs; ``head`` is None for hooks without a head axis and
        when ``heads`` is False.
    """
    if heads is True:
        head_list = None
    elif heads is False:
        head_list = []
    else:
        head_list = list(heads)
    rows: list[Component] = []
    for name in names:
        axes = model.hook_axes(name)
        if not any(a in POSITION_AXES for a in axes):
            raise ValueError(f"hook {name!r} has no position axis ({axes}); choose another hook")
        if not any(a in HEAD_AXES for a in axes) or head_list == []:
            rows.append((name, None))
            continue
        kv = "kv_head" in axes
        n_heads = model.cfg.n_key_value_heads if kv else model.cfg.n_heads
        chosen = range(n_heads) if head_list is None else head_list
        for head in chosen:
            if not isinstance(head, int) or not 0 <= head < n_heads:
                raise ValueError(f"head {head!r} is out of range for {n_heads} heads; use 0..{n_heads - 1}")
            rows.append((name, head))
    return rows


def resolve_positions(positions: Sequence[int] | str | None, n_pos: int) -> list[Position]:
    """Positions of a sweep: None for every position, ``"all"`` for all at once, or a list.

    Args:
        positions: None, ``"all"``, or ints in ``[0, n_pos)``.
        n_pos: Sequence length of the inputs.

    Returns:
        The positions (ints), or ``["all"]``.
    """
    if positions is None:
        return list(range(n_pos))
    if isinstance(positions, str):
        if positions != ALL:
            raise ValueError(f"positions must be None, 'all' or a list of ints, got {positions!r}")
        return [ALL]
    if isinstance(positions, int):
        positions = [positions]
    out = list(positions)
    if not out:
        raise ValueError("positions is empty; pass None for every position")
    for p in out:
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < n_pos:
            raise ValueError(f"position {p!r} is out of range for {n_pos} positions; use 0..{n_pos - 1}")
    return out


def matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether a hook name matches one of the ``blocks.*.`` patterns."""
    return hook_pattern(name) in patterns
