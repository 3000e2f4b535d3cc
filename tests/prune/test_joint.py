"""Joint pruning (mechlab.prune.joint) on planted models with position-gated MLPs.

The model (3 layers, 2 heads, every head zero, LayerNorms the identity as in
tests/prune/test_planted.py) writes the input into slot 0; the position table writes a
gate: ``g = 1`` at even positions and ``1 - g`` at odd ones (the position table is inert
under interchange ablation, so the gates act whatever the masks). MLP ``m1`` copies the
input to slot 2 at even positions only, ``m2`` to slot 3 at odd positions only (ReLU
units ``relu(+-x + 10 g - 10)``, exactly 0 when the gate is shut), and ``m0``, when
present, copies it to slot 1 everywhere. The read-out adds the slots.

* ``disjoint``: no ``m0``; target ``even`` needs ``embed -> m1.in, m1 -> out`` and
  ``odd`` needs ``embed -> m2.in, m2 -> out``: nothing can be shared for free.
* ``shareable``: read-out ``0.5 (slot 1 + slot 2 + slot 3)``; each target can use the
  shared path through ``m0`` or its own gated MLP, equally well (faithfulness 0.75
  either way, asked for 2 edges). Sharing should make both take ``m0``.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from mechlab.models.transformer import Transformer, TransformerConfig
from mechlab.prune.config import JOINT_CONFIG
from mechlab.prune.engine import prune
from mechlab.prune.graph import build_graph, countable_edges
from mechlab.prune.joint import consensus_penalty, joint_prune, share_sweep
from mechlab.prune.refine import pair_disagreement
from mechlab.traces import Traces
from tests.prune.test_planted import LN_EPS, blank_transformer, planted_data

SHARED = {("embed", "m0.in"), ("m0", "out")}
EVEN = {("embed", "m1.in"), ("m1", "out")}
ODD = {("embed", "m2.in"), ("m2", "out")}


def even(traces: Traces) -> torch.Tensor:
    mask = torch.zeros(traces.inputs.shape[:2], dtype=torch.bool)
    mask[:, 0::2] = True
    return mask


def odd(traces: Traces) -> torch.Tensor:
    return ~even(traces)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def gated_model(shared: bool) -> Transformer:
    """The planted model of the module docstring (``shared``: with the m0 path)."""
    cfg = TransformerConfig(d_model=20, n_layers=3, n_heads=2, d_head=2, d_mlp=4, d_in=2,
                            d_out=2, n_ctx=8, layer_norm_eps=LN_EPS, act_fn="relu")  # fmt: skip
    model = blank_transformer(cfg)
    weight = 0.5 if shared else 1.0
    with torch.no_grad():
        gate = torch.zeros(cfg.n_ctx)
        gate[0::2] = 1.0
        model.W_pos[:, 16], model.W_pos[:, 18] = gate, -gate  # slot 4: g, 1 - g
        model.W_pos[:, 17], model.W_pos[:, 19] = 1 - gate, -(1 - gate)
        for layer, gate_dim in ((0, None), (1, 16), (2, 17)):
            if layer == 0 and not shared:
                continue
            mlp = model.blocks[layer].mlp
            for i, sign in enumerate((1.0, -1.0, 1.0, -1.0)):
                mlp.W_in[i // 2, i] = sign  # +-x_j
                if gate_dim is not None:
                    mlp.W_in[gate_dim, i], mlp.b_in[i] = 10.0, -10.0
            for i, sign in enumerate((1.0, -1.0, 1.0, -1.0)):  # relu(x) - relu(-x) = x
                mlp.W_out[i, 4 * (layer + 1) + i // 2] = sign
                mlp.W_out[i, 4 * (layer + 1) + 2 + i // 2] = -sign
            model.read_out.proj.weight[0, 4 * (layer + 1)] = weight
            model.read_out.proj.weight[1, 4 * (layer + 1) + 1] = weight
    return model.eval()


def two_edge_sparsity(model) -> float:
    return 1 - 2 / int(countable_edges(build_graph(model), "interchange").sum())


def test_gated_models_are_what_they_claim():
    data = planted_data(n_pos=6)
    x = data.test.inputs
    for shared in (False, True):
        model = gated_model(shared)
        with torch.no_grad():
            out = model(x)
        torch.testing.assert_close(out, x, atol=1e-5, rtol=0)  # every path adds up to x
        circuit_of = {"even": EVEN, "odd": ODD}
        for name, target in (("even", even), ("odd", odd)):
            kept = prune(model, data, target, two_edge_sparsity(model), seed=0, progress=False)
            assert set(kept.edges) in ([circuit_of[name], SHARED] if shared else [circuit_of[name]])
            expected = 0.75 if shared else 1.0
            assert kept.metadata["metrics"]["faithfulness"] == pytest.approx(expected, abs=0.02)


def test_sharing_terms_by_hand():
    p = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    # distance from the consensus (1, 1, 0, 0): 0 and 4 / 2 -> mean 1
    assert float(consensus_penalty(p, p[0], [2, 2])) == pytest.approx(1.0)
    assert float(consensus_penalty(p[[0, 0]], p[0], [2, 2])) == 0.0
    sets = [torch.tensor([True, True, False]), torch.tensor([True, False, True]),
            torch.tensor([True, True, False])]  # fmt: skip
    # pairs (0,1): 2 / 2, (0,2): 0, (1,2): 2 / 2 -> mean 2/3
    assert pair_disagreement(sets, [2, 2, 2]) == pytest.approx(2 / 3)
    assert pair_disagreement(sets[:1], [2]) == 0.0


def test_share_zero_is_independent_pruning():
    model = gated_model(shared=True)
    data = planted_data(1, n_pos=6)
    sparsity = two_edge_sparsity(model)
    for seed in (0, 1):
        # one search core: each target's run is prune()'s, selection included
        joint = joint_prune(model, data, [even, odd], sparsity, share=0.0, seed=seed, progress=False)
        for name, target in (("even", even), ("odd", odd)):
            alone = prune(model, data, target, sparsity, seed=seed, progress=False, config=JOINT_CONFIG)
            circuit = joint.circuits[name]
            assert set(circuit.edges) == set(alone.edges)
            for edge, value in alone.log_alpha.items():  # alone, "even" runs on traces cut
                # after its last target (one position fewer): the same search up to round-off
                assert circuit.log_alpha[edge] == pytest.approx(value, rel=1e-4, abs=1e-4)
            meta = circuit.metadata
            assert meta["edge_effects"] == pytest.approx(alone.metadata["edge_effects"])
            assert meta["joint"] and meta["share"] == 0.0 and meta["partners"] == [
                "odd" if name == "even" else "even"
            ]


@pytest.mark.parametrize("share", [pytest.param(0.3, marks=pytest.mark.slow), 1.0, "tied"])
@pytest.mark.parametrize("seed", range(3))
def test_sharing_picks_the_shared_path(seed, share):
    model = gated_model(shared=True)
    data = planted_data(seed, n_pos=6)
    result = joint_prune(model, data, [even, odd], two_edge_sparsity(model), share=share, seed=seed,
                         progress=False)  # fmt: skip
    assert set(result.circuits["even"].edges) == SHARED, f"seed {seed}"
    assert set(result.circuits["odd"].edges) == SHARED, f"seed {seed}"
    assert result.jaccard == {"even|odd": 1.0}
    for circuit in result.circuits.values():
        assert circuit.metadata["metrics"]["faithfulness"] == pytest.approx(0.75, abs=0.02)
        assert circuit.metadata["refined"] and circuit.metadata["share"] == share


def test_refinement_keeps_independent_circuits_faithful():
    """At share 0 the refined circuits serve their own target (either route is fine)."""
    model = gated_model(shared=True)
    for seed in range(2):
        result = joint_prune(model, planted_data(seed, n_pos=6), [even, odd],
                             two_edge_sparsity(model), share=0.0, seed=seed, progress=False)  # fmt: skip
        assert set(result.circuits["even"].edges) in (EVEN, SHARED)
        assert set(result.circuits["odd"].edges) in (ODD, SHARED)
        for circuit in result.circuits.values():
            assert circuit.metadata["metrics"]["faithfulness"] == pytest.approx(0.75, abs=0.02)


@pytest.mark.filterwarnings("ignore:circuit for .* the search likely failed")  # a deliberately short search
@pytest.mark.parametrize("seed", [0, 1, pytest.param(2, marks=pytest.mark.slow)])
def test_sharing_cannot_invent_shared_edges_for_free(seed):
    model = gated_model(shared=False)
    data = planted_data(seed, n_pos=6)
    sweep = share_sweep(model, data, [even, odd], shares=[0.0, 1.0, "tied"], seeds=[seed],
                        sparsity=two_edge_sparsity(model), progress=False)  # fmt: skip
    for row, res in zip(sweep.rows, sweep.results, strict=True):
        faith = [row[t]["faithfulness"] for t in ("even", "odd")]
        if row["share"] == 0.0:
            assert set(res.circuits["even"].edges) == EVEN and set(res.circuits["odd"].edges) == ODD
        # either the circuits stay apart (and faithful) or sharing cost faithfulness
        assert row["jaccard"] == 0.0 and min(faith) > 0.99 or min(faith) < 0.9
        if math.isinf(row["share"]):  # one 2-edge circuit serves one target only
            assert max(faith) > 0.99 and min(faith) < 0.01
    summary = sweep.summary()
    assert summary[0]["share"] == 0.0 and summary[0]["even.cost"] == 0.0
    tied = summary[-1]
    assert max(tied["even.cost"], tied["odd.cost"]) > 0.99  # what sharing costs, measured
    assert "cost" in sweep.table() and sweep.to_dict()["summary"][-1]["share"] == "tied"


def test_bad_input_is_refused_in_one_line():
    model = gated_model(shared=True)
    data = planted_data(n_pos=6)
    cases = [
        ({"share": -0.1}, "share must be >= 0"),
        ({"share": math.nan}, "share must be a number"),
        ({"share": "0.1"}, "share must be a number"),
        ({"targets": [even]}, "at least two targets"),
        ({"targets": "all"}, "list of at least two"),
        ({"targets": ["all", "all"]}, "distinct"),
        ({"targets": ["all", "3-before"]}, "unknown target"),
        ({"sparsity": 1.5}, "sparsity"),
        ({"node_sparsity": 0.5}, "edges only"),
        ({"stpes": 3}, "unknown pruning setting 'stpes'"),
    ]
    for change, message in cases:
        kwargs = {"targets": [even, odd], "sparsity": 0.9, "share": 0.1, **change}
        with pytest.raises(ValueError, match=message) as info:
            joint_prune(model, data, steps=1, progress=False, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="shares"):
        share_sweep(model, data, [even, odd], shares=[], steps=1, progress=False)


@pytest.mark.filterwarnings("ignore:circuit for .* the search likely failed")  # a deliberately short search
def test_targets_of_unequal_loss_scales_are_flagged(monkeypatch):
    import mechlab.prune.setup as setup  # where prepare_search computes each target's ablated loss

    model = gated_model(shared=True)
    data = planted_data(n_pos=6)
    scales = iter([1.0, 5.0] * 2)
    monkeypatch.setattr(setup, "ablated_loss", lambda *a, **k: next(scales))
    with pytest.warns(UserWarning, match=r"differ 5\.0x \(even 1, odd 5\).*normalize_loss=True"):
        joint_prune(model, data, [even, odd], 0.9, share=1.0, steps=1, select="rank",
                    normalize_loss=False, progress=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        try:
            joint_prune(model, data, [even, odd], 0.9, share=1.0, steps=1, select="rank",
                        progress=False)  # fmt: skip (the default normalises)
        except UserWarning as w:  # only the search-failure warnings of a 1-step run may fire
            assert "differ" not in str(w)
