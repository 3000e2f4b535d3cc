"""Attention-pattern scores of an induction model: previous-token and induction heads.

On sequences ``[BOS, r_1 .. r_n, r_1 .. r_m]`` (:mod:`mechlab.tasks.induction`), with
``A[t, j]`` a head's attention from query position ``t`` to key position ``j``:

* the **previous-token score** of a head is the mean of ``A[t, t - 1]`` over the
  positions ``t = 1 .. T - 1`` (1 for a head that always attends to the token before);
* the **induction score** is the mean of ``A[t, t - n + 1]`` over the predictable
  positions ``t = n + 1 .. n + m - 1``: the attention from the second ``r_i`` to the token
  after its first occurrence, ``r_{i+1}`` at position ``i + 1``.

Both are averages of attention weights, in ``[0, 1]``; a uniform causal head scores about
``1 / (t + 1)`` on both, under 0.1 on the bundled task. The scores are means over
``n_sequences`` sequences drawn from ``Generator(seed)`` (or the sequences given).

:func:`induction_edges` names the edges the induction circuit runs through in the pruning
graph (``embed -> a0.hP.v``, ``a0.hP -> a1.hI.k``, ``embed -> a1.hI.q``, ``embed -> a1.hI.v``,
``a1.hI -> out``), :func:`recovered_roles` says which of them a circuit holds and
:func:`induction_chains` through which induction heads a circuit holds all of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mechlab.models.registry import graph_kind
from mechlab.tasks.induction import InductionConfig, Sequences, sample_sequences


@dataclass
class HeadScores:
    """Per-head attention scores, ``[n_layers, n_heads]`` each.

    Attributes:
        previous_token: Mean attention to the previous position.
        induction: Mean attention to the token after the current token's earlier occurrence.
    """

    previous_token: Tensor
    induction: Tensor

    def top(self, kind: str, layer: int) -> tuple[int, float]:
        """``(head, score)`` of the highest-scoring head of ``kind`` in ``layer``."""
        scores = {"previous_token": self.previous_token, "induction": self.induction}
        if kind not in scores:
            raise ValueError(f"unknown score {kind!r}; choose previous_token or induction")
        row = scores[kind][layer]
        head = int(row.argmax())
        return head, float(row[head])

    def to_dict(self) -> dict[str, list[list[float]]]:
        """Plain lists (``[layer][head]``), for JSON."""
        return {"previous_token": self.previous_token.tolist(), "induction": self.induction.tolist()}


def _check_attention_model(model: nn.Module) -> None:
    cfg = getattr(model, "cfg", None)
    if graph_kind(getattr(cfg, "arch", None)) != "transformer":
        raise ValueError(
            f"attention scores need a mechlab transformer, got {type(model).__name__}"
        )
    if cfg.io != "tokens":
        raise ValueError("attention scores of the induction task need a token model (io='tokens')")


@torch.no_grad()
def head_scores(
    model: nn.Module,
    cfg: InductionConfig,
    n_sequences: int = 256,
    seed: int = 0,
    sequences: Sequences | None = None,
) -> HeadScores:
    """The previous-token and induction score of every head (module docstring).

    Args:
        model: A mechlab transformer trained (or not) on the task.
        cfg: The induction task.
        n_sequences: Sequences drawn from ``Generator(seed)`` (ignored with ``sequences``).
        seed: Their seed.
        sequences: Sequences of the task to score on instead.

    Returns:
        The :class:`HeadScores`.
    """
    _check_attention_model(model)
    if sequences is None:
        sequences = sample_sequences(cfg, n_sequences, torch.Generator().manual_seed(seed))
    if sequences.tokens.shape[1] != cfg.n_ctx:
        raise ValueError(f"sequences have {sequences.tokens.shape[1]} tokens, the task {cfg.n_ctx}")
    device = next(model.parameters()).device
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    was_training = model.training
    model.eval()
    try:
        _, cache = model.run_with_cache(sequences.tokens.to(device), names_filter=names)
    finally:
        model.train(was_training)
    # (trace, query, key) of every previous-token and every induction cell
    T = cfg.n_ctx
    B = len(sequences)
    prev_b = torch.arange(B).repeat_interleave(T - 1)
    prev_q = torch.arange(1, T).repeat(B)
    ind_b, ind_q = sequences.scored.nonzero(as_tuple=True)
    ind_k = ind_q - sequences.first_len[ind_b] + 1
    prev, induction = [], []
    for name in names:
        pattern = cache[name].float().cpu()  # [batch, head, query, key]
        prev.append(pattern[prev_b, :, prev_q, prev_q - 1].mean(0))
        induction.append(pattern[ind_b, :, ind_q, ind_k].mean(0))
    return HeadScores(torch.stack(prev), torch.stack(induction))


def induction_edges(previous_head: int, induction_head: int, n_layers: int = 2) -> dict[str, tuple[str, str]]:
    """The edges of the induction circuit through one previous-token head (layer 0) and one
    induction head (the last layer), by role, in the pruning graph's names.

    * ``previous_value``: ``embed -> a0.h{P}.v`` (the token the previous-token head moves on);
    * ``key``: ``a0.h{P} -> a{L-1}.h{I}.k`` (K-composition: the key of the earlier occurrence's
      successor says which token preceded it);
    * ``query``: ``embed -> a{L-1}.h{I}.q`` (the current token looks for itself);
    * ``value``: ``embed -> a{L-1}.h{I}.v`` (the token found is copied);
    * ``output``: ``a{L-1}.h{I} -> out``.
    """
    last = n_layers - 1
    head = f"a{last}.h{induction_head}"
    return {
        "previous_value": ("embed", f"a0.h{previous_head}.v"),
        "key": (f"a0.h{previous_head}", f"{head}.k"),
        "query": ("embed", f"{head}.q"),
        "value": ("embed", f"{head}.v"),
        "output": (head, "out"),
    }


def recovered_roles(edges: Iterable[tuple[str, str]], previous_head: int, induction_head: int,
                    n_layers: int = 2) -> dict[str, bool]:  # fmt: skip
    """Which edges of :func:`induction_edges` a circuit's ``edges`` hold (role -> bool)."""
    kept = set(edges)
    return {role: edge in kept for role, edge in induction_edges(previous_head, induction_head, n_layers).items()}


def induction_chains(edges: Iterable[tuple[str, str]], previous_head: int, n_heads: int,
                     n_layers: int = 2) -> list[int]:  # fmt: skip
    """The last-layer heads through which ``edges`` hold the whole circuit of
    :func:`induction_edges` with ``previous_head``: every role present, in head order."""
    kept = set(edges)
    return [h for h in range(n_heads)
            if all(recovered_roles(kept, previous_head, h, n_layers).values())]  # fmt: skip
