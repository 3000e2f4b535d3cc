"""Make any torch module hookable: ``hooked(module)``.

The wrapper exposes the output of every submodule of a module you bring as a
TransformerLens hook point, so the cache and hook API of mechlab's own models
(``run_with_cache``, ``run_with_hooks``, ``hooks()``, ``hook_dict``,
``mod_dict``) and nnsight work on it unchanged::

    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model = hooked(net)
    out, cache = model.run_with_cache(x)
    cache["0.hook_out"]          # output of net[0], [batch, 8]
    cache["hook_out"]            # output of net itself

Hook names. The output of the submodule at path ``p`` (as ``named_modules``
spells it, e.g. ``"0"`` or ``"encoder.layers.1.mlp"``) is ``"p.hook_out"``; the
output of the whole module is ``"hook_out"``. The hook points live in a tree of
empty container modules that mirrors those paths, so the nnsight path of a hook
point is its hook name too: ``NNsight(model).get("encoder.layers.1.mlp.hook_out")``.
The user's own submodules stay reachable under ``model.wrapped``.

Which submodules get a hook point: every submodule whose class defines its own
``forward`` (containers such as ``nn.ModuleList`` and ``nn.ModuleDict`` are
never called, so they get none) and which is not itself a ``HookPoint``. What
reaches the hook point:

* a Tensor output passes through it, and whatever a hook returns replaces it;
* a tuple or list output whose first item is a Tensor (``nn.LSTM``,
  ``nn.MultiheadAttention``, ``nn.GRU``) passes its *first* tensor through it;
  a hook's replacement goes back into the same position, the other items are
  left as they are;
* any other output (a dict, a dataclass, None, a tuple starting with a
  non-tensor) passes untouched and its hook point never fires, so it never
  appears in a cache. Give ``example=`` to :func:`hooked` to run one forward
  pass up front and keep only the hook points that fire.

A submodule called several times in one forward pass (a shared activation, a
block applied twice): with ``example=`` the probe counts its calls, and each call
gets its own hook point: ``"p.hook_out"`` the first, ``"p.hook_out_1"`` the
second, and so on, so a cache holds every use and a hook patches exactly one.
Without ``example=`` the submodule has the one hook point ``"p.hook_out"``, which
fires on every call (hooks see every call, a cache keeps the last); the first
forward pass that calls it twice warns once, pointing to ``example=``. Calls
beyond those the probe saw go through the last call's hook point.

The wrapped module's code and parameters are untouched: the wrapper registers
one torch forward hook per submodule, and these act only while the wrapper's own
forward runs (calling the original module directly gives its plain outputs).
``remove()`` / ``unwrap()``, leaving a ``with hooked(m) as model:`` block, or
garbage-collecting the wrapper takes them off again.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

OUT = "hook_out"
WRAPPED = "wrapped"


class HookTree(nn.Module):
    """An empty container that places hook points at their submodule's path. Never called."""


class HookedModule(HookedRootModule):
    """A HookedRootModule around a module you bring; see :func:`hooked`.

    Args:
        module: Any ``nn.Module``.
        example: Optional input for one probing forward pass (a Tensor, or a
            tuple of positional arguments); only submodules whose output
            reaches a hook point during it get one. The probe runs under
            ``torch.no_grad()`` in eval mode; training flags are restored after.

    Attributes:
        wrapped: The module you brought.
        module_paths: Hook name -> submodule path (``""`` for the whole module).
    """

    def __init__(self, module: nn.Module, example: Tensor | tuple[Any, ...] | None = None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"hooked() wraps a torch nn.Module, got {type(module).__name__}")
        if isinstance(module, HookedModule):
            raise TypeError("this module is already a HookedModule; use it directly")
        if WRAPPED in module._modules:
            raise ValueError(
                f"the module has a child named {WRAPPED!r}, the name hooked() keeps the module "
                "under; rename that child"
            )

        paths = [
            path
            for path, sub in module.named_modules()
            if path and not isinstance(sub, HookPoint) and _has_forward(sub)
        ]
        for path in paths:
            clash = next((part for part in path.split(".") if part.startswith(OUT)), None)
            if clash is not None:
                raise ValueError(
                    f"submodule {path!r} has a part named {clash!r}, a name hooked() gives its "
                    "hook points; rename that submodule"
                )
        calls: dict[str, int] = {}
        if example is not None:
            calls = _probe(module, paths, example)
            paths = [p for p in paths if p in calls]
        self._attach(module, paths, calls)

    def _attach(self, module: nn.Module, paths: list[str], calls: dict[str, int]) -> None:
        """Wrap ``module`` with hook points for each submodule path in ``paths``
        (one per call where ``calls`` counts more than one)."""
        self.wrapped = module
        self.hook_out = HookPoint()  # [*] output of the whole module
        self.module_paths: dict[str, str] = {OUT: ""}
        self.module_calls = {p: calls.get(p, 1) for p in paths}  # hook points per submodule
        self._handles: list[RemovableHandle] = []
        self._depth = 0  # > 0 while this wrapper's forward runs
        self._call_counts: dict[int, int] = {}  # router id -> calls in the running forward
        self._removed = False
        owner = weakref.ref(self)
        for path in paths:
            names = [OUT] + [f"{OUT}_{i}" for i in range(1, self.module_calls[path])]
            points = [self._place(path, name) for name in names]
            sub = module.get_submodule(path)
            self._handles.append(sub.register_forward_hook(_Router(owner, points, path)))
            for name in names:
                self.module_paths[f"{path}.{name}"] = path
        # Runs when the wrapper is garbage-collected; holds no reference to it.
        self._finalizer = weakref.finalize(self, _remove_all, list(self._handles))
        self.setup()

    def __deepcopy__(self, memo: dict[int, Any]) -> HookedModule:
        """A new wrapper around a deep copy of the module, with the same hook points.

        Hooks added to the hook points are not copied.
        """
        module = copy.deepcopy(self.wrapped, memo)
        for sub in module.modules():  # the copy's routers still point at this wrapper
            for key, fn in list(sub._forward_hooks.items()):
                if isinstance(fn, _Router):
                    del sub._forward_hooks[key]
        clone = type(self).__new__(type(self))
        HookedRootModule.__init__(clone)
        clone._attach(module, list(self.module_calls), dict(self.module_calls))
        clone.training = self.training
        memo[id(self)] = clone
        return clone

    def setup(self) -> None:
        """Index the hook points (``hook_dict``) and modules (``mod_dict``) by name.

        Unlike ``HookedRootModule.setup`` this names only the wrapper's own hook
        points; the wrapped module's submodules are listed in ``mod_dict`` under
        their own paths but left unmodified (no ``name`` attribute is set on them).
        """
        self.hook_dict = {}
        self.mod_dict = {}
        for name, module in self.named_modules():
            if name == WRAPPED or name.startswith(WRAPPED + ".") or name == "":
                continue
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module
        for path, sub in self.wrapped.named_modules():
            if path:
                self.mod_dict[path] = sub
        self.mod_dict.update(self.hook_dict)

    def _place(self, path: str, name: str = OUT) -> HookPoint:
        """Create the hook point ``<path>.<name>`` and the containers above it."""
        node: nn.Module = self
        for part in path.split("."):
            child = node._modules.get(part)
            if child is None:
                child = HookTree()
                # Set directly: a top-level name such as "training" would clash
                # with an attribute under add_module; named_modules still lists it.
                node._modules[part] = child
            node = child
        point = HookPoint()
        node._modules[name] = point
        return point

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module, routing submodule outputs through their hook points."""
        if self._removed:
            raise RuntimeError(
                "this HookedModule was removed; call the original module, or hooked() it again"
            )
        if self._depth == 0:
            self._call_counts = {}
        self._depth += 1
        try:
            output = self.wrapped(*args, **kwargs)
        finally:
            self._depth -= 1
        routed = _route(self.hook_out, output)
        return output if routed is None else routed

    def remove(self) -> None:
        """Take the wrapper's forward hooks off the wrapped module's submodules."""
        self._finalizer()
        self._handles.clear()
        self._removed = True

    def unwrap(self) -> nn.Module:
        """:meth:`remove`, then return the wrapped module."""
        self.remove()
        return self.wrapped

    def __enter__(self) -> HookedModule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def hook_shapes(self, *args: Any, **kwargs: Any) -> dict[str, tuple[int, ...]]:
        """Name and shape of every hook point that fires on this input, in forward order."""
        with torch.no_grad():
            _, cache = self.run_with_cache(*args, **kwargs)
        return {name: tuple(t.shape) for name, t in cache.items()}


def hooked(module: nn.Module, example: Tensor | tuple[Any, ...] | None = None) -> HookedModule:
    """Wrap any torch module so every submodule's output is a hook point.

    Args:
        module: The module to wrap; its code and weights are not changed.
        example: Optional input (a Tensor, or a tuple of positional arguments)
            for one probing forward pass; only submodules whose output reaches a
            hook point during it get one.

    Returns:
        A :class:`HookedModule`; ``module``'s output at path ``p`` is hook
        ``"p.hook_out"`` and the whole output is ``"hook_out"``.
    """
    return HookedModule(module, example=example)


class _Router:
    """Torch forward hook on a user submodule: sends its output through the hook point
    of this call (the first, second, ... call in the running forward pass)."""

    def __init__(
        self, owner: weakref.ReferenceType[HookedModule], points: list[HookPoint], path: str
    ):
        self.owner = owner
        self.points = points
        self.path = path
        self.warned = False

    def __call__(self, module: nn.Module, args: Any, output: Any) -> Any:
        owner = self.owner()
        if owner is None or owner._depth == 0:
            return None  # outside the wrapper's forward: leave the output alone
        index = owner._call_counts.get(id(self), 0)
        owner._call_counts[id(self)] = index + 1
        if index >= 1 and len(self.points) == 1 and not self.warned:
            self.warned = True
            warnings.warn(
                f"submodule {self.path!r} ran more than once in one forward pass; its hook point "
                f"'{self.path}.{OUT}' sees every call and a cache keeps only the last. Pass "
                f"example= to hooked() for one hook point per call ('{self.path}.{OUT}', "
                f"'{self.path}.{OUT}_1', ...)",
                UserWarning,
                stacklevel=2,
            )
        return _route(self.points[min(index, len(self.points) - 1)], output)


def _route(point: HookPoint, output: Any) -> Any:
    """Pass ``output`` (or its first tensor) through ``point``; None when not routable."""
    if isinstance(output, Tensor):
        return point(output)
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        first = point(output[0])
        if first is output[0]:
            return None
        items = [first, *output[1:]]
        if isinstance(output, list):
            return type(output)(items)
        make = getattr(type(output), "_make", None)  # namedtuple
        return make(items) if make is not None else type(output)(items)
    return None


def _has_forward(module: nn.Module) -> bool:
    return type(module).forward is not nn.Module.forward


def _probe(module: nn.Module, paths: list[str], example: Any) -> dict[str, int]:
    """How many times each path's submodule gives a routable output during one forward
    pass on ``example`` (paths that never do are left out)."""
    fired: dict[str, int] = {}

    def recorder(path: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            if isinstance(output, Tensor) or (
                isinstance(output, tuple | list) and output and isinstance(output[0], Tensor)
            ):
                fired[path] = fired.get(path, 0) + 1

        return hook

    handles = [module.get_submodule(p).register_forward_hook(recorder(p)) for p in paths]
    modes = {m: m.training for m in module.modules()}
    try:
        module.eval()
        with torch.no_grad():
            module(*example) if isinstance(example, tuple) else module(example)
    finally:
        for m, training in modes.items():
            m.training = training
        _remove_all(handles)
    return fired


def _remove_all(handles: list[RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()
