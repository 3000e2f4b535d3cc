"""The groups of the state-tracking task: Z_m and S_5, their numbering, composition and states."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from mechlab.limits import check_elements

if TYPE_CHECKING:  # only for annotations: state_tracking imports this module
    from mechlab.tasks.state_tracking import StateTrackingConfig

GROUPS = ("zm", "s5")

# S_5 element k is S5_PERMUTATIONS[k]; element 0 is the identity.
S5_PERMUTATIONS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations(range(5)))
_S5_INDEX = {p: k for k, p in enumerate(S5_PERMUTATIONS)}
# _S5_TABLE[a, b] = a o b, i.e. the element i -> a[b[i]]
_S5_TABLE = np.array(
    [[_S5_INDEX[tuple(a[b[i]] for i in range(5))] for b in S5_PERMUTATIONS] for a in S5_PERMUTATIONS],
    dtype=np.int64,
)


def identity(group: str) -> int:
    """The identity element (0 in both numberings).

    Args:
        group: ``"zm"`` or ``"s5"``.

    Returns:
        0.
    """
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}; choose one of {list(GROUPS)}")
    return 0


def compose(group: str, a: int, b: int, m: int | None = None) -> int:
    """``a o b``: ``b`` first, then ``a`` (``(a + b) mod m`` in Z_m, ``i -> a[b[i]]`` in S_5).

    Args:
        group: ``"zm"`` or ``"s5"``.
        a: An element.
        b: An element.
        m: The modulus (``"zm"`` only).

    Returns:
        The element ``a o b``.
    """
    if group == "zm":
        if m is None or m < 2:
            raise ValueError(f"compose('zm', ...) needs the modulus m >= 2, got {m!r}")
        return (int(a) + int(b)) % m
    if group == "s5":
        return int(_S5_TABLE[int(a), int(b)])
    raise ValueError(f"unknown group {group!r}; choose one of {list(GROUPS)}")


def composition_table(cfg: StateTrackingConfig) -> np.ndarray:
    """``table[a, b] = a o b`` for every pair of elements, ``[V, V]`` int64.

    Raises:
        ValueError: ``V * V`` is above the size limit (:func:`mechlab.limits.check_elements`).
    """
    if cfg.group == "s5":
        return _S5_TABLE.copy()
    check_elements("the composition table of Z_m", {"rows (m)": cfg.m, "columns (m)": cfg.m}, lower="m")
    r = np.arange(cfg.m)
    return (r[:, None] + r[None, :]) % cfg.m


def states_of(cfg: StateTrackingConfig, inputs: np.ndarray) -> np.ndarray:
    """The states ``s_1..s_n`` of sequences of inputs.

    Args:
        cfg: The task.
        inputs: ``[k, n]`` elements.

    Returns:
        ``[k, n]`` int64, ``s_t = x_t o s_{t-1}`` with ``s_0`` the identity.
    """
    inputs = np.asarray(inputs, dtype=np.int64)
    # Z_m composes by addition: no [m, m] table (7 TiB at m = 10**6), whatever m.
    table = None if cfg.group == "zm" else composition_table(cfg)
    out = np.empty_like(inputs)
    s = np.zeros(inputs.shape[0], dtype=np.int64)  # [k]
    for t in range(inputs.shape[1]):
        s = (inputs[:, t] + s) % cfg.m if table is None else table[inputs[:, t], s]
        out[:, t] = s
    return out
