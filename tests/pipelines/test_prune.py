"""mechlab.pipelines: pruning a checkpoint on its own task's traces."""

import pytest
import torch

from mechlab.checkpoint import save_checkpoint
from mechlab.cli import main
from mechlab.models import build_model
from mechlab.pipelines import prune_checkpoint
from mechlab.prune import Circuit

torch.set_num_threads(1)

TASK_CFG = {"d_state": 3, "n_pairs": 6, "n_ctx": 40, "n_train_systems": 50, "n_test_systems": 20,
            "max_systems": 4}  # fmt: skip


@pytest.fixture
def lds_checkpoint(tmp_path):
    torch.manual_seed(0)
    model = build_model(
        "transformer", d_model=16, n_layers=2, n_heads=2, d_in=2 * 6 + 2 + 3, d_out=3, n_ctx=40
    )
    path = tmp_path / "lds.pt"
    save_checkpoint(model, path, task="lds", task_cfg=TASK_CFG,
                    train_cfg={"eval_haystack": 3, "eval_seg_len": 5})  # fmt: skip
    bare = tmp_path / "bare.pt"
    save_checkpoint(model, bare)
    return path, bare


def test_prune_checkpoint_builds_nih_data(lds_checkpoint):
    path, _ = lds_checkpoint
    circuit = prune_checkpoint(path, "2-after", 0.9, n_train=16, n_test=16, steps=3, progress=False)
    meta = circuit.metadata
    assert len(meta["checkpoint_sha256"]) == 64
    assert meta["target"] == "2-after"
    assert meta["data"]["n_haystack"] == 3 and meta["data"]["seg_len"] == 5
    assert meta["data"]["corruption"] == "misdirect_incorrect"
    assert meta["metrics"]["n_positions"] == 16


def test_prune_checkpoint_errors(lds_checkpoint):
    path, bare = lds_checkpoint
    with pytest.raises(ValueError, match="task metadata"):
        prune_checkpoint(bare, "1-after", 0.9, steps=1, progress=False)
    with pytest.raises(ValueError, match="unknown target"):
        prune_checkpoint(path, "first", 0.9, steps=1, progress=False)
    with pytest.raises(ValueError, match="k must be"):
        prune_checkpoint(path, "6-after", 0.9, steps=1, progress=False)  # seg_len is 5
    with pytest.raises(ValueError, match="sparsity"):
        prune_checkpoint(path, "1-after", 1.0, steps=1, progress=False)


def test_prune_checkpoint_seed_sets_the_data_seed_and_loss_scale_passes(lds_checkpoint):
    path, _ = lds_checkpoint
    kw = {"n_train": 8, "n_test": 8, "steps": 2, "progress": False}
    a = prune_checkpoint(path, "1-after", 0.9, seed=1, loss_scale=1000.0, **kw)
    assert (a.metadata["seed"], a.metadata["data_seed"]) == (1, 1)
    assert a.metadata["data"]["data_seed"] == 1 and a.metadata["loss_scale"] == 1000.0
    b = prune_checkpoint(path, "1-after", 0.9, seed=1, data_seed=5, **kw)
    assert (b.metadata["seed"], b.metadata["data_seed"]) == (1, 5)


def test_prune_checkpoint_refuses_bad_settings_before_loading(lds_checkpoint, tmp_path):
    missing = tmp_path / "nothing.pt"  # never opened: the arguments are checked first
    for bad in ({"lr": float("nan")}, {"lambda_lr": 0.0}, {"batch_size": 0}, {"loss_scale": -1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            prune_checkpoint(missing, "1-after", 0.9, **bad)
    path, _ = lds_checkpoint
    with pytest.raises(ValueError, match="keeps no edge"):
        prune_checkpoint(path, "1-after", 0.999, steps=1, progress=False)


def test_cli_checks_every_target_before_pruning(lds_checkpoint, tmp_path, capsys):
    path, _ = lds_checkpoint
    out = tmp_path / "circuits"
    argv = ["prune", "--ckpt", str(path), "--target", "1-after", "--target", "6-after",
            "--traces", "8", "--test-traces", "8", "--steps", "2", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "6-after" in err and len(err.splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())  # nothing was pruned
    assert main([*argv[:5], *argv[7:]]) == 0  # the same with only the good target
    assert len(list(out.glob("*.json"))) == 1


def test_cli_prune_seeds_draw_their_own_traces(lds_checkpoint, tmp_path):
    path, _ = lds_checkpoint
    out = tmp_path / "c"
    argv = ["prune", "--ckpt", str(path), "--seed", "0", "--seed", "1", "--traces", "8",
            "--test-traces", "8", "--steps", "2", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    seeds = sorted(
        (c.metadata["seed"], c.metadata["data_seed"])
        for c in map(Circuit.from_json, out.glob("*.json"))
    )
    assert seeds == [(0, 0), (1, 1)]


def test_cli_prune_seeds_record_their_consensus_and_a_rerun_changes_nothing(
    lds_checkpoint, tmp_path
):
    path, _ = lds_checkpoint
    out = tmp_path / "c"
    argv = ["prune", "--ckpt", str(path), "--seed", "0", "--seed", "1", "--seed", "2", "--traces", "8",
            "--test-traces", "8", "--steps", "3", "--sparsity", "0.9", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    circuits = [Circuit.from_json(out / f"1-after_seed{s}.json") for s in range(3)]
    # independent count: for every edge any seed keeps, the fraction of the three that keep it
    every = {e for c in circuits for e in c.edges}
    expected = {e: sum(e in c.edges for c in circuits) / 3 for e in every}
    for c in circuits:
        entry = c.metadata["consensus"]
        assert entry["n_runs"] == 3 and entry["seeds"] == [0, 1, 2]
        assert {(w, r): f for w, r, f in entry["scores"]} == pytest.approx(expected)
    assert "consensus" in (out / "1-after_seed0.html").read_text()  # the view shows it
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix in (".json", ".html")}
    assert main(argv) == 0  # read back: the same files, byte for byte
    assert {
        p.name: p.read_bytes() for p in out.iterdir() if p.suffix in (".json", ".html")
    } == before


def test_nearby_budgets_join_the_consensus_and_are_counted_again_here(lds_checkpoint, tmp_path, capsys):
    from mechlab.pipelines import prune_targets
    from mechlab.prune.consensus import nearby_sparsities

    path, _ = lds_checkpoint
    kw = {"n_train": 8, "n_test": 8, "steps": 3, "progress": False}
    run = prune_targets(path, ["1-after"], (0, 1), tmp_path / "c", sparsity=0.9, nearby_budgets=True, **kw)
    main_runs = run.circuits["1-after"]
    budgets = nearby_sparsities(main_runs[0].metadata["n_edges_countable"], 0.9)
    assert len(budgets) == 3
    runs = [prune_checkpoint(path, "1-after", b, seed=s, **kw) for s in (0, 1) for b in budgets]
    expected = {e: sum(e in c.edges for c in runs) / len(runs) for c in runs for e in c.edges}
    for c in main_runs:
        entry = c.metadata["consensus"]
        assert entry["n_runs"] == 6 and entry["sparsities"] == sorted(budgets, reverse=True)
        assert {(w, r): f for w, r, f in entry["scores"]} == pytest.approx(expected)
    assert len(list((tmp_path / "c").glob("*.json"))) == 2  # the nearby runs are not written
    with pytest.raises(ValueError, match="nearby budgets apply to edge pruning"):
        prune_targets(path, ["1-after"], (0,), tmp_path / "d", method="eap", nearby_budgets=True, **kw)
    assert not (tmp_path / "d").exists()
    argv = ["prune", "--ckpt", str(path), "--method", "eap", "--nearby-budgets", "--out", str(tmp_path / "e")]
    assert main(argv) == 2 and not (tmp_path / "e").exists()
    assert "--nearby-budgets applies to edge pruning" in capsys.readouterr().err


def test_issue_34_a_rerun_of_other_seeds_or_budgets_never_reads_back_and_rewrites(lds_checkpoint, tmp_path,
                                                                                  capsys):  # fmt: skip
    """`prune --seed 0 --seed 1`, then `--seed 0 --seed 2`, said "read back ... 1-after_seed0"
    and rewrote it (its consensus now over seeds [0, 2]) while seed 1's said [0, 1]; nor was
    --nearby-budgets part of the key. Each circuit's settings now hold what its consensus is
    made of: such a rerun is refused in one line naming the difference, nothing written."""
    path, _ = lds_checkpoint
    out = tmp_path / "c"
    base = ["prune", "--ckpt", str(path), "--traces", "8", "--test-traces", "8", "--steps", "2", "--sparsity",
            "0.9", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main([*base, "--seed", "0", "--seed", "1"]) == 0
    capsys.readouterr()

    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    before = files()
    settings = Circuit.from_json(out / "1-after_seed0.json").metadata["settings"]
    assert settings["consensus_seeds"] == [0, 1] and "nearby_budgets" not in settings
    for change, phrase in ((["--seed", "0", "--seed", "2"], "consensus_seeds [0, 1] (now [0, 2])"),
                           (["--seed", "0"], "consensus_seeds [0, 1] (now unset)"),
                           (["--seed", "0", "--seed", "1", "--nearby-budgets"], "nearby_budgets unset (now true)")):  # fmt: skip
        assert main([*base, *change]) == 2
        out_, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "1-after_seed0.json" in lines[0] and phrase in lines[0], err
        assert "read back" not in out_ and files() == before
    assert main([*base, "--seed", "1", "--seed", "0"]) == 0  # the same seeds in another order: the same files
    assert "read back 2 circuit(s) found before with the same settings" in capsys.readouterr().out and files() == before
    assert main([*base, "--seed", "0", "--seed", "2", "--force"]) == 0  # asked: recomputed, keyed anew
    for s in (0, 2):
        c = Circuit.from_json(out / f"1-after_seed{s}.json")
        assert c.metadata["settings"]["consensus_seeds"] == c.metadata["consensus"]["seeds"] == [0, 2]
    assert main([*base, "--seed", "0", "--seed", "2", "--nearby-budgets", "--force"]) == 0
    assert Circuit.from_json(out / "1-after_seed0.json").metadata["settings"]["nearby_budgets"] is True
    capsys.readouterr()
    again = files()
    assert main([*base, "--seed", "0", "--seed", "2", "--nearby-budgets"]) == 0  # the same: truly read back
    assert "read back 2 circuit(s) found before with the same settings" in capsys.readouterr().out and files() == again


def test_issue_34_a_circuit_read_back_whose_consensus_changes_is_not_called_read_back(lds_checkpoint, tmp_path,
                                                                                     capsys):  # fmt: skip
    """When another circuit of the target is not the one a circuit's consensus was made with
    (recomputed, or edited by hand), the circuit is rewritten with the new consensus, and
    the run says so instead of "read back"."""
    import json

    path, _ = lds_checkpoint
    out = tmp_path / "c"
    argv = ["prune", "--ckpt", str(path), "--traces", "8", "--test-traces", "8", "--steps", "2", "--sparsity",
            "0.9", "--seed", "0", "--seed", "1", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    edited = json.loads((out / "1-after_seed1.json").read_text())
    circuit = Circuit.from_dict(edited)
    circuit.edges.pop(next(iter(circuit.edges)))  # its settings record stays: it is read back
    (out / "1-after_seed1.json").write_text(json.dumps(circuit.to_dict(), indent=1))
    capsys.readouterr()
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "found before with the same settings" not in text, text  # not said to be read back unchanged
    assert "read back 2 circuit(s) of the same settings and rewrote them with this run's consensus" in text, text
    assert Circuit.from_json(out / "1-after_seed0.json").metadata["consensus"]["scores"] == \
        Circuit.from_json(out / "1-after_seed1.json").metadata["consensus"]["scores"]  # fmt: skip
    assert main(argv) == 0  # and now they are what a rerun reads back
    assert "read back 2 circuit(s) found before with the same settings" in capsys.readouterr().out


def test_a_prune_command_opens_its_checkpoint_once(lds_checkpoint, tmp_path, monkeypatch):
    """Two targets x two seeds (and the target check before them): one read of the file
    (main at 4d72a04 read it 1 + targets x seeds times)."""
    path, _ = lds_checkpoint
    loads: list[str] = []
    real_load = torch.load
    monkeypatch.setattr(
        torch, "load", lambda f, *a, **k: loads.append(str(f)) or real_load(f, *a, **k)
    )
    argv = ["prune", "--ckpt", str(path), "--target", "1-after", "--target", "2-after", "--seed", "0",
            "--seed", "1", "--traces", "8", "--test-traces", "8", "--steps", "2", "--sparsity", "0.9",
            "--out", str(tmp_path / "c"), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert loads == [str(path)]
    assert len(list((tmp_path / "c").glob("*.json"))) == 4


def test_the_pipeline_builds_the_graph_and_checks_the_sparsity_only_in_the_engine(
    lds_checkpoint, monkeypatch
):
    """prune_checkpoint builds the edge graph and checks the sparsity exactly as often as the
    engine's prune() alone does (main at 4d72a04 did both twice per prune)."""
    import mechlab.prune.setup as setup
    from mechlab.checkpoint import load_checkpoint
    from mechlab.pipelines.data import nih_data
    from mechlab.prune.engine import prune as engine_prune
    from mechlab.prune.graph import EdgeGraph

    path, _ = lds_checkpoint
    counts = {"graphs": 0, "sparsity checks": 0}
    real_init, real_check = EdgeGraph.__init__, setup.check_sparsity

    def init(self, *args, **kwargs):
        counts["graphs"] += 1
        real_init(self, *args, **kwargs)

    def check(*args, **kwargs):
        counts["sparsity checks"] += 1
        return real_check(*args, **kwargs)

    monkeypatch.setattr(EdgeGraph, "__init__", init)
    monkeypatch.setattr(setup, "check_sparsity", check)
    kw = {"n_train": 8, "n_test": 8, "steps": 1, "progress": False, "seed": 0}
    prune_checkpoint(path, "1-after", 0.9, **kw)
    through_pipeline = dict(counts)
    counts.update({k: 0 for k in counts})
    ckpt = load_checkpoint(path)
    data = nih_data(ckpt, n_train=8, n_test=8)
    engine_prune(ckpt.model, data, "1-after", 0.9, steps=1, progress=False, seed=0)
    assert through_pipeline == counts
    assert counts["sparsity checks"] == 1


def test_prune_settings_resolve_the_search_defaults(tiny_lds_checkpoint):
    """The settings record resolves PruneConfig's defaults (and the effective warm-up), so a
    rerun that gives a default explicitly reads the same circuits back."""
    from mechlab.pipelines import open_checkpoint
    from mechlab.pipelines.prune import prune_settings
    from mechlab.prune.config import PruneConfig

    ckpt = open_checkpoint(tiny_lds_checkpoint)
    plain = prune_settings(ckpt, "1-after")
    assert plain["steps"] == PruneConfig().steps and plain["warm_start"] == PruneConfig().warm_start
    assert plain == prune_settings(
        ckpt, "1-after", steps=PruneConfig().steps, warmup=PruneConfig().steps // 2
    )
    assert plain != prune_settings(ckpt, "1-after", steps=7)
