"""path_patch against hand computations by linearity of the residual stream; backends; errors."""

import pytest
import torch

from mechlab.patching import activation_patch, path_patch
from tests.patching.helpers import last_output, make_model, make_pair

torch.set_num_threads(1)


def add_at(pos, delta):
    def hook(act, hook):
        act[:, pos] += delta
        return act

    return hook


def sender_delta(model, clean, corrupted, hook, pos, head=None):
    """Clean minus corrupted activation of the sender cell, ``[batch, d_model]``."""
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)
        _, corrupted_cache = model.run_with_cache(corrupted)
    index = (slice(None), pos) if head is None else (slice(None), pos, head)
    return (clean_cache[hook][index] - corrupted_cache[hook][index]), corrupted_cache


def test_head_to_value_input_of_a_later_head_equals_the_hand_computation():
    """Sender head 1 of layer 0 at position 2; receiver: head 0's values in layer 1."""
    model = make_model("transformer")
    clean, corrupted = make_pair(seed=10)
    pos, head, receiver_head = 2, 1, 0
    sender = "blocks.0.attn.hook_result"
    result = path_patch(
        model, clean, corrupted, last_output, receivers=("blocks.1.attn.hook_v", receiver_head),
        senders=sender, positions=[pos], heads=[head], progress=False,
    )
    delta, cache = sender_delta(model, clean, corrupted, sender, pos, head)
    with torch.no_grad():
        # the sender's change reaches layer 1 only along the residual stream (MLP 0 frozen)
        resid = cache["blocks.1.hook_resid_pre"].clone()
        resid[:, pos] += delta
        ln, attn = model.blocks[1].ln1, model.blocks[1].attn
        x = resid - resid.mean(-1, keepdim=True)
        x = x / (x.pow(2).mean(-1, keepdim=True) + ln.eps).sqrt() * ln.w + ln.b
        v = x @ attn.W_V[receiver_head] + attn.b_V[receiver_head]  # [batch, pos, d_head]

        def set_v(act, hook):
            act[:, :, receiver_head] = v
            return act

        hand = last_output(model.run_with_hooks(corrupted, fwd_hooks=[("blocks.1.attn.hook_v", set_v)]))
    assert float(result.values[0, 0]) == pytest.approx(float(hand), abs=1e-6)
    assert abs(float(result.effect[0, 0])) > 1e-4
    assert result.meta["receivers"] == ["blocks.1.attn.hook_v[0]"]


def test_direct_path_to_resid_mid_is_the_sender_delta_and_differs_from_activation_patching():
    model = make_model("transformer")
    clean, corrupted = make_pair(seed=11)
    sender, pos = "blocks.0.hook_mlp_out", 5
    result = path_patch(
        model, clean, corrupted, last_output, receivers="blocks.1.hook_resid_mid",
        senders=sender, positions=[pos], progress=False,
    )
    delta, _ = sender_delta(model, clean, corrupted, sender, pos)
    with torch.no_grad():
        hand = last_output(
            model.run_with_hooks(corrupted, fwd_hooks=[("blocks.1.hook_resid_mid", add_at(pos, delta))])
        )
    assert float(result.values[0, 0]) == pytest.approx(float(hand), abs=1e-5)
    # activation patching also sends the change through attention in layer 1
    total = activation_patch(model, clean, corrupted, last_output, hooks=sender, positions=[pos], progress=False)
    assert abs(float(total.values[0, 0] - result.values[0, 0])) > 1e-5


def test_recurrent_sender_to_next_mixer_input_equals_the_hand_computation():
    model = make_model("lstm")
    clean, corrupted = make_pair(seed=12)
    sender, pos = "blocks.0.hook_mixer_out", 1
    result = path_patch(
        model, clean, corrupted, last_output, receivers="blocks.1.hook_mixer_in", positions=[pos],
        progress=False,
    )
    assert result.components == [(sender, None)]  # the default senders run before the receiver
    delta, cache = sender_delta(model, clean, corrupted, sender, pos)
    with torch.no_grad():
        resid = cache["blocks.1.hook_resid_pre"].clone()
        resid[:, pos] += delta
        mixer_in = model.blocks[1].norm(resid)

        def set_in(act, hook):
            return mixer_in

        hand = last_output(model.run_with_hooks(corrupted, fwd_hooks=[("blocks.1.hook_mixer_in", set_in)]))
    assert float(result.values[0, 0]) == pytest.approx(float(hand), abs=1e-6)
    assert abs(float(result.effect[0, 0])) > 1e-5


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_hooks_and_nnsight_backends_agree(arch):
    model = make_model(arch)
    clean, corrupted = make_pair(seed=13, batch=2)
    receiver = "blocks.1.hook_resid_post"
    kw = {"receivers": receiver, "positions": [3, 5], "direction": "noise", "progress": False}
    by_hooks = path_patch(model, clean, corrupted, last_output, **kw)
    by_nnsight = path_patch(model, clean, corrupted, last_output, backend="nnsight", **kw)
    torch.testing.assert_close(by_hooks.values, by_nnsight.values, atol=1e-6, rtol=0)
    assert by_hooks.effect.abs().max() > 1e-4


def test_bad_receivers_and_senders_raise():
    model = make_model("transformer")
    clean, corrupted = make_pair()
    with pytest.raises(ValueError, match="unknown receiver hook"):
        path_patch(model, clean, corrupted, last_output, receivers="blocks.9.hook_resid_mid", progress=False)
    with pytest.raises(ValueError, match="do not run before every receiver"):
        path_patch(
            model, clean, corrupted, last_output, receivers="blocks.0.hook_resid_mid",
            senders="blocks.1.hook_mlp_out", progress=False,
        )
    with pytest.raises(ValueError, match="no component output runs before"):
        path_patch(model, clean, corrupted, last_output, receivers="hook_embed", progress=False)
    with pytest.raises(ValueError, match="out of range"):
        path_patch(
            model, clean, corrupted, last_output, receivers=("blocks.1.attn.hook_q", 5), progress=False
        )
