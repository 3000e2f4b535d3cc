"""Regression tests of issue 10 (hardening), through the command line where the issue
reproduced them there: each numbered case, then the model-layer review items.

Library-level tests of the same cases live beside their modules:
tests/test_checkpoint.py (checksums, dtypes, devices, sizes), tests/train/test_trainer.py
(NaN guard, dry evaluation, resume, metrics, temporary files)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from mechlab.checkpoint import load_checkpoint, save_checkpoint
from mechlab.cli import main
from mechlab.io import atomic_write_text
from mechlab.models import build_model
from mechlab.models.export import to_hf_gpt2, to_hf_gpt2_read_in_out, to_transformer_bridge
from mechlab.models.hooked import hooked
from mechlab.prune import Circuit
from mechlab.train import TrainConfig, train

TASK = {
    "d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
    "n_train_systems": 200, "n_test_systems": 50,
}
MODEL = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2}
SMALL = {
    "task_cfg": TASK, "model": MODEL, "batch_size": 8, "eval_haystack": 2, "eval_seg_len": 4,
    "eval_traces": 16, "eval_every": 0, "log_every": 1, "n_checkpoints": 0,
}
PRUNE_FAST = ["--steps", "2", "--traces", "8", "--test-traces", "8", "--no-progress"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished 3-step run of a small model."""
    out = tmp_path_factory.mktemp("reliability") / "run"
    train(TrainConfig(steps=3, **SMALL), out, progress=False)
    return out


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *args) -> str:
    """Run the CLI, expect exit status 2 and one line on stderr; return that line."""
    code, _, err = cli(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("mechlab: error: "), err
    assert "Traceback" not in err
    return lines[0]


def copy_run(run_dir, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


# --------------------------------------------------------------------------- data loss


@pytest.mark.parametrize("setting", ["eval_haystack=7", "eval_seg_len=1000"])
def test_case_1_evaluation_settings_fail_before_training(capsys, tmp_path, setting):
    line = refused(capsys, "train", "--preset", "recall-cpu", "--steps", "40", "--set", "batch_size=16",
                   "--set", "save_every=100", "--set", "eval_every=0", "--set", setting,
                   "--out", tmp_path / "r", "--no-progress")  # fmt: skip
    assert "evaluation cannot be built" in line and "more than n_ctx=64" in line
    assert not (tmp_path / "r").exists()


def test_case_2_nan_guard_through_the_cli(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({**SMALL, "steps": 100, "save_every": 1, "lr": 1e6}))
    code, _, err = cli(capsys, "train", "--config", config, "--out", tmp_path / "n", "--no-progress")
    assert code == 1 and "keeps the last state whose weights and loss were finite" in err
    ckpt = load_checkpoint(tmp_path / "n" / "last.pt")
    assert all(torch.isfinite(t).all() for t in ckpt.model.state_dict().values())


def test_case_3_a_flipped_bit_is_refused_by_eval(capsys, run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path)
    path = run / "last.pt"
    data = bytearray(path.read_bytes())
    payload = torch.load(path, weights_only=True)
    weight = payload["state_dict"]["blocks.0.attn.W_Q"]
    needle = weight.flatten()[:4].numpy().tobytes()  # the first 16 bytes of that tensor
    at = bytes(data).index(needle)
    data[at + 3] ^= 0x40  # an exponent bit of its first float
    path.write_bytes(bytes(data))
    line = refused(capsys, "eval", "--ckpt", path, "--traces", "8", "--out", tmp_path / "e")
    assert "tensor 'state_dict/blocks.0.attn.W_Q' does not match its checksum" in line
    assert not (tmp_path / "e").exists()


# --------------------------------------------------------------------------- tracebacks


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_case_4_any_float_dtype_runs_info_eval_and_prune(capsys, run_dir, tmp_path, dtype):
    ckpt = load_checkpoint(run_dir / "last.pt")
    path = save_checkpoint(ckpt.model.to(dtype), tmp_path / "d.pt", step=ckpt.step, **ckpt.metadata)
    code, out, err = cli(capsys, "info", "--ckpt", path)
    assert code == 0 and "parameters:" in out, err
    code, out, err = cli(capsys, "eval", "--ckpt", path, "--traces", "8", "--out", tmp_path / "e")
    assert code == 0 and "1-after: median" in out, err
    code, out, err = cli(capsys, "prune", "--ckpt", path, *PRUNE_FAST, "--out", tmp_path / "p")
    assert code == 0 and (tmp_path / "p" / "1-after_seed0.json").is_file(), err


def test_case_5_bad_devices_are_one_line(capsys, tmp_path):
    assert "unknown device 'tpu'" in refused(capsys, "train", "--device", "tpu", "--out", tmp_path / "t")
    assert "unknown device 'bogus'" in refused(capsys, "bench", "hooks", "--device", "bogus")
    assert "does not run on device type 'meta'" in refused(capsys, "bench", "train", "--device=meta")
    assert not (tmp_path / "t").exists()


def test_case_5_meta_weights_and_bad_metadata_are_one_line(capsys, run_dir, tmp_path):
    payload = torch.load(run_dir / "last.pt", weights_only=True)
    payload.pop("checksum")
    payload["state_dict"] = {k: torch.empty_like(v, device="meta") for k, v in payload["state_dict"].items()}
    torch.save(payload, tmp_path / "meta.pt")
    assert "hold no data" in refused(capsys, "info", "--ckpt", tmp_path / "meta.pt")
    ckpt = load_checkpoint(run_dir / "last.pt")
    save_checkpoint(ckpt.model, tmp_path / "x.pt", **{**ckpt.metadata, "train_cfg": "x"})
    for command in ("info", "eval"):
        line = refused(capsys, command, "--ckpt", tmp_path / "x.pt")
        assert "metadata entry 'train_cfg' is str, not dict" in line


def test_case_5_resume_with_another_models_last_pt(capsys, run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path)
    other = build_model({**MODEL, "d_model": 8, "d_in": 13, "d_out": 3, "n_ctx": 24})
    save_checkpoint(other, run / "last.pt", step=3)
    line = refused(capsys, "train", "--resume", run, "--steps", "5", "--no-progress")
    assert "holds a different model" in line


@pytest.mark.parametrize(
    "content, phrase",
    [
        ([1], "holds a JSON list"),
        ("s", "holds a JSON string"),
        ({"format": "mechlab-circuit", "version": 1, "nodes": [], "edges": 5}, "edges must be a list, got 5"),
        ({"format": "mechlab-circuit", "version": 1, "nodes": 3, "edges": []}, "nodes must be a list, got 3"),
        ({"format": "mechlab-circuit", "version": 1, "nodes": []}, "field edges is missing"),
        ({"format": "mechlab-circuit", "version": 1, "nodes": [], "edges": [["embed", "out"]]}, "field edges[0][2] is missing"),
    ],
    ids=["list", "string", "edges-int", "nodes-int", "no-edges", "short-edge"],
)
def test_case_5_and_7_bad_circuit_files_name_the_field(capsys, tmp_path, content, phrase):
    good = Circuit.from_edges({("embed", "out"): 1.0}, {"checkpoint_sha256": "a" * 64})
    good.to_json(tmp_path / "a.json")
    (tmp_path / "l.json").write_text(json.dumps(content))
    line = refused(capsys, "overlap", tmp_path / "a.json", tmp_path / "l.json")
    assert phrase in line and "l.json" in line


def test_case_6_a_huge_config_is_refused_before_allocation(capsys, run_dir, tmp_path):
    payload = torch.load(run_dir / "last.pt", weights_only=True)
    payload.pop("checksum")
    payload["config"]["d_model"] = 10**7
    torch.save(payload, tmp_path / "huge.pt")
    line = refused(capsys, "info", "--ckpt", tmp_path / "huge.pt")
    assert "would allocate about" in line and "MECHLAB_MAX_ELEMENTS" in line


# --------------------------------------------------------------------------- misleading or silent


def test_case_7_a_bad_device_is_not_blamed_on_the_checkpoint(capsys, run_dir, tmp_path):
    line = refused(capsys, "prune", "--ckpt", run_dir / "last.pt", "--device", "bogus", "--out", tmp_path / "p")
    assert "unknown device 'bogus'" in line and "corrupt" not in line
    assert not (tmp_path / "p").exists()


def test_case_7_random_bytes_starting_0x82_are_corrupt(capsys, tmp_path):
    path = tmp_path / "r.pt"
    path.write_bytes(b"\x82" + bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)))
    line = refused(capsys, "info", "--ckpt", path)
    assert "corrupt" in line and "pickled Python objects" not in line


def test_case_7_circuits_of_different_checkpoints_are_refused_or_warned(capsys, tmp_path):
    edges = {("embed", "a0.h0.q"): 1.0, ("a0.h0", "out"): 1.0}
    graph = {"arch": "transformer", "n_layers": 1, "n_heads": 2}
    for name, sha in (("a", "a" * 64), ("b", "b" * 64)):
        Circuit.from_edges(edges, {"checkpoint_sha256": sha, "graph": graph}).to_json(tmp_path / f"{name}.json")
    fast = ["--boot", "5", "--null", "5"]
    line = refused(capsys, "overlap", tmp_path / "a.json", tmp_path / "b.json", *fast)
    assert "different checkpoints" in line and "--mixed-checkpoints" in line
    code, out, err = cli(capsys, "overlap", tmp_path / "a.json", tmp_path / "b.json", *fast, "--mixed-checkpoints")
    assert code == 0 and "jaccard" in out
    assert err.count("mechlab: warning:") == 1 and "different checkpoints" in err
    with pytest.warns(UserWarning, match="different checkpoints"):
        from mechlab.prune import overlap

        overlap(Circuit.from_json(tmp_path / "a.json"), Circuit.from_json(tmp_path / "b.json"))


def test_case_8_resume_applies_weight_decay_and_refuses_fewer_steps(capsys, run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path)
    line = refused(capsys, "train", "--resume", run, "--steps", "2", "--no-progress")
    assert "the run is at step 3" in line
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", "4", "--set", "weight_decay=1e6",
                       "--no-progress")  # fmt: skip
    assert code == 0, err
    last = load_checkpoint(run / "last.pt")
    assert {g["weight_decay"] for g in last.optimizer_state["param_groups"]} == {1e6}


def test_case_9_a_torn_metrics_line_is_dropped_with_a_one_line_warning(capsys, run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path)
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 4, "loss": "unterminated')
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", "4", "--no-progress")
    assert code == 0, err
    warning = [line for line in err.splitlines() if line.startswith("mechlab: warning:")]
    assert len(warning) == 1 and "torn last line" in warning[0] and "metrics.jsonl" in warning[0]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_case_10_files_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = atomic_write_text(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_case_10_nothing_is_created_for_refused_input(capsys, run_dir, tmp_path):
    corrupt = tmp_path / "bad.pt"
    corrupt.write_bytes(b"PK\x03\x04 not a zip")
    for command in ("eval", "prune"):
        refused(capsys, command, "--ckpt", corrupt, "--out", tmp_path / command)
        assert not (tmp_path / command).exists()
    line = refused(capsys, "prune", "--ckpt", run_dir / "last.pt", "--target", "1-after", "--target", "bogus",
                   "--out", tmp_path / "targets", *PRUNE_FAST)  # fmt: skip
    assert "unknown target 'bogus'" in line and not (tmp_path / "targets").exists()


@pytest.mark.parametrize("command", [["train"], ["eval", "--ckpt", "x.pt"], ["prune", "--ckpt", "x.pt"]])
def test_case_10_an_empty_out_is_refused(capsys, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    assert "--out is empty" in refused(capsys, *command, "--out", "")
    assert "--out is empty" in refused(capsys, *command, "--out=")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- model layer


@pytest.mark.parametrize("arch", ["lstm", "mamba", "dense_ssm"])
def test_gpt2_export_refuses_other_families_by_name(arch):
    model = build_model(arch, io="tokens", d_vocab=5, d_model=16)
    for export in (to_hf_gpt2, to_hf_gpt2_read_in_out, to_transformer_bridge):
        with pytest.raises(TypeError, match=f"exports mechlab transformers.*got a {arch} model"):
            export(model)


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.act(self.lin(self.act(x)))


def test_hooked_gives_each_use_of_a_shared_module_its_own_hook_point():
    torch.manual_seed(0)
    net, x = Twice(), torch.randn(2, 3)
    model = hooked(net, example=x)
    assert model.module_calls["act"] == 2
    _, cache = model.run_with_cache(x)
    assert torch.allclose(cache["act.hook_out"], torch.tanh(x))  # the first use
    assert torch.allclose(cache["act.hook_out_1"], net(x))  # the second use
    # A hook on one use patches that use only.
    out = model.run_with_hooks(x, fwd_hooks=[("act.hook_out", lambda t, hook: torch.zeros_like(t))])
    assert torch.allclose(out, torch.tanh(net.lin(torch.zeros_like(x))))


def test_hooked_without_example_warns_once_about_a_shared_module():
    net, x = Twice(), torch.randn(2, 3)
    model = hooked(net)
    with pytest.warns(UserWarning, match="'act' ran more than once.*example="):
        model.run_with_cache(x)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.run_with_cache(x)  # said once


# --------------------------------------------------------------------------- issue 19, library side
# The cases of issue 19 that the library below the CLI now refuses, through the command
# line (the output-policy cases are the CLI side's). Each is refused with exit 2 and one
# line, fast, and leaves nothing behind. The library-level tests of the same cases:
# tests/test_limits.py, tests/tasks/, tests/prune/test_circuit_file.py, tests/test_schema.py,
# tests/sweep/test_spec.py, tests/train/test_config.py, tests/checkpoint/.

TRILLION = str(10**12)


def fast_refusal(capsys, *args, seconds: float = 5.0) -> str:
    """Exit 2 with one error line, the last on stderr (progress lines and one-line warnings
    may come before it; the order of report's stages is the CLI side's), no traceback, fast."""
    import time

    start = time.perf_counter()
    code, _, err = cli(capsys, *args)
    assert time.perf_counter() - start < seconds  # no allocation attempt
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("mechlab: error: ")]
    assert code == 2 and errors == lines[-1:] and "Traceback" not in err, err
    assert all(not line.startswith("mechlab: ") or line.startswith(("mechlab: error: ", "mechlab: warning: "))
               for line in lines)  # fmt: skip
    return errors[0]


@pytest.mark.parametrize(
    "command",
    [["eval", "--traces", TRILLION], ["eval", "--suite", "nih", "--traces", "10", "--trials", TRILLION],
     ["prune", "--traces", TRILLION, "--test-traces", "8"], ["prune", "--test-traces", TRILLION, "--traces", "8"],
     ["curve", "--traces", TRILLION], ["recall", "--traces", TRILLION],
     ["report", "--eval-traces", TRILLION], ["report", "--prune-traces", TRILLION, "--eval-traces", "8"]],
    ids=["eval-traces", "eval-trials", "prune-traces", "prune-test-traces", "curve-traces", "recall-traces",
         "report-eval-traces", "report-prune-traces"],
)  # fmt: skip
def test_issue_19_counts_of_a_trillion_are_refused_before_allocating(capsys, run_dir, tmp_path, command):
    line = fast_refusal(capsys, *command, "--ckpt", run_dir / "last.pt", "--out", tmp_path / "o")
    assert "would hold" in line and "1e+1" in line and "MECHLAB_MAX_ELEMENTS" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "command, phrase",
    [(["overlap", "C0", "C1", "--boot", TRILLION], "n_boot 1e+12"), (["overlap", "C0", "C1", "--null", TRILLION], "n_null 1e+12"),
     (["pairs", "ioi", "--tokenizer", "TOK", "--out", "OUT", "--n", TRILLION], "--n 1e+12 is more than mechlab's limit of 100,000"),
     (["bench", "hooks", "--batch", TRILLION], "batch 1e+12"), (["bench", "scan", "--pos", TRILLION], "positions 1e+12"),
     (["bench", "prune", "--batch", TRILLION], "batch 1e+12")],
    ids=["overlap-boot", "overlap-null", "pairs-n", "bench-hooks-batch", "bench-scan-pos", "bench-prune-batch"],
)  # fmt: skip
def test_issue_19_other_counts_of_a_trillion_are_refused_before_allocating(capsys, tmp_path, command, phrase):
    committed = Path(__file__).resolve().parents[1] / "circuits" / "recall-cpu"
    names = {"C0": committed / "1-after_seed0.json", "C1": committed / "1-after_seed1.json", "TOK": tmp_path,
             "OUT": tmp_path / "p.jsonl"}  # fmt: skip
    line = fast_refusal(capsys, *[names.get(a, a) for a in command])
    bounded = "is more than mechlab's limit" in line  # a count bounded on its own (pairs of a file)
    assert phrase in line and (bounded or "would hold" in line and "MECHLAB_MAX_ELEMENTS" in line)
    assert not (tmp_path / "p.jsonl").exists()


def test_issue_19_an_old_checkpoints_task_config_too_big_to_allocate(capsys, run_dir, tmp_path):
    payload = torch.load(run_dir / "last.pt", weights_only=True)
    payload.pop("checksum")  # an old-format file: its metadata can be edited unnoticed
    payload["metadata"]["task_cfg"]["n_pairs"] = 10**12
    torch.save(payload, tmp_path / "old.pt")
    line = fast_refusal(capsys, "eval", "--ckpt", tmp_path / "old.pt", "--traces", "8", "--out", tmp_path / "e")
    assert "one LDS trace would hold positions 24 x width 2e+12" in line and "lower n_ctx or n_pairs" in line


def test_issue_19_a_zip_bomb_checkpoint_is_refused_from_its_directory(capsys, run_dir, tmp_path):
    import zipfile

    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(run_dir / "last.pt") as zin, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
        with zout.open("archive/data/999", "w", force_zip64=True) as f:
            for _ in range(4):
                f.write(bytes(16 << 20))  # 64 MiB in about 64 KB
    line = fast_refusal(capsys, "info", "--ckpt", bomb)
    assert "'archive/data/999' is compressed" in line and "nothing was decompressed" in line


def issue_19_circuits(tmp_path) -> dict[str, Path]:
    """The hostile circuit files of issue 19, made from a committed circuit."""
    good = json.loads((Path(__file__).resolve().parents[1] / "circuits/recall-cpu/1-after_seed0.json").read_text())
    changes = {
        "inf-score": lambda v: v["edges"][0].__setitem__(2, float("inf")),
        "n_layers-1e8": lambda v: v["metadata"]["graph"].__setitem__("n_layers", 10**8),
        "writer-1e9": lambda v: v["edges"][0].__setitem__(0, "a0.h1000000000"),
        "data-5": lambda v: v["metadata"].__setitem__("data", 5),
    }
    out = {}
    for name, change in changes.items():
        values = json.loads(json.dumps(good))
        change(values)
        out[name] = tmp_path / f"{name}.json"
        out[name].write_text(json.dumps(values, allow_nan=True))
    out["deep"] = tmp_path / "deep.json"
    out["deep"].write_text("[" * 200_000 + "]" * 200_000)
    return out


@pytest.mark.parametrize("case", ["inf-score", "n_layers-1e8", "writer-1e9", "data-5", "deep"])
@pytest.mark.parametrize("command", ["view", "overlap"])
def test_issue_19_hostile_circuit_files_are_one_line(capsys, tmp_path, case, command):
    path = issue_19_circuits(tmp_path)[case]
    other = Path(__file__).resolve().parents[1] / "circuits/recall-cpu/1-after_seed1.json"
    args = [path, "--out", tmp_path / "v.html"] if command == "view" else [path, other]
    line = fast_refusal(capsys, command, *args)
    assert f"{case}.json" in line
    assert not (tmp_path / "v.html").exists()


@pytest.mark.parametrize(
    "text, phrase",
    [("a: " + "[" * 3000 + "]" * 3000 + "\n", "nests more than 64 levels deep"),
     ("steps: !!python/object/apply:os.system ['echo pwned']\n", "holds the tag"),
     ("steps: abc\n", "steps must be an integer, got 'abc'")],
    ids=["deep-3000", "python-tag", "steps-abc"],
)  # fmt: skip
def test_issue_19_hostile_train_config_files_are_one_line(capsys, tmp_path, text, phrase):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    line = fast_refusal(capsys, "train", "--config", config, "--out", tmp_path / "r", "--no-progress")
    assert phrase in line and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "text", ["steps: !!python/object/apply:os.system ['echo pwned']\n", "a: " + "[" * 3000 + "]" * 3000 + "\n"],
    ids=["python-tag", "deep-3000"],
)
def test_issue_19_hostile_sweep_config_files_are_one_line_through_the_cli(capsys, tmp_path, text):
    config = tmp_path / "s.yaml"
    config.write_text(text)
    fast_refusal(capsys, "sweep", "--config", config, "--out", tmp_path / "s", "--local")


# --------------------------------------------------------------------------- issue 19, CLI side
# The output policy (mechlab/pipelines/outputs.py), resume keyed by settings, and checks
# before work, through the command line; one test per case of docs/reliability.md's rows
# marked cli. The policy's own tests: tests/pipelines/test_outputs.py (test_locks.py, test_records.py).


def digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def two_circuits(capsys, run_dir, tmp_path):
    """Two circuits (seeds 0 and 1) of the run's checkpoint, under tmp_path/c."""
    code, _, err = cli(capsys, "prune", "--ckpt", run_dir / "last.pt", *PRUNE_FAST, "--seed", "0", "--seed", "1",
                       "--out", tmp_path / "c")  # fmt: skip
    assert code == 0, err
    return tmp_path / "c" / "1-after_seed0.json", tmp_path / "c" / "1-after_seed1.json"


def test_issue_19_overlap_json_never_replaces_a_checkpoint_or_an_input(capsys, run_dir, tmp_path, two_circuits):
    a, b = two_circuits
    ckpt = shutil.copy(run_dir / "last.pt", tmp_path / "last.pt")
    before = {p: digest(p) for p in (ckpt, a, b)}
    fast = ["--boot", "5", "--null", "5"]
    for force in ([], ["--force"]):  # not even with --force
        line = refused(capsys, "overlap", a, b, *fast, "--json", ckpt, *force)
        assert "is a checkpoint; mechlab never writes an output over one" in line
        line = refused(capsys, "overlap", a, b, *fast, "--json", a, *force)
        assert "--json" in line and "is one of the inputs" in line
    assert {p: digest(p) for p in before} == before


def test_issue_19_view_out_never_overwrites_without_force(capsys, tmp_path, two_circuits):
    a, b = two_circuits
    page = tmp_path / "existing.html"
    page.write_text("mine")
    line = refused(capsys, "view", a, "--out", page)
    assert "exists; pass --force to replace it" in line and page.read_text() == "mine"
    assert "is one of the inputs" in refused(capsys, "view", a, "--out", a, "--force")
    code, _, err = cli(capsys, "view", a, b, "--out", page, "--force")
    assert code == 0, err
    assert page.read_text() != "mine"


def test_issue_34_view_and_overlap_never_replace_a_device_or_a_pipe(capsys, tmp_path, two_circuits):
    """``view --out <a device node> --force`` replaced the node with a page (as root, ``--out
    /dev/null --force`` would have replaced /dev/null); a pipe stands in for the device."""
    a, b = two_circuits
    page, record = tmp_path / "page.html", tmp_path / "overlap.json"
    os.mkfifo(page)
    os.mkfifo(record)
    for force in ([], ["--force"]):
        assert "is not a regular file" in refused(capsys, "view", a, b, "--out", page, *force)
        line = refused(capsys, "overlap", a, b, "--boot", "5", "--null", "5", "--json", record, *force)
        assert "--json" in line and "is not a regular file" in line
    assert stat.S_ISFIFO(page.stat().st_mode) and stat.S_ISFIFO(record.stat().st_mode)


def test_issue_19_prune_into_a_folder_git_tracks_is_refused(capsys, run_dir, tmp_path):
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    (repo / "circuits").mkdir(parents=True)
    (repo / "circuits" / "1-after_seed0.json").write_text("committed")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(repo)]
    for step in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run([*git, *step], check=True)
    line = refused(capsys, "prune", "--ckpt", run_dir / "last.pt", *PRUNE_FAST, "--out", repo / "circuits")
    assert "holds files git tracks (circuits/1-after_seed0.json); pass --force" in line
    assert (repo / "circuits" / "1-after_seed0.json").read_text() == "committed"
    assert sorted(os.listdir(repo / "circuits")) == ["1-after_seed0.json"]
    line = refused(capsys, "train", "--config", tmp_path / "none.yaml", "--out", repo / "circuits")
    assert "holds files git tracks" in line  # the trainer too


def test_issue_19_eval_and_recall_default_outside_the_checkpoints_folder(capsys, run_dir, tmp_path, monkeypatch):
    run = copy_run(run_dir, tmp_path)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "eval", "--ckpt", run / "last.pt", "--traces", "8")
    assert code == 0, err
    code, _, err = cli(capsys, "recall", "--ckpt", run / "last.pt", "--traces", "8", "--offset", "1",
                       "--no-components", "--no-progress")  # fmt: skip
    assert code == 0, err
    assert sorted(os.listdir(tmp_path / "mechlab-out" / "run")) == ["eval", "recall"]
    assert not (run / "eval").exists() and not (run / "recall").exists()
    # the same command again reads back (the README runs recall twice), and changes nothing
    before = digest(tmp_path / "mechlab-out" / "run" / "recall" / "recall.json")
    code, out, err = cli(capsys, "recall", "--ckpt", run / "last.pt", "--traces", "8", "--offset", "1",
                         "--no-components", "--no-progress")  # fmt: skip
    assert code == 0 and "read back" in out, err
    assert digest(tmp_path / "mechlab-out" / "run" / "recall" / "recall.json") == before
    line = refused(capsys, "recall", "--ckpt", run / "last.pt", "--traces", "9", "--offset", "1", "--no-components")
    assert "n_traces 8 (now 9)" in line and "--force" in line


def _hold_lock(folder: Path) -> tuple[int, int]:
    """A child process holding the lock of ``folder`` until the returned pipe closes."""
    from tests.pipelines.test_locks import _fork_holding

    folder.mkdir(parents=True, exist_ok=True)
    return _fork_holding(folder, "wait")


def test_issue_19_two_prunes_into_one_out_cannot_interleave(capsys, run_dir, tmp_path):
    pid, go = _hold_lock(tmp_path / "p")
    try:
        line = refused(capsys, "prune", "--ckpt", run_dir / "last.pt", *PRUNE_FAST, "--sparsity", "0.5",
                       "--out", tmp_path / "p")  # fmt: skip
        assert f"another mechlab run (pid {pid}, mechlab prune" in line and "wait for it to finish" in line
        assert sorted(os.listdir(tmp_path / "p")) == [".mechlab.lock"]  # the other's lock only
    finally:
        os.close(go)
        os.waitpid(pid, 0)
    code, out, err = cli(capsys, "prune", "--ckpt", run_dir / "last.pt", *PRUNE_FAST, "--sparsity", "0.5",
                         "--out", tmp_path / "p")  # fmt: skip
    assert code == 0, err
    edges = int(out.split("1-after_seed0: ")[1].split(" edges")[0])
    assert len(Circuit.from_json(tmp_path / "p" / "1-after_seed0.json").edges) == edges  # printed = stored


def test_issue_34_a_prune_into_a_folder_inside_a_running_report_is_refused(capsys, run_dir, tmp_path):
    """A `report --out R` and a `prune --out R/circuits` at the same time both exited 0, the
    prune's circuit replaced by the report's: a lock now covers its folder and all under it."""
    pid, go = _hold_lock(tmp_path / "R")  # the report, running
    try:
        line = refused(capsys, "prune", "--ckpt", run_dir / "last.pt", *PRUNE_FAST, "--out", tmp_path / "R" / "circuits")
        assert "circuits' lies inside" in line and f"another mechlab run (pid {pid}, mechlab prune" in line
        assert sorted(os.listdir(tmp_path / "R")) == [".mechlab.lock"]  # nothing written, no folder made
    finally:
        os.close(go)
        os.waitpid(pid, 0)
    pid, go = _hold_lock(tmp_path / "R" / "circuits")  # the prune, running
    try:
        line = refused(capsys, "report", "--ckpt", run_dir / "last.pt", "--out", tmp_path / "R", *REPORT_FAST)
        assert f"{str(tmp_path / 'R' / 'circuits')!r}, which is being written by another mechlab run (pid {pid}" in line
        assert sorted(os.listdir(tmp_path / "R")) == ["circuits"]
    finally:
        os.close(go)
        os.waitpid(pid, 0)


@pytest.mark.parametrize("change, phrase", [(["--traces", "9"], "n_train 8 (now 9)"),
                                            (["--haystack", "3", "--seg-len", "3"], "n_haystack 2 (now 3)"),
                                            (["--corruption", "shuffle"], "corruption misdirect_incorrect (now shuffle)")],
                         ids=["traces", "haystack", "corruption"])  # fmt: skip
def test_issue_19_a_finished_joint_prune_rerun_with_other_settings_is_refused(capsys, run_dir, tmp_path, change, phrase):
    args = ["prune", "--ckpt", run_dir / "last.pt", "--target", "1-after", "--target", "2-after", "--share", "0",
            *PRUNE_FAST, "--out", tmp_path / "j"]  # fmt: skip
    code, _, err = cli(capsys, *args)
    assert code == 0, err
    circuit = tmp_path / "j" / "joint" / "share-0" / "1-after_seed0.json"
    before = digest(circuit)
    line = refused(capsys, *args, *change)
    assert phrase in line and "--force" in line and digest(circuit) == before
    code, _, err = cli(capsys, *args, *change, "--force")  # asked: recomputed, the file records the new settings
    assert code == 0, err
    settings = Circuit.from_json(circuit).metadata["settings"]
    key, value = phrase.split(" (now ")[0].split(" ")[0], phrase.split("(now ")[1].rstrip(")")
    assert str(settings[key]) == value


REPORT_FAST = ["--eval-traces", "8", "--prune-traces", "8", "--recall-traces", "8", "--steps", "2",
               "--no-components", "--no-progress", "--target", "1-after"]  # fmt: skip


def test_issue_19_a_second_report_into_one_out_never_mixes_circuits(capsys, run_dir, tmp_path):
    out = tmp_path / "r"
    code, _, err = cli(capsys, "report", "--ckpt", run_dir / "last.pt", "--out", out, *REPORT_FAST,
                       "--seed", "0", "--seed", "1")  # fmt: skip
    assert code == 0, err
    code, stdout, err = cli(capsys, "report", "--ckpt", run_dir / "last.pt", "--out", out, *REPORT_FAST,
                            "--seed", "0", "--seed", "1")  # fmt: skip
    assert code == 0 and "read back: the report in --out was finished with the same settings" in stdout, err
    line = refused(capsys, "report", "--ckpt", run_dir / "last.pt", "--out", out, *REPORT_FAST, "--seed", "2",
                   "--seed", "3")  # fmt: skip
    assert "report.json' was made with other settings: seeds [0, 1] (now [2, 3])" in line
    code, _, err = cli(capsys, "report", "--ckpt", run_dir / "last.pt", "--out", out, *REPORT_FAST, "--seed", "2",
                       "--seed", "3", "--force")  # fmt: skip
    assert code == 0, err
    assert sorted(p.name for p in (out / "circuits").glob("*.json")) == ["1-after_seed2.json", "1-after_seed3.json"]
    report = json.loads((out / "report.json").read_text())
    assert report["finished"] is True and report["settings"]["seeds"] == [2, 3]


def test_issue_34_a_report_reads_back_only_circuits_whose_consensus_it_keeps(capsys, run_dir, tmp_path):
    """A report's circuits record their seeds' consensus, so their settings hold the seeds:
    an interrupted report resumes (its circuits read back, unchanged), while other seeds with
    --force recompute the circuit of a seed both runs share instead of saying "read back"
    and rewriting it with another consensus."""
    out = tmp_path / "r"
    args = ["report", "--ckpt", run_dir / "last.pt", "--out", out, *REPORT_FAST]
    code, _, err = cli(capsys, *args, "--seed", "0", "--seed", "1")
    assert code == 0, err
    circuit = Circuit.from_json(out / "circuits" / "1-after_seed0.json")
    assert circuit.metadata["settings"]["consensus_seeds"] == circuit.metadata["consensus"]["seeds"] == [0, 1]
    report = json.loads((out / "report.json").read_text())
    (out / "report.json").write_text(json.dumps({**report, "finished": False}))  # as if interrupted
    before = {p.name: digest(p) for p in (out / "circuits").iterdir()}
    code, stdout, err = cli(capsys, *args, "--seed", "0", "--seed", "1")
    assert code == 0 and "circuits/1-after_seed0.json: read back (same settings)" in stdout + err, err
    assert {p.name: digest(p) for p in (out / "circuits").iterdir()} == before
    code, stdout, err = cli(capsys, *args, "--seed", "0", "--seed", "2", "--force")
    assert code == 0, err
    assert "read back" not in stdout + err
    for s in (0, 2):
        circuit = Circuit.from_json(out / "circuits" / f"1-after_seed{s}.json")
        assert circuit.metadata["settings"]["consensus_seeds"] == circuit.metadata["consensus"]["seeds"] == [0, 2]


@pytest.mark.parametrize("case", ["file", "proc", "recall-traces", "circuits-a-file"])
def test_issue_19_report_options_and_out_are_checked_before_the_first_stage(capsys, run_dir, tmp_path, case):
    out, extra = tmp_path / "rpart", []
    if case == "file":
        out.write_text("a file")
    elif case == "proc":
        out = Path("/proc/mechlab-x")
    elif case == "recall-traces":
        extra = ["--recall-traces", TRILLION]
    else:
        out.mkdir()
        (out / "circuits").write_text("a file")
    before = sorted(os.listdir(tmp_path))
    line = fast_refusal(capsys, "report", "--ckpt", run_dir / "last.pt", "--out", out, *REPORT_FAST, *extra,
                        seconds=2.0)  # fmt: skip
    phrase = {"file": "is a file, not a folder", "proc": "cannot be made", "recall-traces": "would hold",
              "circuits-a-file": "circuits' is a file where mechlab writes a folder"}[case]  # fmt: skip
    assert phrase in line
    assert sorted(os.listdir(tmp_path)) == before  # nothing written (no rpart/, no eval/)
    if case == "circuits-a-file":
        assert sorted(os.listdir(out)) == ["circuits"]


def test_issue_19_duplicate_circuits_unknown_writers_and_huge_shares_are_refused(capsys, run_dir, tmp_path,
                                                                               two_circuits):  # fmt: skip
    a, b = two_circuits
    copy = shutil.copy(a, tmp_path / "copy.json")
    fast = ["--boot", "5", "--null", "5"]
    assert "are the same file; give each circuit once" in refused(capsys, "overlap", a, a, *fast)
    assert "are identical files; give each circuit once" in refused(capsys, "overlap", a, copy, *fast)
    assert "the same file" in refused(capsys, "view", a, a.parent / "." / a.name, "--out", tmp_path / "v.html")
    line = refused(capsys, "overlap", a, b, *fast, "--exclude-writer", "bogus")
    assert "--exclude-writer 'bogus' is not a writer of the circuits' graph (its writers: a0.h0" in line
    code, _, err = cli(capsys, "overlap", a, b, *fast, "--exclude-writer", "pos")
    assert code == 0, err
    line = refused(capsys, "prune", "--ckpt", run_dir / "last.pt", "--target", "1-after", "--target", "2-after",
                   "--share", "1e400", "--out", tmp_path / "s")  # fmt: skip
    assert "--share '1e400' is not a finite number" in line and not (tmp_path / "s").exists()
    line = refused(capsys, "prune", "--ckpt", run_dir / "last.pt", *PRUNE_FAST, "--seed", "0", "--seed", "0",
                   "--out", tmp_path / "d")  # fmt: skip
    assert "must not repeat" in line and not (tmp_path / "d").exists()


def test_issue_19_a_killed_multi_seed_prune_resumes_and_leaves_no_temp_files(capsys, run_dir, tmp_path,
                                                                             monkeypatch):  # fmt: skip
    """kill -9 while seed 0's figure is half written: the rerun reads seed 0 back (its
    figure redrawn), prunes only seed 1, and removes the temporary file. Seed 0 was written
    before the seeds' consensus, so the rerun says it rewrote it with the consensus (issue
    34: never "read back" of a file it then rewrites)."""
    import signal
    import subprocess
    import sys

    import mechlab.pipelines.prune as pipeline

    args = ["prune", "--ckpt", run_dir / "last.pt", *PRUNE_FAST, "--seed", "0", "--seed", "1", "--out", tmp_path / "k"]
    # the run that is killed: a fresh interpreter (a fork of this torch-using process can hang)
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "import mechlab.pipelines.outputs as outputs\n"
        "from mechlab.io import atomic_write, atomic_write_text\n"
        "def dying(path, text):\n"
        "    if Path(path).name == '1-after_seed0.html':\n"
        "        atomic_write(path, lambda f: (f.write(text[:1000].encode()), f.flush(),\n"
        "                                      os.kill(os.getpid(), signal.SIGKILL)))\n"
        "    return atomic_write_text(path, text)\n"
        "outputs.atomic_write_text = dying\n"
        "from mechlab.cli import main\n"
        "main(sys.argv[1:])\n"
        "sys.exit(3)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, timeout=300, env=env)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    left = sorted(os.listdir(tmp_path / "k"))
    assert "1-after_seed0.json" in left and any(n.startswith(".1-after_seed0.html.") for n in left)
    pruned = []
    real = pipeline.prune_request  # one circuit's search
    monkeypatch.setattr(pipeline, "prune_request", lambda *a, **k: pruned.append(a[1].seed) or real(*a, **k))
    code, out, err = cli(capsys, *args)
    assert code == 0, err
    assert pruned == [1] and "read back 1 circuit(s) of the same settings and rewrote them with this run's " \
        "consensus (an interrupted run wrote them before it" in out and "found before" not in out  # fmt: skip
    assert Circuit.from_json(tmp_path / "k" / "1-after_seed0.json").metadata["consensus"]["seeds"] == [0, 1]
    assert sorted(os.listdir(tmp_path / "k")) == ["1-after_seed0.html", "1-after_seed0.json", "1-after_seed1.html",
                                                  "1-after_seed1.json", "plotly.min.js"]  # fmt: skip
    assert "plotly" in (tmp_path / "k" / "1-after_seed0.html").read_text()


def test_issue_19_eval_checks_every_suite_before_the_first(capsys, run_dir, tmp_path):
    ckpt = shutil.copy(run_dir / "last.pt", tmp_path / "alone.pt")  # no checkpoints/ beside it
    line = refused(capsys, "eval", "--ckpt", ckpt, "--suite", "nih", "--suite", "dynamics", "--traces", "8",
                   "--out", tmp_path / "e")  # fmt: skip
    assert "the dynamics suite needs the run's checkpoints/step_*.pt" in line
    assert not (tmp_path / "e").exists()  # nih did not run first


def test_issue_19_a_curve_rerun_reads_back_or_refuses_by_settings(capsys, run_dir, tmp_path):
    args = ["curve", "--ckpt", run_dir / "last.pt", "--steps", "2", "--traces", "8", "--test-traces", "8",
            "--budgets", "0.1,0.5", "--no-progress", "--out", tmp_path / "cv"]  # fmt: skip
    assert cli(capsys, *args)[0] == 0
    before = digest(tmp_path / "cv" / "curve_1-after.json")
    code, out, err = cli(capsys, *args)
    assert code == 0 and "read back: same settings" in out, err
    assert digest(tmp_path / "cv" / "curve_1-after.json") == before
    other = [a if a != "0.1,0.5" else "0.2,0.5" for a in args]
    assert "budgets [0.1, 0.5, 1.0] (now [0.2, 0.5, 1.0])" in refused(capsys, *other)
    assert digest(tmp_path / "cv" / "curve_1-after.json") == before


# --------------------------------------------------------------------------- issue 19: the property
# No command changes a file it did not create in this run. A tree holds what a user has
# lying around (a git repository with a committed run and circuits, an untracked page, a
# folder of an earlier prune with other settings, one inside a folder of its own, a file
# where a folder would go); each example runs one command with one choice of output place, with or without --force, and
# hashes every file before and after. Without --force nothing that existed changes or
# disappears; with --force only files under the output place that are neither inputs nor
# checkpoints may; new files appear only under the output place (or mechlab-out/ when
# none is given); the outcome is exit 0, or exit 2 with one line. The commands include a
# bench subcommand (its --json, issue 34) and the places folders inside an earlier output
# folder and a folder that holds one (nested output folders, issue 34).

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

POLICY_EXAMPLES = 6 * int(os.environ.get("MECHLAB_PROPERTY_EXAMPLES", "1"))
PLACES = ["fresh", "checkpoint", "circuit", "page", "old-prune", "run-folder", "committed", "under-a-file",
          "default", "inside-prune", "holding-prune"]  # fmt: skip
COMMANDS = ["view", "overlap", "prune", "joint", "eval", "recall", "curve", "train", "bench"]


@pytest.fixture(scope="module")
def policy_template(run_dir, tmp_path_factory):
    """The tree each example copies (built once)."""
    import subprocess

    import yaml

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path_factory.mktemp("policy") / "tree"
    shutil.copytree(run_dir, root / "run")
    for seed, folder in ((["--seed", "0", "--seed", "1"], root / "committed"), (["--sparsity", "0.5"], root / "old")):
        code = main([str(a) for a in ("prune", "--ckpt", root / "run" / "last.pt", *PRUNE_FAST, *seed, "--out", folder)])
        assert code == 0
    shutil.copytree(root / "old", root / "outer" / "old")  # an output folder inside a folder
    (root / "page.html").write_text("<p>mine</p>")
    (root / "afile").write_text("a file")
    config = {**SMALL, "steps": 1}
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(root)]
    for step in (["init", "-q"], ["add", "run", "committed", "train.yaml"], ["commit", "-qm", "x"]):
        subprocess.run([*git, *step], check=True)
    return root


def tree_state(root: Path) -> dict[str, tuple[str, int]]:
    return {str(p.relative_to(root)): (digest(p), p.stat().st_mode)
            for p in root.rglob("*") if p.is_file() and not p.is_symlink()}  # fmt: skip


def policy_command(root: Path, command: str, place: str) -> tuple[list, Path | None]:
    """The command line of an example and the output place it names (None: the default)."""
    ckpt, a, b = root / "run" / "last.pt", root / "committed" / "1-after_seed0.json", root / "committed" / "1-after_seed1.json"
    target = {"fresh": root / "new" / ("out.html" if command == "view" else "out.json"
                                       if command in ("overlap", "bench") else "out"),
              "inside-prune": root / "old" / "inner", "holding-prune": root / "outer",
              "checkpoint": ckpt, "circuit": a, "page": root / "page.html", "old-prune": root / "old",
              "run-folder": root / "run", "committed": root / "committed", "under-a-file": root / "afile" / "x",
              "default": None}[place]  # fmt: skip
    fast_curve = ["--steps", "2", "--traces", "8", "--test-traces", "8", "--budgets", "0.5", "--no-progress"]
    args = {
        "view": ["view", a, b], "overlap": ["overlap", a, b, "--boot", "5", "--null", "5"],
        "prune": ["prune", "--ckpt", ckpt, *PRUNE_FAST, "--seed", "0"],
        "joint": ["prune", "--ckpt", ckpt, "--target", "1-after", "--target", "2-after", "--share", "0", *PRUNE_FAST],
        "eval": ["eval", "--ckpt", ckpt, "--traces", "8"],
        "recall": ["recall", "--ckpt", ckpt, "--traces", "8", "--offset", "1", "--no-components", "--no-progress"],
        "curve": ["curve", "--ckpt", ckpt, *fast_curve],
        "train": ["train", "--config", root / "train.yaml", "--no-progress"],
        "bench": ["bench", "hooks", "--families", "mamba", "--batch", "2", "--pos", "4", "--repeats", "1",
                  "--threads", "1"],
    }[command]
    option = "--json" if command in ("overlap", "bench") else "--out"
    if target is not None:
        args += [option, target]
    elif command == "view":  # --out is required: the default place is a fresh page in the tree
        target = root / "view.html"
        args += ["--out", target]
    return args, target


# Every place where something is in the way, with each kind of command, is always tried.
CRITICAL = [("view", "page", False), ("view", "circuit", True), ("overlap", "checkpoint", True),
            ("overlap", "circuit", True), ("overlap", "page", False), ("prune", "old-prune", False),
            ("prune", "committed", False), ("prune", "committed", True), ("prune", "checkpoint", True),
            ("joint", "old-prune", False), ("eval", "run-folder", False), ("recall", "run-folder", False),
            ("curve", "old-prune", False), ("train", "run-folder", False), ("train", "committed", True),
            ("eval", "default", False), ("bench", "checkpoint", True), ("bench", "page", False),
            ("bench", "old-prune", True), ("prune", "inside-prune", False), ("prune", "holding-prune", True),
            ("recall", "holding-prune", False)]  # fmt: skip


def critical_examples(test):
    for command, place, force in reversed(CRITICAL):
        test = example(command=command, place=place, force=force)(test)
    return test


@critical_examples
@settings(max_examples=POLICY_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(command=st.sampled_from(COMMANDS), place=st.sampled_from(PLACES), force=st.booleans())
def test_issue_19_no_command_changes_a_file_it_did_not_create(policy_template, tmp_path_factory, monkeypatch,
                                                              capsys, command, place, force):  # fmt: skip
    root = tmp_path_factory.mktemp("example") / "tree"
    shutil.copytree(policy_template, root)
    monkeypatch.chdir(root)
    args, target = policy_command(root, command, place)
    inputs = {root / "run" / "last.pt", root / "train.yaml"}  # what the commands read (and a checkpoint)
    if command in ("view", "overlap"):  # others may replace a committed circuit with --force (prune --out committed)
        inputs |= {root / "committed" / "1-after_seed0.json", root / "committed" / "1-after_seed1.json"}
    before = tree_state(root)
    code, _, err = cli(capsys, *args, *(["--force"] if force else []))
    after = tree_state(root)
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert code == 0 or (code == 2 and [x for x in lines if x.startswith("mechlab: error: ")] == lines[-1:]), err
    where = target if target is not None else root / "mechlab-out"

    def under(name: str) -> bool:
        path = root / name
        return path == where or where in path.parents

    changed = [n for n in before if after.get(n) != before[n]]
    for name in changed:
        path = root / name
        assert force and under(name) and path not in inputs and not name.endswith(".pt"), (
            f"{' '.join(map(str, args))}: changed {name}"
        )
    new = [n for n in after if n not in before]
    assert all(under(n) for n in new), f"{' '.join(map(str, args))}: wrote {new} outside {where}"
    assert not any(n.endswith((".tmp", ".mechlab.lock")) for n in new)


def test_issue_19_a_sweep_rerun_is_keyed_by_its_settings(capsys, tmp_path):
    """The same sweep resumes (every trial reused); other settings say which changed, reuse
    the trials whose own specs match and make the tables anew; another trial function is
    refused (its results would be taken as this one's) unless --force."""
    oracle = ["--trial", "mechlab.sweep.oracle:oracle_trial"]
    args = ["sweep", "--out", tmp_path / "s", "--local", "--no-progress", "--models", "st_lstm_small", "--formats",
            "acot", "--m", "3", "--L", "3", "--lrs", "1e-3", "--n-val", "5", "--lengths", "fixed", "--no-kappa"]  # fmt: skip
    code, out, err = cli(capsys, *args, "--seeds", "10", *oracle)
    assert code == 0, err
    code, out, err = cli(capsys, *args, "--seeds", "10", *oracle)
    assert code == 0 and "(same settings): finished trials are reused" in out + err and " 0 run," in out, err
    code, out, err = cli(capsys, *args, "--seeds", "10,20", *oracle)
    assert code == 0 and "ran other settings (seeds [10] (now [10, 20]))" in out + err, err
    assert json.loads((tmp_path / "s" / "sweep.json").read_text())["seeds"] == [10, 20]
    line = refused(capsys, *args, "--seeds", "10,20", "--trial", "mechlab.sweep.oracle:oracle_key")
    assert "holds trials of trial function" in line and "oracle_key" in line and "--force" in line
