"""A synthetic bilingual corpus: a tiny language model's training data for the translation test.

The recall study asks of a language model's training checkpoints whether *starting* an
in-context translation from a symbolic label emerges later than *continuing* it
(:mod:`mechlab.tasks.translation`). No language model can be downloaded here, so this
module makes a world small enough to train one on a CPU: a made-up source language (the
word list's ``english`` column) and two made-up target languages (:data:`LANGUAGES`), a
dictionary of ``n_words`` entries (one word per language each, every word distinct), and a
corpus that mixes

* **plain text**: a sentence of one language (source or target), its words drawn from the
  language's own bigram chain (a fixed random successor table per language), ended by
  ``.``; and
* **translation episodes**, laid out exactly as :func:`mechlab.tasks.translation.episodes`
  lays out its prompts: one example segment per target language in a shuffled order
  (``<label> : <word> = <translation> , ...``, ``1..max_k`` pairs each), then
  ``1..max_segments`` query segments of ``2..max_query`` items, each under one of those
  labels drawn anew (the evaluation's prompts have one). Half the episodes
  (``symbolic_share``) take symbolic labels drawn per document from
  :data:`mechlab.tasks.translation.SYMBOLS` (a fresh label-to-language mapping every time),
  the others the languages' names (``Veltish``, ``Moranic``).

Why this makes the study's question a fair one: every query item needs the same
dictionary; what differs between positions is how the wanted language is known. At a
query segment's first answer (the start) only the label says it: a semantic label always
names the same language across the corpus (learnable as a fixed association), a symbolic
one only through the earlier segment under the same label in the same document (an
in-context lookup). At later answers (the continuation) the segment's own first answer says
it too. Both kinds of label are equally frequent and the episodes' layout matches the
evaluation's prompts (whose ``k`` and query count lie within the training ranges).

The tokenizer (:func:`tokenizer`) is word-level: one token per word, label and
punctuation mark (the Hugging Face ``tokenizers`` WordLevel model with whitespace
splitting, so that ``"X:"`` is ``X`` then ``:`` and a newline is no token). Training
sequences (:func:`batch`) are ``n_ctx + 1`` tokens of documents packed one after the
other from the sequence's first position, cut at the end; every next token is scored.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mechlab.tasks.translation import SYMBOLS, WordList

LANGUAGES = ("veltish", "moranic")
"""The two made-up target languages (their capitalised names are the semantic labels)."""
PUNCTUATION = (":", "=", ",", ".")
SPECIAL = ("[UNK]", "[PAD]")
VAL_SEED_OFFSET = 7919  # the validation set's seed is seed + this
_ONSETS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class BilingualConfig:
    """The made-up languages and the corpus's mix.

    Args:
        n_words: Dictionary entries (one word of the source language and of each target
            language per entry).
        n_ctx: Tokens a training sequence holds (the model's context).
        episode_share: Share of documents that are translation episodes (else plain text).
        symbolic_share: Share of episodes under symbolic labels (else semantic ones).
        max_k: Most example pairs per language in an episode (at least 1).
        max_query: Most query items in a query segment (at least 2: a start and a continuation).
        max_segments: Most query segments in an episode (each under a label drawn anew).
        sentence_len: Shortest and longest plain-text sentence, in words.
        n_val: Sequences of the fixed validation set.
        seed: Seeds the vocabulary, the dictionary, the bigram chains and the validation set
            (training batches are seeded by the trainer).
    """

    n_words: int = 40
    n_ctx: int = 64
    episode_share: float = 0.8
    symbolic_share: float = 0.5
    max_k: int = 4
    max_query: int = 5
    max_segments: int = 3
    sentence_len: tuple[int, int] = (4, 10)
    n_val: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.sentence_len, list):
            object.__setattr__(self, "sentence_len", tuple(self.sentence_len))
        for name in ("n_words", "n_ctx", "max_k", "max_query", "max_segments", "n_val", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in ("episode_share", "symbolic_share"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 1
            ):
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if self.max_k < 1 or self.max_query < 2 or self.max_segments < 1:
            raise ValueError(f"max_k must be >= 1, max_query >= 2 and max_segments >= 1, got {self.max_k}, "
                             f"{self.max_query} and {self.max_segments}")  # fmt: skip
        low_high = self.sentence_len
        if len(low_high) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in low_high) \
                or not 1 <= low_high[0] <= low_high[1]:  # fmt: skip
            raise ValueError(
                f"sentence_len must be two integers 1 <= low <= high, got {self.sentence_len!r}"
            )
        needed = self.max_k * len(LANGUAGES) + self.max_query * self.max_segments
        if self.n_words < needed:
            raise ValueError(f"n_words must be at least max_k * {len(LANGUAGES)} + max_query * max_segments = "
                             f"{needed} (an episode's distinct words), got {self.n_words}")  # fmt: skip
        if self.n_words > len(_ONSETS) ** 2 * len(_VOWELS) ** 2 // (2 * (1 + len(LANGUAGES))):
            raise ValueError(
                f"n_words={self.n_words} is more than the made-up words this module can spell"
            )
        longest = len(LANGUAGES) * (1 + 4 * self.max_k) + 1 + 4 * self.max_query
        if self.n_ctx < longest:
            raise ValueError(f"n_ctx must hold the longest one-query-segment episode ({longest} tokens at "
                             f"max_k={self.max_k}, max_query={self.max_query}), got {self.n_ctx}")  # fmt: skip
        if self.n_val < 1:
            raise ValueError(f"n_val must be positive, got {self.n_val}")

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON values."""
        out = dataclasses.asdict(self)
        out["sentence_len"] = list(self.sentence_len)
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BilingualConfig:
        """Build from a dict, refusing unknown keys with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown BilingualConfig field(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


@dataclass(frozen=True)
class Vocabulary:
    """The world of one config: its tokens, its dictionary and its bigram chains.

    Attributes:
        tokens: Token id -> its string (specials, punctuation, labels, then the words).
        words: The dictionary as a word list (``english`` then :data:`LANGUAGES`).
        chains: Per language (``english`` first), per word index, the indices of the words
            that may follow it in plain text.
    """

    tokens: tuple[str, ...]
    words: WordList
    chains: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def ids(self) -> dict[str, int]:
        """Token string -> id."""
        return {t: i for i, t in enumerate(self.tokens)}


def semantic_label(language: str) -> str:
    """A language's semantic label (its name, capitalised, as the translation task writes it)."""
    return language.capitalize()


def vocabulary(cfg: BilingualConfig) -> Vocabulary:
    """The made-up words, dictionary and bigram chains of ``cfg`` (deterministic in its seed)."""
    rng = random.Random(cfg.seed)
    syllables = [o + v for o in _ONSETS for v in _VOWELS]
    spelled = sorted({a + b for a in syllables for b in syllables})
    rng.shuffle(spelled)
    columns = 1 + len(LANGUAGES)
    entries = tuple(
        tuple(spelled[i * columns + j] for j in range(columns)) for i in range(cfg.n_words)
    )
    words = WordList(LANGUAGES, entries)
    labels = [*SYMBOLS, *(semantic_label(lang) for lang in LANGUAGES)]
    tokens = (*SPECIAL, *PUNCTUATION, *labels, *(w for entry in entries for w in entry))
    chains = tuple(tuple(tuple(sorted(rng.sample(range(cfg.n_words), 3))) for _ in range(cfg.n_words))
                   for _ in range(columns))  # fmt: skip
    return Vocabulary(tokens, words, chains)


def tokenizer(vocab: Vocabulary) -> Any:
    """A Hugging Face word-level tokenizer of ``vocab`` (built offline; ``save_pretrained``
    writes it beside the checkpoints)."""
    # lazy: paid only when the tokenizer is built, beside transformers; transformers adds ~0.4 s to this module's import; paid only when the tokenizer is built
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab.ids, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


def write_word_list(vocab: Vocabulary, path: str | Path) -> None:
    """Write the dictionary as a word-list TSV (:func:`mechlab.tasks.translation.load_words`)."""
    lines = ["\t".join(("english", *vocab.words.languages))] + [
        "\t".join(e) for e in vocab.words.entries
    ]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def sentence(rng: random.Random, vocab: Vocabulary, cfg: BilingualConfig) -> list[str]:
    """A plain-text document: one language's words along its bigram chain, then ``.``."""
    column = rng.randrange(1 + len(LANGUAGES))
    chain = vocab.chains[column]
    word = rng.randrange(cfg.n_words)
    out = []
    for _ in range(rng.randint(*cfg.sentence_len)):
        out.append(vocab.words.entries[word][column])
        word = rng.choice(chain[word])
    return [*out, "."]


def episode(rng: random.Random, vocab: Vocabulary, cfg: BilingualConfig, kind: str) -> list[str]:
    """A translation document, laid out as :func:`mechlab.tasks.translation.episodes` does
    (with its ``\\n`` pieces, which are no tokens here), under ``kind`` labels."""
    n = len(LANGUAGES)
    ks = [rng.randint(1, cfg.max_k) for _ in LANGUAGES]
    queries = [rng.randint(2, cfg.max_query) for _ in range(rng.randint(1, cfg.max_segments))]
    chosen = rng.sample(range(cfg.n_words), sum(ks) + sum(queries))
    entries = [vocab.words.entries[i] for i in chosen]
    if kind == "symbolic":
        labels = dict(zip(LANGUAGES, rng.sample(list(SYMBOLS), n), strict=True))
    else:
        labels = {lang: semantic_label(lang) for lang in LANGUAGES}
    order = list(range(n))
    rng.shuffle(order)
    out: list[str] = []

    def segment(lang: int, items: list[tuple[str, ...]]) -> None:
        out.extend([labels[LANGUAGES[lang]], ":"])
        for j, entry in enumerate(items):
            out.extend([","] * bool(j) + [entry[0], "=", entry[1 + lang]])

    start = 0
    for lang in order:
        segment(lang, entries[start : start + ks[lang]])
        start += ks[lang]
    for n_query in queries:
        segment(rng.randrange(n), entries[start : start + n_query])
        start += n_query
    return out


def document(rng: random.Random, vocab: Vocabulary, cfg: BilingualConfig) -> list[str]:
    """One document of the corpus: an episode (``episode_share``; symbolic with
    ``symbolic_share``) or a plain-text sentence."""
    if rng.random() < cfg.episode_share:
        return episode(
            rng, vocab, cfg, "symbolic" if rng.random() < cfg.symbolic_share else "semantic"
        )
    return sentence(rng, vocab, cfg)


def sequences(cfg: BilingualConfig, vocab: Vocabulary, n: int, seed: int) -> Tensor:
    """``[n, n_ctx + 1]`` token ids: documents packed from the first position, cut at the end."""
    rng = random.Random(seed)
    ids = vocab.ids
    rows = []
    for _ in range(n):
        row: list[int] = []
        while len(row) <= cfg.n_ctx:
            row.extend(ids[t] for t in document(rng, vocab, cfg))
        rows.append(row[: cfg.n_ctx + 1])
    return torch.tensor(rows, dtype=torch.long)


def batch(
    cfg: BilingualConfig, vocab: Vocabulary, n: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """A training batch ``(inputs, targets, mask)``, each ``[n, n_ctx]``: every next token scored."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    seqs = sequences(cfg, vocab, n, seed)
    return seqs[:, :-1], seqs[:, 1:], torch.ones(n, cfg.n_ctx, dtype=torch.bool)


def validation_set(cfg: BilingualConfig, vocab: Vocabulary) -> Tensor:
    """The fixed validation sequences, ``[n_val, n_ctx + 1]`` (seed ``seed + 7919``)."""
    return sequences(cfg, vocab, cfg.n_val, cfg.seed + VAL_SEED_OFFSET)
