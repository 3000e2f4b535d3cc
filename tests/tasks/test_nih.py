"""mechlab.nih: analysis-ready needle-in-a-haystack traces on a checkpoint's own task."""

from pathlib import Path

import pytest
import torch

import mechlab
from mechlab.tasks import LDSConfig, task_config

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "checkpoints" / "recall-cpu" / "last.pt"
CFG = LDSConfig(
    d_state=3, n_pairs=6, n_ctx=48, zipf_a=0.0, min_systems=2, max_systems=4,
    n_train_systems=50, n_test_systems=20,
)  # fmt: skip


@pytest.fixture(scope="module")
def bundled():
    return mechlab.load_checkpoint(BUNDLED)


def test_checkpoint_exposes_its_task_and_nih_uses_the_runs_eval_settings(bundled):
    assert bundled.task == "lds"
    assert bundled.task_config == LDSConfig.from_dict(bundled.metadata["task_cfg"])
    t = mechlab.nih(bundled, n_traces=8)
    train_cfg = bundled.metadata["train_cfg"]
    assert (t.n_haystack, t.seg_len) == (train_cfg["eval_haystack"], train_cfg["eval_seg_len"])
    assert t.clean.shape == (8, t.n_pos, bundled.config.d_in)
    assert t.n_pos == (t.seg_len + 2) * (t.n_haystack + 1)  # tokens minus one
    assert t.offsets == (1, 2, 3) and t.positions.tolist() == [t.target_index(k) for k in (1, 2, 3)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_truth_at_k_after_is_the_query_systems_continuation(seed):
    t = mechlab.nih(CFG, n_traces=16, n_haystack=3, seg_len=5, seed=seed, probe=None)
    assert t.corrupted is None and t.corrupted_batch is None
    S = t.seg_len
    for b in range(len(t)):
        q = int(t.query[b])
        U = t.library.U[t.systems[b, q]].double()
        x0 = t.clean_batch.x0[b, q].double()
        for k in range(1, S + 1):
            expected = torch.linalg.matrix_power(U, S + k - 1) @ x0  # trajectory index S+k-1
            torch.testing.assert_close(t.truth[b, t.target_index(k)].double(), expected, atol=1e-5, rtol=0)
        # the query label shown at p is the query slot's label
        label = int(t.slot_labels[b, q])
        assert t.clean[b, t.query_position, CFG.open_dim(label)] > 1.0


@pytest.mark.parametrize("seed", [0, 1])
def test_misdirection_changes_only_the_query_label_and_points_at_the_other_slot(seed):
    t = mechlab.nih(CFG, n_traces=32, n_haystack=3, seg_len=5, seed=seed)
    differs = (t.clean != t.corrupted).any(-1)  # [batch, pos]
    assert differs[:, t.query_position].all()
    differs[:, t.query_position] = False
    assert not differs.any()
    assert (t.other != t.query).all()
    shown = t.corrupted_batch.label[:, t.query_position]
    torch.testing.assert_close(shown, t.slot_labels.gather(1, t.other[:, None]).squeeze(1))
    torch.testing.assert_close(t.corrupted_truth, t.truth)  # observations stay the true ones


def test_restart_probe_changes_the_continuation_not_the_label():
    t = mechlab.nih(CFG, n_traces=16, n_haystack=3, seg_len=5, probe="misdirect_restart")
    p = t.query_position
    torch.testing.assert_close(t.corrupted[:, : p + 1], t.clean[:, : p + 1])
    assert not torch.allclose(t.corrupted_truth[:, p], t.truth[:, p])


def test_errors_and_to():
    t = mechlab.nih(CFG, n_traces=4, n_haystack=2, seg_len=4, offsets=(1, 4))
    pred = torch.randn(*t.truth.shape)
    expected = (pred[:, [t.target_index(1), t.target_index(4)]] - t.truth[:, t.positions]).pow(2).sum(-1)
    torch.testing.assert_close(t.errors(pred), expected)
    moved = t.to("cpu")
    assert moved.clean_batch.tokens.device.type == "cpu" and moved.library.U.shape == t.library.U.shape
    with pytest.raises(ValueError, match="do not match"):
        t.errors(pred[:, :-1])


def test_bad_input_is_one_line_valueerror(bundled, tmp_path):
    with pytest.raises(ValueError, match="unknown probe"):
        mechlab.nih(CFG, 4, probe="nonsense")
    with pytest.raises(ValueError, match="takes a checkpoint"):
        mechlab.nih({"d_state": 3}, 4)
    with pytest.raises(ValueError, match="offsets must be"):
        mechlab.nih(CFG, 4, n_haystack=2, seg_len=4, offsets=(5,))
    with pytest.raises(ValueError, match="offset k must be"):
        mechlab.nih(CFG, 4, n_haystack=2, seg_len=4).target_index(5)
    model = mechlab.build_model({"arch": "lstm", "d_model": 8, "d_in": CFG.d_in, "d_out": 3, "n_ctx": 48})
    path = mechlab.save_checkpoint(model, tmp_path / "no_task.pt", step=0)
    ckpt = mechlab.load_checkpoint(path)
    assert ckpt.task is None
    with pytest.raises(ValueError, match="no task metadata") as err:
        mechlab.nih(ckpt, 4)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="does not know"):
        task_config({"task": "parity", "task_cfg": {}})


# --------------------------------------------------------------- sizes before work (issue 19)


def test_a_trillion_nih_traces_are_refused_before_anything_is_drawn(bundled):
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"n_traces 1e\+12 x positions") as err:
        mechlab.nih(bundled, n_traces=10**12)
    assert time.perf_counter() - start < 1.0  # the test library is built first (tens of ms)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fields", [{"n_pairs": 10**12}, {"n_pairs": 10**12, "max_systems": 3}, {"n_ctx": 10**9}])
def test_a_checkpoints_task_config_too_big_to_allocate_is_refused_naming_the_file(fields):
    # Issue 19: an old-format checkpoint (no checksum, so its metadata can be edited) whose
    # task config asks n_pairs = 1e12 ended in a traceback.
    metadata = {"task": "lds", "task_cfg": {**CFG.to_dict(), **fields}}
    with pytest.raises(ValueError) as err:
        task_config(metadata, "old.pt")
    message = str(err.value)
    assert message.startswith("checkpoint 'old.pt' records an unusable lds task_cfg: ") and "\n" not in message
