"""Label-swapped prompt pairs of the start and continue targets."""

from __future__ import annotations

import pytest

from mechlab.tasks.prompts import pairs_from_records
from mechlab.tasks.translation import episodes, load_words, usable_words
from mechlab.tasks.translation_pairs import label_span, pair_records, task_prune_data
from tests.tasks.translation_helpers import word_tokenizer


@pytest.fixture(scope="module")
def setup():
    words = load_words()
    tok = word_tokenizer(words)
    return usable_words(words, tok)[0], tok


def test_pairs_differ_only_at_the_label_and_explain_the_answers(setup):
    words, tok = setup
    ids = tok.get_vocab()
    prompts = episodes(words, tok, n=6, kind="symbolic", k=2, n_query=3, seed=4)
    for target, item_index in (("start", 0), ("continue", 1)):
        records = pair_records(words, tok, target, n=6, kind="symbolic", k=2, n_query=3, seed=4)
        assert len(records) == 6
        for record, prompt in zip(records, prompts, strict=True):
            assert record["clean"] == prompt.tokens
            diff = [
                i
                for i, (a, b) in enumerate(zip(record["clean"], record["corrupted"], strict=True))
                if a != b
            ]
            begin, _ = label_span(prompt, tok)
            assert diff == [begin] and record["clean"][begin] == ids[prompt.labels[prompt.language]]
            other = next(lang for lang in words.languages if lang != prompt.language)
            assert (
                record["corrupted"][begin] == ids[prompt.labels[other]]
            )  # the other language's label
            item = prompt.items[item_index]
            assert record["position"] == item.positions[0] - 1
            assert (
                record["answer"]
                == record["clean"][record["position"] + 1]
                == item.answers[prompt.language][0]
            )
            entry = next(e for e in words.entries if e[0] == item.english)
            assert record["wrong"] == ids[entry[1 + words.languages.index(other)]]
    pairs = pairs_from_records(records)
    assert len(pairs) == 6


def test_refusals(setup):
    words, tok = setup
    with pytest.raises(ValueError, match="target 'middle' is not one of the translation targets"):
        pair_records(words, tok, "middle", n=2, kind="symbolic")
    from mechlab.tasks.bilingual import BilingualConfig

    with pytest.raises(ValueError, match="target 'all' is not one of the bilingual task's"):
        task_prune_data(BilingualConfig(), "all", n_train=2, n_test=2)
    with pytest.raises(ValueError, match="unknown corruption 'resample'"):
        task_prune_data(BilingualConfig(), "start", n_train=2, n_test=2, corruption="resample")


def test_task_prune_data_explains_one_position_per_pair():
    from mechlab.tasks.bilingual import BilingualConfig

    data, target = task_prune_data(BilingualConfig(n_words=30), "continue", n_train=6, n_test=4)
    assert target == "all" and data.train.inputs.shape[0] + data.test.inputs.shape[0] == 10
