"""Prompt pairs for the translation task's circuits: the start and the continue positions.

A pair is a translation prompt (:func:`mechlab.tasks.translation.episodes`, not
misdirected) and the same prompt with its query segment's label swapped for the label of
another language of the prompt (``X: water = agua, moon = luna`` becomes ``Q: water = agua,
moon = luna`` where ``Q`` labels the French examples): the tokens differ only at the label.
Two targets explain a position of the same pairs (:data:`TARGETS`):

* ``start``: the prediction of the query's first answer token, right after ``<label>:
  <word> =``, where only the label says which language is wanted;
* ``continue``: the prediction of the second answer's first token, where the first answer
  says it too.

The answer is the clean prompt's (the label's language) and the wrong token the swapped
label's language's translation of the same word, so the logit difference measures how much
the position follows the label. A pair whose swapped label takes another number of tokens
than the label it replaces (possible for semantic labels with a subword tokenizer) is left
out. The records are those of :mod:`mechlab.tasks.prompts` (token ids), so the pairs go
through ``mechlab prune --pairs`` and its attribution methods unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from mechlab.tasks.registry import get_task
from mechlab.tasks.translation import SYMBOLS, Episode, WordList, encode, episodes

TARGETS = ("start", "continue")
CORRUPTION = "label_swap"


def label_span(episode: Episode, tokenizer: Any) -> tuple[int, int]:
    """The token span ``[begin, end)`` of the query segment's ``<label>:`` in ``episode``.

    The query segment is ``<label>: <english> = <answer>, ...``: its label ends where its
    first item's English word begins.
    """
    item = episode.items[0]
    before = len(encode(tokenizer, " " + item.english)) + len(encode(tokenizer, " ="))
    end = item.positions[0] - before
    return end - len(encode(tokenizer, f"{episode.labels[episode.language]}:")), end


def swapped(episode: Episode, tokenizer: Any, language: str) -> list[int] | None:
    """The prompt's tokens with the query label replaced by ``language``'s label, or None
    when the two labels take different numbers of tokens."""
    begin, end = label_span(episode, tokenizer)
    ids = encode(tokenizer, f"{episode.labels[language]}:")
    if len(ids) != end - begin:
        return None
    return episode.tokens[:begin] + ids + episode.tokens[end:]


def pair_records(
    words: WordList,
    tokenizer: Any,
    target: str,
    *,
    n: int,
    kind: str,
    k: int = 4,
    n_query: int = 3,
    seed: int = 0,
    symbols: Sequence[str] = SYMBOLS,
) -> list[dict[str, Any]]:
    """Up to ``n`` pair records (token ids) of one target; see the module's docstring.

    Args:
        words: The word list, filtered by :func:`mechlab.tasks.translation.usable_words`.
        tokenizer: A Hugging Face tokenizer.
        target: ``start`` or ``continue``.
        n: Prompts drawn (pairs whose labels tokenize unequally are left out).
        kind: ``symbolic`` or ``semantic`` labels.
        k: Example pairs per language.
        n_query: Query items (at least 2).
        seed: Seed of the prompts (the same seed gives both targets the same prompts) and
            of the swapped label's language.
        symbols: The pool of symbolic labels.

    Returns:
        Records ``{"clean", "corrupted", "position", "answer", "wrong"}``.

    Raises:
        ValueError: One line: an unknown target, a word list with one language, or what
            :func:`~mechlab.tasks.translation.episodes` refuses.
    """
    if target not in TARGETS:
        raise ValueError(
            f"target {target!r} is not one of the translation targets; use one of {TARGETS}"
        )
    if len(words.languages) < 2:
        raise ValueError("label-swapped pairs need a word list with two languages or more")
    rng = random.Random(seed)
    records = []
    for episode in episodes(
        words, tokenizer, n=n, kind=kind, k=k, n_query=n_query, seed=seed, symbols=symbols
    ):
        other = rng.choice([lang for lang in words.languages if lang != episode.language])
        corrupted = swapped(episode, tokenizer, other)
        if corrupted is None:
            continue
        item = episode.items[0 if target == "start" else 1]
        records.append({"clean": list(episode.tokens), "corrupted": corrupted, "position": item.positions[0] - 1,
                        "answer": item.answers[episode.language][0], "wrong": item.answers[other][0]})  # fmt: skip
    return records


def task_prune_data(cfg: Any, target: str, *, n_train: int, n_test: int, corruption: str = CORRUPTION, seed: int = 0,
                    **_: Any) -> tuple[Any, str]:  # fmt: skip
    """The pruning traces of a checkpoint trained on the bilingual corpus
    (:mod:`mechlab.tasks.bilingual`): ``n_train + n_test`` symbolic-label pairs of
    ``target``, the last ``n_test`` held out (the task registry's ``prune_data``).

    Returns:
        ``(PruneData, "all")``: the traces' only observed position is the explained one.

    Raises:
        ValueError: A target or corruption the task does not take (one line).
    """
    if target not in TARGETS:
        raise ValueError(get_task("bilingual").target_refusal.format(target=target))
    if corruption != CORRUPTION:
        raise ValueError(
            f"unknown corruption {corruption!r} for the bilingual task; it takes {CORRUPTION!r}"
        )
    # lazy: this module loads without torch (~15 ms); the bilingual task and mechlab.tasks.prompts load torch (~1 s)
    from mechlab.tasks import bilingual
    from mechlab.tasks.prompts import pairs_from_records

    vocab = bilingual.vocabulary(cfg)
    tok = bilingual.tokenizer(vocab)
    k = min(4, cfg.max_k)
    records = pair_records(vocab.words, tok, target, n=n_train + n_test, kind="symbolic", k=k,
                           n_query=min(3, cfg.max_query), seed=seed)  # fmt: skip
    pairs = pairs_from_records(records, tok, pad_id=vocab.ids["[PAD]"])
    return pairs.prune_data(test_fraction=n_test / len(pairs), seed=seed), "all"
