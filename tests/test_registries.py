"""The task and circuit-method registries (issue 35): lookups, their one-line refusals, no name
comparison left outside them (nor a model family's name outside the family registry), and a toy task and a toy method that reach ``mechlab prune``
and ``mechlab bench methods`` through the registries alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from mechlab import circuit_methods
from mechlab.checkpoint import load_checkpoint, save_checkpoint
from mechlab.cli import main
from mechlab.prune import Circuit
from mechlab.tasks import registry as task_registry

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "examples" / "checkpoints"

# A task name compared (``ckpt.task == "lds"``, ``task in (...)``, ``== "induction"``).
TASK_TEST = re.compile(
    r"\btask\s*(==|!=)|\btask\s+(not\s+)?in\s+[(\[{]|(==|!=)\s*['\"](lds|state_tracking|induction)['\"]"
    r"|['\"](lds|state_tracking|induction)['\"]\s*(==|!=)"
)
_NAMES = r"(prune|eap|eap-ig|eap-ig-inputs|exact|acdc)"
# A circuit method's name compared, or a method tested against a tuple of names.
METHOD_TEST = re.compile(
    rf"method\w*\s*(==|!=)\s*['\"]|method\w*\s+(not\s+)?in\s+[(\[{{]['\"]|['\"]{_NAMES}['\"]\s*(==|!=)"
    rf"|(==|!=)\s*['\"]{_NAMES}['\"]|method\w*\s+(not\s+)?in\s+(METHODS|IG_METHODS|ATTRIBUTION_METHODS)\b"
)
# Where a comparison is the registry itself, or another registry's (patching kinds are not circuit methods).
ALLOWED = {
    "mechlab/tasks/registry.py": "the task registry",
    "mechlab/circuit_methods.py": "the method registry",
    "mechlab/patching/result.py": "patching kinds (mechlab.patching.result.PATCH_KINDS), not circuit methods",
}

_FAMILIES = r"(transformer|lstm|dense_ssm|mamba)"
# A model family's name compared (``cfg.arch == "transformer"``, ``family != "lstm"``); what a
# family can do is asked of the family registry (``graph_kind(arch) == "transformer"`` asks
# for the graph kind, which the test leaves alone).
FAMILY_TEST = re.compile(
    rf"\b(arch|family)\s*(==|!=)|\b(arch|family)\s+(not\s+)?in\s+[(\[{{]"
    rf"|(==|!=)\s*['\"]{_FAMILIES}['\"]|['\"]{_FAMILIES}['\"]\s*(==|!=)"
)
FAMILY_ALLOWED = {
    "mechlab/models/registry.py": "the family registry (its parameter count per family)",
    "mechlab/prune/planted.py": "each planted ground truth builds one named family",
    "mechlab/bench/goals.py": "benchmark goals set per named family",
    "mechlab/bench/hooks.py": "benchmark rows of named families",
    "mechlab/models/hf_config.py": "Hugging Face architecture names (the importer's table), not families",
    "mechlab/models/importers.py": "Hugging Face architecture names (the importer's table), not families",
    "mechlab/models/export.py": "a hint naming the one family with a converter of its own",
    "mechlab/models/cache.py": "TransformerLens' accessors exist for the transformer; the registry "
    "imports this module (through models.base), so it cannot ask the registry",
    "mechlab/models/names.py": "a circuit file's arch; this module stays free of torch for start-up",
}


def _hits(pattern: re.Pattern[str], allowed: dict[str, str] = ALLOWED) -> list[str]:
    found = []
    for path in sorted((ROOT / "mechlab").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in allowed:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code) and "graph_kind(" not in code:
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_the_patterns_find_what_they_look_for():
    assert TASK_TEST.search('    if ckpt.task == "state_tracking":')
    assert TASK_TEST.search('if self.target_weights and self.task != "lds":')
    assert TASK_TEST.search('elif name == "induction":')
    assert METHOD_TEST.search('    if method in ("eap", "eap-ig-inputs") and ablation in ("mean", "zero"):')
    assert METHOD_TEST.search('tag = "" if method == "prune" else "_" + method')
    assert METHOD_TEST.search("if ig_steps is not None and method not in IG_METHODS:")
    assert METHOD_TEST.search('scores if "acdc" == kind else scores.abs()')
    assert METHOD_TEST.search('if method not in {"eap", "exact"}:')
    assert TASK_TEST.search('if ckpt.task in ["lds", "induction"]:')
    assert not METHOD_TEST.search('if spec.kind == "search":')
    assert FAMILY_TEST.search('        transformer = model.cfg.arch == "transformer"')
    assert FAMILY_TEST.search('if getattr(cfg, "arch", None) != "transformer":')
    assert FAMILY_TEST.search('elif family == "lstm" and ratio:')
    assert FAMILY_TEST.search('if cfg.arch in ("lstm", "mamba"):')
    assert not FAMILY_TEST.search('if graph.n_heads == 0:')


def test_no_task_or_method_name_is_compared_outside_the_registries():
    assert _hits(TASK_TEST) == []
    assert _hits(METHOD_TEST) == []


def test_no_family_name_is_compared_outside_the_family_registry():
    assert _hits(FAMILY_TEST, FAMILY_ALLOWED) == []
    for rel in FAMILY_ALLOWED:  # every exception still holds a comparison, or it goes
        assert (ROOT / rel).exists() and FAMILY_TEST.search((ROOT / rel).read_text()), rel


def test_the_task_registry_holds_the_built_in_tasks():
    assert task_registry.task_names()[:3] == ("lds", "state_tracking", "induction")
    lds, st, induction = (task_registry.get_task(n) for n in ("lds", "state_tracking", "induction"))
    assert lds.targets == ("k-after", "all") and lds.haystack is not None and not lds.takes_length
    assert st.takes_length and st.resolves_targets and st.corruption("misdirect_incorrect") == "random"
    assert induction.corruption("misdirect_incorrect") == "resample" and induction.corruption("x") == "x"
    assert lds.corruption("misdirect_incorrect") == "misdirect_incorrect"
    from mechlab.tasks import TASK_CONFIGS, LDSConfig

    assert lds.config() is LDSConfig and TASK_CONFIGS["lds"] is LDSConfig
    from mechlab.train.task import LDSTask, make_task

    assert task_registry.get_task("lds").trainer is LDSTask  # attached by the training layer
    with pytest.raises(ValueError, match=r"^unknown task 'nope'; choose one of \['bilingual', 'induction', 'lds', 'state_tracking'\]$"):
        make_task("nope", {})


def test_an_unknown_task_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown task 'nope'; choose one of \['lds', 'state_tracking', "
                                         r"'induction'"):  # fmt: skip
        task_registry.get_task("nope")
    with pytest.raises(ValueError, match="is registered already"):
        task_registry.register(task_registry.get_task("lds"))
    with pytest.raises(ValueError, match="which mechlab does not know"):
        task_registry.task_config({"task": "nope", "task_cfg": {}}, "x.pt")


def test_the_method_registry_holds_the_built_in_methods():
    assert circuit_methods.method_names() == ("prune", "eap", "eap-ig", "eap-ig-inputs", "exact", "acdc")
    assert circuit_methods.scoring_names() == ("eap", "eap-ig", "eap-ig-inputs", "exact")
    assert circuit_methods.integrating_names() == ("eap-ig", "eap-ig-inputs")
    acdc = circuit_methods.get_method("acdc")
    assert acdc.edge_limit and acdc.signed and acdc.checks_as == "exact" and not acdc.scores
    assert circuit_methods.is_edge_pruning("prune") and circuit_methods.is_edge_pruning(None)
    assert not circuit_methods.is_edge_pruning("eap") and not circuit_methods.is_edge_pruning("unknown")
    assert circuit_methods.method_tag("prune") == "" and circuit_methods.method_tag("eap-ig") == "_eap-ig"
    import mechlab.prune.attribution  # noqa: F401 -- attaches the built-in scorers

    assert all(circuit_methods.get_method(m).scorer is not None for m in circuit_methods.scoring_names())


def test_an_unknown_method_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown method 'nope'; choose one of prune, eap, eap-ig, "
                                         r"eap-ig-inputs, exact, acdc$"):  # fmt: skip
        circuit_methods.get_method("nope")
    with pytest.raises(ValueError, match=r"^unknown attribution method 'acdc'; choose one of eap, eap-ig, "
                                         r"eap-ig-inputs, exact$"):  # fmt: skip
        circuit_methods.get_scoring("acdc")
    with pytest.raises(ValueError, match="unknown method kind"):
        circuit_methods.CircuitMethod("x", "y", kind="guess")


def test_the_cli_reads_the_method_registry():
    from mechlab.cli import circuits

    assert circuits.METHOD_HELP.startswith("prune: differentiable edge pruning (default); eap: edge attribution")
    assert circuits.METHOD_HELP.endswith("is scored on the same held-out traces.")
    assert circuits.PRUNE_ONLY == circuit_methods.EDGE_PRUNING_OPTIONS


# ---- a toy task and a toy method, registered through the registries alone


def _toy_prune_data(cfg, target, *, n_train, n_test, corruption, seed, **_):
    """The toy task's traces: the induction task's, under the target name ``every``."""
    from mechlab.tasks.induction_prune import induction_prune_data

    if target != "every":
        raise ValueError(f"target {target!r} is not the toy task's; use every")
    return induction_prune_data(cfg, n_train=n_train, n_test=n_test, corruption=corruption, seed=seed), "all"


def _toy_scores(run, *, batch_size, progress, **_):
    """The toy method's scores: the later an edge, the higher (a fixed ranking)."""
    return torch.arange(1, run.graph.n_edges + 1, dtype=torch.float64)


@pytest.fixture
def toy_registries():
    from mechlab.tasks.induction import InductionConfig

    task_registry.register(task_registry.Task(
        "toy", ("every",), lambda: InductionConfig, _toy_prune_data, default_corruption="resample",
        target_refusal="target {target!r} is not the toy task's; use every",
    ))  # fmt: skip
    circuit_methods.register(circuit_methods.CircuitMethod("toy-rank", "the later edges first",
                                                           scorer=_toy_scores))  # fmt: skip
    try:
        yield
    finally:
        task_registry.unregister("toy")
        circuit_methods.unregister("toy-rank")


@pytest.fixture
def toy_checkpoint(tmp_path):
    """The bundled induction checkpoint's model, recorded as trained on the toy task."""
    ckpt = load_checkpoint(BUNDLED / "induction-cpu" / "last.pt")
    meta = {k: v for k, v in ckpt.metadata.items() if k not in ("task",)}
    return save_checkpoint(ckpt.model, tmp_path / "toy.pt", step=ckpt.step, **{**meta, "task": "toy"})


def test_a_toy_task_and_a_toy_method_reach_mechlab_prune(toy_registries, toy_checkpoint, tmp_path, capsys):
    out = tmp_path / "c"
    code = main(["prune", "--ckpt", str(toy_checkpoint), "--target", "every", "--method", "toy-rank",
                 "--sparsity", "0.9", "--traces", "8", "--test-traces", "8", "--no-progress", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    circuit = Circuit.from_json(out / "every_toy-rank_seed0.json")
    meta = circuit.metadata
    assert meta["method"] == "toy-rank" and meta["data"]["task"] == "induction"
    assert meta["data"]["corruption"] == "resample"  # the toy task's default corruption
    assert meta["settings"]["target"] == "every" and meta["settings"]["method"] == "toy-rank"
    assert circuit.edges, "the toy ranking keeps edges"
    # the toy task refuses another target in its own words, before any pruning
    code = main(["prune", "--ckpt", str(toy_checkpoint), "--target", "all", "--out", str(tmp_path / "d")])
    assert code == 2 and "target 'all' is not the toy task's; use every" in capsys.readouterr().err


def test_a_toy_method_reaches_mechlab_bench_methods(toy_registries, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["bench", "methods", "--ckpt", str(BUNDLED / "recall-cpu" / "last.pt"), "--methods", "toy-rank",
                 "--targets", "1-after", "--planted", "none", "--tracr-seeds", "none", "--redundant", "none",
                 "--stability-boots", "0", "--traces", "8", "--test-traces", "8", "--no-progress", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    table = json.loads(out.read_text())
    assert table["methods"] == ["toy-rank"]
    row = table["model"]["toy-rank"]["1-after"]
    assert row["refused"] is None and row["n_edges_kept"] > 0 and row["faithfulness"] is not None
    assert "| toy-rank |" in capsys.readouterr().out
