"""Pruning data of state-tracking checkpoints (mechlab.tasks.state_tracking_prune) and
`mechlab prune --length` on them.

The CLI runs prune the ground-truth dense SSM for Z_3 saved as a checkpoint: its circuit
for the outcome is known by construction (docs/ground_truth_models.md): the changed
element's embedding into the layer, the layer's state carried to the final window, the
final window's layer output to the read-out.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mechlab
from mechlab.cli import main
from mechlab.models.ground_truth import dense_ssm_group_model
from mechlab.pipelines import check_prune_targets, prune_checkpoint
from mechlab.prune import Circuit
from mechlab.tasks.state_tracking import StateTrackingConfig
from mechlab.tasks.state_tracking_prune import (
    resolve_target,
    state_tracking_prune_data,
    windows_for,
)
from mechlab.traces import target_mask

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CONSTRUCTED = {
    ("embed@changed", "l0.in@changed"),
    ("l0@changed", "l0.state@final"),
    ("l0@final", "out@final"),
}


def cfg_of(**kw) -> StateTrackingConfig:
    return StateTrackingConfig(**{"group": "zm", "m": 3, "L": 6, "format": "acot", **kw})


def s5_states(x: np.ndarray) -> np.ndarray:
    """States of S_5 sequences, composed as permutation arrays: s_t[i] = x_t[s_{t-1}[i]]."""
    perms = [np.array(p) for p in itertools.permutations(range(5))]
    index = {tuple(p): k for k, p in enumerate(perms)}
    out = np.zeros_like(x)
    for row in range(x.shape[0]):
        s = np.arange(5)
        for t in range(x.shape[1]):
            s = perms[x[row, t]][s]
            out[row, t] = index[tuple(s)]
    return out


# ------------------------------------------------------------------------- the traces


@pytest.mark.parametrize("group, m", [("zm", 5), ("s5", 2)])
@pytest.mark.parametrize("fmt", ["acot", "outcome"])
def test_traces_change_one_element_and_carry_the_task_labels(group, m, fmt):
    cfg = cfg_of(group=group, m=m, format=fmt)
    V = cfg.n_states
    n = 5
    data = state_tracking_prune_data(cfg, n, n_train=200, n_test=300, seed=3)
    for traces in (data.train, data.test):
        x, bad = traces.inputs, traces.corrupted  # [B, n + 1]
        assert x.shape == (len(traces), n + 1)
        assert (x[:, 0] == V).all() and (bad[:, 0] == V).all()  # BOS
        assert ((x[:, 1:] < V) & (bad[:, 1:] < V)).all()  # elements only
        diff = x != bad
        assert (diff.sum(1) == 1).all()  # exactly one token changed
        where = diff.float().argmax(1)  # [B]
        assert where.min() >= 1 and where.max() <= n - 1  # random: x_1..x_(n-1)
        assert len(set(where.tolist())) == n - 1  # every allowed position occurs
        elements = x[:, 1:].numpy()
        states = elements.cumsum(1) % m if group == "zm" else s5_states(elements)
        scored = torch.zeros(len(traces), n + 1, dtype=torch.bool)
        if fmt == "acot":
            scored[:, 1:] = True
        else:
            scored[:, n] = True
        assert torch.equal(traces.observed, scored)
        assert torch.equal(traces.truth[scored], torch.from_numpy(states)[scored[:, 1:]])
        assert (traces.truth[~scored] == -100).all()
        assert traces.windows == (("prefix", 0, 1), ("changed", 1, n), ("final", n, n + 1))
    assert not torch.equal(data.train.inputs[:200], data.test.inputs[:200])  # own seeds
    again = state_tracking_prune_data(cfg, n, n_train=200, n_test=300, seed=3)
    assert torch.equal(again.train.corrupted, data.train.corrupted)  # deterministic
    assert data.info["length"] == n and data.info["format"] == fmt


def test_a_fixed_position_and_its_windows():
    cfg = cfg_of()
    data = state_tracking_prune_data(cfg, 6, n_train=64, n_test=64, corruption="x3")
    diff = data.train.inputs != data.train.corrupted
    assert diff[:, 3].all() and diff.sum() == 64
    assert data.train.windows == (("prefix", 0, 3), ("changed", 3, 4), ("suffix", 4, 6), ("final", 6, 7))
    assert windows_for(1, 1, 2) == (("prefix", 0, 1), ("changed", 1, 2), ("final", 2, 3))
    assert windows_for(4, 4, 4) == (("prefix", 0, 4), ("changed", 4, 5))  # the last element changed
    # the random corruption's windows have the same names at every length
    names = {tuple(w[0] for w in state_tracking_prune_data(cfg, n, n_train=1, n_test=1).train.windows)
             for n in (2, 4, 6, 12)}  # fmt: skip
    assert names == {("prefix", "changed", "final")}


def test_targets_pick_the_right_positions_and_are_named_by_length():
    cfg = cfg_of()
    data = state_tracking_prune_data(cfg, 4, n_train=32, n_test=32, seed=1)
    traces = data.train
    final, changed, every = (resolve_target(t, data) for t in ("final", "changed", "all"))
    assert [f.__name__ for f in (final, changed, every)] == ["final_n4", "changed_n4", "all_n4"]
    mask = target_mask(final, traces)
    assert mask[:, 4].all() and mask.sum() == 32
    mask = target_mask(changed, traces)
    assert torch.equal(mask, traces.inputs != traces.corrupted)
    assert torch.equal(target_mask(every, traces), traces.observed)
    outcome = state_tracking_prune_data(cfg_of(format="outcome"), 4, n_train=4, n_test=4)
    with pytest.raises(ValueError, match="acot"):
        resolve_target("changed", outcome)
    with pytest.raises(ValueError, match="unknown target '1-after'"):
        resolve_target("1-after", data)


@pytest.mark.parametrize(
    "kwargs, phrase",
    [
        ({"length": 1}, "at least 2"),
        ({"length": 7, "n_ctx": 7}, "n_ctx=7"),
        ({"length": 4, "corruption": "x5"}, "1..4"),
        ({"length": 4, "corruption": "x0"}, "1..4"),
        ({"length": 4, "corruption": "shuffle"}, "unknown corruption"),
        ({"length": 4, "n_train": 0}, "n_train"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs, phrase):
    with pytest.raises(ValueError, match=phrase) as err:
        state_tracking_prune_data(cfg_of(), **kwargs)
    assert "\n" not in str(err.value)


def test_cot_is_refused():
    with pytest.raises(ValueError, match="cot"):
        state_tracking_prune_data(cfg_of(format="cot"), 4)


# ------------------------------------------------------------------- checkpoints, CLI


@pytest.fixture(scope="module")
def ground_truth_checkpoint(tmp_path_factory):
    """The exact dense SSM for Z_3, saved as a checkpoint of the acot task with L = 6."""
    cfg = cfg_of()
    path = tmp_path_factory.mktemp("st") / "gt.pt"
    model = dense_ssm_group_model("zm", 3, n_ctx=cfg.n_ctx)  # n_ctx 13: lengths up to 12
    mechlab.save_checkpoint(model, path, task="state_tracking", task_cfg=cfg.to_dict())
    return path


@pytest.fixture(scope="module")
def tiny_transformer_checkpoint(tmp_path_factory):
    """An untrained token transformer saved as a checkpoint of the outcome task."""
    cfg = cfg_of(format="outcome", L=4)
    torch.manual_seed(0)
    model = mechlab.build_model({"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2,
                                 "io": "tokens", "d_vocab": cfg.d_vocab, "d_vocab_out": cfg.d_vocab_out,
                                 "n_ctx": cfg.n_ctx})  # fmt: skip
    path = tmp_path_factory.mktemp("st") / "tf.pt"
    mechlab.save_checkpoint(model, path, task="state_tracking", task_cfg=cfg.to_dict())
    return path


def test_cli_prunes_a_state_tracking_checkpoint_at_a_length(ground_truth_checkpoint, tmp_path, capsys):
    out = tmp_path / "circuits"
    code = main(["prune", "--ckpt", str(ground_truth_checkpoint), "--target", "final", "--length", "4",
                 "--sparsity", "0.5", "--steps", "200", "--seed", "0", "--traces", "32",
                 "--test-traces", "64", "--out", str(out), "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "final_n4_seed0" in captured.out
    circuit = Circuit.from_json(out / "final_n4_seed0.json")
    assert (out / "final_n4_seed0.html").is_file()
    # the budget (4 edges) is one more than the circuit: the default fills it, and names
    # what it filled with no measurable effect
    extra = set(circuit.edges) - CONSTRUCTED
    assert CONSTRUCTED <= set(circuit.edges)
    assert extra <= {tuple(e) for e in circuit.metadata["edges_without_effect"]}
    meta = circuit.metadata
    assert meta["target"] == "final_n4" and meta["data"]["length"] == 4
    assert meta["data"]["task"] == "state_tracking" and meta["data"]["corruption"] == "random"
    assert meta["metrics"]["faithfulness"] > 0.999
    assert meta["metrics"]["complement_faithfulness"] < 0.001
    assert json.loads((out / "final_n4_seed0.json").read_text())["metadata"]["data"]["windows"][-1] == ["final", 4, 5]


@pytest.mark.filterwarnings("ignore:circuit for")  # an untrained model: no circuit to find
def test_the_default_length_is_the_runs_L_and_a_transformer_gets_its_plain_graph(tiny_transformer_checkpoint):
    circuit = prune_checkpoint(tiny_transformer_checkpoint, "final", 0.9, steps=5, n_train=16, n_test=16,
                               progress=False, batch_size=8)  # fmt: skip
    meta = circuit.metadata
    assert meta["target"] == "final_n4" and meta["data"]["length"] == 4
    assert "windows" not in meta["graph"]  # heads and MLPs: the same edges at every length
    assert all("@" not in w for w, _ in circuit.edges)


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["--length", "1"], "at least 2"),
        (["--length", "13"], "n_ctx=13"),
        (["--target", "1-after"], "unknown target '1-after'"),
        (["--target", "final", "--target", "bogus"], "unknown target 'bogus'"),
        (["--corruption", "x9", "--length", "4"], "1..4"),
    ],
)
def test_cli_bad_input_is_one_line_before_any_work(ground_truth_checkpoint, tmp_path, args, phrase, capsys):
    out = tmp_path / "never"
    argv = ["prune", "--ckpt", str(ground_truth_checkpoint), "--steps", "1", "--no-progress", "--out", str(out)]
    if "--target" not in args:
        argv += ["--target", "final"]
    assert main(argv + args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mechlab: error:") and "\n" not in err and phrase in err
    assert not out.exists()  # nothing pruned


def test_length_is_refused_for_a_recall_checkpoint(tiny_lds_checkpoint, capsys):
    with pytest.raises(ValueError, match="state-tracking"):
        check_prune_targets(tiny_lds_checkpoint, ["1-after"], length=4)
    assert main(["prune", "--ckpt", str(tiny_lds_checkpoint), "--length", "4", "--steps", "1",
                 "--no-progress"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.startswith("mechlab: error:") and "\n" not in err and "state-tracking" in err


# --------------------------------------------------- the bundled checkpoints and circuits

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = {"transformer": ROOT / "examples/checkpoints/st-transformer-cpu/last.pt",
           "dense_ssm": ROOT / "examples/checkpoints/st-dense-ssm-cpu/last.pt"}  # fmt: skip


@pytest.mark.parametrize("arch", list(BUNDLED))
def test_bundled_checkpoint_tracks_z5_at_its_lengths(arch):
    ckpt = mechlab.load_checkpoint(BUNDLED[arch])
    assert ckpt.model.cfg.arch == arch and BUNDLED[arch].stat().st_size < 2 * 2**20
    cfg = ckpt.task_config
    assert (cfg.group, cfg.m, cfg.L, cfg.format, cfg.lengths) == ("zm", 5, 6, "acot", "uniform")
    x = torch.randint(0, 5, (500, 6), generator=torch.Generator().manual_seed(99))  # [500, 6]
    tokens = torch.cat([torch.full((500, 1), cfg.bos), x], dim=1)
    with torch.no_grad():
        predicted = ckpt.model(tokens)[:, 1:].argmax(-1)  # [500, 6]
    assert (predicted == x.cumsum(1) % 5).float().mean() > 0.99


def committed_circuits(arch: str) -> list[Path]:
    return sorted((ROOT / "circuits/state-tracking" / arch).glob("final_n*_seed*.json"))


@pytest.mark.parametrize("arch", list(BUNDLED))
def test_committed_circuits_belong_to_the_bundled_checkpoint(arch):
    paths = committed_circuits(arch)
    sha = mechlab.load_checkpoint(BUNDLED[arch]).sha256
    lengths = set()
    for path in paths:
        circuit = Circuit.from_json(path)
        meta = circuit.metadata
        assert meta["checkpoint_sha256"] == sha
        assert meta["target"] == path.stem.split("_seed")[0] == f"final_n{meta['data']['length']}"
        assert circuit.n_edges > 0 and not any(w == "pos" for w, _ in circuit.edges)
        lengths.add(meta["data"]["length"])
    assert len(lengths) >= 2 and len(paths) >= 3 * len(lengths)  # two lengths or more, 3+ seeds each


@pytest.mark.parametrize("arch", list(BUNDLED))
def test_committed_overlap_is_the_jaccard_of_the_committed_circuits(arch):
    summary = json.loads((ROOT / "circuits/state-tracking" / arch / "summary.json").read_text())
    by_length: dict[int, list[set]] = {}
    for path in committed_circuits(arch):
        c = Circuit.from_json(path)
        by_length.setdefault(c.metadata["data"]["length"], []).append(c.edge_set())
    for key, entry in summary["overlap"]["across"].items():
        a, b = (int(part.split("_n")[1]) for part in key.split(" vs "))
        pairs = [len(x & y) / len(x | y) for x in by_length[a] for y in by_length[b]]
        assert entry["jaccard_observed"] == pytest.approx(sum(pairs) / len(pairs))


def regenerated_edges(arch: str, name: str) -> tuple[set, set]:
    committed = Circuit.from_json(ROOT / "circuits/state-tracking" / arch / f"{name}.json")
    meta = committed.metadata
    again = prune_checkpoint(BUNDLED[arch], "final", meta["sparsity_asked"], length=meta["data"]["length"],
                             seed=meta["seed"], steps=meta["steps"], progress=False)  # fmt: skip
    return set(again.edges), set(committed.edges)


@pytest.mark.slow
def test_prune_regenerates_a_committed_dense_ssm_circuit():
    again, committed = regenerated_edges("dense_ssm", "final_n4_seed1")
    assert again == committed == CONSTRUCTED


@pytest.mark.slow
def test_prune_regenerates_a_committed_transformer_circuit():
    again, committed = regenerated_edges("transformer", "final_n4_seed0")
    assert again == committed


# --------------------------------------------------------------- sizes before work (issue 19)


@pytest.mark.parametrize("counts", [{"n_train": 10**12}, {"n_test": 10**12}])
def test_a_trillion_pruning_traces_are_refused_before_anything_is_drawn(counts):
    from mechlab.tasks.state_tracking_prune import state_tracking_prune_data

    name = next(iter(counts))
    with pytest.raises(ValueError, match=rf"the pruning traces would hold {name} 1e\+12 x positions 6.*lower {name}"):
        state_tracking_prune_data(StateTrackingConfig(m=3, L=5), **counts)
