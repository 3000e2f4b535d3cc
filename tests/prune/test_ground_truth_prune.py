"""Edge pruning on the ground-truth state-tracking models, whose circuit is known by construction.

Traces: ``[BOS, x_1 .. x_7]`` of Z_3 tokens; the corrupted trace changes one input,
``x_4`` (position 4), to another element. Windows: ``before`` ``[0, 4)``, ``changed``
``[4, 5)``, ``after`` ``[5, 8)``. The models track the running sum, so under interchange
ablation the prediction at any later position depends on the changed token only through
the layer reading it and the recurrent state carrying it forward:

* target at the last position (the outcome ``s_7``), or at every ``after`` position (the
  aligned chain): ``embed@changed -> l0.in@changed``, ``l0@changed -> l0.state@after``,
  ``l0@after -> out@after``;
* target at the changed position itself: ``embed@changed -> l0.in@changed``,
  ``l0@changed -> out@changed`` (the read-out never reads the embedding: the edge
  ``embed@changed -> out@changed`` is inert by construction).

Checked: exhaustive single-edge ablation gives exactly these edges (each moves the
target logits by the model's margin, every other edge by < 1e-9 in float64), and
:func:`mechlab.prune.prune` at its defaults (200 steps) recovers them exactly for the
dense SSM, for an LSTM with soft gates and for the exact LSTM (gate scale 20), whose
saturated gates leave the masks no gradient: the default's selection on the true
objective (mechlab.prune.refine.select_edges) finds what the gradient cannot.
"""

from __future__ import annotations

import pytest
import torch

from mechlab.models.ground_truth import dense_ssm_group_model, lstm_group_model
from mechlab.prune.engine import prune
from mechlab.prune.forward import make_ablation, masked_forward
from mechlab.prune.graph import countable_edges, pruning_graph
from mechlab.traces import PruneData, Traces

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

M, N_POS, CHANGED = 3, 8, 4
WINDOWS = (("before", 0, CHANGED), ("changed", CHANGED, CHANGED + 1), ("after", CHANGED + 1, N_POS))
LATER = {
    ("embed@changed", "l0.in@changed"),
    ("l0@changed", "l0.state@after"),
    ("l0@after", "out@after"),
}
AT_CHANGED = {("embed@changed", "l0.in@changed"), ("l0@changed", "out@changed")}
SOFT_GATES = 5.0  # an LSTM still exact for Z_3 (tested below) whose gates pass gradients


def last(traces: Traces) -> torch.Tensor:
    """The outcome's position."""
    return torch.tensor([N_POS - 1])


def after(traces: Traces) -> torch.Tensor:
    """Every position after the changed one (aligned-chain targets)."""
    return torch.arange(CHANGED + 1, N_POS)


def at_changed(traces: Traces) -> torch.Tensor:
    """The changed position itself."""
    return torch.tensor([CHANGED])


TARGETS = {"last": (last, LATER), "after": (after, LATER), "at_changed": (at_changed, AT_CHANGED)}


def changed_token_traces(n: int, seed: int) -> Traces:
    """``n`` traces ``[BOS, x_1..x_7]`` whose corruption changes ``x_4`` to another element."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, M, (n, N_POS), generator=g)  # [n, pos]
    x[:, 0] = M  # BOS
    corrupted = x.clone()
    corrupted[:, CHANGED] = (x[:, CHANGED] + torch.randint(1, M, (n,), generator=g)) % M
    return Traces(x, corrupted, windows=WINDOWS)


def prune_data(seed: int) -> PruneData:
    return PruneData(changed_token_traces(32, seed), changed_token_traces(64, seed + 100))


def models() -> dict:
    return {
        "dense_ssm": dense_ssm_group_model("zm", M),
        "lstm": lstm_group_model(M),
        "lstm_soft": lstm_group_model(M, gate_scale=SOFT_GATES),
    }


def test_the_soft_gated_lstm_is_still_exact():
    model = lstm_group_model(M, gate_scale=SOFT_GATES)
    tokens = changed_token_traces(8, 0).inputs
    tokens = torch.cat([tokens, torch.randint(0, M, (8, 1000))], dim=1)  # [8, 1008]
    truth = tokens[:, 1:].cumsum(1) % M
    with torch.no_grad():
        assert torch.equal(model(tokens)[:, 1:].argmax(-1), truth)


@pytest.mark.parametrize("arch", ["dense_ssm", "lstm", "lstm_soft"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_exhaustive_single_edge_ablation_gives_the_constructed_circuit(arch, target):
    model = models()[arch].double()
    traces = changed_token_traces(64, 1)
    position_fn, circuit = TARGETS[target]
    at = position_fn(traces)
    graph = pruning_graph(model, WINDOWS)
    assert graph.n_edges == 11
    ablated = make_ablation(model, "interchange", traces, graph=graph)
    with torch.no_grad():
        full = masked_forward(model, graph, traces.inputs, ablated, torch.ones(graph.n_edges))
        assert (full - model(traces.inputs)).abs().max() < 1e-9
        effects = {}
        for i, edge in enumerate(graph.edges):
            z = torch.ones(graph.n_edges)
            z[i] = 0.0
            out = masked_forward(model, graph, traces.inputs, ablated, z)
            effects[edge] = float((out - full)[:, at].abs().max())
        # the circuit's edges together carry the whole prediction
        only = torch.tensor([float(e in circuit) for e in graph.edges])
        alone = masked_forward(model, graph, traces.inputs, ablated, only)
        assert float((alone - full)[:, at].abs().max()) < 1e-9
    assert min(effects[e] for e in circuit) > 25.0  # the margin (30) moves to another element
    assert max(v for e, v in effects.items() if e not in circuit) < 1e-9


CASES = [("dense_ssm", "last"), ("dense_ssm", "after"), ("dense_ssm", "at_changed"),
         ("lstm_soft", "last")]  # fmt: skip


@pytest.mark.parametrize("arch, target", CASES[:1] + CASES[2:])
def test_default_search_recovers_the_constructed_circuit(arch, target):
    check_recovered(arch, target, seeds=(0,))


@pytest.mark.slow
@pytest.mark.parametrize("arch, target", CASES)
def test_default_search_recovers_the_constructed_circuit_for_more_seeds(arch, target):
    check_recovered(arch, target, seeds=(1, 2, 3))


def check_recovered(arch: str, target: str, seeds: tuple[int, ...]) -> None:
    model = models()[arch]
    position_fn, circuit = TARGETS[target]
    graph = pruning_graph(model, WINDOWS)
    n_countable = int(countable_edges(graph, "interchange", position_fn(None).tolist()).sum())
    assert n_countable == (7 if circuit is LATER else 5)
    for seed in seeds:
        found = prune(
            model, prune_data(seed), position_fn, 1 - len(circuit) / n_countable,
            steps=200, seed=seed, progress=False,
        )  # fmt: skip
        assert set(found.edges) == circuit, f"seed {seed}: {sorted(found.edges)}"
        metrics = found.metadata["metrics"]
        assert metrics["faithfulness"] > 0.999
        assert metrics["complement_faithfulness"] < 0.001


def test_default_search_on_the_exact_saturated_lstm():
    model = lstm_group_model(M)
    graph = pruning_graph(model, WINDOWS)
    n_countable = int(countable_edges(graph, "interchange", [N_POS - 1]).sum())
    found = prune(
        model, prune_data(0), last, 1 - len(LATER) / n_countable, steps=200, seed=0,
        progress=False,
    )  # fmt: skip
    assert set(found.edges) == LATER
    assert found.metadata["metrics"]["faithfulness"] > 0.999
