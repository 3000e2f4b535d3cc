"""Tiny local tokenizers for the prompt-task tests (built offline with ``tokenizers``)."""

from __future__ import annotations

from pathlib import Path

SENTENCES = [
    "When Mary and John went to the store, John gave a drink to Mary",
    "When Anne and Paul went to the park, Paul gave a book to Anne",
    "Then, Sarah and Mark went to the school. Mark gave a ring to Sarah",
    "After Lucy and Tom went to the garden, Tom gave a ball to Lucy",
]


def word_level(folder: Path, extra: tuple[str, ...] = ()) -> Path:
    """A word-level tokenizer of the words of :data:`SENTENCES` (split on spaces, so
    ``" Mary"`` is the one token ``Mary``), saved with ``save_pretrained``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([*SENTENCES, *extra], trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    fast.save_pretrained(folder)
    return folder


def byte_bpe(folder: Path, sentences: list[str] | None = None, vocab_size: int = 300) -> Path:
    """A GPT-2-style byte-level BPE trained on ``sentences``, saved with ``save_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )  # fmt: skip
    tok.train_from_iterator((sentences or SENTENCES) * 20, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)
    return folder
