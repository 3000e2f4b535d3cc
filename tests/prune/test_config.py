"""PruneConfig (mechlab.prune.config): validation, unknown settings refused, protocols as
instances, and prune()'s keyword API building one."""

from __future__ import annotations

import dataclasses

import pytest

from mechlab.prune.config import RECIPES, RUN_ARGUMENTS, PruneConfig, prune_config
from mechlab.prune.engine import check_prune_args


def test_defaults_are_the_documented_search():
    cfg = PruneConfig()
    assert (cfg.sparsity, cfg.constraint, cfg.select, cfg.noise) == (0.95, "budget", "refine", "mixed")
    assert cfg.normalize_loss and cfg.loss_scale == 1.0 and cfg.warm_start == "eap-ig" and cfg.refine_pool == "auto"
    assert cfg.optimizer == "shared-adam" and (cfg.batch_size, cfg.refine_traces, cfg.warm_steps) == (32, 128, 3)
    assert cfg.pool_traces == 64 and cfg.validate_traces == 128
    assert cfg.steps == 50 and cfg.warmup_steps == 25 and cfg.lambda_warmup_steps == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.steps = 3  # type: ignore[misc]


@pytest.mark.parametrize("field, value, message", [
    ("sparsity", 1.0, r"sparsity must be in \(0, 1\)"),
    ("sparsity", "0.9", "sparsity must be a number"),
    ("node_sparsity", -0.1, r"node_sparsity must be in \[0, 1\)"),
    ("ablation", "resample", "unknown ablation 'resample'"),
    ("loss", "kl", "unknown loss 'kl'"),
    ("normalize_loss", "yes", "normalize_loss must be True or False"),
    ("loss_scale", 0.0, "loss_scale must be positive"),
    ("constraint", "penalty", "unknown constraint 'penalty'"),
    ("steps", 0, "steps must be a positive integer"),
    ("steps", True, "steps must be a positive integer"),
    ("warmup", -1, "warmup must be an integer >= 0"),
    ("lr", float("nan"), "lr must be a finite number"),
    ("batch_size", 2.5, "batch_size must be a positive integer"),
    ("validate_traces", -1, "validate_traces must be an integer >= 0"),
    ("select", "best", "unknown select 'best'"),
    ("noise", "iid", "unknown noise 'iid'"),
    ("optimizer", "sgd", "unknown optimizer 'sgd'"),
    ("pool_traces", 0, "pool_traces must be a positive integer"),
    ("refine_pool", "acdc", "unknown refine_pool 'acdc'"),
    ("refine_extra", -1, "refine_extra must be an integer >= 0"),
    ("min_effect", -1e-3, "min_effect must be >= 0"),
    ("warm_start", "acdc", "unknown warm_start 'acdc'"),
    ("warm_start", None, "unknown warm_start None"),
    ("warm_steps", 0, "warm_steps must be a positive integer"),
])  # fmt: skip
def test_bad_values_are_refused_in_one_line(field, value, message):
    with pytest.raises(ValueError, match=message) as info:
        PruneConfig(**{field: value})
    assert "\n" not in str(info.value)


def test_unknown_settings_are_refused_and_run_arguments_ignored():
    with pytest.raises(ValueError, match=r"unknown pruning setting 'stpes'; known: .*steps"):
        prune_config(0.9, stpes=10)
    with pytest.raises(ValueError, match=r"unknown pruning settings 'a', 'b'"):
        check_prune_args(0.9, a=1, b=2)
    cfg = check_prune_args(0.9, steps=7, **{k: 3 for k in RUN_ARGUMENTS})
    assert (cfg.sparsity, cfg.steps) == (0.9, 7)
    assert prune_config(None, steps=None) == PruneConfig()  # None: not given


def test_from_settings_and_overrides():
    base = RECIPES["study"]
    cfg = PruneConfig.from_settings(base, steps=10)
    assert cfg.steps == 10 and cfg.loss == "truth" and cfg.constraint == "lagrangian"
    assert PruneConfig().overrides() == {}
    assert PruneConfig(steps=10).overrides() == {"steps": 10}
    assert PruneConfig(lr=1).lr == 1.0 and isinstance(PruneConfig(lr=1).lr, float)


def test_protocols_are_instances_and_the_pipelines_carry_their_data_separately():
    from mechlab.pipelines import PRUNE_RECIPES

    assert set(RECIPES) == set(PRUNE_RECIPES) == {"default", "uniform", "fast", "thorough", "study"}
    assert all(isinstance(c, PruneConfig) for c in RECIPES.values())
    study = RECIPES["study"]
    assert (study.sparsity, study.node_sparsity, study.loss, study.loss_scale, study.steps) == (
        0.99, 0.8, "truth", 1000.0, 3000)
    assert not study.normalize_loss and study.warm_start == "none"
    for name, entry in PRUNE_RECIPES.items():  # the NiH construction is the data side's
        assert {k: v for k, v in entry.items() if k != "nih"} == {
            "sparsity": RECIPES[name].sparsity, **RECIPES[name].overrides()}
    assert PRUNE_RECIPES["uniform"]["nih"] == "uniform"


def test_to_dict_records_the_effective_schedules():
    record = PruneConfig(steps=40).to_dict()
    assert record["warmup"] == 20 and record["lambda_warmup"] == 4
    assert set(record) == {f.name for f in dataclasses.fields(PruneConfig)}


def test_resolved_settings_record_defaults_and_explicit_values_alike():
    """What the pipelines' settings records hold: a default and the same value given
    explicitly resolve alike, on the base asked for (the joint search's 500 steps)."""
    from mechlab.prune.config import JOINT_CONFIG, PruneConfig, resolved_settings

    plain = resolved_settings({"seed": 0, "device": "cpu", "progress": False})
    assert plain == resolved_settings({"seed": 0, "steps": PruneConfig().steps, "warmup": None})
    assert plain["steps"] == PruneConfig().steps and "device" not in plain and "progress" not in plain
    assert resolved_settings({}, JOINT_CONFIG, sparsity=False)["steps"] == JOINT_CONFIG.steps
    assert "sparsity" not in resolved_settings({}, sparsity=False)
