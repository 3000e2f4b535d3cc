"""The translation episodes: layout, fresh labels per prompt, word roles, refusals."""

from __future__ import annotations

import pytest

from mechlab.tasks.translation import (
    DEFAULT_WORDS,
    WordList,
    episodes,
    load_words,
    usable_words,
)
from tests.tasks.translation_helpers import word_tokenizer

SMALL = WordList(("spanish", "french"), (
    ("dog", "perro", "chien"), ("house", "casa", "maison"), ("cat", "gato", "chat"),
    ("water", "agua", "eau"), ("tree", "árbol", "arbre"), ("book", "libro", "livre"),
    ("moon", "luna", "lune"), ("bread", "pan", "pain"),
))  # fmt: skip


@pytest.fixture(scope="module")
def words():
    return load_words()


@pytest.fixture(scope="module")
def tok(words):
    return word_tokenizer(words)


def test_bundled_list_has_a_few_hundred_entries(words):
    assert DEFAULT_WORDS.name == "en_es.tsv"
    assert words.languages == ("spanish", "french")
    assert len(words.entries) > 250
    assert ("dog", "perro", "chien") in words.entries


def test_layout_of_one_prompt_by_hand():
    tok = word_tokenizer(SMALL)
    (ep,) = episodes(SMALL, tok, n=1, kind="semantic", k=2, n_query=2, seed=3)
    lines = ep.text.split("\n")
    assert len(lines) == 3
    assert {lines[0].split(":")[0], lines[1].split(":")[0]} == {"Spanish", "French"}
    query = lines[2]
    assert query.startswith(f"{ep.language.capitalize()}: ")
    first, second = ep.items
    column = SMALL.languages.index(ep.language) + 1
    entries = {e[0]: e for e in SMALL.entries}
    assert query == (f"{ep.language.capitalize()}: {first.english} = {entries[first.english][column]}, "
                     f"{second.english} = {entries[second.english][column]}")  # fmt: skip
    # each example line: two "english = translation" pairs of its own language
    for line in lines[:2]:
        label, body = line.split(": ")
        lang_column = SMALL.languages.index(label.lower()) + 1
        for pair in body.split(", "):
            english, translation = pair.split(" = ")
            assert entries[english][lang_column] == translation
    # the answer positions point at the answer's tokens, right after " ="
    for item in ep.items:
        (pos,) = item.positions
        assert ep.tokens[pos] == tok.convert_tokens_to_ids(entries[item.english][column])
        assert ep.tokens[pos - 1] == tok.convert_tokens_to_ids("=")
        assert ep.tokens[pos - 2] == tok.convert_tokens_to_ids(item.english)
    assert tok.decode(ep.tokens).split() == ep.text.replace(":", " :").replace(",", " ,").split()


def test_symbolic_labels_fresh_per_prompt(words, tok):
    kept, _ = usable_words(words, tok)
    eps = episodes(kept, tok, n=40, kind="symbolic", seed=0)
    mappings = {tuple(sorted(e.labels.items())) for e in eps}
    assert len(mappings) > 20  # a fresh mapping per prompt, not one fixed code
    for e in eps:
        assert len(set(e.labels.values())) == 2
        assert e.text.split("\n")[-1].startswith(e.labels[e.language] + ":")
        assert e.language == e.written and not e.misdirected
    again = episodes(kept, tok, n=40, kind="symbolic", seed=0)
    assert [e.tokens for e in again] == [e.tokens for e in eps]


def test_no_word_in_two_roles(words, tok):
    kept, _ = usable_words(words, tok)
    for e in episodes(kept, tok, n=30, kind="semantic", k=5, n_query=4, seed=1, misdirect=True):
        assert len(e.roles) == 2 * (5 * 2 + 4)
        assert len({w.lower() for w in e.roles}) == len(e.roles)
        assert e.misdirected and e.written != e.language


def test_usable_words_drops_shared_first_tokens_and_shared_words(words, tok):
    kept, dropped = usable_words(words, tok)
    assert ("table", "mesa", "table") not in kept.entries  # the French answer starts as the English word
    assert ("sad", "triste", "triste") not in kept.entries  # Spanish and French start alike
    assert not any(e[0] in ("money", "silver") for e in kept.entries)  # 'argent' in two entries
    assert len(kept.entries) + len(dropped) == len(words.entries)
    for entry in kept.entries:
        heads = [tok(" " + w, add_special_tokens=False)["input_ids"][0] for w in entry]
        assert len(set(heads)) == len(heads)


def test_refusals(words, tok, tmp_path):
    with pytest.raises(ValueError, match="cannot encode the word 'zzyzx'"):
        usable_words(WordList(("spanish",), (("dog", "perro"), ("zzyzx", "gato"))), word_tokenizer(SMALL))
    with pytest.raises(ValueError, match="label 'dog' is a word of the word list"):
        episodes(SMALL, word_tokenizer(SMALL), n=1, kind="symbolic", k=1, symbols=("X", "dog"))
    with pytest.raises(ValueError, match="label 'Casa' is a word"):  # a language named like a word
        episodes(WordList(("casa",), tuple(e[:2] for e in SMALL.entries)), word_tokenizer(SMALL), n=1,
                 kind="semantic", k=1)  # fmt: skip
    with pytest.raises(ValueError, match="a prompt needs 10 distinct words"):
        episodes(SMALL, word_tokenizer(SMALL), n=1, kind="semantic", k=4, n_query=2)
    with pytest.raises(ValueError, match="misdirection needs"):
        episodes(WordList(("spanish",), SMALL.entries), word_tokenizer(SMALL), n=1, kind="semantic", k=1,
                 misdirect=True)  # fmt: skip
    bad = tmp_path / "bad.tsv"
    bad.write_text("english\tspanish\ndog\tperro\ncat\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3: want 2 single words"):
        load_words(bad)
    with pytest.raises(ValueError, match="header"):
        load_words(DEFAULT_WORDS.parent / ".." / "tasks" / "translation.py")


def test_bos_shifts_every_position_by_one():
    tok = word_tokenizer(SMALL)
    plain = episodes(SMALL, tok, n=2, kind="semantic", k=1, n_query=2, seed=5)
    assert tok.bos_token_id is None and plain[0].tokens[0] != 0
    with pytest.raises(ValueError, match="needs a tokenizer with a BOS token"):
        episodes(SMALL, tok, n=1, kind="semantic", k=1, bos=True)
    tok.bos_token = "[UNK]"  # id 0, standing in for a BOS token
    with_bos = episodes(SMALL, tok, n=2, kind="semantic", k=1, n_query=2, seed=5, bos=True)
    for a, b in zip(plain, with_bos, strict=True):
        assert b.tokens == [0, *a.tokens]
        assert [i.positions for i in b.items] == [[p + 1 for p in i.positions] for i in a.items]
    assert [e.tokens for e in episodes(SMALL, tok, n=2, kind="semantic", k=1, n_query=2, seed=5)] == \
        [e.tokens for e in plain]  # the tokenizer does not add BOS itself: none by default


def test_bos_by_default_when_the_tokenizer_adds_one():
    from tokenizers import processors

    tok = word_tokenizer(SMALL)
    plain = episodes(SMALL, tok, n=1, kind="semantic", k=1, n_query=2, seed=5)
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="[PAD] $A", special_tokens=[("[PAD]", 1)])
    tok.bos_token = "[PAD]"
    assert tok("dog")["input_ids"] == [1, tok.convert_tokens_to_ids("dog")]
    (ep,) = episodes(SMALL, tok, n=1, kind="semantic", k=1, n_query=2, seed=5)
    assert ep.tokens == [1, *plain[0].tokens]


def test_the_word_list_installs_as_package_data():
    import fnmatch
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["mechlab"]
    assert any(fnmatch.fnmatch("data/en_es.tsv", p) for p in patterns)


def test_pieces_encoded_alone_are_the_text_encoded_by_a_byte_level_bpe(words):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    lines = [" ".join(entry) for entry in words.entries] + ["X: Q: Spanish: French: = ,"]
    bpe.train_from_iterator(lines * 3, trainers.BpeTrainer(vocab_size=400,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    kept, dropped = usable_words(words, tok)
    assert 0 < len(kept.entries) < len(words.entries)  # a small BPE splits words, and some start alike
    multi = 0
    for ep in episodes(kept, tok, n=10, kind="symbolic", seed=2, misdirect=True):
        assert tok(ep.text, add_special_tokens=False)["input_ids"] == ep.tokens
        for item in ep.items:
            assert ep.tokens[item.positions[0]:item.positions[-1] + 1] == item.answers[ep.written]
            multi += len(item.positions) > 1
    assert multi > 0  # multi-token answers occur: their later tokens are "continue" positions
