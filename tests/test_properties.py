"""Property-based tests (hypothesis) of the loaders and the command line (issue 10).

The only outcomes allowed are success or a one-line error: a ``CheckpointError`` /
``ValueError`` from the library, exit status 2 with one ``mechlab: error:`` line from
the CLI. A checkpoint that loads after its bytes were damaged must hold exactly the
weights that were saved (the checksum makes silent corruption impossible).

The default run is small (a few seconds). ``MECHLAB_PROPERTY_EXAMPLES=N`` multiplies
every test's example count by N for a longer search; docs/reliability.md records the
counts that were run.
"""

from __future__ import annotations

import json
import os
import string
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mechlab.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, seal
from mechlab.cli import main
from mechlab.models import build_model
from mechlab.prune import Circuit
from mechlab.train.trainer import read_metrics_lines

SCALE = int(os.environ.get("MECHLAB_PROPERTY_EXAMPLES", "1"))
MODEL = {"arch": "transformer", "d_model": 8, "n_layers": 1, "n_heads": 2, "d_in": 3, "d_out": 2, "n_ctx": 8}
SMALL_RUN = {
    "task_cfg": {"d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
                 "n_train_systems": 50, "n_test_systems": 20},
    "model": {"arch": "transformer", "d_model": 8, "n_layers": 1, "n_heads": 2},
    "eval_haystack": 2, "eval_seg_len": 4, "eval_traces": 8, "n_checkpoints": 0,
}  # fmt: skip


def examples(n: int):
    """Settings for a property: ``n`` examples (times SCALE), no deadline, reproducible."""
    return settings(
        max_examples=n * SCALE, deadline=None, derandomize=SCALE == 1,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )  # fmt: skip


@pytest.fixture(autouse=True)
def small_size_limit(monkeypatch):
    """Random configs must not allocate gigabytes here: a 2e6-element model limit."""
    monkeypatch.setenv("MECHLAB_MAX_ELEMENTS", "2000000")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A sealed checkpoint (weights, optimizer and RNG state) and its weights."""
    torch.manual_seed(0)
    model = build_model(MODEL)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4, 3)).sum().backward()
    optimizer.step()
    path = tmp_path_factory.mktemp("prop") / "good.pt"
    save_checkpoint(model, path, optimizer=optimizer, step=2, rng=True, task="lds")
    return path, {k: v.clone() for k, v in model.state_dict().items()}


def one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text and text == text.strip()
    return text


def load_outcome(path: Path):
    """Load ``path``: the Checkpoint, or the one-line CheckpointError."""
    try:
        return load_checkpoint(path)
    except CheckpointError as err:
        one_line(err)
        return err


# --------------------------------------------------------------------------- checkpoint bytes


@examples(40)
@given(data=st.binary(min_size=0, max_size=4096))
def test_random_bytes_never_load_and_fail_in_one_line(tmp_path, data):
    path = tmp_path / "random.pt"
    path.write_bytes(data)
    assert isinstance(load_outcome(path), CheckpointError)


@examples(40)
@given(fraction=st.floats(0, 1, exclude_max=True))
def test_truncations_fail_in_one_line(tmp_path, saved, fraction):
    good, _ = saved
    data = good.read_bytes()
    path = tmp_path / "cut.pt"
    path.write_bytes(data[: int(len(data) * fraction)])
    assert isinstance(load_outcome(path), CheckpointError)


@examples(60)
@given(position=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_flipped_bit_anywhere_is_refused_or_changes_nothing(tmp_path, saved, position, bit):
    good, weights = saved
    data = bytearray(good.read_bytes())
    data[int(len(data) * position)] ^= 1 << bit
    path = tmp_path / "flipped.pt"
    path.write_bytes(bytes(data))
    outcome = load_outcome(path)
    if not isinstance(outcome, CheckpointError):  # the flip hit bytes no reader uses
        state = outcome.model.state_dict()
        assert all(torch.equal(state[k], v) for k, v in weights.items())
        assert outcome.checksum_verified


# Plain values a (damaged or hand-made) checkpoint payload may hold.
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=8)
    | st.builds(lambda n: torch.zeros(n), st.integers(0, 3)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
FIELDS = ["format", "version", "config", "state_dict", "step", "metrics", "metadata", "optimizer", "rng"]


@examples(30)
@given(field=st.sampled_from(FIELDS), value=plain, reseal=st.booleans())
def test_a_payload_field_of_any_shape_loads_or_fails_in_one_line(tmp_path, saved, field, value, reseal):
    payload = torch.load(saved[0], weights_only=True)
    payload[field] = value
    if reseal:
        seal(payload)
    path = tmp_path / "payload.pt"
    torch.save(payload, path)
    load_outcome(path)


@examples(25)
@given(key=st.sampled_from(["d_model", "n_layers", "n_heads", "d_head", "d_mlp", "n_ctx", "d_in", "arch", "io"]),
       value=st.integers(-5, 10**12) | st.text(max_size=6) | st.none() | st.floats())  # fmt: skip
def test_any_config_value_loads_or_fails_in_one_line_without_allocating(tmp_path, saved, key, value):
    payload = torch.load(saved[0], weights_only=True)
    payload["config"][key] = value
    seal(payload)
    path = tmp_path / "config.pt"
    torch.save(payload, path)
    load_outcome(path)


# --------------------------------------------------------------------------- circuits and metrics


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
CIRCUIT = {"format": "mechlab-circuit", "version": 1, "nodes": ["embed", "out"],
           "edges": [["embed", "out", 1.0]], "metadata": {"checkpoint_sha256": "ab"}}  # fmt: skip


@examples(60)
@given(
    document=json_values
    | st.builds(lambda k, v: {**CIRCUIT, k: v}, st.sampled_from(sorted(CIRCUIT) + ["log_alpha"]), json_values)
)
def test_any_json_is_a_circuit_or_a_one_line_error(tmp_path, document):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(document))
    try:
        circuit = Circuit.from_json(path)
    except ValueError as err:
        assert "c.json" in one_line(err)
    else:
        assert circuit.to_dict()["edges"] == [list(e) for e in document["edges"]]


@examples(60)
@given(lines=st.lists(json_values.map(json.dumps) | st.text(string.printable, max_size=20), max_size=6))
def test_any_metrics_file_reads_or_fails_naming_the_file(tmp_path, lines):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            records = read_metrics_lines(path)
        except ValueError as err:
            assert "metrics.jsonl" in one_line(err)
        else:
            assert all(isinstance(r, dict) for _, r in records)


# --------------------------------------------------------------------------- command line

words = st.text(string.ascii_letters + string.digits + ":._-=/ ", max_size=12)


def run_cli(capsys, args) -> int:
    code = main([str(a) for a in args])
    _, err = capsys.readouterr()
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mechlab: error: ") and "Traceback" not in err
    return code


@examples(30)
@given(device=words | st.sampled_from(["cpu", "cuda", "cuda:7", "mps", "meta", "xla", "cpu:0"]),
       setting=words, steps=st.integers(-3, 0) | st.just(1))  # fmt: skip
def test_train_options_fail_in_one_line_before_creating_anything(capsys, tmp_path, device, setting, steps):
    # Every run here is refused: by the device, the setting, steps <= 0, or at the latest by
    # the batch size (checked before a batch is drawn). Nothing may be created before that.
    config = tmp_path / "small.yaml"
    config.write_text(json.dumps(SMALL_RUN))
    out = tmp_path / "run"
    args = ["train", "--config", config, "--set", setting, "--device", device, "--steps", steps, "--out", out,
            "--no-progress", "--set", "batch_size=1000000000000000"]  # fmt: skip
    assert run_cli(capsys, args) == 2
    assert not out.exists()


@examples(30)
@given(name=words | st.sampled_from(["tiny", "lstm", "mamba", "dense_ssm", "transformer"]))
def test_info_model_names_succeed_or_fail_in_one_line(capsys, name):
    assume(name.strip() and not name.startswith("-"))
    assert run_cli(capsys, ["info", "--model", name]) in (0, 2)


@examples(20)
@given(suite=words, traces=st.integers(-2, 2), out=words)
def test_eval_options_on_a_damaged_checkpoint_fail_in_one_line(capsys, tmp_path, suite, traces, out):
    ckpt = tmp_path / "bad.pt"
    ckpt.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    args = ["eval", "--ckpt", ckpt, "--suite", suite, "--traces", traces, "--out", out]
    assert run_cli(capsys, args) == 2
