"""Sweep configs (mechlab.sweep.spec) read safely and validated by the spec's own field
annotations: issue 19's hostile sweep YAML (python tags, wrong types, billion laughs,
deep nesting) and a batch too big to allocate are one-line errors before any trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from mechlab.sweep.spec import SweepSpec, read_settings

ROOT = Path(__file__).resolve().parents[2]
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)
SMALL = "models: [st_lstm_small]\nms: [3]\nLs: [3]\nkappa: false\nood: false\n"


def refused(tmp_path, text: str) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        SweepSpec.from_yaml(path)
    assert "\n" not in str(err.value) and "sweep.yaml" in str(err.value)
    return str(err.value)


@pytest.mark.parametrize(
    "text, phrase",
    [("steps: !!python/object/apply:os.system ['echo pwned']\n", "holds the tag '!!python/object/apply:os.system'"),
     ("steps: abc\n", "steps must be an integer, got 'abc'"),
     ("steps: 1.5\n", "steps must be an integer, got 1.5"),
     ("kappa: maybe\n", "kappa must be true or false, got 'maybe'"),
     ("ms: [5, x]\n", "ms[1] must be an integer, got 'x'"),
     ("lrs: [fast]\n", "lrs[0] must be a number, got 'fast'"),
     ("models: [5]\n", "models[0] must be a string, got 5"),
     ("n_max: lots\n", "search.n_max must be an integer, got 'lots'"),
     ("search: {epsilon: small}\n", "search.epsilon must be a number, got 'small'"),
     ("search: 5\n", "search must be a mapping of search settings"),
     ("- a\n- b\n", "must hold a mapping of settings, got list"),
     (LAUGHS, "expands to more than 1,000,000 values"),
     ("a: " + "[" * 3000 + "]" * 3000 + "\n", "nests more than 64 levels deep"),
     (SMALL + "batch_size: 1000000000000\n", "(its logits) would hold batch_size 1e+12 x positions 7 x vocabulary 3"),
     ("bogus: 1\n", "unknown sweep setting(s) bogus")],
    ids=["python-tag", "steps-abc", "steps-float", "kappa-string", "ms-item", "lrs-item", "models-int", "n_max",
         "search-field", "search-int", "list", "laughs", "deep", "batch-1e12", "unknown"],
)  # fmt: skip
def test_a_hostile_or_mistyped_sweep_config_is_one_line(tmp_path, text, phrase):
    assert phrase in refused(tmp_path, text)


def test_the_example_sweeps_still_read_and_one_value_stands_for_a_list(tmp_path):
    for path in sorted((ROOT / "examples" / "sweeps").rglob("sweep.yaml")):
        assert SweepSpec.from_yaml(path).search_keys()
    path = tmp_path / "sweep.yaml"
    path.write_text("models: st_lstm_small\nms: 3\nLs: 3\nlrs: 1e-3\nkappa: false\nood: false\n")
    spec = SweepSpec.from_yaml(path)
    assert (spec.models, spec.ms, spec.Ls, spec.lrs) == (("st_lstm_small",), (3,), (3,), (1e-3,))
    assert read_settings(path)["lrs"] == 1e-3  # a float, though YAML 1.1 reads "1e-3" as a string
