"""mechlab.pipelines.methods and the method dispatch of prune_checkpoint / prune_targets."""

from __future__ import annotations

import pytest

from mechlab.pipelines import checkpoint_prune_data, prune_checkpoint, prune_targets
from mechlab.pipelines.methods import check_method
from mechlab.prune.methods import find_circuit

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("method, extra", [("eap-ig", {"ig_steps": 4}), ("exact", {}), ("acdc", {})])
def test_prune_checkpoint_runs_the_method_find_circuit_runs(tiny_lds_checkpoint, method, extra):
    circuit = prune_checkpoint(tiny_lds_checkpoint, "2-after", method=method, n_edges=5, n_train=16,
                               n_test=16, seed=3, **extra)  # fmt: skip
    ckpt, data = checkpoint_prune_data(tiny_lds_checkpoint, n_train=16, n_test=16, data_seed=3)
    kw = {"steps": 4} if method == "eap-ig" else {}
    direct = find_circuit(ckpt.model, data, "2-after", method, n_edges=5, **kw)
    assert circuit.edges == direct.edges
    meta = circuit.metadata
    assert meta["metrics"]["faithfulness"] == pytest.approx(direct.metadata["metrics"]["faithfulness"])
    assert meta["method"] == method and meta["seed"] == 3 and meta["data_seed"] == 3
    assert meta["protocol"] == "default" and meta["checkpoint"] == str(tiny_lds_checkpoint)
    assert meta["method_settings"] == {"sparsity": None, "n_edges": 5, "ablation": "interchange",
                                       **({"ig_steps": 4} if method == "eap-ig" else {}),
                                       **({"acdc_max_edges": 400} if method == "acdc" else {})}  # fmt: skip


@pytest.mark.filterwarnings("ignore:circuit for")  # two steps find no circuit
def test_edge_pruning_keeps_its_path_and_records_its_method(tiny_lds_checkpoint):
    circuit = prune_checkpoint(tiny_lds_checkpoint, "1-after", steps=2, n_train=8, n_test=8, progress=False)
    assert circuit.metadata["method"] == "prune" and circuit.log_alpha is not None


@pytest.mark.parametrize(
    "method, settings, kw, message",
    [
        ("eap", {"node_sparsity": 0.5}, {}, "node_sparsity is edge pruning's"),
        ("eap", {"loss": "truth", "steps": 3000}, {}, "loss 'truth', steps are edge pruning's"),
        ("exact", {"loss": "model", "ablation": "zero"}, {}, None),
        ("eap-ig-inputs", {"ablation": "mean"}, {}, "needs interchange ablation, not 'mean'"),
        ("exact", {}, {"ig_steps": 2}, "method 'exact' does not integrate"),
        ("eap-ig", {}, {"ig_steps": 1.5}, "--ig-steps must be an integer >= 1"),
        ("eap-ig", {}, {"ig_steps": 10**12}, r"--ig-steps 1e\+12 is more than mechlab.s limit"),
        ("acdc", {}, {"acdc_max_edges": 0}, "max_edges must be a positive integer"),
        ("prune", {"node_sparsity": 0.5}, {}, None),
    ],
)
def test_check_method(method, settings, kw, message):
    if message is None:
        check_method(method, settings, **kw)
        return
    with pytest.raises(ValueError, match=message):
        check_method(method, settings, **kw)


def test_prune_targets_refuses_a_budget_for_every_target_before_the_first_circuit(tiny_lds_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="above its limit of 10"):
        prune_targets(tiny_lds_checkpoint, ["1-after", "2-after"], out=tmp_path / "c", method="acdc",
                      acdc_max_edges=10, n_train=8, n_test=8)  # fmt: skip
    assert not (tmp_path / "c").exists()
