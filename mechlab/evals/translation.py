"""Starting vs continuing an in-context translation (:mod:`mechlab.tasks.translation`).

For each prompt the model reads the whole prompt once (teacher forcing) and is scored at
the query segment's answer tokens, each from the logits one position before it:

* **start**: the first token of the first answer, right after ``<label>: <word> =``,
  where only the label says which language is wanted;
* **continue**: the first token of every later answer (the segment's own answers now
  show the language) and every later token of a multi-token answer.

Per prompt: top-1 accuracy (the argmax is the answer's token) and the answer token's
log-probability, at the start and averaged over the continue positions; per label kind,
their mean over prompts with a percentile bootstrap interval (prompts resampled).

Misdirection (prompts whose answers are written in another language than the label
names, :func:`mechlab.tasks.translation.episodes` with ``misdirect=True``): at the start
and at every later answer's first token, whether the label's language gets the higher
logit than the written language (*follows the label*) or the lower (*follows the
examples*).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from mechlab.models.importers import from_pretrained
from mechlab.tasks.translation import Episode

CONFIDENCE = 0.95


def as_model(model: Any) -> Any:
    """A mechlab model, or a Hugging Face causal LM imported with
    :func:`mechlab.models.importers.from_pretrained` (nothing downloaded)."""
    bridge = type(model).__name__ == "TransformerBridge"
    if bridge or (isinstance(model, nn.Module) and hasattr(model, "config") and hasattr(model, "generation_config")):
        return from_pretrained(model)
    return model


@torch.no_grad()
def log_probs(model: Any, tokens: Sequence[Sequence[int]], batch_size: int = 8) -> list[torch.Tensor]:
    """Per prompt, ``[pos, vocab]`` log-probabilities of the next token (right-padded
    batches of a causal model: the padding never reaches an earlier position).

    Raises:
        ValueError: An empty prompt.
    """
    out: list[torch.Tensor] = []
    device = next(iter(model.parameters()), torch.zeros(())).device if isinstance(model, nn.Module) else "cpu"
    for start in range(0, len(tokens), batch_size):
        chunk = [list(t) for t in tokens[start:start + batch_size]]
        if any(not t for t in chunk):
            raise ValueError("a prompt has no tokens")
        width = max(map(len, chunk))
        ids = torch.tensor([t + [t[-1]] * (width - len(t)) for t in chunk], device=device)
        logits = model(ids)
        logits = getattr(logits, "logits", logits)
        lp = torch.log_softmax(logits.float(), dim=-1).cpu()
        out.extend(lp[i, :len(t)] for i, t in enumerate(chunk))
    return out


def score_episode(lp: torch.Tensor, episode: Episode) -> dict[str, float]:
    """One prompt's start and continue scores from its next-token log-probabilities.

    Returns:
        ``start_acc``, ``start_logprob``, ``continue_acc``, ``continue_logprob`` (means
        over the continue positions), and ``continue_items_acc`` / ``continue_tokens_acc``
        (later items' first tokens / later tokens of multi-token answers; NaN when none).
    """
    tokens = episode.tokens
    first, items, later = [], [], []
    for i, item in enumerate(episode.items):
        for j, pos in enumerate(item.positions):
            row = lp[pos - 1]
            hit = float(int(row.argmax()) == tokens[pos])
            entry = (hit, float(row[tokens[pos]]))
            (first if i == 0 and j == 0 else items if j == 0 else later).append(entry)
    cont = items + later

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else float("nan")

    return {
        "start_acc": first[0][0], "start_logprob": first[0][1],
        "continue_acc": mean([h for h, _ in cont]), "continue_logprob": mean([v for _, v in cont]),
        "continue_items_acc": mean([h for h, _ in items]), "continue_tokens_acc": mean([h for h, _ in later]),
    }  # fmt: skip


def score_misdirected(lp: torch.Tensor, episode: Episode) -> dict[str, float]:
    """Whether a misdirected prompt's start and continuation follow the label.

    Returns:
        ``start_follows_label`` (1 when the label's language's first answer token has the
        higher log-probability than the written language's, else 0) and
        ``continue_follows_label`` (its mean over the later items).

    Raises:
        ValueError: A prompt that is not misdirected, or whose two answers start alike.
    """
    if not episode.misdirected:
        raise ValueError("score_misdirected needs a misdirected prompt (answers in another language than the label)")
    follows = []
    for item in episode.items:
        said, written = item.answers[episode.language][0], item.answers[episode.written][0]
        if said == written:
            raise ValueError(f"the answers to {item.english!r} start with the same token; filter the words first")
        row = lp[item.positions[0] - 1]
        follows.append(float(row[said] > row[written]))
    return {"start_follows_label": follows[0], "continue_follows_label": float(np.mean(follows[1:]))}


def bootstrap(values: Sequence[float], n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """The mean of ``values`` (NaNs left out) and its percentile bootstrap interval.

    Returns:
        ``mean``, ``low``, ``high`` (the :data:`CONFIDENCE` interval) and ``n``; NaNs when
        no value.
    """
    x = np.asarray([v for v in values if not np.isnan(v)], dtype=float)
    if x.size == 0:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    return {"mean": float(x.mean()), "low": float(np.percentile(means, tail)),
            "high": float(np.percentile(means, 100 - tail)), "n": int(x.size)}  # fmt: skip


def start_vs_continue(
    model: Any,
    prompts: dict[str, Sequence[Episode]],
    *,
    batch_size: int = 8,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, dict[str, dict[str, float]]]:
    """Start and continue scores per set of prompts, with bootstrap intervals over prompts.

    Args:
        model: A mechlab model or a Hugging Face causal LM (:func:`as_model`).
        prompts: Name -> prompts; a set of misdirected prompts is scored with
            :func:`score_misdirected`, any other with :func:`score_episode` (e.g.
            ``{"symbolic": ..., "semantic": ..., "misdirected": ...}``).
        batch_size: Prompts per forward pass.
        n_boot: Bootstrap resamples.
        seed: The bootstrap's seed.

    Returns:
        Name -> metric -> ``{"mean", "low", "high", "n"}``.

    Raises:
        ValueError: An empty or mixed (misdirected and not) set of prompts.
    """
    model = as_model(model)
    if isinstance(model, nn.Module):
        model.eval()
    report = {}
    for name, episodes in prompts.items():
        if not episodes:
            raise ValueError(f"the prompts {name!r} are empty")
        kinds = {e.misdirected for e in episodes}
        if len(kinds) > 1:
            raise ValueError(f"the prompts {name!r} mix misdirected and plain prompts; score them apart")
        score = score_misdirected if kinds.pop() else score_episode
        rows = [score(lp, e) for lp, e in zip(log_probs(model, [e.tokens for e in episodes], batch_size),
                                              episodes, strict=True)]  # fmt: skip
        report[name] = {key: bootstrap([r[key] for r in rows], n_boot, seed) for key in rows[0]}
    return report
