"""The recall task's systems: Haar-random orthogonal matrices, their initial states, rollouts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # only for the annotation of make_libraries: lds imports this module
    from mechlab.tasks.lds import LDSConfig


def haar_orthogonal(n: int, d: int, generator: torch.Generator | None = None) -> Tensor:
    """``n`` Haar-distributed ``d x d`` orthogonal matrices (float64).

    QR of a standard Gaussian matrix, then ``Q * sign(diag(R))`` (column ``j`` of ``Q``
    times the sign of ``R[j, j]``), which makes the law exactly Haar on O(d).
    """
    gauss = torch.randn(n, d, d, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gauss)
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))  # [n, d]
    return q * signs.unsqueeze(-2)


@dataclass
class SystemLibrary:
    """A set of systems: orthogonal matrices and their fixed initial states.

    Attributes:
        U: ``[n_systems, d, d]`` float32 orthogonal matrices.
        x0: ``[n_systems, d]`` float32 initial states, ``N(0, I/d)``.
    """

    U: Tensor  # [n, d, d]
    x0: Tensor  # [n, d]

    def __post_init__(self) -> None:
        if self.U.dim() != 3 or self.U.shape[1] != self.U.shape[2]:
            raise ValueError(f"U must be [n, d, d], got {list(self.U.shape)}")
        if self.x0.shape != self.U.shape[:2]:
            raise ValueError(
                f"x0 must be [n, d] = {list(self.U.shape[:2])}, got {list(self.x0.shape)}"
            )

    @property
    def n_systems(self) -> int:
        return self.U.shape[0]

    @property
    def d_state(self) -> int:
        return self.U.shape[-1]

    @classmethod
    def haar(
        cls, n_systems: int, d_state: int, generator: torch.Generator | None = None
    ) -> SystemLibrary:
        """Draw ``n_systems`` Haar-random systems with ``x0 ~ N(0, I/d)``."""
        U = haar_orthogonal(n_systems, d_state, generator)
        x0 = torch.randn(n_systems, d_state, generator=generator, dtype=torch.float64)
        x0 = x0 / math.sqrt(d_state)
        return cls(U=U.float(), x0=x0.float())

    def to(self, device: torch.device | str) -> SystemLibrary:
        return SystemLibrary(U=self.U.to(device), x0=self.x0.to(device))

    def subset(self, ids: Tensor) -> SystemLibrary:
        return SystemLibrary(U=self.U[ids], x0=self.x0[ids])

    def trajectories(self, ids: Tensor, length: int, x0: Tensor | None = None) -> Tensor:
        """States ``x_0 .. x_{length-1}`` of systems ``ids`` by plain iteration (float64).

        Args:
            ids: Library indices, any shape.
            length: Number of states.
            x0: Initial states; defaults to the library's.
        """
        return rollout(self.U[ids].double(), (self.x0[ids] if x0 is None else x0).double(), length)


def rollout(U: Tensor, x0: Tensor, length: int) -> Tensor:
    """``[x0, U x0, U^2 x0, ...]`` (``length`` states), by iterating ``x <- U x``."""
    states = [x0]
    for _ in range(length - 1):
        states.append((U @ states[-1].unsqueeze(-1)).squeeze(-1))
    return torch.stack(states, dim=-2)


def make_libraries(cfg: LDSConfig) -> tuple[SystemLibrary, SystemLibrary]:
    """The training and test libraries of ``cfg``: one draw of ``n_train + n_test``
    systems from ``torch.Generator().manual_seed(cfg.seed)``, split into the first
    ``n_train_systems`` (train) and the rest (test), so the two are disjoint."""
    generator = torch.Generator().manual_seed(cfg.seed)
    lib = SystemLibrary.haar(cfg.n_train_systems + cfg.n_test_systems, cfg.d_state, generator)
    n = cfg.n_train_systems
    return (
        SystemLibrary(U=lib.U[:n].clone(), x0=lib.x0[:n].clone()),
        SystemLibrary(U=lib.U[n:].clone(), x0=lib.x0[n:].clone()),
    )
