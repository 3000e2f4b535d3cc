"""Shared fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module's tests (pruning and training runs are timed and
    seeded; one thread keeps them fast on a shared machine), restored afterwards.
    Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TINY_LDS_TASK = {"d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
                 "n_train_systems": 60, "n_test_systems": 30}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_lds_checkpoint(tmp_path_factory):
    """An untrained 2-layer, 2-head transformer saved as a checkpoint of the lds task (with
    the run's evaluation haystack: 2 systems of 4 observations)."""
    from mechlab.checkpoint import save_checkpoint
    from mechlab.models import build_model

    torch.manual_seed(0)
    model = build_model({"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2,
                         "io": "continuous", "d_in": 2 * 4 + 2 + 3, "d_out": 3, "n_ctx": 24})  # fmt: skip
    path = tmp_path_factory.mktemp("ckpt") / "lds.pt"
    save_checkpoint(model, path, task="lds", task_cfg=TINY_LDS_TASK,
                    train_cfg={"eval_haystack": 2, "eval_seg_len": 4})  # fmt: skip
    return path
