"""The study's training settings: the loss summed over state dims, gradient accumulation,
the presets' choices, and recall-cpu kept on its own (mean) loss."""

from __future__ import annotations

import pytest
import torch

from mechlab.train import TrainConfig, Trainer, masked_mse, resolve_config
from mechlab.train.trainer import batch_generator

torch.set_num_threads(1)

TASK = {"d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
        "n_train_systems": 100, "n_test_systems": 20}  # fmt: skip
MODEL = {"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2}


def cfg_of(**fields) -> TrainConfig:
    base = dict(task_cfg=TASK, model=MODEL, steps=4, batch_size=12, eval_haystack=2,
                eval_seg_len=4, eval_traces=16, eval_every=0, n_checkpoints=0)  # fmt: skip
    return TrainConfig(**{**base, **fields})


def test_sum_reduction_is_the_squared_error_summed_over_dims_by_hand():
    g = torch.Generator().manual_seed(1)
    pred, targets = torch.randn(2, 4, 3, generator=g), torch.randn(2, 4, 3, generator=g)
    mask = torch.tensor([[True, False, True, True], [False, True, False, False]])
    rows = [((pred[b, p] - targets[b, p]) ** 2).sum().item()
            for b in range(2) for p in range(4) if mask[b, p]]  # fmt: skip
    assert masked_mse(pred, targets, mask, "sum").item() == pytest.approx(sum(rows) / len(rows), rel=1e-6)
    assert masked_mse(pred, targets, mask, "sum").item() == pytest.approx(
        3 * masked_mse(pred, targets, mask).item(), rel=1e-6
    )
    # A micro-batch divided by the whole batch's count: the parts add up to the whole.
    n = mask.sum()
    parts = [masked_mse(pred[i : i + 1], targets[i : i + 1], mask[i : i + 1], "sum", n) for i in range(2)]
    assert (parts[0] + parts[1]).item() == pytest.approx(masked_mse(pred, targets, mask, "sum").item(), rel=1e-6)
    with pytest.raises(ValueError, match="unknown reduction"):
        masked_mse(pred, targets, mask, "max")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grad_accum_equals_one_batch_k_times_larger(tmp_path, seed):
    whole = Trainer(cfg_of(seed=seed, grad_clip=0.0), tmp_path / "a", progress=False)
    accum = Trainer(cfg_of(seed=seed, grad_clip=0.0, grad_accum=3), tmp_path / "b", progress=False)
    accum.model.load_state_dict(whole.model.state_dict())
    loss_whole, loss_accum = whole.train_step(1), accum.train_step(1)
    assert loss_accum == pytest.approx(loss_whole, rel=1e-5)
    for (name, p), q in zip(whole.model.named_parameters(), accum.model.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-7), name
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), name


def test_sum_scales_the_gradient_by_d_so_clipping_acts(tmp_path):
    mean = Trainer(cfg_of(loss_reduction="mean", grad_clip=0.0, lr=1e-12), tmp_path / "m", progress=False)
    summ = Trainer(cfg_of(loss_reduction="sum", grad_clip=0.0, lr=1e-12), tmp_path / "s", progress=False)
    summ.model.load_state_dict(mean.model.state_dict())
    lm, ls = mean.train_step(1), summ.train_step(1)
    assert ls == pytest.approx(3 * lm, rel=1e-5)  # d_state = 3
    norm = lambda t: torch.cat([p.grad.flatten() for p in t.model.parameters()]).norm()  # noqa: E731
    assert norm(summ).item() == pytest.approx(3 * norm(mean).item(), rel=1e-4)


def test_mean_step_is_the_plain_adamw_step_of_the_mean_loss(tmp_path):
    """recall-cpu's loss: one step equals AdamW on masked_mse (mean over dims) by hand."""
    cfg = cfg_of(loss_reduction="mean", lr=1e-3)
    trainer = Trainer(cfg, tmp_path / "t", progress=False)
    ref = Trainer(cfg, tmp_path / "r", progress=False).model
    ref.load_state_dict(trainer.model.state_dict())
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    inputs, targets, mask = trainer.task.batch(12, batch_generator(cfg.seed, 1))
    pred = ref(inputs)
    loss = ((pred - targets) ** 2).mean(-1)[mask].mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    opt.step()
    assert trainer.train_step(1) == pytest.approx(loss.item(), rel=1e-6)
    for p, q in zip(trainer.model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-7)


def test_presets_carry_the_studys_loss_and_the_medium_batch():
    for name in ("tiny", "small", "medium", "big"):
        assert resolve_config(preset=name).loss_reduction == "sum"
    medium = resolve_config(preset="medium")
    assert (medium.batch_size, medium.grad_accum) == (1536, 3)
    cpu = resolve_config(preset="recall-cpu")
    assert (cpu.loss_reduction, cpu.grad_accum, cpu.batch_size) == ("mean", 1, 64)
    assert TrainConfig().loss_reduction == "sum"  # the trainer's default is the study's


def test_bad_settings_raise_one_line_errors():
    with pytest.raises(ValueError, match="batch_size=10 is not a multiple of grad_accum=3"):
        TrainConfig(batch_size=10, grad_accum=3)
    with pytest.raises(ValueError, match="grad_accum must be positive"):
        TrainConfig(grad_accum=0)
    with pytest.raises(ValueError, match="unknown loss_reduction 'avg'"):
        TrainConfig(loss_reduction="avg")
    with pytest.raises(ValueError, match="grad_accum must be an integer"):
        resolve_config(overrides=["grad_accum=1.5"])


def test_resuming_a_run_saved_before_loss_reduction_existed(tmp_path):
    """Old checkpoints hold no loss_reduction: they were trained with the mean."""
    cfg = cfg_of(loss_reduction="mean", steps=2, save_every=1)
    Trainer(cfg, tmp_path, progress=False).run()
    from mechlab.checkpoint import load_checkpoint, save_checkpoint

    old = load_checkpoint(tmp_path / "last.pt")
    train_cfg = {k: v for k, v in old.metadata["train_cfg"].items() if k not in ("loss_reduction", "grad_accum")}
    save_checkpoint(old.model, tmp_path / "last.pt", step=old.step, task="lds",
                    task_cfg=old.metadata["task_cfg"], train_cfg=train_cfg)  # fmt: skip
    with pytest.raises(ValueError, match="loss_reduction' was 'mean' in the run, now 'sum'"):
        Trainer(cfg_of(steps=3), tmp_path, progress=False).resume()
    resumed = Trainer(cfg_of(loss_reduction="mean", steps=3), tmp_path, progress=False)
    resumed.resume()
    assert resumed.step == 2
