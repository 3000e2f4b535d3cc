"""The sweep runner: persisted trials, resume, and Ray (a killed worker retried, nothing
finished lost). One local Ray instance (2 CPUs) serves every Ray test of this module."""

import json
import logging
import os
import time

import pytest

from mechlab.pipelines import write_outputs
from mechlab.sweep import (
    OracleTrial,
    SearchConfig,
    SweepSpec,
    TrialStore,
    run_sweep,
    trial_key,
)
from mechlab.sweep.executors import check_address


def small_spec(**kw):
    settings = dict(models=("st_lstm_small",), formats=("acot",), ms=(3,), Ls=(3,), lengths=("fixed",),
                    kappa=False, ood=True, lrs=(1e-3,), seeds=(10, 20), n_val=5,
                    search=SearchConfig(n_min=1, n_max=100, multiplier=10))  # fmt: skip
    settings.update(kw)
    return SweepSpec(**settings)


# Z_3 at n = 3: 27 sequences, 5 of them validation: N <= 22. Both seeds converge from N = 5.
ORACLE = OracleTrial(thresholds={"fixed:3": 5}, lr_spread=0.0, seed_spread=0.0)


class Interrupted(OracleTrial):
    """The oracle, but the sweep is interrupted (Ctrl-C) at the k-th trial."""

    def __init__(self, k):
        super().__init__(thresholds={"fixed:3": 5}, lr_spread=0.0, seed_spread=0.0)
        object.__setattr__(self, "calls", [])
        object.__setattr__(self, "k", k)

    def __call__(self, spec):
        self.calls.append(spec)
        if len(self.calls) == self.k:
            raise KeyboardInterrupt
        return super().__call__(spec)


def running(pid):
    """Whether process ``pid`` runs (a zombie awaiting its parent does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pid, within=30.0):
    """Whether process ``pid`` stops running within ``within`` seconds (a worker that called
    ``os._exit`` may still be tearing down for a moment on a busy machine)."""
    deadline = time.monotonic() + within
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def never(spec):
    raise AssertionError(f"trial {spec} ran again although it had finished")


def test_an_interrupted_sweep_resumes_without_rerunning_finished_trials(tmp_path):
    full = run_sweep(small_spec(), tmp_path / "full", trial=ORACLE, local=True, progress=False)
    stopped = Interrupted(k=4)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(small_spec(), tmp_path / "resumed", trial=stopped, local=True, progress=False)
    assert len(TrialStore(tmp_path / "resumed" / "trials")) == 3  # the three before the 4th
    resumed = run_sweep(small_spec(), tmp_path / "resumed", trial=ORACLE, local=True, progress=False)
    assert resumed.ran == full.ran - 3 and resumed.reused == 3
    assert {k: r.to_dict() for k, r in resumed.searches.items()} == {k: r.to_dict() for k, r in full.searches.items()}
    (r,) = full.searches.values()
    assert r.n_star == 5 and r.status == "found"
    again = run_sweep(small_spec(), tmp_path / "resumed", trial=never, local=True, progress=False)
    assert again.ran == 0 and again.reused == len(full.trials)


def test_the_store_names_trials_by_spec_without_the_device_and_writes_whole_files(tmp_path):
    spec = small_spec().trial_specs(small_spec().main_keys()[0], 7)[0]
    assert trial_key(spec) == trial_key({**spec, "device": "cuda"})
    assert trial_key(spec) != trial_key({**spec, "seed": spec["seed"] + 1})
    store = TrialStore(tmp_path)
    (tmp_path / f".{trial_key(spec)}.json.abcd1234.tmp").write_text('{"half')  # a killed write
    path = store.put(spec, {"val_loss": 0.5})
    assert json.loads(path.read_text())["result"]["val_loss"] == 0.5
    reopened = TrialStore(tmp_path)
    assert reopened.get(spec)["val_loss"] == 0.5 and len(reopened) == 1
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # the orphan temp file is gone


def test_outputs_tables_and_figures(tmp_path):
    result = run_sweep(small_spec(lengths=("uniform",), kappa=True, Ls=(3,)), tmp_path,
                       trial=OracleTrial(), local=True, progress=False)  # fmt: skip
    paths = write_outputs(result, tmp_path)
    searches = json.loads(paths["searches_json"].read_text())
    assert {(r["lengths"], r["n"]) for r in searches} == {("uniform", "2..3"), ("fixed", "2"), ("fixed", "3")}
    joint = next(r for r in searches if r["lengths"] == "uniform")
    assert joint["kappa_bound"] in ("exact", "lower", "upper", "undefined") and joint["ood_n"] == joint["cap"]
    rows = paths["trials_csv"].read_text().splitlines()
    assert rows[0].startswith("key,model,group,m,L,format,lengths,n_train,lr,seed")
    assert len(rows) == 1 + len(json.loads(paths["trials_json"].read_text())) == 1 + len(result.trials)
    for name in ("nstar", "kappa", "ood_kappa"):
        text = paths[name].read_text()
        assert "<html>" in text and "plotly" in text
    from mechlab.viz.sweep import kappa_figure, n_star_figure, ood_kappa_figure

    fig = n_star_figure(searches)
    drawn = {(t.name, x): y for t in fig.data for x, y in zip(t.x, t.y, strict=True)}
    for r in searches:
        name = f"st_lstm_small acot Z3 {r['lengths']}"
        if r["n_star"] is not None:
            assert drawn[(name, r["L"])] == r["n_star"]
        else:  # not reached: drawn at its largest failing N
            assert drawn[(f"{name}: not reached (> lo)", r["L"])] == r["lo"]
    bars = kappa_figure(searches).data
    assert [y for t in bars for y in t.y] == [r["kappa"] for r in searches if r["kappa"] is not None]
    points = ood_kappa_figure(searches).data
    if joint["kappa"] is not None:
        assert points[0].x[0] == joint["kappa"] and points[0].y[0] == joint["ood_token_acc"]


def test_an_unreachable_address_is_refused_at_once():
    with pytest.raises(ValueError, match="cannot reach a Ray cluster at '127.0.0.1:1'"):
        check_address("127.0.0.1:1")
    with pytest.raises(ValueError, match="not host:port"):
        check_address("nowhere")


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[sweep]'")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_a_killed_worker_is_retried_and_a_rerun_skips_everything(local_ray, tmp_path):
    markers = tmp_path / "markers"
    # every trial of seed 20 kills its worker process on its first attempt
    crashing = OracleTrial(thresholds={"fixed:3": 5}, lr_spread=0.0, seed_spread=0.0, sleep=0.1,
                           crash_dir=str(markers), crash_seeds=(20,))  # fmt: skip
    result = run_sweep(small_spec(), tmp_path / "sweep", trial=crashing, max_retries=2, progress=False)
    (r,) = result.searches.values()
    assert r.n_star == 5 and r.status == "found"
    # N = 1 (a failing point) and the OOD point at N = 22 needed seed 20: it crashed there
    # once and was retried in a new worker
    crashed = {p.name for p in markers.iterdir()}
    assert {"crashed-1-0.001-20", "crashed-22-0.001-20"} <= crashed
    for p in markers.iterdir():
        pid = int(p.read_text())
        assert pid != os.getpid() and gone(pid), p.name  # that worker process is gone
    store = TrialStore(tmp_path / "sweep" / "trials")
    for n in (1, 22):
        spec = small_spec().trial_specs(small_spec().main_keys()[0], n)[1]
        assert spec["seed"] == 20 and store.get(spec)["val_loss"] == (0.0 if n >= 5 else 1.0)
    assert len(store) == result.ran == len(result.trials)
    assert result.ood[small_spec().main_keys()[0]].n_train == 22
    again = run_sweep(small_spec(), tmp_path / "sweep", trial=never, progress=False)
    assert again.ran == 0 and again.reused == result.ran
    assert again.searches == result.searches


def test_ray_grid_points_as_units_give_the_same_answer(local_ray, tmp_path):
    spec = small_spec(lengths=("uniform",), kappa=True)
    local = run_sweep(spec, tmp_path / "local", trial=OracleTrial(), local=True, progress=False)
    on_ray = run_sweep(spec, tmp_path / "ray", trial=OracleTrial(), units="point", progress=False)
    assert {k: r.n_star for k, r in on_ray.searches.items()} == {k: r.n_star for k, r in local.searches.items()}
    assert on_ray.kappas == local.kappas
    # a grid point is one unit: every configuration of every point tried has run
    tried = {(k, n) for k, r in on_ray.searches.items() for n, _ in r.history}
    assert len(on_ray.trials) >= len({n for _, n in tried})


@pytest.mark.slow  # about 30 s: real training in fresh Ray workers
def test_ray_a_tiny_real_sweep(local_ray, tmp_path):
    spec = SweepSpec(models=("st_lstm_small",), formats=("acot",), ms=(3,), Ls=(3,), lengths=("fixed",),
                     kappa=False, ood=True, lrs=(1e-2,), seeds=(10, 20), steps=20, eval_every=10, n_val=5,
                     search=SearchConfig(n_min=4, n_max=22, multiplier=4))  # fmt: skip
    result = run_sweep(spec, tmp_path, progress=False)
    (r,) = result.searches.values()
    assert r.status in ("found", "at_min", "not_reached", "bracketed")
    assert result.ran == len(result.trials) >= 2
    for t in result.trials:
        assert t["spec"]["task"]["format"] == "acot" and t["steps_run"] <= 20
        assert -1.0 <= t["ood_token_acc"] <= 1.0 and t["val_loss"] >= 0
    assert r.lo == 22 if r.status == "not_reached" else r.n_star <= 22


@pytest.mark.slow  # about 25 s: a second process joins the running instance
def test_ray_mechlab_sweep_joins_a_running_cluster(local_ray, tmp_path):
    import subprocess
    import sys

    address = local_ray.get_runtime_context().gcs_address
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}  # as a fresh shell
    out = tmp_path / "joined"
    proc = subprocess.run(
        [sys.executable, "-m", "mechlab.cli", "sweep", "--out", str(out), "--address", address,
         "--models", "st_lstm_small", "--formats", "acot", "--m", "3", "--L", "3", "--lengths", "fixed",
         "--no-kappa", "--lrs", "1e-3", "--seeds", "10,20", "--n-val", "5", "--no-progress",
         "--trial", "mechlab.sweep.oracle:oracle_trial"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads((out / "searches.json").read_text())
    assert row["n_star"] == 12 and row["status"] == "found"  # ceil(3 * 3 * 1.3)
