"""ReplayForward: the same outputs as the masked forward for any sequence of masks, while
replaying only the layers a change reaches; plain masked forwards where it does not apply."""

from __future__ import annotations

import pytest
import torch

from mechlab.models import build_model
from mechlab.prune.forward import frozen_eval, masked_forward, writer_outputs
from mechlab.prune.graph import build_graph
from mechlab.prune.replay import ReplayForward, reader_layers

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {
    "gpt2": {},
    "llama": {"normalization": "RMS", "positional": "rotary", "gated_mlp": True, "act_fn": "silu",
              "n_heads": 4, "d_head": 4, "n_key_value_heads": 2, "qkv_bias": False, "attn_out_bias": False,
              "mlp_bias": False},
    "neox_parallel": {"positional": "rotary", "rotary_dim": 2, "parallel_attn_mlp": True, "act_fn": "gelu"},
    "attn_only": {"attn_only": True},
}
HARD_VARIANTS = {  # the last block computed at a few positions: every way a block can differ
    "gemma2": {"normalization": "RMS", "positional": "rotary", "gated_mlp": True, "act_fn": "gelu",
               "post_norms": True, "attn_softcap": 0.5, "final_softcap": 1.5, "sliding_window": 3,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
               "n_heads": 4, "d_head": 6, "n_key_value_heads": 2, "qk_norm": True,
               "attn_out_bias": False},
    "qk_norm_parallel": {"positional": "rotary", "parallel_attn_mlp": True, "qk_norm": True, "n_heads": 2,
                         "d_head": 6},
}


def setup(variant: str, ablation: str = "interchange", seed: int = 0):
    torch.manual_seed(seed)
    base = {"d_model": 12, "n_layers": 3, "n_heads": 3, "d_in": 4, "d_out": 3, "n_ctx": 8}
    options = {**VARIANTS, **HARD_VARIANTS}[variant]
    model = build_model("transformer", **{**base, **options}).double().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(5, 7, 4, generator=gen, dtype=torch.float64)
    ablated = writer_outputs(model, torch.randn(5, 7, 4, generator=gen, dtype=torch.float64))
    if ablation == "mean":
        ablated = ablated.mean(dim=1, keepdim=True)
    return model, build_graph(model), x, ablated


def mask_walk(graph, n: int, seed: int) -> list[torch.Tensor]:
    """Masks as a selection visits them: a random binary set, then sets that each differ
    from one visited before by one to three edges (anywhere in the graph), now and then a
    fresh set."""
    gen = torch.Generator().manual_seed(seed)
    masks = [(torch.rand(graph.n_edges, generator=gen) < 0.5).double()]
    for _ in range(n):
        if torch.rand((), generator=gen) < 0.1:
            masks.append((torch.rand(graph.n_edges, generator=gen) < 0.5).double())
            continue
        start = masks[int(torch.randint(max(0, len(masks) - 4), len(masks), (), generator=gen))].clone()
        flip = torch.randint(graph.n_edges, (int(torch.randint(1, 4, (), generator=gen)),), generator=gen)
        start[flip] = 1 - start[flip]
        masks.append(start)
    return masks


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("ablation", ["interchange", "mean"])
def test_replayed_outputs_equal_the_masked_forward(variant, ablation):
    model, graph, x, ablated = setup(variant, ablation)
    with frozen_eval(model):
        forward = ReplayForward(model, graph, x, ablated)
        assert forward.replays
        for mask in mask_walk(graph, 40, seed=3):
            expected = masked_forward(model, graph, x, ablated, mask)
            torch.testing.assert_close(forward(mask), expected, rtol=0, atol=1e-12)
    full = forward.passes * (graph.n_layers + 1)
    assert forward.layers_run < 0.9 * full  # the walk's small changes replay part of the model


def test_a_change_in_the_read_out_replays_only_the_read_out():
    model, graph, x, ablated = setup("gpt2")
    layers = reader_layers(graph)
    out_edges = (layers == graph.n_layers).nonzero().flatten()
    last_layer = (layers == graph.n_layers - 1).nonzero().flatten()
    with frozen_eval(model):
        forward = ReplayForward(model, graph, x, ablated)
        ones = torch.ones(graph.n_edges, dtype=torch.float64)
        forward(ones)
        assert forward.layers_run == graph.n_layers + 1
        for k in out_edges[:3]:
            trial = ones.clone()
            trial[k] = 0
            before = forward.layers_run
            torch.testing.assert_close(forward(trial), masked_forward(model, graph, x, ablated, trial))
            assert forward.layers_run - before == 1
        trial = ones.clone()
        trial[last_layer[0]] = 0
        before = forward.layers_run
        forward(trial)
        assert forward.layers_run - before == 2  # the last layer and the read-out


def test_every_layer_maps_its_readers_edges():
    model, graph, _, _ = setup("gpt2")
    layers = reader_layers(graph)
    for r in graph.readers:
        start = graph.edge_offset[r.name]
        assert set(layers[start : start + r.n_upstream].tolist()) == {r.layer}
    assert int(layers.max()) == graph.n_layers


def test_trainable_parameters_or_a_recurrent_model_run_the_plain_forward():
    model, graph, x, ablated = setup("gpt2")
    forward = ReplayForward(model, graph, x, ablated)  # parameters still need gradients
    assert not forward.replays
    mask = torch.ones(graph.n_edges, dtype=torch.float64)
    torch.testing.assert_close(forward(mask), masked_forward(model, graph, x, ablated, mask))
    torch.manual_seed(0)
    lstm = build_model("lstm", d_model=8, n_layers=2, d_in=4, d_out=3, n_ctx=8).double().eval()
    g = build_graph(lstm)
    with frozen_eval(lstm):
        abl = writer_outputs(lstm, torch.randn(2, 5, 4, dtype=torch.float64))
        x2 = torch.randn(2, 5, 4, dtype=torch.float64)
        forward = ReplayForward(lstm, g, x2, abl)
        assert not forward.replays
        m = (torch.rand(g.n_edges) < 0.5).double()
        torch.testing.assert_close(forward(m), masked_forward(lstm, g, x2, abl, m))


def test_no_kept_pass_when_one_buffer_would_pass_the_memory_cap(monkeypatch):
    import mechlab.prune.replay as replay

    model, graph, x, ablated = setup("gpt2")
    monkeypatch.setattr(replay, "MAX_KEPT_BYTES", 16)
    with frozen_eval(model):
        forward = replay.ReplayForward(model, graph, x, ablated)
        assert not forward.replays


@pytest.mark.parametrize("variant", [*VARIANTS, *HARD_VARIANTS])
@pytest.mark.parametrize("ablation", ["interchange", "mean"])
def test_outputs_at_given_positions_equal_the_masked_forward_there(variant, ablation):
    model, graph, x, ablated = setup(variant, ablation)
    gen = torch.Generator().manual_seed(7)
    at = torch.rand(x.shape[:2], generator=gen) < 0.3
    at[0, -1] = at[2, 0] = True  # the first and the last position among them
    with frozen_eval(model):
        forward = ReplayForward(model, graph, x, ablated, at=at)
        assert forward.replays
        for mask in mask_walk(graph, 30, seed=5):
            expected = masked_forward(model, graph, x, ablated, mask)[at]
            torch.testing.assert_close(forward(mask), expected, rtol=0, atol=1e-10)
    assert forward.layers_run < 0.9 * forward.passes * (graph.n_layers + 1)


def test_outputs_at_given_positions_without_replay_are_the_masked_forwards_rows():
    model, graph, x, ablated = setup("gpt2")
    at = torch.zeros(x.shape[:2], dtype=torch.bool)
    at[:, 3] = True
    forward = ReplayForward(model, graph, x, ablated, at=at)  # parameters still need gradients
    assert not forward.replays
    mask = (torch.rand(graph.n_edges, generator=torch.Generator().manual_seed(0)) < 0.5).double()
    with torch.no_grad():
        torch.testing.assert_close(forward(mask), masked_forward(model, graph, x, ablated, mask)[at])
