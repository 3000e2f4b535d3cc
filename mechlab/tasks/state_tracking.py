"""State tracking on Z_m and S_5: the tasks of the induction-bias study (Ebrahimi et al.,
arXiv 2602.18333).

A sequence of ``n`` group elements ``x_1..x_n`` has the states ``s_t = x_t o s_{t-1}``,
``s_0 = identity``. The group is ``"zm"`` (the integers mod ``m``, ``s_t = (s_{t-1} + x_t)
mod m``; ``m = 2`` is parity) or ``"s5"`` (the 120 permutations of five items).

S_5 numbering: element ``k`` is the ``k``-th tuple of ``itertools.permutations(range(5))``
(lexicographic order; element 0 is the identity), a tuple ``p`` with ``p[i]`` the image of
``i``. ``compose("s5", a, b)`` is ``a o b`` (``b`` first, then ``a``): ``(a o b)[i] =
a[b[i]]``, so ``s_t[i] = x_t[s_{t-1}[i]]``.

Token layout (``V`` = group order: ``m`` or 120): tokens ``0..V-1`` are group elements,
``BOS = V``, ``SEP = V + 1``, ``PAD = V + 2`` (``d_vocab = V + 3``); the model predicts
states only (``d_vocab_out = V``). Every sequence starts with BOS:

* ``outcome``: ``[BOS, x_1..x_n]``; one target, ``s_n`` at the position of ``x_n``.
* ``acot``: ``[BOS, x_1..x_n]``; target ``s_i`` at the position of ``x_i``.
* ``cot``: ``[BOS, x_1..x_n, SEP, s_1..s_{n-1}]``; target ``s_1`` at SEP and ``s_{i+1}`` at
  the position of ``s_i`` (teacher forcing); at evaluation the ``n`` states are also
  generated greedily after SEP (:func:`generate_cot`).

A batch is padded on the right with PAD to its longest sequence; ``mask`` is True exactly
on the scored positions, and ``targets`` is ``-100`` wherever ``mask`` is False.

Data (:func:`make_data`): for each length ``n`` the ``V**n`` sequences are numbered by
their rank ``sum_j x_{j+1} V**j``; validation ranks are drawn first (without replacement,
from a generator seeded by ``seed`` and ``n`` alone), then the training ranks from the
remaining ones, so every training sequence is unique and none is a validation sequence,
and the validation set is the same whatever ``n_train``. Ranks are drawn as integers and
decoded in base ``V``: no space is enumerated. The OOD set holds fresh sequences of length
``ood_factor * L``. The groups are :mod:`mechlab.tasks.state_tracking_groups`'s (their
names are importable from here too).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mechlab.limits import MAX_SEQUENCE_LENGTH, MAX_STATES, check_at_most, check_elements
from mechlab.tasks.state_tracking_groups import GROUPS, S5_PERMUTATIONS, states_of
from mechlab.tasks.state_tracking_groups import compose as compose
from mechlab.tasks.state_tracking_groups import composition_table as composition_table
from mechlab.tasks.state_tracking_groups import identity as identity

FORMATS = ("outcome", "acot", "cot")
LENGTH_DISTRIBUTIONS = ("fixed", "uniform", "short_to_long")
IGNORE = -100  # the target wherever the mask is False

_INT64_MAX = 2**63 - 1


EVAL_CHUNK = 512
"""Sequences per forward pass of the evaluations (:func:`set_loss`, :func:`set_accuracy`)."""
STATES_COST = "one token per element: a model's embedding, read-out and logits grow with m"
LENGTH_COST = (
    "checking the task counts the sequences of every length up to L, a sweep with kappa runs a "
    "search at each, and the models read ood_factor x L elements"
)


def check_length(L: int) -> None:
    """Refuse (one line, before any sequence is counted) a length above
    :data:`~mechlab.limits.MAX_SEQUENCE_LENGTH`."""
    check_at_most("L", L, MAX_SEQUENCE_LENGTH, LENGTH_COST)


def check_model_vocabulary(m: int) -> None:
    """Refuse (one line, before a model is built or trained on the task) a modulus above
    :data:`~mechlab.limits.MAX_STATES`: the data of Z_m needs no table and takes any m, a
    model has one embedding row and one read-out row per element, and a training step
    holds logits of every token over all of them."""
    check_at_most("m", m, MAX_STATES, STATES_COST)


def check_eval_chunk(cfg: StateTrackingConfig, chunk: int = EVAL_CHUNK) -> int:
    """Refuse an evaluation whose chunk of logits (``chunk`` sequences x the longest sequence's
    tokens x the states) is above the size limit, before any forward pass."""
    return check_elements(
        "an evaluation chunk's logits",
        {"sequences": chunk, "positions": cfg.n_ctx, "states": cfg.n_states},
        lower="L or m",
    )


@dataclass
class StateTrackingConfig:
    """One state-tracking task: the group, the sequence format, the lengths and the data sizes.

    Args:
        group: ``"zm"`` (integers mod ``m``) or ``"s5"`` (the 120 permutations of 5 items).
        m: The modulus of ``"zm"`` (ignored by ``"s5"``); at least 2.
        L: The longest training length; sequences have ``n`` in ``2..L`` (``L`` only for
            ``lengths="fixed"``).
        format: ``"outcome"``, ``"acot"`` or ``"cot"`` (see the module docstring).
        lengths: ``"fixed"`` (``n = L``), ``"uniform"`` (``n_train`` split evenly over
            ``2..L``, a length with too few sequences giving its share to the others) or
            ``"short_to_long"`` (every sequence of length ``n`` before any of ``n + 1``).
        n_train: Unique training sequences.
        n_val: Validation sequences in all, split evenly over the lengths.
        val_frac: At most this fraction of the sequences of each length is validation.
        n_ood: Sequences in the OOD set (at most all that exist).
        ood_factor: The OOD length is ``ood_factor * L``.
        seed: Seeds the validation, training and OOD sets.
    """

    group: str = "zm"
    m: int = 5
    L: int = 5
    format: str = "outcome"
    lengths: str = "uniform"
    n_train: int = 1000
    n_val: int = 2000
    val_frac: float = 0.2
    n_ood: int = 2000
    ood_factor: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("m", "L", "n_train", "n_val", "n_ood", "ood_factor", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.group not in GROUPS:
            raise ValueError(f"unknown group {self.group!r}; choose one of {list(GROUPS)}")
        if self.format not in FORMATS:
            raise ValueError(f"unknown format {self.format!r}; choose one of {list(FORMATS)}")
        if self.lengths not in LENGTH_DISTRIBUTIONS:
            raise ValueError(
                f"unknown length distribution {self.lengths!r}; choose one of {list(LENGTH_DISTRIBUTIONS)}"
            )
        if self.m < 2:
            raise ValueError(f"m must be at least 2 (Z_m with m = 2 is parity), got {self.m}")
        if self.L < 2:
            raise ValueError(f"L must be at least 2 (sequences have n = 2..L elements), got {self.L}")
        check_length(self.L)
        for name in ("n_train", "n_val", "n_ood", "ood_factor"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if isinstance(self.val_frac, bool) or not isinstance(self.val_frac, (int, float)) or not (
            0 < self.val_frac < 1
        ):
            raise ValueError(f"val_frac must be a number in (0, 1), got {self.val_frac!r}")
        self.val_frac = float(self.val_frac)

    @property
    def n_states(self) -> int:
        """``V``: the group's order (``m`` or 120)."""
        return self.m if self.group == "zm" else len(S5_PERMUTATIONS)

    @property
    def bos(self) -> int:
        return self.n_states

    @property
    def sep(self) -> int:
        return self.n_states + 1

    @property
    def pad(self) -> int:
        return self.n_states + 2

    @property
    def d_vocab(self) -> int:
        """Input vocabulary: ``V`` elements, BOS, SEP and PAD."""
        return self.n_states + 3

    @property
    def d_vocab_out(self) -> int:
        """Output vocabulary: the ``V`` states."""
        return self.n_states

    @property
    def train_lengths(self) -> list[int]:
        """The sequence lengths of the training and validation sets."""
        return [self.L] if self.lengths == "fixed" else list(range(2, self.L + 1))

    @property
    def ood_length(self) -> int:
        return self.ood_factor * self.L

    def n_tokens(self, n: int) -> int:
        """Tokens of a sequence of ``n`` elements in this format."""
        return 2 * n + 1 if self.format == "cot" else n + 1

    @property
    def n_ctx(self) -> int:
        """The longest sequence (in tokens) of the training, validation and OOD sets."""
        return self.n_tokens(max(self.L, self.ood_length))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> StateTrackingConfig:
        """Build from a dict, refusing unknown keys with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown StateTrackingConfig field(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


# -- unique sampling ----------------------------------------------------------------------
def _rng(cfg: StateTrackingConfig, purpose: str, n: int) -> random.Random:
    # A str seed is hashed with SHA-512 by random.Random: the same on every machine and run.
    return random.Random(f"state_tracking:{purpose}:{cfg.seed}:{n}")


def _sample_ranks(rng: random.Random, total: int, k: int) -> list[int]:
    """``k`` distinct integers of ``range(total)``, without enumerating it."""
    if k > total:
        raise ValueError(f"cannot draw {k} distinct sequences of {total}")
    if total <= 2**62:
        return rng.sample(range(total), k)
    seen: set[int] = set()
    out = []
    while len(out) < k:  # total > 2**62 >> k: a clash is rare
        r = rng.randrange(total)
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


def _skip(ranks: list[int], excluded: list[int]) -> list[int]:
    """Map ranks in the complement of ``excluded`` to the integers they stand for.

    The ``r``-th (0-based) integer not in the sorted set ``E`` is ``r + #{j: E_j - j <= r}``.
    """
    if not excluded:
        return list(ranks)
    shifted = [e - j for j, e in enumerate(sorted(excluded))]
    if max(ranks, default=0) + len(excluded) <= _INT64_MAX and shifted[-1] <= _INT64_MAX:
        r = np.asarray(ranks, dtype=np.int64)
        return (r + np.searchsorted(np.asarray(shifted, dtype=np.int64), r, side="right")).tolist()
    return [r + bisect.bisect_right(shifted, r) for r in ranks]


def _decode(ranks: list[int], base: int, n: int) -> np.ndarray:
    """Digits of ``ranks`` in base ``base``, least significant first: ``[k, n]`` int64."""
    out = np.empty((len(ranks), n), dtype=np.int64)
    if base**n <= _INT64_MAX:
        r = np.asarray(ranks, dtype=np.int64).reshape(-1)
        for j in range(n):
            out[:, j] = r % base
            r = r // base
        return out
    chunk = max(1, int(math.log(_INT64_MAX) / math.log(base)) - 1)  # digits per int64 chunk
    for start in range(0, n, chunk):
        width = min(chunk, n - start)
        r = np.asarray([(x // base**start) % base**width for x in ranks], dtype=np.int64)
        for j in range(width):
            out[:, start + j] = r % base
            r = r // base
    return out


@dataclass
class SequenceSet:
    """Sequences of several lengths, right-padded with 0 (padding is never read).

    Attributes:
        inputs: ``[k, n_max]`` long elements ``x_1..x_n``.
        states: ``[k, n_max]`` long states ``s_1..s_n``.
        lengths: ``[k]`` long ``n`` of each sequence.
    """

    inputs: Tensor
    states: Tensor
    lengths: Tensor

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def to(self, device: str | torch.device) -> SequenceSet:
        return SequenceSet(self.inputs.to(device), self.states.to(device), self.lengths.to(device))

    def subset(self, index: Tensor | slice) -> SequenceSet:
        """The sequences at ``index`` (``[b]`` long, or a slice)."""
        return SequenceSet(self.inputs[index], self.states[index], self.lengths[index])


def _sequence_set(cfg: StateTrackingConfig, parts: list[np.ndarray]) -> SequenceSet:
    parts = [p for p in parts if len(p)]
    n_max = max((p.shape[1] for p in parts), default=1)
    k = sum(len(p) for p in parts)
    inputs = np.zeros((k, n_max), dtype=np.int64)
    states = np.zeros((k, n_max), dtype=np.int64)
    lengths = np.zeros(k, dtype=np.int64)
    row = 0
    for p in parts:
        inputs[row : row + len(p), : p.shape[1]] = p
        states[row : row + len(p), : p.shape[1]] = states_of(cfg, p)
        lengths[row : row + len(p)] = p.shape[1]
        row += len(p)
    return SequenceSet(torch.from_numpy(inputs), torch.from_numpy(states), torch.from_numpy(lengths))


def validation_sizes(cfg: StateTrackingConfig) -> dict[int, int]:
    """Validation sequences per length: ``n_val`` split evenly over the lengths (the
    remainder to the shortest), each at most ``floor(val_frac * V**n)``."""
    lengths = cfg.train_lengths
    share, extra = divmod(cfg.n_val, len(lengths))
    out = {}
    for i, n in enumerate(lengths):
        total = cfg.n_states**n
        cap = math.floor(total * cfg.val_frac) if total < 2**62 else 2**62  # (no float overflow)
        out[n] = int(min(share + (i < extra), cap))
    return out


def training_sizes(cfg: StateTrackingConfig, n_train: int | None = None) -> dict[int, int]:
    """Training sequences per length for ``n_train`` (default ``cfg.n_train``).

    ``fixed``: all at ``L``. ``uniform``: an equal share per length; a length with fewer
    sequences left (after validation) than its share gives all it has and the rest is
    shared among the others (a remainder to the shortest). ``short_to_long``: every
    sequence of length 2, then 3, ... until ``n_train`` are taken.

    Raises:
        ValueError: ``n_train`` is more than the unique sequences left for training.
    """
    n_train = cfg.n_train if n_train is None else n_train
    val = validation_sizes(cfg)
    available = {n: cfg.n_states**n - val[n] for n in cfg.train_lengths}
    total = sum(available.values())
    if n_train > total:
        raise ValueError(
            f"n_train={n_train} is more than the {total} unique training sequences that exist "
            f"({cfg.group}{'' if cfg.group == 's5' else f' m={cfg.m}'}, lengths {cfg.lengths} up to "
            f"L={cfg.L}, after {sum(val.values())} validation sequences); use n_train <= {total}"
        )
    out = {n: 0 for n in available}
    if cfg.lengths == "short_to_long":
        left = n_train
        for n in sorted(available):
            out[n] = min(left, available[n])
            left -= out[n]
        return out
    left, open_ = n_train, sorted(available)
    while left > 0:
        share, extra = divmod(left, len(open_))
        full = [n for i, n in enumerate(open_) if available[n] - out[n] <= share + (i < extra)]
        if not full:
            for i, n in enumerate(open_):
                out[n] += share + (i < extra)
            break
        for n in full:
            left -= available[n] - out[n]
            out[n] = available[n]
        open_ = [n for n in open_ if n not in full]
    return out


@dataclass
class StateTrackingData:
    """A task's training, validation and OOD sequences.

    Attributes:
        cfg: The task.
        train: The ``n_train`` unique training sequences.
        val: The validation sequences (disjoint from ``train``; the same for every ``n_train``).
        ood: Fresh sequences of length ``ood_factor * L``.
    """

    cfg: StateTrackingConfig
    train: SequenceSet
    val: SequenceSet
    ood: SequenceSet

    def to(self, device: str | torch.device) -> StateTrackingData:
        return StateTrackingData(self.cfg, self.train.to(device), self.val.to(device), self.ood.to(device))

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """A training batch: ``batch_size`` training sequences drawn uniformly (with replacement).

        Args:
            batch_size: Sequences per batch.
            generator: A CPU generator; it alone decides the batch.

        Returns:
            ``tokens``, ``targets``, ``mask`` (see :func:`encode`), on the data's device.
        """
        index = torch.randint(len(self.train), (batch_size,), generator=generator)  # [batch]
        return encode(self.cfg, self.train.subset(index.to(self.train.lengths.device)))


def check_data_size(
    cfg: StateTrackingConfig, n_train: int | None = None, lower: str = "n_train, n_val or n_ood"
) -> int:
    """Refuse (one line) data sets whose sequences (training, validation and OOD, each as
    long as the longest) are above the size limit, before any is drawn.

    Args:
        cfg: The task.
        n_train: Training sequences (default ``cfg.n_train``).
        lower: What the message tells the user to lower.

    Returns:
        The number of elements.
    """
    n_train = cfg.n_train if n_train is None else n_train
    n_val = sum(validation_sizes(cfg).values())
    n_ood = min(cfg.n_ood, cfg.n_states**cfg.ood_length)
    return check_elements(
        "the task's sequences",
        {"sequences (train + validation + OOD)": n_train + n_val + n_ood, "elements": max(cfg.ood_length, cfg.L)},
        lower=lower,
    )  # fmt: skip


def make_data(cfg: StateTrackingConfig, n_train: int | None = None) -> StateTrackingData:
    """Draw the task's validation, training and OOD sets (see the module docstring).

    Args:
        cfg: The task.
        n_train: Training sequences (default ``cfg.n_train``).

    Returns:
        The three sets, on the CPU.

    Raises:
        ValueError: More training sequences asked for than exist, or no validation
            sequence at all (every length too short for ``val_frac``).
    """
    val_sizes = validation_sizes(cfg)
    if sum(val_sizes.values()) == 0:
        raise ValueError(
            f"no validation sequences: val_frac={cfg.val_frac} of the {cfg.n_states}**n sequences of "
            f"each length {cfg.train_lengths} is less than one; use a longer L or a larger group"
        )
    train_sizes = training_sizes(cfg, n_train)
    check_data_size(cfg, sum(train_sizes.values()))
    val_parts, train_parts = [], []
    for n in cfg.train_lengths:
        total = cfg.n_states**n
        val_ranks = _sample_ranks(_rng(cfg, "val", n), total, val_sizes[n])
        train_ranks = _sample_ranks(_rng(cfg, "train", n), total - len(val_ranks), train_sizes[n])
        val_parts.append(_decode(val_ranks, cfg.n_states, n))
        train_parts.append(_decode(_skip(train_ranks, val_ranks), cfg.n_states, n))
    n_ood = cfg.ood_length
    ood_total = cfg.n_states**n_ood
    ood = _decode(_sample_ranks(_rng(cfg, "ood", n_ood), ood_total, min(cfg.n_ood, ood_total)), cfg.n_states, n_ood)
    return StateTrackingData(cfg, _sequence_set(cfg, train_parts), _sequence_set(cfg, val_parts),
                             _sequence_set(cfg, [ood]))  # fmt: skip


# -- tokens ---------------------------------------------------------------------------------
def encode(cfg: StateTrackingConfig, seqs: SequenceSet) -> tuple[Tensor, Tensor, Tensor]:
    """Tokens, targets and loss mask of sequences in the task's format.

    Args:
        cfg: The task (format and vocabulary).
        seqs: The sequences.

    Returns:
        ``tokens`` ``[B, T]`` long, ``targets`` ``[B, T]`` long (``-100`` where the mask is
        False) and ``mask`` ``[B, T]`` bool, padded to the longest sequence (``T`` tokens).
    """
    lengths = seqs.lengths  # [B]
    n_b = int(lengths.max()) if len(seqs) else 1
    x, s = seqs.inputs[:, :n_b], seqs.states[:, :n_b]  # [B, n_b]
    batch, device = x.shape[0], x.device
    n = lengths[:, None]  # [B, 1]
    if cfg.format in ("outcome", "acot"):
        pos = torch.arange(n_b, device=device)[None]  # [1, n_b]
        valid = pos < n  # [B, n_b]
        bos = torch.full((batch, 1), cfg.bos, dtype=torch.long, device=device)
        tokens = torch.cat([bos, torch.where(valid, x, cfg.pad)], dim=1)  # [B, n_b + 1]
        scored = valid if cfg.format == "acot" else pos == n - 1  # [B, n_b]
        mask = torch.cat([torch.zeros_like(bos, dtype=torch.bool), scored], dim=1)  # [B, n_b + 1]
        targets = torch.cat([torch.full_like(bos, IGNORE), torch.where(scored, s, IGNORE)], dim=1)
        return tokens, targets, mask
    p = torch.arange(2 * n_b + 1, device=device)[None]  # [1, T]
    in_x = (p >= 1) & (p <= n)  # [B, T]
    in_s = (p >= n + 2) & (p <= 2 * n)
    x_at = x.gather(1, (p - 1).clamp(0, n_b - 1).expand(batch, -1))  # [B, T]
    s_at = s.gather(1, (p - n - 2).clamp(0, n_b - 1))  # [B, T]: s_{p-n-1} (1-based) as input
    tokens = torch.full_like(x_at, cfg.pad)
    tokens = torch.where(p == 0, cfg.bos, tokens)
    tokens = torch.where(in_x, x_at, tokens)
    tokens = torch.where(p == n + 1, cfg.sep, tokens)
    tokens = torch.where(in_s, s_at, tokens)
    mask = (p >= n + 1) & (p <= 2 * n)  # [B, T]
    targets = torch.where(mask, s.gather(1, (p - n - 1).clamp(0, n_b - 1)), IGNORE)
    return tokens, targets, mask


def masked_cross_entropy(
    logits: Tensor, targets: Tensor, mask: Tensor, n_scored: Tensor | None = None
) -> Tensor:
    """Cross-entropy averaged over the scored positions (safe under ``torch.func.vmap``).

    Args:
        logits: ``[B, T, V]``.
        targets: ``[B, T]`` (any value where ``mask`` is False).
        mask: ``[B, T]`` bool.
        n_scored: The count to divide by (default ``mask.sum()``).

    Returns:
        A scalar: ``-sum(mask * log p(target)) / n_scored``.
    """
    logp = F.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [B, T]
    n_scored = mask.sum() if n_scored is None else n_scored
    return -(picked * mask).sum() / n_scored.clamp(min=1)


def normalised_accuracy(acc: float, n_states: int) -> float:
    """Accuracy rescaled so that chance (``1 / V``) is 0 and perfect is 1: ``(acc - 1/V) / (1 - 1/V)``."""
    chance = 1.0 / n_states
    return (acc - chance) / (1.0 - chance)


Predictor = Callable[[Tensor], Tensor]  # tokens [B, T] -> logits [B, T, V]


@torch.no_grad()
def set_loss(
    predict: Predictor, cfg: StateTrackingConfig, seqs: SequenceSet, chunk: int = EVAL_CHUNK
) -> float:
    """Mean cross-entropy per scored token over a whole set (teacher forcing for CoT).

    Args:
        predict: The model, tokens -> logits.
        cfg: The task.
        seqs: The sequences (on the model's device).
        chunk: Sequences per forward pass.

    Returns:
        The loss.
    """
    total, count = 0.0, 0
    check_eval_chunk(cfg, min(chunk, len(seqs)))
    for i in range(0, len(seqs), chunk):
        tokens, targets, mask = encode(cfg, seqs.subset(slice(i, i + chunk)))
        n = mask.sum()
        total += float(masked_cross_entropy(predict(tokens), targets, mask) * n)
        count += int(n)
    return total / max(count, 1)


@torch.no_grad()
def set_loss_by_length(
    predict: Predictor, cfg: StateTrackingConfig, seqs: SequenceSet, chunk: int = EVAL_CHUNK
) -> dict[int, float]:
    """Mean cross-entropy per scored token of each length's sequences (see :func:`set_loss`).

    Which length keeps a model trained on a mixture above epsilon: the count-weighted mean
    of these values is :func:`set_loss` of the whole set.

    Returns:
        ``{n: loss}`` for every length ``n`` in ``seqs``, in increasing ``n``.
    """
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    check_eval_chunk(cfg, min(chunk, len(seqs)))
    for i in range(0, len(seqs), chunk):
        part = seqs.subset(slice(i, i + chunk))
        tokens, targets, mask = encode(cfg, part)
        logp = F.log_softmax(predict(tokens).float(), dim=-1)  # [B, T, V]
        nll = -logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask  # [B, T]
        for n in part.lengths.unique().tolist():
            rows = part.lengths == n
            total[n] = total.get(n, 0.0) + float(nll[rows].sum())
            count[n] = count.get(n, 0) + int(mask[rows].sum())
    return {n: total[n] / max(count[n], 1) for n in sorted(total)}


@torch.no_grad()
def generate_cot(predict: Predictor, cfg: StateTrackingConfig, inputs: Tensor) -> Tensor:
    """Greedy CoT generation: after ``[BOS, x_1..x_n, SEP]`` generate ``n`` states.

    Args:
        predict: The model, tokens -> logits.
        cfg: The task.
        inputs: ``[B, n]`` sequences of one length.

    Returns:
        ``[B, n]`` the generated states.
    """
    batch, n = inputs.shape
    bos = torch.full((batch, 1), cfg.bos, dtype=torch.long, device=inputs.device)
    tokens = torch.cat([bos, inputs, torch.full_like(bos, cfg.sep)], dim=1)  # [B, n + 2]
    out = []
    for _ in range(n):
        nxt = predict(tokens)[:, -1].argmax(-1)  # [B]
        out.append(nxt)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
    return torch.stack(out, dim=1)


@torch.no_grad()
def set_accuracy(
    predict: Predictor, cfg: StateTrackingConfig, seqs: SequenceSet, chunk: int = EVAL_CHUNK
) -> dict[str, float]:
    """Accuracy on a set: per token (over the scored positions) and per sequence (all right).

    CoT is scored on its greedy generation (:func:`generate_cot`); Outcome and ACoT, whose
    inputs never hold predictions, on the argmax at each scored position.

    Args:
        predict: The model, tokens -> logits.
        cfg: The task.
        seqs: The sequences (on the model's device).
        chunk: Sequences per forward pass.

    Returns:
        ``token_acc``, ``seq_acc`` and their chance-normalised forms ``token_acc_norm``,
        ``seq_acc_norm`` (chance ``1/V`` for both; see :func:`normalised_accuracy`).
    """
    right_tokens, n_tokens, right_seqs = 0, 0, 0
    check_eval_chunk(cfg, min(chunk, len(seqs)))
    for i in range(0, len(seqs), chunk):
        part = seqs.subset(slice(i, i + chunk))
        if cfg.format == "cot":
            for n in part.lengths.unique().tolist():
                rows = part.lengths == n
                x, s = part.inputs[rows, :n], part.states[rows, :n]  # [b, n]
                ok = generate_cot(predict, cfg, x) == s  # [b, n]
                right_tokens += int(ok.sum())
                n_tokens += ok.numel()
                right_seqs += int(ok.all(dim=1).sum())
            continue
        tokens, targets, mask = encode(cfg, part)
        ok = (predict(tokens).argmax(-1) == targets) & mask  # [b, T]
        right_tokens += int(ok.sum())
        n_tokens += int(mask.sum())
        right_seqs += int((ok.sum(1) == mask.sum(1)).sum())
    token_acc = right_tokens / max(n_tokens, 1)
    seq_acc = right_seqs / max(len(seqs), 1)
    return {"token_acc": token_acc, "seq_acc": seq_acc,
            "token_acc_norm": normalised_accuracy(token_acc, cfg.n_states),
            "seq_acc_norm": normalised_accuracy(seq_acc, cfg.n_states)}  # fmt: skip
