"""The induction task: the sequences' form, the scored positions, the config's refusals,
the pruning traces of both corruptions, and the trainer's task."""

import pytest
import torch

from mechlab.models import build_model
from mechlab.tasks import TASK_CONFIGS, task_config
from mechlab.tasks.induction import BOS, InductionConfig, batch, sample_sequences, validation_set
from mechlab.tasks.induction_prune import induction_prune_data
from mechlab.train.task import make_task

torch.set_num_threads(1)


@pytest.mark.parametrize("distinct", [True, False])
def test_sequences_are_random_tokens_then_a_repeat_of_their_beginning(distinct):
    cfg = InductionConfig(d_vocab=40, n_ctx=21, min_repeat=3, max_repeat=10, distinct=distinct)
    seqs = sample_sequences(cfg, 300, torch.Generator().manual_seed(0))
    T = cfg.n_ctx
    assert seqs.tokens.shape == (300, T) and (seqs.tokens[:, 0] == BOS).all()
    repeats = T - 1 - seqs.first_len
    assert repeats.min() == 3 and repeats.max() == 10  # both ends drawn in 300 sequences
    for row, n in zip(seqs.tokens.tolist(), seqs.first_len.tolist(), strict=True):
        first, again = row[1 : n + 1], row[n + 1 :]
        assert again == first[: len(again)]
        assert all(1 <= t < cfg.d_vocab for t in row[1:])
        if distinct:
            assert len(set(first)) == n
    # scored: the repeat's positions whose next token is in the sequence
    pos = torch.arange(T)
    expected = (pos[None] >= seqs.first_len[:, None] + 1) & (pos[None] <= T - 2)
    assert torch.equal(seqs.scored, expected)
    rows, cols = seqs.scored.nonzero(as_tuple=True)
    target = seqs.targets[rows, cols]
    earlier = seqs.tokens[rows, cols - seqs.first_len[rows] + 1]  # after the first occurrence
    assert torch.equal(target, earlier) and torch.equal(target, seqs.tokens[rows, cols + 1])
    inputs, targets, mask = batch(cfg, 4, torch.Generator().manual_seed(1))
    assert inputs.shape == targets.shape == mask.shape == (4, T) and (targets[:, -1] == -100).all()


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"min_repeat": 1}, "min_repeat must be at least 2"),
        ({"max_repeat": 17}, r"max_repeat <= \(n_ctx - 1\) // 2 = 16"),
        ({"min_repeat": 9, "max_repeat": 8}, "min_repeat <= max_repeat"),
        ({"d_vocab": 20}, "distinct tokens .* do not fit d_vocab=20"),
        ({"d_vocab": 2}, "d_vocab must be at least 3"),
        ({"n_ctx": 33.0}, "n_ctx must be an integer"),
        ({"distinct": "yes"}, "distinct must be true or false"),
    ],
)
def test_config_refuses_what_cannot_be_drawn(fields, match):
    with pytest.raises(ValueError, match=match):
        InductionConfig(**fields)
    with pytest.raises(ValueError, match=r"unknown InductionConfig field\(s\) \['half'\]"):
        InductionConfig.from_dict({"half": 16})


def test_checkpoint_metadata_names_the_task():
    assert TASK_CONFIGS["induction"] is InductionConfig
    cfg = task_config({"task": "induction", "task_cfg": {"n_ctx": 25, "max_repeat": 12}})
    assert cfg == InductionConfig(n_ctx=25, max_repeat=12)


def test_prune_data_are_clean_draws_and_independent_corruptions():
    cfg = InductionConfig(d_vocab=30, n_ctx=17, min_repeat=3, max_repeat=8)
    data = induction_prune_data(cfg, n_train=64, n_test=32, seed=2)
    assert len(data.train) == 64 and len(data.test) == 32 and data.info["corruption"] == "resample"
    tr = data.train
    assert torch.equal(tr.truth[:, :-1], tr.inputs[:, 1:])
    # observed = the clean traces' predictable positions: the repeat starts after n
    n = (~tr.observed).cumprod(1).sum(1) - 1
    rows = torch.arange(64)
    assert torch.equal(tr.inputs[rows, n + 1], tr.inputs[rows, 1])
    assert torch.equal(tr.observed, (tr.truth != -100) & tr.observed)
    # the corruption is another draw: other tokens, the repeat elsewhere in most traces
    assert (tr.inputs[:, 1:] != tr.corrupted[:, 1:]).float().mean() > 0.8
    assert (tr.corrupted[rows, n + 1] == tr.corrupted[rows, 1]).float().mean() < 0.5
    again = induction_prune_data(cfg, n_train=64, n_test=32, seed=2)
    assert torch.equal(again.train.corrupted, tr.corrupted)  # seeded
    assert not torch.equal(data.test.inputs[:32], tr.inputs[:32])  # held-out traces differ
    with pytest.raises(ValueError, match="unknown corruption 'shuffle'"):
        induction_prune_data(cfg, corruption="shuffle")
    with pytest.raises(ValueError, match="n_train must be a positive integer"):
        induction_prune_data(cfg, n_train=0)


def test_trainer_task_fixes_the_model_fields_and_evaluates():
    task = make_task("induction", {"d_vocab": 20, "n_ctx": 13, "min_repeat": 2, "max_repeat": 6, "n_val": 16})
    fields = task.model_fields()
    assert fields == {"io": "tokens", "d_vocab": 20, "d_vocab_out": 20, "n_ctx": 13}
    torch.manual_seed(0)
    model = build_model({"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2,
                         "attn_only": True, **fields}).eval()  # fmt: skip
    inputs, targets, mask = task.batch(8, torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss = task.loss(model(inputs), targets, mask)
        logp = torch.log_softmax(model(inputs), -1)
    direct = -logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0][mask].mean()
    assert float(loss) == pytest.approx(float(direct), rel=1e-5)

    class Settings:
        eval_traces = 8

    out = task.evaluate(model, Settings(), torch.Generator())
    assert set(out) == {"val_loss", "val_accuracy", "previous_token_score", "induction_score"}
    val = validation_set(task.cfg)
    assert len(val) == 16 and out["val_loss"] > 1.0  # an untrained model is near chance (log 19)
