"""collect_activations: one big forward and the cache agree, the mode is restored, bad input refused."""

import pytest
import torch

import mechlab
from mechlab.probes import (
    collect_activations,
    default_hooks,
)
from tests.probes.helpers import CFG, tiny_transformer, traces


def test_collect_activations_matches_one_big_forward_and_restores_the_mode():
    model = tiny_transformer()
    model.train()
    x = traces(7).clean
    hooks = ["blocks.1.hook_resid_post", "blocks.0.attn.hook_pattern"]
    acts = collect_activations(model, x, hooks, positions=[3, -1], batch_size=3, progress=False)
    assert model.training
    model.eval()
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    torch.testing.assert_close(acts[hooks[0]], cache[hooks[0]][:, [3, x.shape[1] - 1]])
    torch.testing.assert_close(acts[hooks[1]], cache[hooks[1]][:, :, [3, x.shape[1] - 1]])
    assert not acts[hooks[0]].requires_grad
    full = collect_activations(model, x, hooks[0], progress=False)[hooks[0]]
    torch.testing.assert_close(full, cache[hooks[0]])


FAMILIES = {
    "lstm": ({"d_hidden": 6}, "blocks.1.lstm.hook_h"),
    "dense_ssm": ({"d_state": 4}, "blocks.1.ssm.hook_h"),
    "mamba": ({"d_state": 3, "expand": 2}, "blocks.1.mixer.hook_ssm_state"),
}


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_collect_activations_on_recurrent_families_matches_the_cache(arch):
    extra, step_hook = FAMILIES[arch]
    torch.manual_seed(0)
    model = mechlab.build_model(
        arch, d_model=8, n_layers=2, d_in=CFG.d_in, d_out=CFG.d_state, n_ctx=CFG.n_ctx, **extra
    )
    x = traces(5).clean
    hooks = [*default_hooks(model), step_hook]
    acts = collect_activations(model, x, hooks, positions=[0, 7, 20], batch_size=2, progress=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    for hook in hooks:  # per-time-step states: the whole trajectory, cut to the positions
        torch.testing.assert_close(acts[hook], cache[hook][:, [0, 7, 20]])


def test_collect_activations_rejects_bad_input():
    model, x = tiny_transformer(), traces(4).clean
    with pytest.raises(ValueError, match="unknown hook 'blocks.0.hook_resid_pots'; did you mean"):
        collect_activations(model, x, "blocks.0.hook_resid_pots", progress=False)
    with pytest.raises(ValueError, match="out of range"):
        collect_activations(model, x, "hook_embed", positions=[x.shape[1]], progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        collect_activations(model, x, "hook_embed", batch_size=0, progress=False)
    with pytest.raises(ValueError, match="hooks is empty"):
        collect_activations(model, x, [], progress=False)
