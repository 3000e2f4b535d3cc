"""The recipes of docs/architecture.md ("How to add a task, a circuit method, a model family
or a command") followed in a test: a toy model family, a toy task and a toy circuit method,
each one registered entry and nothing else, reach ``mechlab prune`` (through typer's
CliRunner) and ``mechlab bench methods``' library function."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest
import torch
from typer.testing import CliRunner

from mechlab import circuit_methods
from mechlab.bench.methods import bench_methods
from mechlab.checkpoint import load_checkpoint, save_checkpoint
from mechlab.cli import app, main
from mechlab.models.dense_ssm import DenseSSM, DenseSSMConfig
from mechlab.models.registry import Family, build_model, register_family, unregister_family
from mechlab.prune import Circuit
from mechlab.prune.graph import build_graph, countable_edges
from mechlab.tasks import registry as task_registry
from mechlab.tasks.induction import InductionConfig

pytestmark = pytest.mark.usefixtures("one_thread")
TRACES = ["--traces", "8", "--test-traces", "8", "--no-progress"]


@dataclasses.dataclass
class ToyConfig(DenseSSMConfig):
    """The toy family's config: a dense SSM's fields under the family's own name."""

    arch: ClassVar[str] = "toy_ssm"


class Toy(DenseSSM):
    """The toy family's model (a dense SSM, which the layers above know only by its entry)."""


def toy_prune_data(cfg, target, *, n_train, n_test, corruption, seed, **_):
    """The toy task's traces: the induction task's, under its one target ``every``."""
    from mechlab.tasks.induction_prune import induction_prune_data

    if target != "every":
        raise ValueError(f"target {target!r} is not the toy task's; use every")
    return induction_prune_data(cfg, n_train=n_train, n_test=n_test, corruption=corruption, seed=seed), "all"


def toy_scores(run, *, batch_size, progress, **_):
    """The toy method's scores: the later an edge in the graph, the higher."""
    return torch.arange(1, run.graph.n_edges + 1, dtype=torch.float64)


@pytest.fixture
def toys():
    """The three entries, registered through the registries alone (and removed again)."""
    register_family("toy_ssm", Family(__name__, "ToyConfig", "Toy", graph="recurrent", mixer="ssm"))
    task_registry.register(task_registry.Task(
        "toy-copy", ("every",), lambda: InductionConfig, toy_prune_data, default_corruption="resample",
        target_refusal="target {target!r} is not the toy task's; use every",
    ))  # fmt: skip
    circuit_methods.register(circuit_methods.CircuitMethod("toy-rank", "the later edges first", scorer=toy_scores))
    try:
        yield
    finally:
        circuit_methods.unregister("toy-rank")
        task_registry.unregister("toy-copy")
        unregister_family("toy_ssm")


@pytest.fixture
def toy_checkpoint(toys, tmp_path):
    """A small toy-family model, recorded as trained on the toy task (the induction task's config)."""
    cfg = InductionConfig()
    torch.manual_seed(0)
    model = build_model({"arch": "toy_ssm", "d_model": 16, "n_layers": 2, "d_state": 4, "io": "tokens",
                         "d_vocab": cfg.d_vocab, "d_vocab_out": cfg.d_vocab, "n_ctx": cfg.n_ctx})  # fmt: skip
    return save_checkpoint(model, tmp_path / "toy.pt", step=0, task="toy-copy", task_cfg=dataclasses.asdict(cfg))


def test_the_toys_reach_mechlab_prune(toy_checkpoint, tmp_path, capsys):
    runner = CliRunner()
    out = tmp_path / "c"
    result = runner.invoke(app, ["prune", "--ckpt", str(toy_checkpoint), "--target", "every", "--method", "toy-rank",
                                 "--sparsity", "0.5", *TRACES, "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    circuit = Circuit.from_json(out / "every_toy-rank_seed0.json")
    meta = circuit.metadata
    assert meta["method"] == "toy-rank" and meta["settings"]["target"] == "every"
    assert meta["data"]["corruption"] == "resample"  # the toy task's default corruption
    model = load_checkpoint(toy_checkpoint).model
    graph = build_graph(model)  # the toy family's graph, from its entry: a recurrent stack
    assert type(model) is Toy and meta["graph"]["arch"] == "toy_ssm" and meta["graph"]["n_edges"] == graph.n_edges
    # the toy ranking's best edge (the last countable one) is kept, its worst (the first) left out
    countable = [graph.edges[i] for i in countable_edges(graph, "interchange").nonzero().flatten().tolist()]
    kept = {tuple(e) for e in circuit.edges}
    order = [e in kept for e in countable]
    assert order[-1] and not order[0] and 0 < sum(order) < len(order)
    # edge pruning runs on the toy family too, and the toy task refuses a target in its own words
    result = runner.invoke(app, ["prune", "--ckpt", str(toy_checkpoint), "--target", "every", "--steps", "20",
                                 "--sparsity", "0.5", *TRACES, "--out", str(tmp_path / "p")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert Circuit.from_json(tmp_path / "p" / "every_seed0.json").metadata["graph"]["arch"] == "toy_ssm"
    code = main(["prune", "--ckpt", str(toy_checkpoint), "--target", "all", "--out", str(tmp_path / "d")])
    assert code == 2 and not (tmp_path / "d").exists()
    assert capsys.readouterr().err.strip().endswith("target 'all' is not the toy task's; use every")


def test_the_toys_reach_mechlab_bench_methods(toy_checkpoint):
    model = load_checkpoint(toy_checkpoint).model.eval()
    entry = task_registry.get_task("toy-copy")
    data, target = entry.prune_data(entry.config()(), "every", n_train=8, n_test=8,
                                    corruption=entry.corruption("misdirect_incorrect"), seed=0)  # fmt: skip
    table = bench_methods(model, data, [target], ["toy-rank", "prune"], sparsity=0.5, budgets=(0.5,),
                          method_kwargs={"prune": {"steps": 20}}, progress=False)  # fmt: skip
    assert table.methods == ["toy-rank", "prune"]
    for method in table.methods:
        row = table.model[method]["all"]
        assert row.refused is None and row.n_edges_kept > 0 and row.faithfulness is not None
