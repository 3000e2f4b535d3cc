"""EAP on the pruning graph equals TransformerLens 4.3's own edge-level attribution patching.

``transformer_lens.tools.analysis.attribution_patching.attribution_patch`` (edge
granularity) scores every writer -> reader pair *at one position*: the writer's
clean-minus-corrupted output there dotted with the gradient of the metric at the
reader's input on the *corrupted* run; it averages over prompt pairs, and it has no
position-table writer (the table is the same on both runs). Our edges carry one mask
across all positions, so the mapping is: sum TransformerLens' scores over positions,
name its nodes ours (``embed``, ``a{l}.h{h}``, ``m{l}``; ``q/k/v_input`` ->
``a{l}.h{h}.q|k|v``, ``mlp_in`` -> ``m{l}.in``, ``logits`` -> ``out``), and average its
per-pair metric exactly as our metric averages (each pair's metric weighted by its
share of the target positions). Our EAP at the corrupted run is the *negated*
denoising estimate (our scores are the metric's increase when an edge is ablated).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformer_lens.tools.analysis.attribution_patching",
                    reason="this transformer-lens has no attribution tools: pip install -U 'transformer-lens>=4'")

from transformer_lens.tools.analysis.attribution_patching import (  # noqa: E402
    EdgeAttributionConfig,
    attribution_patch,
)

from mechlab.models.export import to_transformer_bridge  # noqa: E402
from mechlab.models.transformer import Transformer, TransformerConfig  # noqa: E402
from mechlab.prune.attribution import attribute  # noqa: E402
from mechlab.traces import Traces, target_mask  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

READERS = {"q_input": "q", "k_input": "k", "v_input": "v"}


def our_name(node) -> str:
    if node.kind == "embed":
        return "embed"
    if node.kind == "attn_head_out":
        return f"a{node.layer}.h{node.head}"
    if node.kind == "mlp_out":
        return f"m{node.layer}"
    if node.kind in READERS:
        return f"a{node.layer}.h{node.head}.{READERS[node.kind]}"
    if node.kind == "mlp_in":
        return f"m{node.layer}.in"
    assert node.kind == "logits"
    return "out"


def last_two(traces: Traces) -> torch.Tensor:
    return torch.tensor([4, 5])


@pytest.mark.parametrize("target", ["all", last_two])
def test_eap_at_the_corrupted_run_equals_transformer_lens_attribution_patching(target):
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=16, n_layers=2, n_heads=2, d_head=8, d_mlp=32, n_ctx=6,
                            io="tokens", d_vocab=7)  # fmt: skip
    model = Transformer(cfg).eval()
    g = torch.Generator().manual_seed(1)
    x, c = torch.randint(7, (4, 6), generator=g), torch.randint(7, (4, 6), generator=g)
    traces = Traces(inputs=x, corrupted=c)
    ours = attribute(model, traces, target, "eap", batch_size=3)  # KL(full || circuit)

    bridge = to_transformer_bridge(model)
    bridge.enable_compatibility_mode(no_processing=True)
    bridge.eval()
    with torch.no_grad():
        full = model(x)
        torch.testing.assert_close(bridge(x), full, atol=1e-5, rtol=0)
    positions = target_mask(target, traces)
    n_total = int(positions.sum())
    theirs: dict[tuple[str, str], float] = {}
    for i in range(len(x)):  # one pair per call: each metric knows its own full logits

        def metric(logits, i=i):
            at = positions[i]
            log_p = F.log_softmax(full[i, at], -1)
            log_q = F.log_softmax(logits[0, at], -1)
            return (log_p.exp() * (log_p - log_q)).sum() * len(x) / n_total

        result = attribution_patch(bridge, x[i : i + 1], c[i : i + 1], metric,
                                   EdgeAttributionConfig(granularity="edge"))  # fmt: skip
        for (writer, reader), score in result.edge_scores.items():
            edge = (our_name(writer), our_name(reader))
            theirs[edge] = theirs.get(edge, 0.0) + score / len(x)  # their mean over pairs

    graph = ours.graph
    assert set(theirs) == {e for e in graph.edges if e[0] != "pos"}
    expected = torch.zeros(graph.n_edges, dtype=torch.float64)
    for edge, score in theirs.items():
        expected[graph.edge_index[edge]] = -score  # denoising estimate -> our ablation effect
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(
        ours.scores, expected, atol=1e-6 * float(expected.abs().max()), rtol=1e-4
    )
