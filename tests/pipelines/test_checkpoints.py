"""mechlab.pipelines.checkpoints: a model with a NaN or infinite parameter is refused, in
one line naming the first such parameter, when it is opened for an analysis (before any
work, before any file is written)."""

from __future__ import annotations

import pytest
import torch

from mechlab.checkpoint import load_checkpoint
from mechlab.pipelines import open_checkpoint, prune_targets
from mechlab.pipelines.checkpoints import check_finite_parameters

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def nan_checkpoint(tiny_lds_checkpoint):
    """The tiny checkpoint opened, then two weights of its model made NaN and inf (as a
    checkpoint loaded with allow_non_finite=True would hold them)."""
    ckpt = load_checkpoint(tiny_lds_checkpoint)
    with torch.no_grad():
        ckpt.model.blocks[1].mlp.W_out.view(-1)[:2] = torch.tensor([float("nan"), float("inf")])
    return ckpt


def test_an_opened_checkpoint_with_non_finite_weights_is_refused_naming_the_parameter(
    nan_checkpoint,
):
    with pytest.raises(ValueError) as err:
        open_checkpoint(nan_checkpoint)
    message = str(err.value)
    assert "\n" not in message
    assert (
        "lds.pt' holds non-finite weights: parameter 'blocks.1.mlp.W_out' has 2 NaN/inf value(s)"
        in message
    )


def test_the_first_bad_parameter_is_named_and_a_healthy_model_passes(tiny_lds_checkpoint):
    model = load_checkpoint(tiny_lds_checkpoint).model
    check_finite_parameters(model, "model")
    names = [name for name, _ in model.named_parameters()]
    with torch.no_grad():
        dict(model.named_parameters())[names[-1]].view(-1)[0] = float("-inf")
        dict(model.named_parameters())[names[1]].view(-1)[0] = float("nan")
    with pytest.raises(
        ValueError, match=f"model holds non-finite weights: parameter '{names[1]}' has 1 "
    ):
        check_finite_parameters(model, "model")


def test_pruning_refuses_non_finite_weights_before_any_work_or_file(
    nan_checkpoint, tmp_path, monkeypatch
):
    def pruned(*args, **kwargs):
        raise AssertionError("pruning ran on a model with non-finite weights")

    monkeypatch.setattr("mechlab.pipelines.prune.prune", pruned)
    out = tmp_path / "circuits"
    with pytest.raises(
        ValueError, match="holds non-finite weights: parameter 'blocks.1.mlp.W_out'"
    ):
        prune_targets(nan_checkpoint, ["1-after"], [0], out, steps=1, progress=False)
    assert not out.exists()
