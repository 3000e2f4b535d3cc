"""Tests of the trainer's configuration (mechlab.train.config) and of the learning-rate
schedule and checkpoint spacing (mechlab.train.trainer)."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from mechlab.train import PRESETS, TrainConfig, available_presets, log_spaced_steps, resolve_config
from mechlab.train.config import parse_override
from mechlab.train.trainer import learning_rate

# The study's presets (papers.md, "Models"): batch size and constant learning rate.
STUDY = {
    "tiny": (2048, 1.268e-4),
    "small": (1024, 4.48e-5),
    "medium": (1536, 1.585e-5),  # 3 x 512 (the study's 3 GPUs), as grad_accum=3
    "big": (640, 1.477e-5),
}


# --------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name", sorted(STUDY))
def test_study_presets_resolve_with_the_studys_batch_and_lr(name):
    cfg = resolve_config(preset=name)
    batch, lr = STUDY[name]
    assert cfg.batch_size == batch
    assert cfg.lr == lr
    assert cfg.model == {"preset": name}
    assert cfg.lr_schedule == "constant" and cfg.warmup_steps == 0
    assert cfg.weight_decay == 0.01 and cfg.grad_clip == 1.0
    assert cfg.task == "lds" and cfg.task_cfg == {}


def test_bundled_preset_is_available_and_resolves():
    assert set(STUDY) <= set(PRESETS)
    assert "recall-cpu" in available_presets()
    cfg = resolve_config(preset="recall-cpu")
    assert cfg.model["arch"] == "transformer"
    assert cfg.task_cfg["n_ctx"] == 64


def test_resolving_does_not_mutate_the_preset_table():
    before = {k: dict(v) for k, v in PRESETS["tiny"].items() if isinstance(v, dict)}
    resolve_config(preset="tiny", overrides=["model.d_model=8", "model.preset=small"])
    assert PRESETS["tiny"]["model"] == before["model"] == {"preset": "tiny"}


# --------------------------------------------------------------------------- YAML + overrides


def test_yaml_file_then_overrides_then_fields(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "steps: 50\n"
        "lr: 5.0e-4\n"
        "model:\n  d_model: 48\n"
        "task_cfg:\n  n_pairs: 6\n  d_state: 3\n"
    )
    cfg = resolve_config(
        preset="tiny",
        config_file=path,
        overrides=["lr=2e-3", "model.n_layers=2", "task_cfg.n_pairs=8", "task_cfg.resample_x0=true"],
        steps=7,
        device=None,  # None: not set, the default stays
    )
    # preset < file < --set < fields; nested dicts merge key by key.
    assert cfg.model == {"preset": "tiny", "d_model": 48, "n_layers": 2}
    assert cfg.task_cfg == {"n_pairs": 8, "d_state": 3, "resample_x0": True}
    assert cfg.lr == 2e-3 and isinstance(cfg.lr, float)
    assert cfg.steps == 7
    assert cfg.batch_size == 2048  # from the preset, untouched
    assert cfg.device == "cpu"


@pytest.mark.parametrize(
    ("text", "keys", "value"),
    [
        ("lr=2e-3", ["lr"], 2e-3),  # YAML 1.1 reads "2e-3" as a string: must become a float
        ("lr=1E-4", ["lr"], 1e-4),
        ("lr=3.5e-4", ["lr"], 3.5e-4),
        ("steps=100", ["steps"], 100),
        ("model.d_model=64", ["model", "d_model"], 64),
        ("task_cfg.zipf_a=0", ["task_cfg", "zipf_a"], 0),
        ("model.act_fn=relu", ["model", "act_fn"], "relu"),  # an 'e' in a word stays a string
        ("lr_schedule=cosine", ["lr_schedule"], "cosine"),
        (" device = cuda", ["device"], "cuda"),
        ("task_cfg.resample_x0=false", ["task_cfg", "resample_x0"], False),
    ],
)
def test_parse_override_values(text, keys, value):
    got_keys, got = parse_override(text)
    assert got_keys == keys
    assert got == value and type(got) is type(value)


def test_number_overrides_become_numbers_in_the_config():
    cfg = resolve_config(overrides=["lr=2e-3", "weight_decay=0", "steps=9", "min_lr_ratio=5e-2"])
    assert cfg.lr == 0.002 and isinstance(cfg.lr, float)
    assert cfg.min_lr_ratio == 0.05 and isinstance(cfg.min_lr_ratio, float)
    assert cfg.steps == 9 and isinstance(cfg.steps, int)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"preset": "nope"}, r"unknown preset 'nope'.*tiny"),
        ({"overrides": ["nope=3"]}, r"unknown setting 'nope'"),
        ({"overrides": ["lr"]}, r"bad override 'lr': expected key=value"),
        ({"overrides": ["=3"]}, r"bad override '=3'"),
        ({"overrides": ["lr=[1,"]}, r"not valid YAML"),
        ({"overrides": ["lr.x=3"]}, r"setting 'lr' has no sub-fields"),
        ({"overrides": ["steps=0"]}, r"steps must be positive"),
        ({"overrides": ["batch_size=-4"]}, r"batch_size must be positive"),
        ({"overrides": ["lr=0"]}, r"lr must be positive"),
        ({"overrides": ["eval_every=-1"]}, r"eval_every must be >= 0"),
        ({"overrides": ["lr_schedule=linear"]}, r"unknown lr_schedule 'linear'.*cosine"),
        ({"overrides": ["task=copy"]}, r"unknown task 'copy'"),
        ({"overrides": ["model=3"]}, r"model must be a mapping, got 3"),
        ({"steps": 0}, r"steps must be positive"),
    ],
)
def test_bad_settings_raise_clear_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        resolve_config(**kwargs)


def test_bad_config_files(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        resolve_config(config_file=tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        resolve_config(config_file=bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("steps: [1,\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        resolve_config(config_file=broken)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("steps: 3\nlearning_rate: 0.1\n")
    with pytest.raises(ValueError, match=r"unknown training setting\(s\) \['learning_rate'\]"):
        resolve_config(config_file=unknown)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert resolve_config(config_file=empty) == TrainConfig()


# Values of the wrong type get past the validation (which only compares numbers) and
# fail later with a TypeError or RuntimeError, i.e. a traceback from `mechlab train`.
@pytest.mark.parametrize("override", ["lr=abc", "grad_clip=abc", "weight_decay=abc", "seed=1e3", "steps=2.5"])
def test_values_of_the_wrong_type_raise_value_errors(override):
    with pytest.raises(ValueError):
        cfg = resolve_config(overrides=[override])
        # What the trainer does with these fields first:
        _ = cfg.lr > 0 and cfg.grad_clip > 0 and cfg.weight_decay >= 0
        assert isinstance(cfg.seed, int) and isinstance(cfg.steps, int)


def test_config_round_trips_through_a_dict():
    cfg = resolve_config(preset="small", overrides=["model.d_model=32", "task_cfg.n_pairs=4"])
    d = cfg.to_dict()
    assert TrainConfig.from_dict(d) == cfg
    d["model"]["d_model"] = 1  # a deep copy: editing it leaves cfg alone
    assert cfg.model["d_model"] == 32
    assert {f.name for f in dataclasses.fields(TrainConfig)} == set(d)


# --------------------------------------------------------------------------- schedule


def test_constant_schedule_with_warmup():
    cfg = TrainConfig(lr=1e-3, warmup_steps=4, steps=20)
    assert [learning_rate(cfg, s) for s in (1, 2, 3, 4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert learning_rate(cfg, 5) == learning_rate(cfg, 20) == 1e-3
    assert learning_rate(TrainConfig(lr=3e-4), 1) == 3e-4  # the study's: no warm-up, constant


def test_cosine_schedule_against_a_hand_computation():
    # warm-up 10 steps, then cosine from 1e-3 down to 0.1 * 1e-3 over the remaining 100.
    cfg = TrainConfig(lr=1e-3, warmup_steps=10, steps=110, lr_schedule="cosine", min_lr_ratio=0.1)
    assert learning_rate(cfg, 5) == pytest.approx(5e-4)
    assert learning_rate(cfg, 10) == pytest.approx(1e-3)
    assert learning_rate(cfg, 35) == pytest.approx(1e-4 + 0.5 * 9e-4 * (1 + math.sqrt(0.5)))  # 8.682e-4
    assert learning_rate(cfg, 60) == pytest.approx(5.5e-4)  # half way: the mean of lr and the floor
    assert learning_rate(cfg, 110) == pytest.approx(1e-4)
    assert learning_rate(cfg, 500) == pytest.approx(1e-4)  # past the end: stays at the floor
    after = [learning_rate(cfg, s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(after, after[1:], strict=False))
    # Without warm-up the first step already decays a little.
    plain = TrainConfig(lr=2e-3, steps=4, lr_schedule="cosine", min_lr_ratio=0.0)
    assert [learning_rate(plain, s) for s in (1, 2, 3, 4)] == pytest.approx(
        [2e-3 * 0.5 * (1 + math.cos(math.pi * s / 4)) for s in (1, 2, 3, 4)]
    )


# --------------------------------------------------------------------------- checkpoint spacing


@pytest.mark.parametrize(("total", "count"), [(12, 4), (1000, 12), (200_000, 12), (20_000, 12), (7, 30)])
def test_log_spaced_steps_properties(total, count):
    steps = log_spaced_steps(total, count)
    assert steps == sorted(set(steps))  # strictly increasing
    assert steps[0] == 1 and steps[-1] == total
    assert all(isinstance(s, int) and 1 <= s <= total for s in steps)
    assert len(steps) <= count
    if total >= 1000:
        # Evenly spaced in log scale: constant ratio wherever rounding does not matter.
        assert len(steps) == count
        ratio = total ** (1 / (count - 1))
        big = [s for s in steps if s >= 20]
        for a, b in zip(big, big[1:], strict=False):
            assert b / a == pytest.approx(ratio, rel=0.1)
        np.testing.assert_allclose(np.log(steps), np.linspace(0, np.log(total), count), atol=0.5)


def test_log_spaced_steps_edge_cases():
    assert log_spaced_steps(10, 100) == list(range(1, 11))  # more asked than exist: every step
    assert log_spaced_steps(1, 5) == [1]
    assert log_spaced_steps(100, 0) == []
    assert log_spaced_steps(0, 5) == []
    assert log_spaced_steps(100, 1) == [1, 100]  # the last step is always kept


# --------------------------------------------------------------- hostile config files (issue 19)


@pytest.mark.parametrize(
    "text, phrase",
    [("a: " + "[" * 3000 + "]" * 3000 + "\n", "nests more than 64 levels deep"),
     ("steps: !!python/object/apply:os.system ['echo pwned']\n", "holds the tag '!!python/object/apply:os.system'"),
     ("steps: abc\n", "steps must be an integer, got 'abc'"),
     ("lr: fast\n", "lr must be a number, got 'fast'"),
     ("model: [1, 2]\n", "model must be a mapping, got [1, 2]"),
     ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n"
      for p, n in zip("abcdef", "bcdefg", strict=True)), "expands to more than 1,000,000 values")],
    ids=["deep-3000", "python-tag", "steps-abc", "lr-string", "model-list", "laughs"],
)  # fmt: skip
def test_a_hostile_config_file_is_one_line(tmp_path, text, phrase):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        resolve_config(config_file=path)
    assert phrase in str(err.value) and "\n" not in str(err.value)


def test_a_config_file_reads_yaml_1_2_floats(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 3e-4\nsteps: 20\n")
    cfg = resolve_config(config_file=path)
    assert cfg.lr == 3e-4 and cfg.steps == 20


@pytest.mark.parametrize(
    "fields, phrase",
    [({"steps": 10**19}, "overflows the 64-bit seed of the batches"),
     ({"seed": 10**16, "steps": 10**10}, "overflows the 64-bit seed"),
     ({"steps": 10**12, "batch_size": 10**12}, "steps x batch_size = 1e+24 training examples"),
     ({"n_checkpoints": 10**12}, "the log-spaced checkpoint steps would hold n_checkpoints 1e+12")],
)  # fmt: skip
def test_counts_a_run_cannot_represent_or_allocate_are_refused_at_once(fields, phrase):
    import time

    start = time.thread_time()
    with pytest.raises(ValueError, match=re.escape(phrase)):
        TrainConfig(**fields)
    assert time.thread_time() - start < 0.5  # refused, not allocated (CPU time of this thread: a busy machine stretches the wall clock)

