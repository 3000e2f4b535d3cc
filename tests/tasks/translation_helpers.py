"""A word-level tokenizer of the translation task's words, built offline (``tokenizers``)."""

from __future__ import annotations

from mechlab.tasks.translation import SYMBOLS, WordList


def word_tokenizer(words: WordList, extra: tuple[str, ...] = ()):
    """A WordLevel tokenizer (split on spaces and punctuation) that knows every word of
    ``words``, the labels, ``=``, ``,`` and ``:`` (ids in sorted order after ``[UNK]``,
    ``[PAD]``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = {w for entry in words.entries for w in entry} | set(SYMBOLS) | set(extra)
    names |= {lang.capitalize() for lang in words.languages} | {"=", ",", ":"}
    vocab = {"[UNK]": 0, "[PAD]": 1} | {w: i + 2 for i, w in enumerate(sorted(names))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
