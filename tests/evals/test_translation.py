"""Start vs continue scoring against a hand-computed example on a model whose logits are set."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mechlab.evals.translation import (
    bootstrap,
    log_probs,
    score_episode,
    score_misdirected,
    start_vs_continue,
)
from mechlab.tasks.translation import Episode, Item, episodes, load_words, usable_words
from tests.tasks.translation_helpers import word_tokenizer

V = 10


class Table(nn.Module):
    """Logits set by hand per position (the same for every prompt)."""

    def __init__(self, rows: dict[int, dict[int, float]], n_pos: int = 11) -> None:
        super().__init__()
        table = torch.zeros(n_pos, V)  # unset rows: uniform
        for pos, probs in rows.items():
            table[pos] = torch.full((V,), -1e4)
            for token, p in probs.items():
                table[pos, token] = math.log(p)
        self.register_buffer("table", table)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[: ids.shape[1]].expand(ids.shape[0], -1, -1)


# answers: dog -> 5 (spanish) / 6 (french) at 4; cat -> 7 8 / 9 at 7, 8; sun -> 3 / 4 at 10
TOKENS = [1, 2, 3, 4, 5, 1, 2, 7, 8, 2, 3]
ITEMS = [Item("dog", {"spanish": [5], "french": [6]}, [4]),
         Item("cat", {"spanish": [7, 8], "french": [9]}, [7, 8]),
         Item("sun", {"spanish": [3], "french": [4]}, [10])]  # fmt: skip
# the row before each answer token: start right (0.75), cat's first token wrong (0.2 vs 0.8 for
# the French 9), its second token right (0.6 vs 0.4), sun wrong (0.1 vs 0.9 for the French 4)
ROWS = {3: {5: 0.75, 6: 0.25}, 6: {7: 0.2, 9: 0.8}, 7: {8: 0.6, 0: 0.4}, 9: {3: 0.1, 4: 0.9}}


def episode(language: str = "spanish") -> Episode:
    return Episode(TOKENS, "", "symbolic", {"spanish": "X", "french": "Q"}, language, "spanish", ITEMS)


def test_start_and_continue_by_hand():
    (lp,) = log_probs(Table(ROWS), [TOKENS])
    got = score_episode(lp, episode())
    assert got["start_acc"] == 1.0
    assert got["start_logprob"] == pytest.approx(math.log(0.75), abs=1e-5)
    assert got["continue_acc"] == pytest.approx(1 / 3)  # cat's 1st token 0, its 2nd 1, sun's 0
    assert got["continue_logprob"] == pytest.approx((math.log(0.2) + math.log(0.6) + math.log(0.1)) / 3, abs=1e-5)
    assert got["continue_items_acc"] == 0.0
    assert got["continue_tokens_acc"] == 1.0


def test_misdirection_by_hand():
    (lp,) = log_probs(Table(ROWS), [TOKENS])
    got = score_misdirected(lp, episode(language="french"))  # label says French, answers written in Spanish
    assert got == {"start_follows_label": 0.0, "continue_follows_label": 1.0}
    with pytest.raises(ValueError, match="needs a misdirected prompt"):
        score_misdirected(lp, episode())


def test_report_per_set_with_intervals():
    report = start_vs_continue(Table(ROWS), {"symbolic": [episode()] * 3, "misdirected": [episode("french")] * 2})
    assert report["symbolic"]["start_acc"] == {"mean": 1.0, "low": 1.0, "high": 1.0, "n": 3}
    assert report["symbolic"]["continue_acc"]["mean"] == pytest.approx(1 / 3)
    assert report["misdirected"]["continue_follows_label"]["mean"] == 1.0
    with pytest.raises(ValueError, match="mix misdirected and plain"):
        start_vs_continue(Table(ROWS), {"x": [episode(), episode("french")]})


def test_bootstrap_interval():
    got = bootstrap([1, 0, 1, 1, float("nan")], n_boot=2000, seed=0)
    assert got["mean"] == 0.75 and got["n"] == 4
    assert 0.0 <= got["low"] < 0.75 < got["high"] <= 1.0
    assert bootstrap([1, 0, 1, 1], n_boot=2000, seed=0) == got  # the NaN left out, same draws


def test_a_hugging_face_model_batched_as_one_by_one():
    import transformers as T

    words, _ = usable_words(load_words(), tok := word_tokenizer(load_words()))
    eps = episodes(words, tok, n=3, kind="semantic", k=2, seed=0)
    torch.manual_seed(0)
    hf = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, n_positions=64,
                                              bos_token_id=0, eos_token_id=0)).eval()
    batched = start_vs_continue(hf, {"semantic": eps}, batch_size=3)
    with torch.no_grad():
        direct = [torch.log_softmax(hf(torch.tensor([e.tokens])).logits[0], -1) for e in eps]
    rows = [score_episode(lp, e) for lp, e in zip(direct, eps, strict=True)]
    assert batched["semantic"]["start_logprob"]["mean"] == pytest.approx(
        sum(r["start_logprob"] for r in rows) / 3, abs=1e-4)  # fmt: skip
    assert batched["semantic"]["continue_acc"]["mean"] == pytest.approx(sum(r["continue_acc"] for r in rows) / 3)
