"""Loss weights by a target's place in its segment (``target_weights``, issue 23 item 3):
the weighted loss against a hand computation, weight 1 reproducing the plain run bit for
bit, the per-trace normalisation, dense checkpoints, and bad input refused before anything
is written."""

from __future__ import annotations

import pytest
import torch

from mechlab.cli import main
from mechlab.tasks.lds import OBS, OPEN
from mechlab.train import TrainConfig, Trainer, masked_mse, resolve_config, train
from mechlab.train.task import LDSTask, after_offsets, target_weight_mask
from mechlab.train.trainer import batch_generator

torch.set_num_threads(1)

TASK = {"d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
        "n_train_systems": 100, "n_test_systems": 20}  # fmt: skip
MODEL = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2}


def cfg_of(**fields) -> TrainConfig:
    base = dict(task_cfg=TASK, model=MODEL, steps=6, batch_size=12, eval_haystack=2, eval_seg_len=4,
                eval_traces=16, eval_every=0, n_checkpoints=0, log_every=1)  # fmt: skip
    return TrainConfig(**{**base, **fields})


def offsets_by_hand(kind: torch.Tensor) -> list[list[int]]:
    """Offset of every target (token i + 1), walking each trace token by token."""
    out = []
    for row in kind.tolist():
        since, offs = None, []
        for k in row:
            if k == OPEN:
                since = 0
            elif k == OBS and since is not None:
                since += 1
            offs.append(since if k == OBS and since is not None else 0)
        out.append(offs[1:])
    return out


@pytest.mark.parametrize("norm", ["none", "trace"])
def test_the_weighted_loss_equals_a_hand_computation(norm):
    task = LDSTask(TASK)
    from mechlab.tasks.lds import sample_batch

    b = sample_batch(task.cfg, task.train_lib, 16, torch.Generator().manual_seed(3))
    weights = {1: 4.0, 3: 0.5}
    hand = offsets_by_hand(b.kind)
    assert after_offsets(b.kind).tolist() == hand
    assert any(1 in row for row in hand) and any(3 in row for row in hand)
    pred = torch.randn(b.targets.shape, generator=torch.Generator().manual_seed(4))
    total, count = 0.0, 0
    for i in range(len(b)):
        w_row = [weights.get(hand[i][p], 1.0) for p in range(len(hand[i])) if b.mask[i, p]]
        scale = len(w_row) / sum(w_row) if norm == "trace" and w_row else 1.0
        for p in range(b.mask.shape[1]):
            if b.mask[i, p]:
                sq = ((pred[i, p] - b.targets[i, p]) ** 2).mean().item()
                total += weights.get(hand[i][p], 1.0) * scale * sq
                count += 1
    w = target_weight_mask(b.kind, b.mask, weights, norm)
    assert masked_mse(pred, b.targets, w).item() == pytest.approx(total / count, rel=1e-5)
    if norm == "trace":  # the same total weight per trace as the plain loss
        assert torch.allclose(w.sum(1), b.mask.sum(1).float(), rtol=1e-5)
    # The trainer's batch carries exactly these weights.
    weighted = LDSTask(TASK, target_weights=weights, target_weight_norm=norm)
    _, _, w_task = weighted.batch(16, torch.Generator().manual_seed(3))
    assert torch.equal(w_task, w)


@pytest.mark.parametrize("norm", ["none", "trace"])
def test_weight_one_reproduces_the_plain_run_bit_for_bit(tmp_path, norm):
    plain = train(cfg_of(), tmp_path / "plain", progress=False)
    ones = train(cfg_of(target_weights={"1-after": 1, "2-after": 1.0}, target_weight_norm=norm),
                 tmp_path / "ones", progress=False)  # fmt: skip
    assert (tmp_path / "plain" / "metrics.jsonl").exists()
    a = torch.load(plain.last_checkpoint, weights_only=True)["state_dict"]
    b = torch.load(ones.last_checkpoint, weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert plain.final_loss == ones.final_loss


def test_a_weight_changes_the_step_as_the_weighted_loss_says(tmp_path):
    cfg = cfg_of(target_weights={"1-after": 16}, grad_clip=0.0)
    trainer = Trainer(cfg, tmp_path / "w", progress=False)
    inputs, targets, w = trainer.task.batch(cfg.batch_size, batch_generator(cfg.seed, 1))
    assert w.max().item() == 16.0 and w.dtype == torch.float32
    reference = Trainer(cfg_of(grad_clip=0.0), tmp_path / "p", progress=False)
    reference.model.load_state_dict(trainer.model.state_dict())
    # Independent loss: the plain batch's mask, weights from the hand-made offsets.
    _, _, mask = reference.task.batch(cfg.batch_size, batch_generator(cfg.seed, 1))
    from mechlab.tasks.lds import sample_batch

    kind = sample_batch(reference.task.cfg, reference.task.train_lib, cfg.batch_size,
                        batch_generator(cfg.seed, 1)).kind  # fmt: skip
    weights = torch.tensor([[16.0 if o == 1 else 1.0 for o in row] for row in offsets_by_hand(kind)]) * mask
    pred = reference.model(inputs)
    expected = ((pred - targets).pow(2).sum(-1) * weights).sum() / mask.sum()
    expected.backward()
    loss = trainer.train_step(1)
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    for (name, p), q in zip(trainer.model.named_parameters(), reference.model.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7), name


def test_dense_checkpoints_are_named_by_step(tmp_path):
    train(cfg_of(steps=10, checkpoint_every=4, n_checkpoints=2), tmp_path / "r", progress=False)
    names = sorted(p.name for p in (tmp_path / "r" / "checkpoints").glob("step_*.pt"))
    assert names == ["step_0000000.pt", "step_0000001.pt", "step_0000004.pt", "step_0000008.pt", "step_0000010.pt"]


def test_the_weights_are_locked_on_resume(tmp_path):
    train(cfg_of(steps=3, target_weights={"1-after": 4}), tmp_path / "r", progress=False)
    with pytest.raises(ValueError, match="target_weights.*cannot change"):
        Trainer(cfg_of(steps=6, target_weights={"1-after": 8}), tmp_path / "r", progress=False).run(resume=True)


def test_overrides_reach_into_target_weights():
    cfg = resolve_config(preset="recall-cpu", overrides=["target_weights.1-after=4", "target_weight_norm=trace"])
    assert cfg.target_weights == {"1-after": 4.0} and cfg.target_weight_norm == "trace"
    assert resolve_config(preset="recall-cpu", overrides=["target_weights={1-after: 16}"]).target_weights == {
        "1-after": 16.0
    }


@pytest.mark.parametrize(
    "sets, phrase",
    [
        (["target_weights.1-after=0"], "must be a finite number > 0"),
        (["target_weights.1-after=-2"], "must be a finite number > 0"),
        (["target_weights.1-after=.nan"], "must be a finite number > 0"),
        (["target_weights.1-after=.inf"], "must be a finite number > 0"),
        (["target_weights.1-after=yes"], "must be a number, got True"),  # YAML 1.1: yes is a bool
        (["target_weights.0-after=4"], "unknown target '0-after'"),
        (["target_weights.label=4"], "unknown target 'label'"),
        (["target_weights.62-after=4"], "no training target is 62-after"),
        (["target_weights.1-after=4", "target_weight_norm=total"], "unknown target_weight_norm"),
        (["target_weights.1-after=4", "steps=0"], "steps must be positive"),
    ],
)
def test_bad_weights_are_refused_in_one_line_before_anything_is_written(tmp_path, capsys, sets, phrase):
    out = tmp_path / "run"
    args = ["train", "--preset", "recall-cpu", "--out", str(out), "--no-progress"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert phrase in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_a_task_without_observation_targets_refuses_weights(tmp_path, capsys):
    out = tmp_path / "st"
    assert main(["train", "--preset", "state-tracking-cpu", "--out", str(out), "--no-progress",
                 "--set", "target_weights.1-after=4"]) == 2  # fmt: skip
    assert "target_weights weigh the lds task" in capsys.readouterr().err
    assert not out.exists()
