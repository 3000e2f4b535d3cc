"""`mechlab train --task induction` and `mechlab prune` on an induction checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechlab.checkpoint import load_checkpoint
from mechlab.cli import main
from mechlab.prune import Circuit

pytestmark = pytest.mark.usefixtures("one_thread")
BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "checkpoints" / "induction-cpu" / "last.pt"


def test_train_the_induction_task_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--task", "induction", "--preset", "induction-cpu", "--steps", "4",
                 "--set", "model.d_model=16", "--set", "task_cfg.n_val=8", "--set", "eval_traces=4",
                 "--no-progress", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    ckpt = load_checkpoint(out / "last.pt")
    assert ckpt.metadata["task"] == "induction" and ckpt.step == 4
    assert ckpt.model.cfg.attn_only and ckpt.model.cfg.d_vocab == 64 and ckpt.model.cfg.n_ctx == 33
    assert "induction_score" in capsys.readouterr().out


def test_prune_an_induction_checkpoint(tmp_path, capsys):
    out = tmp_path / "c"
    code = main(["prune", "--ckpt", str(BUNDLED), "--target", "all", "--sparsity", "0.9", "--steps", "5",
                 "--traces", "16", "--test-traces", "16", "--no-progress", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    circuit = Circuit.from_json(out / "all_seed0.json")
    assert circuit.metadata["data"]["task"] == "induction" and circuit.metadata["target"] == "all"
    assert circuit.metadata["checkpoint"] == str(BUNDLED)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--target", "1-after"], "target '1-after' is not one of the induction task's; use all"),
        (["--target", "all", "--corruption", "shuffle"], "unknown corruption 'shuffle'"),
        (["--target", "all", "--length", "4"], "a length applies to state-tracking checkpoints"),
    ],
)
def test_bad_induction_prune_input_is_one_line_exit_2(extra, message, tmp_path, capsys):
    out = tmp_path / "c"
    code = main(["prune", "--ckpt", str(BUNDLED), *extra, "--steps", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_prune_a_mechlab_checkpoint_on_token_id_pairs(tmp_path, capsys):
    """--ckpt with --pairs: the induction model on id pairs whose answer is the repeat's next
    token (position -2 predicts the last one); the trained model's logit difference is large."""
    import json

    import torch

    from mechlab.tasks.induction import InductionConfig, sample_sequences

    cfg = InductionConfig()
    gen = torch.Generator().manual_seed(0)
    clean, corrupted = sample_sequences(cfg, 12, gen), sample_sequences(cfg, 12, gen)
    lines = []
    for x, y in zip(clean.tokens.tolist(), corrupted.tokens.tolist(), strict=True):
        wrong = next(t for t in range(1, cfg.d_vocab) if t not in x)
        lines.append(json.dumps({"clean": x, "corrupted": y, "answer": x[-1], "wrong": wrong, "position": -2}))
    pairs = tmp_path / "repeats.jsonl"
    pairs.write_text("\n".join(lines) + "\n")
    code = main(["prune", "--ckpt", str(BUNDLED), "--pairs", str(pairs), "--sparsity", "0.9", "--steps", "5",
                 "--no-progress", "--out", str(tmp_path / "c")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    meta = Circuit.from_json(tmp_path / "c" / "repeats_seed0.json").metadata
    assert meta["model_kind"] == "checkpoint" and meta["metrics"]["logit_diff_full"] > 10
    assert meta["metrics"]["logit_diff_ablated"] < meta["metrics"]["logit_diff_full"] - 10
