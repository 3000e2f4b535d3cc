"""Pruning data of a state-tracking checkpoint: clean sequences at one length, corrupted
copies that change one input element, targets and position windows.

The pruning engine (:mod:`mechlab.prune`) knows no task: this module builds its
:class:`~mechlab.traces.PruneData` from a :class:`StateTrackingConfig`.

Traces (formats ``outcome`` and ``acot``, the task's token layout): ``n`` elements drawn
uniformly, encoded as ``[BOS, x_1..x_n]`` (:func:`~mechlab.tasks.state_tracking.encode`),
so element ``x_i`` sits at token position ``i`` and the outcome ``s_n`` is predicted at
position ``n``. ``truth`` holds the task's targets (``-100`` where nothing is scored) and
``observed`` its loss mask.

Corruption: the corrupted trace is the clean one with exactly one element ``x_c`` replaced
by another element (uniform over the other ``V - 1``), so every later state changes (in a
group, changing one factor of ``x_n o ... o x_1`` changes the product):

* ``"random"`` (default): ``c`` uniform over ``1..n-1`` per trace (every element but the
  last, so the outcome's own input is never the one changed);
* ``"x<k>"`` (e.g. ``"x1"``): ``c = k`` in every trace (``1 <= k <= n``).

Windows (for a recurrent model's windowed graph; a transformer's graph has none), with
``lo..hi`` the positions ``c`` may take: ``prefix`` ``[0, lo)`` (BOS and the elements
before), ``changed`` ``[lo, hi + 1)``, ``suffix`` ``[hi + 1, n)`` and ``final``
``[n, n + 1)``; an empty window is left out (``"random"`` gives ``prefix``, ``changed``,
``final`` at every length, so circuits found at two lengths share their edge names).

Targets (:data:`TARGETS`, resolved by :func:`resolve_target` into a callable whose name,
``<target>_n<length>``, is what the circuit records, so circuits of one target at two
lengths are two groups for :func:`mechlab.prune.stats.overlap_report`):

* ``"final"``: the prediction of ``s_n`` at position ``n`` (both formats);
* ``"changed"``: the prediction of ``s_c`` at the changed position (``acot`` only: the
  outcome format scores nothing there);
* ``"all"``: every scored position (``acot``: ``1..n``; ``outcome``: ``n``).

CoT is not built: changing ``x_c`` would also change the teacher-forced states after SEP,
so no corruption changes exactly one token.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mechlab.limits import check_elements
from mechlab.tasks.state_tracking import SequenceSet, StateTrackingConfig, encode, states_of
from mechlab.traces import PruneData, Traces, Windows

FORMATS = ("outcome", "acot")
TARGETS = ("final", "changed", "all")
DEFAULT_CORRUPTION = "random"
_FIXED = re.compile(r"x(\d+)")
TEST_SEED_OFFSET = 7919  # the held-out traces' seed is seed + this


def check_length(cfg: StateTrackingConfig, length: int, n_ctx: int | None = None) -> int:
    """Raise ValueError unless ``length`` elements fit the task's format and the model.

    Args:
        cfg: The task the model was trained on.
        length: Elements per sequence ``n``.
        n_ctx: The model's context (tokens), or None.

    Returns:
        ``length``.
    """
    if isinstance(length, bool) or not isinstance(length, int):
        raise ValueError(f"length must be an integer, got {length!r}")
    if length < 2:
        raise ValueError(f"length must be at least 2 (sequences have n = 2..L elements), got {length}")
    if cfg.format not in FORMATS:
        raise ValueError(
            f"pruning data is built for the formats {list(FORMATS)}, not {cfg.format!r} (under cot a "
            "changed input also changes the teacher-forced states, so no trace differs in one token)"
        )
    if n_ctx is not None and cfg.n_tokens(length) > n_ctx:
        raise ValueError(
            f"length {length} needs {cfg.n_tokens(length)} tokens, beyond the model's n_ctx={n_ctx}; "
            f"use a length <= {n_ctx - 1}"
        )
    return length


def changed_range(corruption: str, length: int) -> tuple[int, int]:
    """The positions ``lo..hi`` (inclusive; element ``x_c`` at position ``c``) a corruption may change.

    Args:
        corruption: ``"random"`` or ``"x<k>"``.
        length: Elements per sequence ``n``.

    Returns:
        ``(lo, hi)``.
    """
    if corruption == "random":
        return 1, length - 1
    m = _FIXED.fullmatch(corruption) if isinstance(corruption, str) else None
    if m is None:
        raise ValueError(
            f"unknown corruption {corruption!r} for state tracking; use 'random' (one of x_1..x_(n-1)) "
            "or 'x<k>' (element k, e.g. 'x1')"
        )
    k = int(m.group(1))
    if not 1 <= k <= length:
        raise ValueError(f"corruption {corruption!r}: k must be in 1..{length} (the sequence's elements)")
    return k, k


def windows_for(lo: int, hi: int, length: int) -> Windows:
    """``prefix``, ``changed``, ``suffix``, ``final`` windows (empty ones left out; module docstring)."""
    out = [("prefix", 0, lo), ("changed", lo, hi + 1)]  # lo >= 1: the prefix holds BOS
    if hi + 1 < length:
        out.append(("suffix", hi + 1, length))
    if hi < length:
        out.append(("final", length, length + 1))
    return tuple(out)


def _sequences(cfg: StateTrackingConfig, x: Tensor) -> SequenceSet:
    """``[count, n]`` elements with their states, all of length ``n``."""
    states = torch.from_numpy(states_of(cfg, x.numpy()))  # [count, n]
    return SequenceSet(x, states, torch.full((x.shape[0],), x.shape[1], dtype=torch.long))


def _traces(cfg: StateTrackingConfig, length: int, count: int, corruption: str, seed: int) -> Traces:
    lo, hi = changed_range(corruption, length)
    g = torch.Generator().manual_seed(seed)
    V = cfg.n_states
    x = torch.randint(0, V, (count, length), generator=g)  # [count, n]
    at = torch.randint(lo, hi + 1, (count,), generator=g) - 1  # [count] element index c - 1
    shift = torch.randint(1, V, (count,), generator=g)  # [count]: another element
    x_bad = x.clone()
    rows = torch.arange(count)
    x_bad[rows, at] = (x[rows, at] + shift) % V
    tokens, targets, mask = encode(cfg, _sequences(cfg, x))  # [count, n + 1] each
    corrupted, _, _ = encode(cfg, _sequences(cfg, x_bad))
    return Traces(inputs=tokens, corrupted=corrupted, truth=targets, observed=mask,
                  windows=windows_for(lo, hi, length))  # fmt: skip


def state_tracking_prune_data(
    cfg: StateTrackingConfig,
    length: int | None = None,
    *,
    n_train: int = 256,
    n_test: int = 512,
    corruption: str = DEFAULT_CORRUPTION,
    seed: int = 0,
    n_ctx: int | None = None,
) -> PruneData:
    """Clean and corrupted traces of ``length`` elements for pruning a state-tracking model.

    The training traces come from ``Generator(seed)``, the held-out ones from
    ``Generator(seed + 7919)``; elements are uniform (a sequence may repeat one the model
    trained on).

    Args:
        cfg: The task the model was trained on (group, format, vocabulary).
        length: Elements per sequence ``n`` (default ``cfg.L``); beyond ``cfg.L`` the traces
            are out of the training distribution (recorded in ``info``).
        n_train: Training traces.
        n_test: Held-out traces.
        corruption: ``"random"`` or ``"x<k>"`` (module docstring).
        seed: Seed of the traces.
        n_ctx: The model's context in tokens (a length that does not fit is refused).

    Returns:
        The :class:`~mechlab.traces.PruneData`; ``info`` records the task, length,
        corruption, changed positions, windows and sizes.
    """
    length = cfg.L if length is None else length
    check_length(cfg, length, n_ctx)
    lo, hi = changed_range(corruption, length)
    for name, value in (("n_train", n_train), ("n_test", n_test)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
        check_elements("the pruning traces", {name: value, "positions": cfg.n_tokens(length)}, lower=name)
    train = _traces(cfg, length, n_train, corruption, seed)
    test = _traces(cfg, length, n_test, corruption, seed + TEST_SEED_OFFSET)
    info = {
        "task": "state_tracking", "group": cfg.group, "m": cfg.m, "format": cfg.format,
        "length": length, "L": cfg.L, "in_training_lengths": length in cfg.train_lengths,
        "corruption": corruption, "changed_positions": [lo, hi], "n_train": n_train,
        "n_test": n_test, "data_seed": seed, "n_pos": train.n_pos,
        "windows": [list(w) for w in train.windows],
    }  # fmt: skip
    return PruneData(train=train, test=test, info=info)


def resolve_target(target: str | Callable[[Traces], Tensor], data: PruneData) -> Callable[[Traces], Tensor]:
    """The callable target of a state-tracking target name, named ``<target>_n<length>``.

    Args:
        target: ``"final"``, ``"changed"``, ``"all"`` (see :data:`TARGETS`), or a callable
            (returned as it is).
        data: The traces the target is for (their format and length).

    Returns:
        A callable of the traces giving a ``[batch, pos]`` bool mask or target indices.
    """
    if callable(target):
        return target
    fmt, length = data.info.get("format"), data.info.get("length")
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r} for state tracking; choose one of {list(TARGETS)}")
    if target == "changed" and fmt != "acot":
        raise ValueError(
            f"target 'changed' needs the acot format (the model is scored at every element); this "
            f"checkpoint's format is {fmt!r}: use 'final'"
        )

    def final(traces: Traces) -> Tensor:
        return torch.tensor([traces.n_pos - 1])

    def changed(traces: Traces) -> Tensor:
        return traces.inputs != traces.corrupted  # [batch, pos]: one True per trace

    def scored(traces: Traces) -> Tensor:
        return traces.observed.clone()  # [batch, pos]

    fn = {"final": final, "changed": changed, "all": scored}[target]
    fn.__name__ = fn.__qualname__ = f"{target}_n{length}"
    return fn


def task_prune_data(
    cfg: StateTrackingConfig,
    target: str | Callable[[Traces], Tensor],
    *,
    n_train: int,
    n_test: int,
    corruption: str = DEFAULT_CORRUPTION,
    seed: int = 0,
    length: int | None = None,
    n_ctx: int | None = None,
    **_: Any,
) -> tuple[PruneData, Callable[[Traces], Tensor]]:
    """The state-tracking task's entry of :mod:`mechlab.tasks.registry`: its pruning traces
    (:func:`state_tracking_prune_data`) and the target resolved on them (:func:`resolve_target`)."""
    data = state_tracking_prune_data(cfg, length, n_train=n_train, n_test=n_test, corruption=corruption,
                                     seed=seed, n_ctx=n_ctx)  # fmt: skip
    return data, resolve_target(target, data)
