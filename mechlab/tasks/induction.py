"""Induction: random tokens, then the first of them repeated, at a random place.

A sequence of ``T = n_ctx`` tokens is ``[BOS, r_1 .. r_n, r_1 .. r_m]``: ``BOS = 0``,
``n = T - 1 - m`` random tokens drawn uniformly from ``1 .. d_vocab - 1`` (distinct
within a sequence by default, so every token's earlier occurrence is unique), then their
first ``m`` again, the repeat's length ``m`` uniform over ``min_repeat .. max_repeat``
per sequence (``m <= n``). Position ``0`` holds BOS, position ``i`` the first ``r_i``,
position ``n + i`` the second. The next token is predictable only in the repeat: at
position ``n + i`` (``1 <= i <= m - 1``) it is ``r_{i+1}``, the token that followed the
earlier occurrence of ``r_i``. Those ``m - 1`` positions are the scored ones (the loss
mask); nothing else is trained on.

The repeat starts at a random place so that no fixed offset finds the earlier occurrence:
with one length for every sequence, a single head with learned positions can attend from
``n + i`` to ``i + 1`` by position alone (a model trained so reaches 100% accuracy without
an induction head); with the place drawn per sequence the earlier occurrence can only be
found by its content.

The known circuit (Elhage et al. 2021; Olsson et al. 2022) of a 2-layer attention-only
transformer: a *previous-token head* in layer 0 writes, at each position ``j``, which token
was at ``j - 1``; an *induction head* in layer 1 attends from ``n + i`` to the position
``j = i + 1`` whose previous token equals the current one (its query reads the current
token, its key the previous-token head's output) and copies the token found there (its
value reads the token embedding) to the read-out. :mod:`mechlab.evals.induction` measures
the two attention patterns per head; pruning traces are :mod:`mechlab.tasks.induction_prune`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

BOS = 0
VAL_SEED_OFFSET = 104729  # the validation set's generator seed is seed + this


@dataclass
class InductionConfig:
    """One induction task: the vocabulary, the sequence length, the repeat's lengths.

    Args:
        d_vocab: Tokens, BOS (``0``) included; the random tokens are ``1 .. d_vocab - 1``.
        n_ctx: Tokens per sequence ``T`` (BOS, ``n`` random tokens, a repeat of ``m``).
        min_repeat: Shortest repeat ``m`` (at least 2: one predictable position).
        max_repeat: Longest repeat, at most ``(T - 1) // 2`` (a repeat is no longer than
            what it repeats).
        distinct: Draw the ``n`` random tokens without replacement (needs
            ``n <= d_vocab - 1``), so no token occurs twice before the repeat.
        n_val: Sequences of the fixed validation set.
        seed: Seeds the validation set (training batches are seeded by the trainer).
    """

    d_vocab: int = 64
    n_ctx: int = 33
    min_repeat: int = 4
    max_repeat: int = 16
    distinct: bool = True
    n_val: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_vocab", "n_ctx", "min_repeat", "max_repeat", "n_val", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if not isinstance(self.distinct, bool):
            raise ValueError(f"distinct must be true or false, got {self.distinct!r}")
        if self.d_vocab < 3:
            raise ValueError(f"d_vocab must be at least 3 (BOS and two tokens), got {self.d_vocab}")
        if self.min_repeat < 2:
            raise ValueError(f"min_repeat must be at least 2 (one predictable position), got {self.min_repeat}")
        if self.n_ctx < 5:
            raise ValueError(f"n_ctx must be at least 5 (BOS, two tokens, their repeat), got {self.n_ctx}")
        longest = (self.n_ctx - 1) // 2
        if not self.min_repeat <= self.max_repeat <= longest:
            raise ValueError(
                f"repeats must satisfy min_repeat <= max_repeat <= (n_ctx - 1) // 2 = {longest} "
                f"(a repeat is no longer than what it repeats), got {self.min_repeat}..{self.max_repeat}"
            )
        if self.distinct and self.n_ctx - 1 - self.min_repeat > self.d_vocab - 1:
            raise ValueError(
                f"{self.n_ctx - 1 - self.min_repeat} distinct tokens (n_ctx - 1 - min_repeat) do not "
                f"fit d_vocab={self.d_vocab} (BOS and {self.d_vocab - 1} tokens); raise d_vocab or "
                "set distinct=false"
            )
        if self.n_val < 1:
            raise ValueError(f"n_val must be positive, got {self.n_val}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> InductionConfig:
        """Build from a dict, refusing unknown keys with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown InductionConfig field(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


@dataclass
class Sequences:
    """Sequences of the task and where their repeats start.

    Attributes:
        tokens: ``[batch, n_ctx]`` token ids (int64).
        first_len: ``[batch]`` the ``n`` of each sequence: its repeat starts at ``n + 1``.
    """

    tokens: Tensor
    first_len: Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def scored(self) -> Tensor:
        """``[batch, n_ctx]`` bool, True at the predictable positions ``n + 1 .. T - 2``."""
        pos = torch.arange(self.tokens.shape[1])
        n = self.first_len[:, None]
        return (pos > n) & (pos < self.tokens.shape[1] - 1)

    @property
    def targets(self) -> Tensor:
        """``[batch, n_ctx]`` the next token of every position (``-100`` at the last one)."""
        targets = torch.full_like(self.tokens, -100)
        targets[:, :-1] = self.tokens[:, 1:]
        return targets


def sample_sequences(
    cfg: InductionConfig, n: int, generator: torch.Generator, repeat: Tensor | None = None
) -> Sequences:
    """``n`` sequences of the task (module docstring).

    Args:
        cfg: The task.
        n: Sequences.
        generator: Draws the repeats' lengths and the tokens.
        repeat: ``[n]`` repeat lengths to use instead of drawing them (a corrupted copy
            keeps its clean trace's).
    """
    T = cfg.n_ctx
    if repeat is None:
        repeat = torch.randint(cfg.min_repeat, cfg.max_repeat + 1, (n,), generator=generator)
    first_len = T - 1 - repeat  # [n]
    longest = T - 1 - cfg.min_repeat
    if cfg.distinct:
        keys = torch.rand(n, cfg.d_vocab - 1, generator=generator)
        first = keys.argsort(dim=-1)[:, :longest] + 1  # an ordered random subset of 1..V-1
    else:
        first = torch.randint(1, cfg.d_vocab, (n, longest), generator=generator)
    pos = torch.arange(T - 1)[None, :]  # positions 1..T-1 of the sequence, less one
    n_ = first_len[:, None]
    index = torch.where(pos < n_, pos, pos - n_)  # r_{pos+1} in the first copy, then again
    tokens = torch.cat([torch.full((n, 1), BOS, dtype=torch.long), first.gather(1, index)], dim=1)
    return Sequences(tokens, first_len)


def batch(cfg: InductionConfig, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """A training batch: ``(inputs, targets, mask)``, each ``[n, n_ctx]``."""
    seqs = sample_sequences(cfg, n, generator)
    return seqs.tokens, seqs.targets, seqs.scored


def validation_set(cfg: InductionConfig) -> Sequences:
    """The fixed validation sequences (``cfg.n_val`` of them, from ``Generator(seed + 104729)``)."""
    return sample_sequences(cfg, cfg.n_val, torch.Generator().manual_seed(cfg.seed + VAL_SEED_OFFSET))
