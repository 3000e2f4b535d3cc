"""mechlab.pipelines: pruning a checkpoint on its own task's traces."""

import pytest
import torch

from mechlab.checkpoint import save_checkpoint
from mechlab.models import build_model
from mechlab.pipelines import prune_checkpoint

TASK_CFG = {"d_state": 3, "n_pairs": 6, "n_ctx": 40, "n_train_systems": 50, "n_test_systems": 20,
            "max_systems": 4}  # fmt: skip


@pytest.fixture
def lds_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = build_model(
        "transformer", d_model=16, n_layers=2, n_heads=2, d_in=2 * 6 + 2 + 3, d_out=3, n_ctx=40
    )
    path = tmp_path / "lds.pt"
    save_checkpoint(model, path, task="lds", task_cfg=TASK_CFG,
                    train_cfg={"eval_haystack": 3, "eval_seg_len": 5})  # fmt: skip
    bare = tmp_path / "bare.pt"
    save_checkpoint(model, bare)
    return path, bare


def test_prune_checkpoint_builds_nih_data(lds_checkpoint):
    path, _ = lds_checkpoint
    circuit = prune_checkpoint(path, "2-after", 0.9, n_train=16, n_test=16, steps=3, progress=False)
    meta = circuit.metadata
    assert len(meta["checkpoint_sha256"]) == 64
    assert meta["target"] == "2-after"
    assert meta["data"]["n_haystack"] == 3 and meta["data"]["seg_len"] == 5
    assert meta["data"]["corruption"] == "misdirect_incorrect"
    assert meta["metrics"]["n_positions"] == 16


def test_prune_checkpoint_errors(lds_checkpoint):
    path, bare = lds_checkpoint
    with pytest.raises(ValueError, match="task metadata"):
        prune_checkpoint(bare, "1-after", 0.9, steps=1, progress=False)
    with pytest.raises(ValueError, match="unknown target"):
        prune_checkpoint(path, "first", 0.9, steps=1, progress=False)
    with pytest.raises(ValueError, match="k must be"):
        prune_checkpoint(path, "6-after", 0.9, steps=1, progress=False)  # seg_len is 5
    with pytest.raises(ValueError, match="sparsity"):
        prune_checkpoint(path, "1-after", 1.0, steps=1, progress=False)
