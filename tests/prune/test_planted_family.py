"""The planted family (mechlab.prune.planted): random models with a known circuit.

Every model's ground truth is confirmed by exhaustive single-edge ablation (every
planted edge's effect >= EFFECT_FLOOR of ablating everything, every other edge <=
INERT_TOLERANCE), and the default search must recover every planted circuit exactly,
told only its size: two seeds per small model here (the three largest under ``-m slow``),
five more per model under ``-m slow``.
"""

from __future__ import annotations

import pytest
import torch

from mechlab.prune.engine import prune
from mechlab.prune.graph import build_graph, countable_edges
from mechlab.prune.planted import (
    EFFECT_FLOOR,
    INERT_TOLERANCE,
    PLANTED_FAMILY,
    PlantedSpec,
    check_ground_truth,
    planted_data,
    planted_model,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
_BUILT: dict[str, object] = {}


def built(name: str):
    if name not in _BUILT:
        _BUILT[name] = planted_model(PLANTED_FAMILY[name])
    return _BUILT[name]


def test_the_family_spans_what_it_claims():
    specs = PLANTED_FAMILY.values()
    transformers = [s for s in specs if s.arch == "transformer"]
    assert {s.n_layers for s in transformers} == {2, 3, 4}
    assert min(s.n_heads for s in transformers) == 2 and max(s.n_heads for s in transformers) == 8
    assert {"value", "qk"} <= {p for s in transformers for p in s.paths}
    assert any(s.arch == "dense_ssm" for s in specs)
    ratios = [max(s.strengths) / min(s.strengths) for s in specs]
    assert min(ratios) == 1.0 and max(ratios) == pytest.approx(10.0)


@pytest.mark.parametrize("name", list(PLANTED_FAMILY))
def test_ground_truth_by_exhaustive_single_edge_ablation(name):
    planted = built(name)
    found = check_ground_truth(planted, planted.data(0, n_test=8))  # 48 positions: cheap, enough
    assert found["min_planted"] >= EFFECT_FLOOR and found["max_other"] <= INERT_TOLERANCE
    paths = planted.paths
    assert planted.edges == frozenset().union(*paths.values()) and set(paths) == set(planted.spec.paths)
    # off-circuit components really have random weights that write into the stream
    if planted.spec.arch == "transformer":
        W_O = torch.stack([b.attn.W_O for b in planted.model.blocks])
        n_writing = int((W_O.flatten(2).abs().sum(-1) > 0).sum())
        assert n_writing == planted.spec.n_layers * planted.spec.n_heads


def test_path_strengths_are_calibrated():
    """The read-out gain of each path makes its output difference's RMS its strength."""
    from mechlab.prune.forward import writer_outputs

    planted = built("ssm4-chain-single-1:10")
    model = planted.model
    data = planted_data("dense_ssm", seed=10_000 + planted.spec.seed, n_train=256, n_test=1)
    with torch.no_grad():
        diff = writer_outputs(model, data.train.inputs) - writer_outputs(model, data.train.corrupted)
    W = model.read_out.proj.weight.detach()
    for kind, strength in zip(planted.spec.paths, planted.spec.strengths, strict=True):
        last = planted.components[kind][-1]
        index = 0 if last == "embed" else 1 + int(last[1:])
        out = diff[index] @ W.T  # [batch, pos, 2]: that writer's part of the output difference
        assert float(out.pow(2).sum(-1).mean().sqrt()) == pytest.approx(strength, rel=1e-4)


def test_bad_specs_are_refused():
    for bad, message in [
        ({"n_layers": 5}, "n_layers must be 2, 3 or 4"),
        ({"n_heads": 9}, "n_heads must be an integer from 2 to 8"),
        ({"paths": ("skip", "skip"), "strengths": (1.0, 1.0)}, "paths must be distinct"),
        ({"paths": ("chain",), "strengths": (1.0,)}, "paths must be distinct kinds"),
        ({"strengths": (1.0, 0.0)}, "strengths must be one positive number per path"),
        ({"arch": "mamba"}, "arch must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            PlantedSpec(**bad)


def recover(name: str, seed: int) -> tuple[bool, str]:
    planted = built(name)
    n = int(countable_edges(build_graph(planted.model), "interchange").sum())
    circuit = prune(planted.model, planted.data(seed), "all", 1 - len(planted.edges) / n,
                    seed=seed, progress=False)  # fmt: skip
    kept = set(circuit.edges)
    return kept == set(planted.edges), f"seed {seed}: missing {set(planted.edges) - kept}, extra {kept - set(planted.edges)}"


LARGE = ("t4x8-value-1:10", "t3x4-value-qk", "t3x8-qk-skip-1:10")  # 10-20 s a run on a loaded core


@pytest.mark.parametrize("name", [
    n if n not in LARGE else pytest.param(n, marks=pytest.mark.slow) for n in PLANTED_FAMILY
])  # fmt: skip
def test_default_search_recovers_every_planted_circuit(name):
    for seed in range(2):  # data and optimiser seeds both vary
        ok, why = recover(name, seed)
        assert ok, why


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANTED_FAMILY))
def test_default_search_recovers_every_planted_circuit_five_seeds(name):
    for seed in range(2, 7):
        ok, why = recover(name, seed)
        assert ok, why
