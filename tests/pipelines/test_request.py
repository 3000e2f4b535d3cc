"""mechlab.pipelines.request: one circuit request, resolved once; traces and checkpoints once."""

import contextlib
import json
from pathlib import Path

import pytest

import mechlab.pipelines.checkpoints as checkpoints_module
import mechlab.pipelines.prune as prune_module
from mechlab.circuit_methods import DEFAULT_METHOD, is_edge_pruning
from mechlab.pipelines import open_checkpoint, prune_targets
from mechlab.pipelines.data import checkpoint_task, task_data, task_haystack
from mechlab.pipelines.outputs import settings_record, with_defaults
from mechlab.pipelines.prune import _with_consensus, prune_settings
from mechlab.pipelines.request import PRUNE_RECIPES, CircuitRequest, TraceCache
from mechlab.prune.circuit import Circuit
from mechlab.prune.config import RUN_ARGUMENTS, resolved_settings
from mechlab.prune.engine import prune
from mechlab.tasks.registry import DEFAULT_CORRUPTION
from mechlab.traces import target_name

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
CKPTS = ROOT / "examples" / "checkpoints"


# ------------------------------------------------------------------ the settings record, as it was


def _old_prune_settings(ckpt, target, sparsity=None, *, n_train=256, n_test=512, n_haystack=None, seg_len=None,
                        corruption=DEFAULT_CORRUPTION, data_seed=None, recipe="default", loss_scale=None,
                        length=None, **prune_kwargs):  # fmt: skip
    """A copy of prune_settings before the request object (the reference the record must match)."""
    if callable(target):
        return None
    given = {"sparsity": sparsity, "loss_scale": loss_scale, **prune_kwargs}
    settings = {**PRUNE_RECIPES[recipe], **{k: v for k, v in given.items() if v is not None}}
    sparsity, nih = settings.pop("sparsity"), settings.pop("nih")
    run = with_defaults(prune, {k: v for k, v in settings.items() if k in RUN_ARGUMENTS})
    settings = {**{k: v for k, v in run.items() if k != "config"},
                **resolved_settings({**settings, "sparsity": sparsity})}  # fmt: skip
    sparsity = settings.pop("sparsity")
    data = {"n_train": n_train, "n_test": n_test, "corruption": corruption,
            "data_seed": settings["seed"] if data_seed is None else data_seed}  # fmt: skip
    task = checkpoint_task(ckpt)
    if task.resolves_targets:
        _, resolved = task_data(
            ckpt, target, length=length, n_train=1, n_test=1, corruption=corruption
        )
        name = target_name(resolved)
    else:
        name = target_name(target)
    if task.takes_length:
        data["length"] = length
    if task.haystack is not None:
        data.update(nih=nih, **task_haystack(task, ckpt, n_haystack, seg_len))
    return {"analysis": "prune", "checkpoint_sha256": ckpt.sha256, "target": name, "recipe": recipe,
            "sparsity": sparsity, **data, **settings}  # fmt: skip


def _old_with_method(record, method_settings):
    method = method_settings.get("method") or DEFAULT_METHOD
    if record is None or (is_edge_pruning(method) and method_settings.get("n_edges") is None):
        return record
    return {
        **record,
        **{k: v for k, v in method_settings.items() if v is not None},
        "method": method,
    }


CASES = [  # (checkpoint, target, options): the bundled checkpoints' circuits
    ("recall-cpu", "1-after", {}),
    ("recall-cpu", "2-after", {}),
    ("recall-cpu", "2-after", {"recipe": "study", "seed": 3}),
    ("recall-cpu", "1-after", {"recipe": "thorough", "steps": 7, "n_haystack": 2, "seg_len": 4}),
    ("recall-lstm-cpu", "1-after", {"sparsity": 0.6}),
    ("recall-lstm-cpu", "2-after", {"sparsity": 0.6, "seed": 1, "data_seed": 5, "lr": 0.05}),
    ("st-transformer-cpu", "final", {"length": 4}),
    ("st-transformer-cpu", "final", {"length": 4, "seed": 2, "corruption": "random"}),
    ("induction-cpu", "all", {"sparsity": 0.9}),
    ("induction-cpu", "all", {"sparsity": 0.9, "recipe": "fast", "seed": 1}),
]


@pytest.fixture(scope="module")
def opened():
    return {name: open_checkpoint(CKPTS / name / "last.pt") for name in {c[0] for c in CASES}}


@pytest.mark.parametrize(("ckpt", "target", "options"), CASES)
def test_record_is_the_old_settings_record(opened, ckpt, target, options):
    ckpt = opened[ckpt]
    old = _old_prune_settings(ckpt, target, **options)
    recipe = options.get("recipe", "default")
    request = CircuitRequest.resolve(recipe, **{k: v for k, v in options.items() if k != "recipe"})
    assert request.record(ckpt, target) == old
    assert settings_record(request.record(ckpt, target)) == settings_record(old)  # byte for byte
    assert (
        prune_settings(ckpt, target, **options) == old
    )  # the public function, now through the request
    # resolved on the traces the pruning uses (the state-tracking name <target>_n<length>)
    data, resolved = request.traces(ckpt, target)
    assert request.record(ckpt, target, resolved) == old


@pytest.mark.parametrize(
    "method",
    [
        {"method": "eap-ig", "ig_steps": 4},
        {"method": "eap"},
        {"n_edges": 12},
        {"method": "acdc", "acdc_max_edges": 900},
    ],
)
def test_record_with_method_and_stability_is_the_old_one(opened, method):
    ckpt = opened["recall-cpu"]
    request = CircuitRequest.resolve(ablation="interchange", stability=3, **method)
    settings = {
        "method": "prune",
        "n_edges": None,
        "ig_steps": None,
        "acdc_max_edges": None,
        **method,
    }
    old = {**_old_with_method(_old_prune_settings(ckpt, "1-after", ablation="interchange"), settings),
           "stability_boots": 3}  # fmt: skip
    assert request.record(ckpt, "1-after") == old


def test_record_matches_the_committed_circuits(opened):
    """The committed recall-cpu circuits (seeds 0-4, default recipe) read back under a request."""
    ckpt = opened["recall-cpu"]
    seeds = [0, 1, 2, 3, 4]
    request = CircuitRequest.resolve(progress=False)
    for target in ("1-after", "2-after"):
        for seed in (0, 3):
            file = ROOT / "circuits" / "recall-cpu" / f"{target}_seed{seed}.json"
            committed = json.loads(file.read_text())["metadata"]
            record = _with_consensus(request.with_seed(seed).record(ckpt, target), seeds, False)
            assert settings_record(record) == {"settings": committed["settings"],
                                               "settings_sha256": committed["settings_sha256"]}  # fmt: skip


# ------------------------------------------------------------------ resolution


def test_resolution_recipe_then_options():
    study = CircuitRequest.resolve("study")
    assert (study.sparsity, study.nih, study.search["steps"], study.search["loss"]) == (
        0.99,
        "study",
        3000,
        "truth",
    )
    # options given explicitly override the recipe; None means "not given"
    mine = CircuitRequest.resolve("study", sparsity=0.9, steps=None, loss="model")
    assert (mine.sparsity, mine.search["steps"], mine.search["loss"]) == (0.9, 3000, "model")
    # a command line's options: only those given override the recipe, the others' defaults do not
    cli = CircuitRequest.resolve(
        "study", given={"steps"}, sparsity=0.95, steps=7, loss="model", lr=0.2
    )
    assert (cli.sparsity, cli.search["steps"], cli.search["loss"], cli.search["lr"]) == (
        0.99,
        7,
        "truth",
        0.2,
    )
    assert CircuitRequest.resolve("uniform").nih == "uniform"
    plain = CircuitRequest.resolve(n_train=8, data_seed=3, length=None)
    assert (plain.n_train, plain.n_test, plain.data_seed, plain.length, plain.trace_seed) == (
        8,
        512,
        3,
        None,
        3,
    )
    assert (
        plain.with_seed(5).trace_seed == 3 and CircuitRequest.resolve().with_seed(5).trace_seed == 5
    )


def test_with_seed_changes_only_the_seed():
    request = CircuitRequest.resolve("uniform", n_train=16, method="eap-ig", ig_steps=3)
    seeded = request.with_seed(4)
    assert seeded.seed == 4 and request.seed == 0 and "seed" not in request.search
    assert {k: v for k, v in seeded.search.items() if k != "seed"} == dict(request.search)
    assert (seeded.n_train, seeded.method, seeded.ig_steps, seeded.recipe) == (
        16,
        "eap-ig",
        3,
        "uniform",
    )
    with pytest.raises(TypeError):
        seeded.search["steps"] = 1  # read-only
    with pytest.raises(ValueError, match="seed must be an integer"):
        request.with_seed("1")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"recipe": "nope"}, "unknown recipe 'nope'"),
        ({"sparsity": 1.5}, "sparsity must be in"),
        ({"steps": 0}, "steps must be"),
        ({"lr": float("nan")}, "lr must be"),
        ({"fancy": 1}, "unknown pruning setting 'fancy'"),
        ({"stability": 1}, "--stability must be 0"),
        ({"ig_steps": 3}, "--ig-steps"),
        ({"method": "nope"}, "nope"),
        ({"n_train": 0}, "n_train must be"),
        ({"n_haystack": -1}, "n_haystack must be"),
        ({"data_seed": 1.5}, "data_seed must be"),
        ({"length": True}, "length must be"),
    ],
)
def test_bad_settings_are_one_line_errors(options, message):
    options = dict(options)
    recipe = options.pop("recipe", "default")
    with pytest.raises(ValueError, match=message) as err:
        CircuitRequest.resolve(recipe, **options)
    assert "\n" not in str(err.value)


def test_bad_setting_refused_before_the_checkpoint_is_opened(monkeypatch, tmp_path):
    def no_load(*args, **kwargs):
        raise AssertionError("the checkpoint was opened before the settings were checked")

    monkeypatch.setattr(checkpoints_module, "load_checkpoint", no_load)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="steps must be"):
        prune_targets(CKPTS / "recall-cpu" / "last.pt", ["1-after"], [0], out, steps=0)
    with pytest.raises(ValueError, match="not both"):
        prune_targets(CKPTS / "recall-cpu" / "last.pt", ["1-after"], [0], out, request=CircuitRequest.resolve(),
                      steps=3)  # fmt: skip
    assert not out.exists()


@pytest.mark.parametrize(
    "given, named",
    [({"n_train": 64}, "n_train"), ({"sparsity": 0.9, "method": "eap"}, "method, sparsity"),
     ({"stability": 3}, "stability"), ({"steps": 3}, "steps"), ({"protocol": "study"}, "recipe")],
)  # fmt: skip
def test_a_request_and_settings_beside_it_are_refused_naming_them(monkeypatch, given, named):
    def no_load(*args, **kwargs):
        raise AssertionError("the checkpoint was opened before the settings were checked")

    monkeypatch.setattr(checkpoints_module, "load_checkpoint", no_load)
    with pytest.warns(DeprecationWarning) if "protocol" in given else contextlib.nullcontext():
        with pytest.raises(ValueError, match=rf"not both \(also given: {named}\)$"):
            prune_module.prune_checkpoint(CKPTS / "recall-cpu" / "last.pt", "1-after", request=CircuitRequest.resolve(),
                                          **given)  # fmt: skip


# ------------------------------------------------------------------ work done once


class Counts:
    """Counters on opening a checkpoint file, checking an opened one and building traces."""

    def __init__(self, monkeypatch):
        self.loads = self.checks = self.pruned = 0
        self.traces: list[tuple[int, int]] = []
        load, check = checkpoints_module.load_checkpoint, checkpoints_module.check_finite_parameters

        def counted_load(*args, **kwargs):
            self.loads += 1
            return load(*args, **kwargs)

        def counted_check(*args, **kwargs):
            self.checks += 1
            return check(*args, **kwargs)

        monkeypatch.setattr(checkpoints_module, "load_checkpoint", counted_load)
        monkeypatch.setattr(checkpoints_module, "check_finite_parameters", counted_check)
        import mechlab.tasks.induction_prune as induction
        import mechlab.tasks.lds_prune as lds
        import mechlab.tasks.state_tracking_prune as state_tracking

        for module in (lds, state_tracking, induction):  # every task's prune-data function
            monkeypatch.setattr(module, "task_prune_data", self._counted(module.task_prune_data))
        monkeypatch.setattr(lds, "check_task_targets", self._counted_check(lds.check_task_targets))

        def fake_find(
            model, data, target, sparsity, **settings
        ):  # the search itself is not counted here
            self.pruned += 1
            circuit = Circuit.from_json(ROOT / "circuits" / "recall-cpu" / "1-after_seed0.json")
            circuit.metadata.update(seed=settings.get("seed", 0), sparsity_asked=sparsity)
            circuit.metadata.pop("settings", None)
            return circuit

        monkeypatch.setattr(prune_module, "_find", fake_find)

    def _counted(self, fn):
        def counted(cfg, target, *, n_train, n_test, seed=0, **kwargs):
            self.traces.append((n_train, seed))
            return fn(cfg, target, n_train=n_train, n_test=n_test, seed=seed, **kwargs)

        return counted

    def _counted_check(self, fn):
        def counted(*args, **kwargs):
            self.traces.append((1, -1))
            return fn(*args, **kwargs)

        return counted


@pytest.mark.parametrize(
    ("ckpt", "targets", "options"),
    [("recall-cpu", ["1-after", "2-after"], {}), ("st-transformer-cpu", ["final"], {"length": 4})],
)
def test_prune_opens_once_and_builds_each_trace_set_once(
    monkeypatch, tmp_path, ckpt, targets, options
):
    counts = Counts(monkeypatch)
    run = prune_targets(
        CKPTS / ckpt / "last.pt", targets, [0, 1], tmp_path / "out", progress=False, **options
    )
    assert (
        counts.loads == 1 and counts.checks == 0
    )  # a file checked as it is read, then never again
    assert counts.pruned == len(targets) * 2
    assert sorted(counts.traces) == sorted(
        (256, s) for _ in targets for s in (0, 1)
    )  # once per (target, seed)
    assert len(run.files) == len(targets) * 2
    # the rerun reads every circuit back (its plan builds the traces it checks the targets on, once)
    counts.traces.clear()
    again = prune_targets(
        CKPTS / ckpt / "last.pt", targets, [0, 1], tmp_path / "out", progress=False, **options
    )
    assert sorted(again.reused) == sorted(run.files) and counts.pruned == len(targets) * 2
    assert sorted(counts.traces) == sorted((256, s) for _ in targets for s in (0, 1))


def test_an_opened_checkpoint_is_checked_once(monkeypatch, tmp_path):
    counts = Counts(monkeypatch)
    ckpt = open_checkpoint(CKPTS / "recall-cpu" / "last.pt")
    prune_targets(ckpt, ["1-after", "2-after"], [0, 1], tmp_path / "out", progress=False)
    assert (counts.loads, counts.checks) == (1, 1)


def test_report_opens_once_and_builds_each_trace_set_once(monkeypatch, tmp_path):
    import mechlab.pipelines.report as report

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    counts = Counts(monkeypatch)
    monkeypatch.setattr(report, "run_suite", lambda *args, **kwargs: {})
    monkeypatch.setattr(report, "_overlap", lambda *args, **kwargs: {})
    monkeypatch.setattr(report, "recall_checkpoint", stop)  # the stage after the pruning
    with pytest.raises(Stop):
        report.report_checkpoint(
            CKPTS / "recall-cpu" / "last.pt", tmp_path / "report", progress=False
        )
    assert (counts.loads, counts.checks, counts.pruned) == (1, 0, 4)
    assert sorted(counts.traces) == [(256, 0), (256, 0), (256, 1), (256, 1)]


def test_trace_cache_builds_once_per_target_and_seed(opened):
    ckpt = opened["recall-cpu"]
    cache = TraceCache(ckpt, CircuitRequest.resolve(n_train=4, n_test=4))
    first = cache.get("1-after", 0)
    assert cache.get("1-after", 0) is first and cache.get("1-after", 1) is not first
    data, target = first
    assert target == "1-after" and data.train.inputs.shape[0] == 4
    same, _ = CircuitRequest.resolve(n_train=4, n_test=4).traces(ckpt, "1-after")
    assert (same.train.inputs == data.train.inputs).all()  # what the pruning would build itself
    cache.clear()
    assert cache.get("1-after", 0) is not first
