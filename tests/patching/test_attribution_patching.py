"""attribution_patch against exact activation patching: exact where linear, ranking, sign."""

import pytest
import torch

from mechlab.patching import activation_patch, attribution_patch
from tests.patching.helpers import STEP_HOOKS, last_output, make_model, make_pair

torch.set_num_threads(1)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
@pytest.mark.parametrize("gradient_at", ["base", "clean", "corrupted"])
def test_exact_where_the_metric_is_linear_in_the_activation(direction, gradient_at):
    """ln_final.hook_normalized -> affine LayerNorm weights -> linear read-out -> linear metric."""
    model = make_model("transformer", n_layers=1)
    clean, corrupted = make_pair(seed=20)
    kw = {"hooks": "ln_final.hook_normalized", "direction": direction, "progress": False}
    exact = activation_patch(model, clean, corrupted, last_output, **kw)
    approx = attribution_patch(model, clean, corrupted, last_output, gradient_at=gradient_at, **kw)
    torch.testing.assert_close(approx.values, exact.values, atol=1e-5, rtol=0)
    assert approx.clean_metric == pytest.approx(exact.clean_metric, abs=1e-6)
    assert exact.effect[0, -1].abs() > 1e-3  # the metric's position does move


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranks_a_planted_head_first_and_agrees_in_sign(seed):
    model = make_model("transformer", seed=seed, n_layers=1)
    with torch.no_grad():
        attn = model.blocks[0].attn
        attn.W_O[0] *= 0.01  # head 0 barely writes
        attn.W_O[1] *= 10.0  # head 1 is the planted important component
        model.blocks[0].mlp.W_out *= 0.01
    clean, corrupted = make_pair(seed=seed, scale=0.3)
    kw = {"hooks": ["blocks.0.attn.hook_result", "blocks.0.hook_mlp_out"], "progress": False}
    exact = activation_patch(model, clean, corrupted, last_output, **kw)
    approx = attribution_patch(model, clean, corrupted, last_output, **kw)
    assert exact.top(1)[0][0] == "blocks.0.attn.hook_result[1]"
    assert approx.top(1)[0][0] == "blocks.0.attn.hook_result[1]"
    big = exact.effect.abs() > 0.1 * exact.effect.abs().max()
    assert (exact.effect[big].sign() == approx.effect[big].sign()).all()


@pytest.mark.parametrize("arch", sorted(STEP_HOOKS))
def test_state_hooks_match_exact_patching_for_small_corruptions(arch):
    """Per-step hooks: the gradient reaches each step through every later step."""
    model = make_model(arch)
    clean, corrupted = make_pair(seed=21, scale=0.1)
    # mamba's layer-0 state barely reaches the output at init: take layer 1's
    hook = STEP_HOOKS[arch].replace("blocks.0", "blocks.1")
    kw = {"hooks": hook, "progress": False}
    exact = activation_patch(model, clean, corrupted, last_output, **kw)
    approx = attribution_patch(model, clean, corrupted, last_output, **kw)
    scale = exact.effect.abs().max()
    assert scale > 1e-5
    assert (approx.effect - exact.effect).abs().max() < 0.15 * scale


def test_leaves_parameter_gradients_alone_and_refuses_bad_options():
    model = make_model("lstm")
    clean, corrupted = make_pair()
    attribution_patch(model, clean, corrupted, last_output, positions=[0], progress=False)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="unknown gradient_at"):
        attribution_patch(model, clean, corrupted, last_output, gradient_at="middle", progress=False)
    with pytest.raises(ValueError, match="metric must return a scalar"):
        attribution_patch(model, clean, corrupted, lambda out: out, progress=False)
