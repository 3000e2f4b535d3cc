"""The synthetic bilingual corpus: its config, vocabulary, tokenizer, documents and batches."""

from __future__ import annotations

import random

import pytest
import torch

from mechlab.tasks import bilingual
from mechlab.tasks.bilingual import LANGUAGES, BilingualConfig, semantic_label
from mechlab.tasks.translation import SYMBOLS, check_labels, episodes, load_words, usable_words

CFG = BilingualConfig(n_words=24, n_ctx=64, max_k=3, max_query=3, max_segments=2, n_val=8)


@pytest.fixture(scope="module")
def vocab():
    return bilingual.vocabulary(CFG)


@pytest.fixture(scope="module")
def tok(vocab):
    return bilingual.tokenizer(vocab)


@pytest.mark.parametrize("field, value, message", [
    ("n_words", 5, "n_words must be at least"), ("episode_share", 1.5, "episode_share must be a number"),
    ("max_query", 1, "max_query >= 2"), ("n_ctx", 20, "n_ctx must hold the longest"),
    ("sentence_len", (3, 2), "sentence_len must be"), ("seed", 1.0, "seed must be an integer"),
])  # fmt: skip
def test_config_refuses_bad_fields(field, value, message):
    with pytest.raises(ValueError, match=message):
        BilingualConfig(**{**CFG.to_dict(), field: value})


def test_config_round_trips_and_refuses_unknown_keys():
    assert BilingualConfig.from_dict(CFG.to_dict()) == CFG
    with pytest.raises(ValueError, match=r"unknown BilingualConfig field\(s\) \['nope'\]"):
        BilingualConfig.from_dict({"nope": 1})


def test_vocabulary_is_deterministic_distinct_and_labels_are_no_words(vocab):
    assert bilingual.vocabulary(CFG) == vocab
    assert (
        bilingual.vocabulary(BilingualConfig(**{**CFG.to_dict(), "seed": 1})).words != vocab.words
    )
    words = [w for entry in vocab.words.entries for w in entry]
    assert len(words) == len(set(words)) == CFG.n_words * (1 + len(LANGUAGES))
    assert len(set(vocab.tokens)) == len(vocab.tokens)
    check_labels(
        [*SYMBOLS, *(semantic_label(lang) for lang in LANGUAGES)], vocab.words
    )  # no collision


def test_word_list_reads_back_and_every_entry_is_usable(vocab, tok, tmp_path):
    path = tmp_path / "words.tsv"
    bilingual.write_word_list(vocab, path)
    listed = load_words(path)
    assert listed == vocab.words
    kept, dropped = usable_words(listed, tok)
    assert kept == listed and dropped == []


def test_tokenizer_gives_each_token_its_id(vocab, tok):
    text = " ".join(vocab.tokens[2:])
    assert tok(text, add_special_tokens=False)["input_ids"] == list(range(2, len(vocab.tokens)))
    assert tok("X: dog =", add_special_tokens=False)["input_ids"][0] == vocab.ids["X"]


def _segments(doc):
    """(label, [(english, answer)]) per segment of an episode document."""
    out, i = [], 0
    while i < len(doc):
        label, colon = doc[i], doc[i + 1]
        assert colon == ":"
        i += 2
        items = []
        while i < len(doc) and doc[i + 1] == "=":
            items.append((doc[i], doc[i + 2]))
            i += 3
            if i < len(doc) and doc[i] == ",":
                i += 1
        out.append((label, items))
    return out


def test_episodes_keep_one_language_per_label_and_draw_symbols_afresh(vocab):
    language_of = {w: j for entry in vocab.words.entries for j, w in enumerate(entry)}
    english = {entry[0]: entry for entry in vocab.words.entries}
    rng = random.Random(0)
    mappings = set()
    for _ in range(200):
        doc = bilingual.episode(rng, vocab, CFG, "symbolic")
        segments = _segments(doc)
        n = len(LANGUAGES)
        assert 1 + n <= len(segments) <= n + CFG.max_segments
        labels = {}
        for label, items in segments[:n]:  # one example segment per language
            langs = {language_of[a] for _, a in items}
            assert len(langs) == 1 and label in SYMBOLS and 1 <= len(items) <= CFG.max_k
            labels[label] = langs.pop()
        assert sorted(labels.values()) == list(range(1, n + 1))
        for label, items in segments[n:]:  # the queries follow their label's examples
            assert 2 <= len(items) <= CFG.max_query
            assert all(english[e][labels[label]] == a for e, a in items)
        used = [e for _, items in segments for e, _ in items]
        assert len(used) == len(set(used))  # no word in two roles
        mappings.add(tuple(sorted(labels.items())))
    assert len(mappings) > 20  # a fresh mapping per document
    doc = bilingual.episode(random.Random(1), vocab, CFG, "semantic")
    assert {label for label, _ in _segments(doc)} <= {semantic_label(lang) for lang in LANGUAGES}


def test_sentences_are_one_language_along_its_chain(vocab):
    rng = random.Random(0)
    for _ in range(50):
        doc = bilingual.sentence(rng, vocab, CFG)
        assert doc[-1] == "." and CFG.sentence_len[0] <= len(doc) - 1 <= CFG.sentence_len[1]
        columns = {
            j
            for w in doc[:-1]
            for entry in vocab.words.entries
            for j, x in enumerate(entry)
            if x == w
        }
        assert len(columns) == 1
        column = columns.pop()
        index = {entry[column]: i for i, entry in enumerate(vocab.words.entries)}
        for a, b in zip(doc[:-1], doc[1:-1], strict=False):
            assert index[b] in vocab.chains[column][index[a]]


def test_batch_is_packed_documents_shifted_by_one(vocab, tok):
    inputs, targets, mask = bilingual.batch(CFG, vocab, 4, torch.Generator().manual_seed(3))
    again = bilingual.batch(CFG, vocab, 4, torch.Generator().manual_seed(3))
    assert torch.equal(inputs, again[0]) and inputs.shape == targets.shape == mask.shape == (
        4,
        CFG.n_ctx,
    )
    assert torch.equal(inputs[:, 1:], targets[:, :-1]) and bool(mask.all())
    seqs = bilingual.sequences(CFG, vocab, 3, seed=5)
    rng = random.Random(5)
    first = bilingual.document(rng, vocab, CFG)  # the first row starts with the first document
    assert (
        seqs[0, : len(first)].tolist()
        == tok(" ".join(first), add_special_tokens=False)["input_ids"][: CFG.n_ctx + 1]
    )


def test_evaluation_prompts_are_episodes_of_the_corpus(vocab, tok):
    prompt = episodes(vocab.words, tok, n=1, kind="symbolic", k=3, n_query=3, seed=0)[0]
    doc = [vocab.tokens[i] for i in prompt.tokens]
    segments = _segments(doc)  # the training layout parses the evaluation's prompt
    assert len(segments) == len(LANGUAGES) + 1 and vocab.ids["[UNK]"] not in prompt.tokens
