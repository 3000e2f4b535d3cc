"""The activation cache of mechlab's models, and the hooks that fill it.

:class:`MechCache` is TransformerLens' ``ActivationCache``: ``cache[name]``,
``cache["pattern", 0]``, ``.items()``, ``remove_batch_dim``, ``to``, and, on a
transformer, ``accumulated_resid``, ``decompose_resid``, ``stack_head_results``,
``get_full_resid_decomposition``, ``apply_ln_to_stack`` and ``logit_attrs``. On the
recurrent families (no attention heads, no MLP, no cached LayerNorm scale) those
transformer methods raise a ``ValueError``.

:func:`caching_hooks` builds the forward and backward hooks that fill a cache. It slices
``pos_slice`` on each hook's own position axis (from ``model.pos_dim``), not on an axis
guessed from the hook's name as TransformerLens does.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import Slice, SliceInput
from transformer_lens.utilities import remove_batch_dim as drop_batch_dim

from mechlab.models.buffers import SESSION, CacheBuffers
from mechlab.models.recurrence import reads_only

if TYPE_CHECKING:
    from mechlab.models.base import MechModel

NamesFilter = Callable[[str], bool] | str | list[str] | None

# ActivationCache methods that need attention heads, MLPs and cached LayerNorm scales.
TRANSFORMER_ONLY = (
    "accumulated_resid",
    "logit_attrs",
    "decompose_resid",
    "compute_head_results",
    "stack_head_results",
    "get_neuron_results",
    "stack_neuron_results",
    "apply_ln_to_stack",
    "get_full_resid_decomposition",
)


def _transformer_only(name: str) -> Callable[..., Any]:
    method = getattr(ActivationCache, name)

    def checked(self: MechCache, *args: Any, **kwargs: Any) -> Any:
        arch = self.model.cfg.arch
        if arch != "transformer":
            raise ValueError(
                f"cache.{name} needs a transformer (attention heads, MLPs, LayerNorm scales); "
                f"this cache comes from a {arch} model: read its hooks by name instead"
            )
        return method(self, *args, **kwargs)

    checked.__name__ = name
    checked.__doc__ = method.__doc__
    return checked


class MechCache(ActivationCache):
    """TransformerLens' ``ActivationCache`` over a mechlab model's activations.

    It also reads like the dict ``run_with_cache`` used to return: ``name in cache``,
    ``cache.get(name)``, ``cache == other_dict``.

    Args:
        cache_dict: Hook name -> activation (and ``name + "_grad"`` -> gradient).
        model: The model the activations come from.
        has_batch_dim: Whether the activations still have their batch axis.
    """

    def __init__(self, cache_dict: dict[str, Tensor], model: MechModel, has_batch_dim: bool = True):
        super().__init__(cache_dict, model, has_batch_dim=has_batch_dim)

    def __contains__(self, key: object) -> bool:
        return key in self.cache_dict

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ActivationCache):
            other = other.cache_dict
        return self.cache_dict == other

    __hash__ = None  # type: ignore[assignment]

    def get(self, key: str, default: Tensor | None = None) -> Tensor | None:
        """The activation under ``key`` (a full hook name), or ``default``."""
        return self.cache_dict.get(key, default)


for _name in TRANSFORMER_ONLY:
    setattr(MechCache, _name, _transformer_only(_name))


def normalize_names_filter(names_filter: NamesFilter) -> Callable[[str], bool]:
    """TransformerLens' ``names_filter`` forms (None, a name, a list, a predicate) as a predicate."""
    if names_filter is None:
        return lambda name: True
    if isinstance(names_filter, str):
        return lambda name: name == names_filter
    if isinstance(names_filter, list):
        wanted = set(names_filter)
        return lambda name: name in wanted
    if callable(names_filter):
        return names_filter
    raise ValueError(
        f"names_filter must be a hook name, a list of names or a function, "
        f"not {type(names_filter).__name__}"
    )


def caching_hooks(
    model: MechModel,
    cache: dict[str, Tensor],
    names_filter: NamesFilter = None,
    incl_bwd: bool = False,
    device: str | torch.device | None = None,
    remove_batch_dim: bool = False,
    pos_slice: Slice | SliceInput = None,
    buffers: CacheBuffers | None = None,
) -> tuple[list, list, Callable[[], None]]:
    """Hooks that store activations (and gradients) into ``cache``.

    Args:
        model: The model whose hook points to use.
        cache: The dict to fill.
        names_filter: Which hooks to cache (see :func:`normalize_names_filter`).
        incl_bwd: Also cache every gradient, as ``name + "_grad"``.
        device: Where to store the tensors (default: where they are).
        remove_batch_dim: Drop a batch axis of size 1.
        pos_slice: Positions to keep, applied on each hook's position axis.
        buffers: A pool the model may compute the big stored activations into
            (:mod:`mechlab.models.buffers`; ``run_with_cache`` passes its session), or None.

    Returns:
        ``(fwd_hooks, bwd_hooks, finalize)``. The forward hooks are marked
        :func:`~mechlab.models.recurrence.reads_only`, so a per-step hook point is called
        once with its whole trajectory, unless a hook that may write shares its mixer;
        then it runs once per time step on a buffer that holds every step, as the
        recurrence used it, only once the pass is over; until ``finalize()`` runs, its entry is that whole buffer (no copy
        per step), and ``finalize()`` applies ``device``, ``remove_batch_dim`` and
        ``pos_slice`` to it. Call it after the forward pass, before reading ``cache``.
    """
    keep = normalize_names_filter(names_filter)
    pos_slice = Slice.unwrap(pos_slice)
    last_buffer: dict[str, Tensor] = {}

    def store(tensor: Tensor, name: str, key: str) -> None:
        tensor = tensor.detach().to(device)
        dim = model.pos_dim(name)
        if remove_batch_dim and tensor.shape[0] == 1:
            tensor, dim = drop_batch_dim(tensor), dim - 1
        cache[key] = pos_slice.apply(tensor, dim=dim)

    def save(tensor: Tensor, hook: HookPoint, is_backward: bool) -> None:
        key = hook.name + "_grad" if is_backward else hook.name
        if not is_backward and model.is_step_hook(hook.name):
            last_buffer[hook.name] = cache[key] = tensor.detach()
            return
        store(tensor, hook.name, key)

    def finalize() -> None:
        for name, buffer in last_buffer.items():
            store(buffer, name, name)
        last_buffer.clear()

    fwd_hooks, bwd_hooks = [], []
    for name in model.hook_dict:
        if keep(name):
            # caching only reads: per-step points can then run the mixers' fast paths
            hook = reads_only(partial(save, is_backward=False))
            if buffers is not None:
                setattr(hook, SESSION, buffers)  # the model may write this activation into the pool
            fwd_hooks.append((name, hook))
            if incl_bwd:
                bwd_hooks.append((name, partial(save, is_backward=True)))
    return fwd_hooks, bwd_hooks, finalize
