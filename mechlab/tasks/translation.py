"""In-context word translation named by a label: the recall study's natural-language test.

A prompt holds one *example segment* per target language, each under its own label, then
one *query segment* under the label of one of them::

    X: dog = perro, house = casa, tree = árbol
    Q: cat = chat, sun = soleil, book = livre
    X: water = agua, moon = luna, city = ciudad

The layout (chosen here; the study describes only "k example pairs under a label, then the
query words"): a segment is ``<label>:`` followed by comma-separated items ``<english> =
<translation>``, segments on their own lines, the query segment last; the example segments'
order is shuffled per prompt. Because every language of the prompt has its own example
segment, at the query segment's first answer (the *start*) only the label says which
language is wanted; from the second item on (the *continue*) the segment's own answers say
it too. Semantic labels are the language's name (``Spanish:``, ``French:``); symbolic
labels are drawn per prompt from a pool of meaningless strings (``X``, ``Q``, ...), so the
label-to-language mapping is fresh in every prompt. A *misdirected* prompt writes its query
segment's answers in another language of the prompt than its label names.

The prompt's token ids are the concatenation of its pieces encoded one by one (``"X:"``,
``" dog"``, ``" ="``, ``" perro"``, ``","``, ``"\\n"``), each word with its leading space,
so that an answer's tokens are exactly its word's tokens (``text`` is the pieces joined).
With the byte-level BPEs of GPT-2, Pythia, OLMo and OLMo 2 a word with its leading space
encodes alone as it does in running text. A BOS token starts the prompt when the tokenizer
adds one itself (``bos`` of :func:`episodes`).

Which words are used: a word the tokenizer cannot encode (an unknown token, or nothing) is
refused; an entry is dropped when the first token of one of its translations equals the
first token of another of its translations or of the English word (the start is scored on
an answer's first token, which must then say which language was produced), or when one of
its words is a word of another entry (no word in two roles of a prompt).
"""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_WORDS = Path(__file__).resolve().parent.parent / "data" / "en_es.tsv"
"""The bundled list: about 280 common English words with Spanish and French translations."""

SYMBOLS = ("X", "Q", "Z", "K", "W", "V", "J", "XQ", "ZK", "QW")
"""The default pool of symbolic labels (strings without meaning)."""

LABEL_KINDS = ("symbolic", "semantic")


@dataclass(frozen=True)
class WordList:
    """English words and their translations.

    Attributes:
        languages: Target languages (column names, e.g. ``("spanish", "french")``).
        entries: Per entry, the English word then one translation per language.
    """

    languages: tuple[str, ...]
    entries: tuple[tuple[str, ...], ...]

    def words(self) -> set[str]:
        """Every word of the list, in any language, lowercased."""
        return {word.lower() for entry in self.entries for word in entry}


def load_words(path: str | Path | None = None) -> WordList:
    """A word list from a TSV file: a header ``english<TAB><language>...``, one entry a line.

    Args:
        path: The file (default: the bundled :data:`DEFAULT_WORDS`).

    Raises:
        ValueError: One line: no such file, no ``english`` first column or no language,
            a line with another number of fields, an empty word or one with spaces.
    """
    path = Path(path) if path is not None else DEFAULT_WORDS
    if not path.is_file():
        raise ValueError(f"word list {str(path)!r} is not a file")
    with path.open(encoding="utf-8", newline="") as f:
        rows = [row for row in csv.reader(f, delimiter="\t") if row]
    if not rows or rows[0][0].strip().lower() != "english" or len(rows[0]) < 2:
        raise ValueError(f"word list {str(path)!r} must start with a header 'english<TAB><language>...'")
    languages = tuple(name.strip().lower() for name in rows[0][1:])
    entries = []
    for line, row in enumerate(rows[1:], start=2):
        words = tuple(word.strip() for word in row)
        if len(words) != len(rows[0]) or any(not w or " " in w for w in words):
            raise ValueError(f"word list {str(path)!r} line {line}: want {len(rows[0])} single words "
                             f"separated by tabs, got {row!r}")  # fmt: skip
        entries.append(words)
    return WordList(languages, tuple(entries))


def encode(tokenizer: Any, piece: str) -> list[int]:
    """The token ids of ``piece`` alone (no special tokens)."""
    return list(tokenizer(piece, add_special_tokens=False)["input_ids"])


def usable_words(words: WordList, tokenizer: Any) -> tuple[WordList, list[str]]:
    """The entries the start/continue metric can score (see the module's docstring).

    Returns:
        The kept list and, per dropped entry, why (one short line each).

    Raises:
        ValueError: A word the tokenizer cannot encode (an unknown token, or no token).
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    first: dict[str, int] = {}
    for entry in words.entries:
        for word in entry:
            ids = encode(tokenizer, " " + word)
            if not ids or (unk is not None and unk in ids):
                raise ValueError(f"the tokenizer cannot encode the word {word!r} (unknown token); "
                                 "remove it from the word list or use another tokenizer")  # fmt: skip
            first[word] = ids[0]
    counts: dict[str, int] = {}
    for entry in words.entries:
        for word in set(entry):
            counts[word.lower()] = counts.get(word.lower(), 0) + 1
    kept, dropped = [], []
    for entry in words.entries:
        heads = [first[word] for word in entry]
        if len(set(heads)) < len(heads):
            dropped.append(f"{entry[0]}: two of {list(entry)} start with the same token")
        elif any(counts[word.lower()] > 1 for word in entry):
            dropped.append(f"{entry[0]}: one of {list(entry)} is a word of another entry")
        else:
            kept.append(entry)
    return WordList(words.languages, tuple(kept)), dropped


def check_labels(labels: Sequence[str], words: WordList) -> None:
    """Refuse labels that repeat, are empty or hold spaces, or are words of the list.

    Raises:
        ValueError: One line naming the label.
    """
    vocabulary = words.words()
    for label in labels:
        if not isinstance(label, str) or not label or any(c.isspace() for c in label) or ":" in label:
            raise ValueError(f"label {label!r} must be a non-empty string without spaces or ':'")
        if label.lower() in vocabulary:
            raise ValueError(f"label {label!r} is a word of the word list; choose labels that are not words")
    if len(set(labels)) < len(labels):
        raise ValueError(f"labels must not repeat, got {list(labels)}")


@dataclass
class Item:
    """One query item: an English word and the answer the prompt's text gives it.

    Attributes:
        english: The English word.
        answers: Language -> its translation's token ids (every language of the prompt).
        positions: Indices in the prompt's tokens of the written answer's tokens.
    """

    english: str
    answers: dict[str, list[int]]
    positions: list[int]


@dataclass
class Episode:
    """One prompt.

    Attributes:
        tokens: The prompt's token ids (the query segment's answers included).
        text: The prompt as text.
        kind: ``"symbolic"`` or ``"semantic"``.
        labels: Language -> its label in this prompt.
        language: The language the query segment's label names.
        written: The language the query segment's answers are written in (``language``
            unless misdirected).
        items: The query segment's items, in order.
        roles: Every word of the prompt (examples and queries, English and translations).
    """

    tokens: list[int]
    text: str
    kind: str
    labels: dict[str, str]
    language: str
    written: str
    items: list[Item]
    roles: list[str] = field(default_factory=list)

    @property
    def misdirected(self) -> bool:
        """Whether the answers are written in another language than the label names."""
        return self.written != self.language


def _semantic(language: str) -> str:
    return language.capitalize()


def episodes(
    words: WordList,
    tokenizer: Any,
    *,
    n: int,
    kind: str,
    k: int = 4,
    n_query: int = 3,
    seed: int = 0,
    misdirect: bool = False,
    symbols: Sequence[str] = SYMBOLS,
    bos: bool | None = None,
) -> list[Episode]:
    """``n`` translation prompts (layout in the module's docstring).

    Args:
        words: The word list, already filtered by :func:`usable_words`.
        tokenizer: A Hugging Face tokenizer (called on each piece).
        n: How many prompts.
        kind: ``"symbolic"`` (labels drawn per prompt from ``symbols``) or ``"semantic"``
            (the language's name).
        k: Example pairs per language.
        n_query: Query items (the first is the start, the others continue).
        seed: Seed of the words, labels, languages and order.
        misdirect: Write the query answers in another language of the prompt than the
            label names (needs two languages).
        symbols: The pool of symbolic labels (at least one per language).
        bos: Start every prompt with the tokenizer's BOS token (default: when the
            tokenizer adds one to the text it encodes, as Llama-style tokenizers do).

    Raises:
        ValueError: One line: a bad kind or count, too few words or symbols, a label that
            is a word of the list, misdirection with one language, ``bos`` with a
            tokenizer that has no BOS token.
    """
    if kind not in LABEL_KINDS:
        raise ValueError(f"kind must be one of {LABEL_KINDS}, got {kind!r}")
    for name, value, low in (("n", n, 1), ("k", k, 1), ("n_query", n_query, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    languages = words.languages
    if misdirect and len(languages) < 2:
        raise ValueError("misdirection needs a word list with two languages or more")
    needed = k * len(languages) + n_query
    if len(words.entries) < needed:
        raise ValueError(f"a prompt needs {needed} distinct words ({k} examples x {len(languages)} languages "
                         f"+ {n_query} queries); the word list has {len(words.entries)} usable")  # fmt: skip
    if kind == "symbolic":
        check_labels(list(symbols), words)
        if len(symbols) < len(languages):
            raise ValueError(f"{len(languages)} languages need as many symbolic labels, got {list(symbols)}")
    else:
        check_labels([_semantic(lang) for lang in languages], words)
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        added = list(tokenizer("a")["input_ids"])
        bos = bos_id is not None and added[:1] == [bos_id] and len(added) > len(encode(tokenizer, "a"))
    if bos and bos_id is None:
        raise ValueError("bos=True needs a tokenizer with a BOS token")
    prefix = [bos_id] if bos else []
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chosen = rng.sample(range(len(words.entries)), needed)
        entries = [words.entries[i] for i in chosen]
        if kind == "symbolic":
            labels = dict(zip(languages, rng.sample(list(symbols), len(languages)), strict=True))
        else:
            labels = {lang: _semantic(lang) for lang in languages}
        language = rng.choice(languages)
        written = rng.choice([lang for lang in languages if lang != language]) if misdirect else language
        order = list(languages)
        rng.shuffle(order)
        out.append(_episode(tokenizer, prefix, kind, languages, labels, entries, order, k, language, written))
    return out


def _episode(tokenizer: Any, prefix: list[int], kind: str, languages: tuple[str, ...], labels: dict[str, str],
             entries: list[tuple[str, ...]], order: list[str], k: int, language: str,
             written: str) -> Episode:  # fmt: skip
    """One prompt of :func:`episodes`: the example segments of ``entries[:k * len(order)]``
    in ``order``, then the query segment of the rest under ``language``'s label, answered
    in ``written``; the tokens start with ``prefix``."""
    pieces: list[str] = []
    tokens: list[int] = list(prefix)

    def add(piece: str) -> list[int]:
        ids = encode(tokenizer, piece)
        pieces.append(piece)
        tokens.extend(ids)
        return list(range(len(tokens) - len(ids), len(tokens)))

    def segment(lang: str, items: Sequence[tuple[str, ...]], column: str) -> list[list[int]]:
        add(f"{labels[lang]}:")
        places = []
        for j, entry in enumerate(items):
            if j:
                add(",")
            add(" " + entry[0])
            add(" =")
            places.append(add(" " + entry[1 + languages.index(column)]))
        return places

    for i, lang in enumerate(order):
        segment(lang, entries[i * k:(i + 1) * k], lang)
        add("\n")
    queries = entries[len(languages) * k:]
    places = segment(language, queries, written)
    items = [Item(entry[0], {lang: encode(tokenizer, " " + entry[1 + languages.index(lang)]) for lang in languages},
                  pos)
             for entry, pos in zip(queries, places, strict=True)]  # fmt: skip
    roles = [entry[0] for entry in entries[:len(languages) * k]]
    roles += [entries[i * k + j][1 + languages.index(lang)] for i, lang in enumerate(order) for j in range(k)]
    roles += [entry[0] for entry in queries] + [entry[1 + languages.index(written)] for entry in queries]
    return Episode(tokens, "".join(pieces), kind, labels, language, written, items, roles)
