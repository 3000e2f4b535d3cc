"""Exact single-edge ablation (mechlab.prune.exact) against an independent loop of masked forwards."""

from __future__ import annotations

import pytest
import torch

from mechlab.models.transformer import Transformer, TransformerConfig
from mechlab.prune.attribution import attribute
from mechlab.prune.forward import divergence, frozen_eval, make_ablation, masked_forward
from mechlab.prune.graph import countable_edges, pruning_graph
from mechlab.prune.objective import build_objective, exact_loop_scores
from mechlab.traces import Traces, target_mask
from tests.prune.test_attribution import WINDOWS, random_traces, small_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@torch.no_grad()
def loop_effects(model, traces: Traces, positions: torch.Tensor, ablation: str) -> torch.Tensor:
    """Mean loss at ``positions`` with each edge alone ablated, one masked forward each."""
    graph = pruning_graph(model, traces.windows)
    ablated = make_ablation(model, ablation, traces, graph=graph)
    full = model(traces.inputs)[positions]
    out = torch.zeros(graph.n_edges, dtype=torch.float64)
    for k in range(graph.n_edges):
        z = torch.ones(graph.n_edges, dtype=torch.float64)
        z[k] = 0.0
        pred = masked_forward(model, graph, traces.inputs, ablated, z, fast=False)[positions]
        out[k] = float(divergence(pred, full, model.cfg.io).double().mean())
    countable = countable_edges(graph, ablation)
    return out.masked_fill(~countable, 0.0)


REPLAY_CASES = [  # io, ablation, normalization, causal
    ("continuous", "interchange", "LN", True),
    ("tokens", "mean", "LN", True),
    ("continuous", "zero", "LN", True),
    ("tokens", "interchange", "none", False),  # a Tracr-like layout
]



def per_trace_targets(traces: Traces) -> torch.Tensor:
    """A different target position per trace (two in one), none at the last position."""
    mask = torch.zeros(len(traces), traces.n_pos, dtype=torch.bool)
    for i in range(len(traces)):
        mask[i, 1 + i % 4] = True
    mask[0, 5] = True
    return mask


@pytest.mark.parametrize("io", ["continuous", "tokens"])
def test_the_last_block_at_target_positions_only_equals_the_loop(io):
    """The replay computes the last block's queries, MLP and read-out at the batch's target
    positions only; traces whose targets differ (so that a batch's positions are the union
    of theirs) and the projection metric score as the loop does."""
    torch.manual_seed(2)
    kw = {"d_in": 3, "d_out": 2} if io == "continuous" else {"io": "tokens", "d_vocab": 6}
    cfg = TransformerConfig(d_model=12, n_layers=2, n_heads=3, d_head=4, d_mlp=8, n_ctx=7, **kw)
    model = Transformer(cfg).double().eval()
    traces = random_traces(model, batch=5, n_pos=7)
    with frozen_eval(model):
        expected = loop_effects(model, traces, per_trace_targets(traces), "interchange")
        got = attribute(model, traces, per_trace_targets, "exact", batch_size=2).scores
        projection = attribute(model, traces, per_trace_targets, "exact", batch_size=2, metric="projection").scores
    assert expected.abs().max() > 1e-4
    torch.testing.assert_close(got, expected, atol=1e-6 * float(expected.abs().max()), rtol=1e-5)
    with frozen_eval(model):  # the projection metric through the loop of masked forwards
        obj = build_objective(model, traces, per_trace_targets, metric="projection")
        torch.testing.assert_close(projection, exact_loop_scores(obj, 2, False, "exact"), atol=1e-9, rtol=1e-7)

@pytest.mark.parametrize("io, ablation, normalization, causal", REPLAY_CASES)
def test_batched_replay_equals_a_loop_of_masked_forwards(io, ablation, normalization, causal):
    torch.manual_seed(1)
    kw = {"d_in": 3, "d_out": 2} if io == "continuous" else {"io": "tokens", "d_vocab": 6}
    act = "gelu" if normalization == "LN" else "relu"
    cfg = TransformerConfig(d_model=12, n_layers=3, n_heads=2, d_head=3, d_mlp=8, n_ctx=7,
                            normalization=normalization, causal=causal, act_fn=act, **kw)  # fmt: skip
    model = Transformer(cfg).double().eval()
    with torch.no_grad():  # logits large enough for KL (computed in float32) to be well resolved
        model.read_out.proj.weight.mul_(50.0)
    traces = random_traces(model, batch=5, n_pos=7)
    target = (lambda t: torch.tensor([2, 4])) if causal else "all"
    with frozen_eval(model):
        expected = loop_effects(model, traces, target_mask(target, traces), ablation)
    got = attribute(model, traces, target, "exact", ablation=ablation, batch_size=2).scores
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(got, expected, atol=1e-6 * float(expected.abs().max()), rtol=1e-5)


@pytest.mark.parametrize("arch", ["lstm", "dense_ssm", "mamba"])
def test_recurrent_and_windowed_graphs_equal_the_loop(arch):
    model = small_model(arch)
    for windows in (None, WINDOWS):
        traces = random_traces(model, windows=windows)
        with frozen_eval(model):
            expected = loop_effects(
                model, traces, torch.ones(6, 6, dtype=torch.bool), "interchange"
            )
        got = attribute(model, traces, "all", "exact").scores
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("options", [
    {"positional": "rotary", "n_key_value_heads": 1, "normalization": "RMS", "gated_mlp": True},
    {"attn_only": True},
    {"parallel_attn_mlp": True, "positional": "rotary", "rotary_dim": 2},
    # learned positions with the options of imported models the replay does not reproduce
    {"post_norms": True, "normalization": "RMS", "attn_out_bias": False},
    {"attn_softcap": 0.5},
    {"sliding_window": 2},
    {"attn_scale": 1.5, "embed_scale": 2.0, "final_softcap": 0.3},
])  # fmt: skip
def test_imported_layouts_are_scored_exactly_by_the_loop(options):
    """Layouts the replay does not cover (rotary, grouped heads, attention-only, parallel
    blocks, post-norms, soft-capping, windows, rescaling: imported models) still get exact
    single-edge effects."""
    torch.manual_seed(2)
    cfg = TransformerConfig(d_model=12, n_layers=2, n_heads=2, d_head=4, d_mlp=8, n_ctx=7,
                            d_in=3, d_out=2, **options)  # fmt: skip
    model = Transformer(cfg).double().eval()
    traces = random_traces(model, batch=4, n_pos=7)
    target = lambda t: torch.tensor([3, 5])  # noqa: E731
    with frozen_eval(model):
        expected = loop_effects(model, traces, target_mask(target, traces), "interchange")
    got = attribute(model, traces, target, "exact", ablation="interchange", batch_size=2).scores
    assert expected.abs().max() > 1e-6
    torch.testing.assert_close(got, expected, atol=1e-6 * float(expected.abs().max()), rtol=1e-5)


def test_the_bar_counts_every_batch_of_traces(capsys):
    """Issue 38: the bar used to stop after the first batch while the others ran silent."""
    from mechlab.prune.attribution import build_objective, score_edges

    torch.manual_seed(1)
    cfg = TransformerConfig(d_model=12, n_layers=2, n_heads=2, d_head=3, d_mlp=8, n_ctx=7, d_in=3, d_out=2)
    model = Transformer(cfg).eval()
    traces = random_traces(model, batch=5, n_pos=7)
    with frozen_eval(model):
        obj = build_objective(model, traces, "all", "interchange", "loss", pruning_graph(model, traces.windows))
        quiet = score_edges(obj, "exact", batch_size=2)
        assert capsys.readouterr().err == ""  # no bar unless asked
        scores = score_edges(obj, "exact", batch_size=2, progress=True, desc="warm start: exact")
    torch.testing.assert_close(scores, quiet)  # the bar changes nothing
    err = capsys.readouterr().err
    n = int(obj.countable.sum())
    for batch in ("traces 1-2 of 5", "traces 3-4 of 5", "traces 5-5 of 5"):  # each starts from 0
        assert f"warm start: exact, {batch}:   0%" in err, err
    assert f"warm start: exact, traces 5-5 of 5: 100%|██████████| {n}/{n}" in err, err  # the last ends full
