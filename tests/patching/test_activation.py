"""activation_patch: numbers against hand-run hooks, recurrent propagation, both backends, errors."""

import pytest
import torch

from mechlab.patching import activation_patch
from tests.patching.helpers import N_POS, STEP_HOOKS, last_output, make_model, make_pair

torch.set_num_threads(1)


def set_at(name_pos_value):
    """A TransformerLens hook writing ``value`` at ``index``."""
    index, value = name_pos_value

    def hook(act, hook):
        act[index] = value[index]
        return act

    return hook


def test_denoise_values_equal_hand_run_hooks_per_position_and_head():
    model = make_model("transformer")
    clean, corrupted = make_pair()
    result = activation_patch(
        model, clean, corrupted, last_output,
        hooks=["blocks.0.attn.hook_result", "blocks.1.hook_mlp_out"], positions=[2, 5], progress=False,
    )
    assert result.labels == [
        "blocks.0.attn.hook_result[0]", "blocks.0.attn.hook_result[1]", "blocks.1.hook_mlp_out"
    ]
    _, cache = model.run_with_cache(clean)
    with torch.no_grad():
        assert result.clean_metric == pytest.approx(float(last_output(model(clean))))
        assert result.corrupted_metric == pytest.approx(float(last_output(model(corrupted))))
        for i, (hook, head) in enumerate(result.components):
            for j, pos in enumerate(result.positions):
                index = (slice(None), pos) if head is None else (slice(None), pos, head)
                out = model.run_with_hooks(corrupted, fwd_hooks=[(hook, set_at((index, cache[hook])))])
                assert result.values[i, j] == pytest.approx(float(last_output(out)), abs=1e-6)


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_patching_the_whole_last_residual_restores_the_other_run(arch):
    model = make_model(arch)
    clean, corrupted = make_pair(seed=1)
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    for direction, target in (("denoise", "clean_metric"), ("noise", "corrupted_metric")):
        result = activation_patch(
            model, clean, corrupted, last_output, hooks=last, positions="all",
            direction=direction, progress=False,
        )
        assert result.positions == ["all"]
        assert float(result.values[0, 0]) == pytest.approx(getattr(result, target), abs=1e-5)
        assert float(result.normalized[0, 0]) == pytest.approx(1.0 if direction == "denoise" else 0.0, abs=1e-4)


def test_positions_after_the_metric_position_have_no_effect_in_a_causal_model():
    model = make_model("transformer")
    clean, corrupted = make_pair(seed=2)
    result = activation_patch(
        model, clean, corrupted, lambda out: out[:, 2, 1].mean(), hooks="blocks.0.hook_resid_pre",
        progress=False,
    )
    assert result.effect[0, 3:].abs().max() == 0
    assert result.effect[0, :3].abs().min() > 0


def test_heads_false_patches_all_heads_at_once_and_a_list_picks_heads():
    model = make_model("transformer")
    clean, corrupted = make_pair(seed=3)
    kw = {"hooks": "blocks.1.attn.hook_z", "positions": [5], "progress": False}
    together = activation_patch(model, clean, corrupted, last_output, heads=False, **kw)
    one = activation_patch(model, clean, corrupted, last_output, heads=[1], **kw)
    assert together.components == [("blocks.1.attn.hook_z", None)]
    assert one.components == [("blocks.1.attn.hook_z", 1)]
    assert float(together.values[0, 0]) != pytest.approx(float(one.values[0, 0]), abs=1e-7)


def test_default_hooks_cover_every_block_of_each_family():
    expect = {
        "transformer": ["hook_resid_pre", "attn.hook_result", "hook_mlp_out"],
        "lstm": ["hook_resid_pre", "lstm.hook_h", "hook_mixer_out"],
        "mamba": ["hook_resid_pre", "mixer.hook_ssm_state", "hook_mixer_out"],
    }
    clean, corrupted = make_pair(batch=1)
    for arch, parts in expect.items():
        model = make_model(arch, n_layers=1)
        result = activation_patch(model, clean, corrupted, last_output, positions=[0], progress=False)
        assert sorted({h for h, _ in result.components}) == sorted(f"blocks.0.{p}" for p in parts)


# --- recurrent state patches -----------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(STEP_HOOKS))
def test_a_state_patch_at_step_t_changes_outputs_at_t_and_later_only(arch):
    model = make_model(arch)
    clean, corrupted = make_pair(seed=4)
    t = 2
    outputs = []

    def metric(out):
        outputs.append(out)
        return out.sum()

    activation_patch(model, clean, corrupted, metric, hooks=STEP_HOOKS[arch], positions=[t], progress=False)
    _, corrupted_out, patched = outputs  # clean, corrupted, then the one patched run
    per_pos = (patched - corrupted_out).abs().amax(dim=(0, 2))  # [pos]
    assert (per_pos[:t] == 0).all(), per_pos
    assert (per_pos[t:] > 1e-6).all(), per_pos


def test_lstm_state_patch_equals_a_hand_unrolled_lstm():
    """1-layer LSTM: corrupted run with h_t replaced by the clean h_t, computed by hand."""
    model = make_model("lstm", n_layers=1)
    clean, corrupted = make_pair(seed=5)
    t, name = 3, "blocks.0.lstm.hook_h"
    outputs = []

    def metric(out):
        outputs.append(out)
        return out.mean()

    activation_patch(model, clean, corrupted, metric, hooks=name, positions=[t], progress=False)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)
        block, rnn = model.blocks[0], model.blocks[0].lstm.rnn
        resid = model.read_in(corrupted)  # [batch, pos, d_model]
        x = block.norm(resid)
        h = torch.zeros(x.shape[0], rnn.hidden_size)
        c = torch.zeros_like(h)
        hs = []
        for s in range(N_POS):
            gates = x[:, s] @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            if s == t:
                h = clean_cache[name][:, t]
            hs.append(h)
        hand = model.read_out(model.ln_final(resid + torch.stack(hs, dim=1)))
    torch.testing.assert_close(outputs[-1], hand, atol=1e-5, rtol=0)


# --- backends ----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["transformer", "lstm", "dense_ssm", "mamba"])
def test_hooks_and_nnsight_backends_give_equal_numbers(arch):
    model = make_model(arch)
    clean, corrupted = make_pair(seed=6, batch=2)
    hooks = ["blocks.0.attn.hook_result", "blocks.1.hook_mlp_out"] if arch == "transformer" else [
        STEP_HOOKS[arch], "blocks.1.hook_mixer_out"
    ]
    kw = {"hooks": hooks, "positions": [1, 5], "heads": [1], "progress": False}
    for direction in ("denoise", "noise"):
        by_hooks = activation_patch(model, clean, corrupted, last_output, direction=direction, **kw)
        by_nnsight = activation_patch(
            model, clean, corrupted, last_output, direction=direction, backend="nnsight", **kw
        )
        assert by_hooks.components == by_nnsight.components
        torch.testing.assert_close(by_hooks.values, by_nnsight.values, atol=1e-6, rtol=0)
        assert by_hooks.effect.abs().max() > 1e-5


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"hooks": ["blocks.0.hook_nope"]}, "unknown hook name"),
        ({"hooks": lambda name: False}, "matched no hook"),
        ({"positions": [N_POS]}, "out of range"),
        ({"positions": [-1]}, "out of range"),
        ({"positions": "last"}, "positions must be"),
        ({"heads": [7], "hooks": "blocks.0.attn.hook_q"}, "head 7 is out of range"),
        ({"direction": "sideways"}, "unknown direction"),
        ({"backend": "jax"}, "unknown backend"),
    ],
)
def test_bad_arguments_raise_one_line_value_errors(kwargs, message):
    model = make_model("transformer")
    clean, corrupted = make_pair()
    with pytest.raises(ValueError, match=message) as err:
        activation_patch(model, clean, corrupted, last_output, progress=False, **kwargs)
    assert "\n" not in str(err.value)


def test_bad_metric_and_mismatched_inputs_raise():
    model = make_model("transformer")
    clean, corrupted = make_pair()
    with pytest.raises(ValueError, match="metric must return a scalar tensor"):
        activation_patch(model, clean, corrupted, lambda out: out[:, -1], progress=False)
    with pytest.raises(ValueError, match="metric must return a scalar tensor"):
        activation_patch(model, clean, corrupted, lambda out: 1.0, progress=False)
    with pytest.raises(ValueError, match="same shape"):
        activation_patch(model, clean, corrupted[:, :4], last_output, progress=False)
    with pytest.raises(ValueError, match="mechlab model"):
        activation_patch(torch.nn.Linear(2, 2), clean, corrupted, last_output, progress=False)
