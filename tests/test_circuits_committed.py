"""The circuits committed under circuits/recall-cpu: they belong to the bundled checkpoint,
meet their sparsity, and `mechlab prune` regenerates them (slow)."""

from pathlib import Path

import pytest

from mechlab.checkpoint import load_checkpoint
from mechlab.pipelines import prune_checkpoint
from mechlab.prune import Circuit

ROOT = Path(__file__).resolve().parents[1]
CIRCUITS = sorted((ROOT / "circuits" / "recall-cpu").glob("*-after_seed*.json"))
CKPT = ROOT / "examples" / "checkpoints" / "recall-cpu" / "last.pt"


def test_both_targets_with_several_seeds_are_committed():
    names = {p.stem for p in CIRCUITS}
    for target in ("1-after", "2-after"):
        assert sum(n.startswith(target) for n in names) >= 2


@pytest.mark.parametrize("path", CIRCUITS, ids=[p.stem for p in CIRCUITS])
def test_committed_circuit_matches_the_bundled_checkpoint(path):
    circuit = Circuit.from_json(path)
    meta = circuit.metadata
    assert meta["checkpoint_sha256"] == load_checkpoint(CKPT).sha256
    # at the asked sparsity, or sparser when too few edges were open or no further complete
    # path fitted, and then it says so
    assert meta["sparsity_reached"] >= meta["sparsity_asked"] - 0.005
    if meta["sparsity_reached"] > meta["sparsity_asked"] + 0.005:
        assert meta["sparsity_limited_by_open_edges"] or meta.get("sparsity_limited_by_paths")
    assert circuit.n_edges <= meta["n_open_edges"]
    assert all(score > 0 for score in circuit.edges.values())  # open edges only
    assert 0 < meta["edge_threshold_mask"] <= 1
    assert not any(writer == "pos" for writer, _ in circuit.edges)  # inert under interchange
    assert meta["target"] == path.stem.split("_seed")[0]
    assert 0 < circuit.n_edges


@pytest.mark.slow
def test_prune_regenerates_the_committed_circuit():
    committed = Circuit.from_json(CIRCUITS[0])
    meta = committed.metadata
    again = prune_checkpoint(CKPT, meta["target"], meta["sparsity_asked"], seed=meta["seed"],
                             data_seed=meta["data_seed"], steps=meta["steps"], progress=False)
    assert set(again.edges) == set(committed.edges)
