"""Attention-pattern scores against a direct loop over the cached patterns, on a random model
and on one whose heads are set to attend to the previous token or the induction target."""

import pytest
import torch

from mechlab.evals.induction import head_scores, induction_chains, induction_edges, recovered_roles
from mechlab.models import build_model
from mechlab.tasks.induction import InductionConfig, sample_sequences

torch.set_num_threads(1)
CFG = InductionConfig(d_vocab=24, n_ctx=15, min_repeat=2, max_repeat=7)


def model(n_layers=2, n_heads=3):
    torch.manual_seed(0)
    return build_model("transformer", d_model=24, n_layers=n_layers, n_heads=n_heads, attn_only=True,
                       io="tokens", d_vocab=CFG.d_vocab, n_ctx=CFG.n_ctx).eval()  # fmt: skip


def test_scores_are_the_mean_attention_on_the_two_diagonals():
    m = model()
    seqs = sample_sequences(CFG, 20, torch.Generator().manual_seed(3))
    scores = head_scores(m, CFG, sequences=seqs)
    with torch.no_grad():
        _, cache = m.run_with_cache(seqs.tokens)
    for layer in range(2):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        for head in range(3):
            prev, ind = [], []
            for b in range(20):
                n = int(seqs.first_len[b])
                prev += [pattern[b, head, t, t - 1] for t in range(1, CFG.n_ctx)]
                ind += [pattern[b, head, t, t - n + 1] for t in range(n + 1, CFG.n_ctx - 1)]
            assert scores.previous_token[layer, head] == pytest.approx(float(torch.stack(prev).mean()), abs=1e-6)
            assert scores.induction[layer, head] == pytest.approx(float(torch.stack(ind).mean()), abs=1e-6)
    assert scores.to_dict()["induction"] == scores.induction.tolist()


def test_a_head_made_to_attend_back_one_scores_one():
    m = model(n_layers=1, n_heads=2)
    seqs = sample_sequences(CFG, 8, torch.Generator().manual_seed(4))

    def previous_only(scores, hook):  # [batch, head, q, k]: head 1 attends to q - 1
        forced = torch.full_like(scores[:, 1], -1e9)
        q = torch.arange(1, scores.shape[-1])
        forced[:, q, q - 1] = 0.0
        forced[:, 0, 0] = 0.0
        scores[:, 1] = forced
        return scores

    m.add_hook("blocks.0.attn.hook_attn_scores", previous_only)
    try:
        scores = head_scores(m, CFG, sequences=seqs)
    finally:
        m.reset_hooks()
    assert scores.previous_token[0, 1] == pytest.approx(1.0, abs=1e-6)
    assert scores.top("previous_token", 0) == (1, pytest.approx(1.0, abs=1e-6))
    assert scores.previous_token[0, 0] < 0.9


def test_roles_name_the_textbook_edges():
    edges = induction_edges(2, 1)
    assert edges == {"previous_value": ("embed", "a0.h2.v"), "key": ("a0.h2", "a1.h1.k"),
                     "query": ("embed", "a1.h1.q"), "value": ("embed", "a1.h1.v"),
                     "output": ("a1.h1", "out")}  # fmt: skip
    found = recovered_roles([("a0.h2", "a1.h1.k"), ("a1.h1", "out"), ("embed", "a1.h0.v")], 2, 1)
    assert found == {"previous_value": False, "key": True, "query": False, "value": False, "output": True}
    both = [*induction_edges(2, 1).values(), *induction_edges(2, 3).values(), ("a0.h1", "a1.h0.k")]
    assert induction_chains(both, 2, n_heads=4) == [1, 3]
    shared = ("embed", "a0.h2.v")  # the previous-token head's value: both chains need it
    assert induction_chains([e for e in both if e != shared], 2, n_heads=4) == []


def test_scores_need_a_transformer():
    lstm = build_model("lstm", d_model=8, io="tokens", d_vocab=CFG.d_vocab, n_ctx=CFG.n_ctx)
    with pytest.raises(ValueError, match="need a mechlab transformer"):
        head_scores(lstm, CFG)
    with pytest.raises(ValueError, match="unknown score"):
        head_scores(model(), CFG, n_sequences=2).top("copying", 0)
