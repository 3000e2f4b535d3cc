"""IOI prompt pairs under a local byte-level BPE: single-token names only, equal token
lengths per pair, the ABC corruption, the answer and the wrong token, refusals."""

import re

import pytest

from mechlab.tasks.ioi import NAMES, TEMPLATES, ioi_records, single_token_names
from mechlab.tasks.prompts import load_tokenizer, pairs_from_records
from tests.tasks.tokenizers import byte_bpe


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(byte_bpe(tmp_path_factory.mktemp("bpe"), vocab_size=1000))


def test_names_are_those_that_are_one_token_with_their_space(tokenizer):
    usable = single_token_names([*NAMES, "Bartholomew"], tokenizer)
    assert 3 <= len(usable) < len(NAMES) and "Bartholomew" not in usable
    for name in usable:
        assert len(tokenizer(" " + name, add_special_tokens=False)["input_ids"]) == 1


def test_ioi_pairs_have_equal_lengths_the_abc_corruption_and_single_token_answers(tokenizer):
    records = ioi_records(tokenizer, n=40, seed=1)
    assert len(records) == 40 and records == ioi_records(tokenizer, n=40, seed=1)  # seeded
    usable = set(single_token_names(NAMES, tokenizer))
    for r in records:
        io, s = r["answer"].strip(), r["wrong"].strip()
        assert io != s and {io, s} <= usable
        clean_names = [w for w in re.findall(r"\w+", r["clean"]) if w in usable]
        corrupt_names = [w for w in re.findall(r"\w+", r["corrupted"]) if w in usable]
        assert sorted(clean_names) == sorted([io, s, s])  # IO once, S twice
        assert len(corrupt_names) == 3 and len(set(corrupt_names)) == 3  # ABC: no name repeats
        assert not {io, s} & set(corrupt_names)  # five distinct names when there are five
        # the rest of the prompt is the same words
        strip = lambda text, names: [w for w in re.findall(r"\w+|[^\w\s]", text) if w not in names]  # noqa: E731
        assert strip(r["clean"], usable) == strip(r["corrupted"], usable)
    pairs = pairs_from_records(records, tokenizer)  # equal lengths, single-token answers
    assert (pairs.position == pairs.lengths - 1).all()
    assert pairs.answer.tolist() == [tokenizer(r["answer"], add_special_tokens=False)["input_ids"][0] for r in records]


def test_ioi_refusals_are_one_line(tokenizer):
    cases = [
        (dict(names=["Mary", "Bartholomew", "Montgomery"]), "only 1 of the 3 names are single tokens"),
        (dict(templates=["Then {IO} went to the {PLACE} with"]), "must hold {IO} once and {S} at least twice"),
        (dict(templates=["{IO} and {S} saw {S} and {WHO}"]), "may only use"),
        (dict(n=0), "n must be a positive integer"),
        (dict(places=[]), "places must not be empty"),
        (dict(corruption="swap"), "unknown corruption"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=re.escape(match)) as info:
            ioi_records(tokenizer, **kwargs)
        assert "\n" not in str(info.value)
    assert all("{IO}" in t for t in TEMPLATES)
