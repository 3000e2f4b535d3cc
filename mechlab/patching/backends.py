"""Two ways to run a model with patches: TransformerLens hooks and nnsight.

Both take the same :class:`Patch` list and give the same numbers. A patch writes
``source[index]`` into a hook's activation. On a per-time-step hook point (a
recurrent state, see :mod:`mechlab.models.recurrence`) the hook is called once per
step with a ``[batch, pos, ...]`` buffer: the TransformerLens backend writes the
patch at every call (what it writes at position ``t`` is carried on at step ``t``);
the nnsight backend addresses step ``t`` as the ``t``-th call with ``tracer.iter[t]``
(every call, ``tracer.iter[0:n_pos]``, for a patch over all positions). nnsight runs
each patch and each save in its own invoke over the whole batch, so they need not be
written in forward order.
"""

from __future__ import annotations

import functools
import gc
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from mechlab.patching.grid import BACKENDS, check_choice

NNSIGHT_HINT = "install the extra: pip install 'mechlab[nnsight]'"


def load_nnsight():
    """nnsight's ``NNsight`` class; nnsight is an extra (``mechlab[nnsight]``), loaded here on
    first use so the base install and every other backend run without it."""
    try:
        # lazy: optional: the ImportError is handled below
        from nnsight import NNsight
    except ImportError as err:
        raise ImportError(f"the nnsight backend needs nnsight; {NNSIGHT_HINT}") from err
    return NNsight


@dataclass(frozen=True)
class Patch:
    """Write ``source[index]`` into hook ``name``'s activation.

    Args:
        name: Hook name.
        index: Index into the ``[batch, ...]`` activation.
        source: A full activation of that hook, ``[batch, ...]``.
        step: For a per-step hook point, the one time step this patch is written at;
            None writes it at every call (a patch spanning all positions).
    """

    name: str
    index: tuple
    source: Tensor
    step: int | None = None


class Backend(ABC):
    """Runs a model with patches and returns its output and some saved activations."""

    def __init__(self, model):
        self.model = model

    @abstractmethod
    def run(
        self, x: Tensor, patches: Sequence[Patch] = (), save: Sequence[str] = ()
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Run ``x`` with ``patches``; return the output and the (patched) activations of ``save``."""

    def close(self) -> None:  # noqa: B027 -- a hook-based backend holds nothing to free
        """Free what the backend holds between runs."""


class HooksBackend(Backend):
    """TransformerLens hooks: ``model.hooks(fwd_hooks=...)`` around a plain forward."""

    def run(
        self, x: Tensor, patches: Sequence[Patch] = (), save: Sequence[str] = ()
    ) -> tuple[Tensor, dict[str, Tensor]]:
        saved: dict[str, Tensor] = {}

        def write(act: Tensor, hook, patch: Patch) -> Tensor:
            act[patch.index] = patch.source[patch.index].to(act.dtype)
            return act

        def keep(act: Tensor, hook) -> None:
            # On a per-step hook point this is the step buffer, full after the last step.
            saved[hook.name] = act.detach()

        fwd = [(p.name, functools.partial(write, patch=p)) for p in patches]
        fwd += [(name, keep) for name in save]
        with self.model.hooks(fwd_hooks=fwd):
            out = self.model(x)
        # a plain hook point may be edited in place by nothing later, but copy to be safe
        return out, {name: t.clone() for name, t in saved.items()}


def _envoy(root, name: str):
    return functools.reduce(getattr, name.split("."), root)


class NNsightBackend(Backend):
    """nnsight: ``NNsight(model).trace(...)``, one invoke per patch and per save."""

    def __init__(self, model):
        super().__init__(model)
        self.traced = load_nnsight()(model)
        self.n_runs = 0

    def run(
        self, x: Tensor, patches: Sequence[Patch] = (), save: Sequence[str] = ()
    ) -> tuple[Tensor, dict[str, Tensor]]:
        nm, model = self.traced, self.model
        n_pos = x.shape[1]
        proxies = {}
        with nm.trace() as tracer:
            with tracer.invoke(x):
                pass
            for patch in patches:
                with tracer.invoke():
                    envoy = _envoy(nm, patch.name)
                    if not model.is_step_hook(patch.name):
                        envoy.output[patch.index] = patch.source[patch.index]
                    elif patch.step is not None:
                        for _ in tracer.iter[patch.step]:
                            envoy.output[patch.index] = patch.source[patch.index]
                    else:
                        for _ in tracer.iter[0:n_pos]:
                            envoy.output[patch.index] = patch.source[patch.index]
            for name in save:
                with tracer.invoke():
                    # a step hook's first call hands over the buffer, full after the run
                    proxies[name] = _envoy(nm, name).output.save()
            with tracer.invoke():
                out = nm.output.save()
        self.n_runs += 1
        if self.n_runs % 64 == 0:
            gc.collect()  # nnsight's per-trace objects hold cycles
        return out, {name: t.detach().clone() for name, t in proxies.items()}

    def close(self) -> None:
        self.traced = None
        gc.collect()


def make_backend(name: str, model) -> Backend:
    """The backend called ``name`` (``"hooks"`` or ``"nnsight"``) for ``model``."""
    check_choice("backend", name, BACKENDS)
    return HooksBackend(model) if name == "hooks" else NNsightBackend(model)

