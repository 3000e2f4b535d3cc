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
     ("bogus: 1\n", "unknown sweep setting(s) bogus"),
     ("ms: [1000000]\n", "m 1e+06 is more than mechlab's limit of 16,384 (one token per element"),
     ("Ls: [1000000]\n", "L 1e+06 is more than mechlab's limit of 4,096"),
     (SMALL + "device: foo\n", "unknown device 'foo'"),
     (SMALL + "device: meta\n", "mechlab does not run on device type 'meta'"),
     ("models: [{arch: lstm, d_model: 100000}]\nms: [3]\nLs: [3]\nkappa: false\n",
      "lstm acot Z3 uniform L=3: the lstm config (d_model=100000, n_layers=1, n_ctx=7) would allocate"),
     ("models: [st_lstm_small]\nms: [5000]\nLs: [4000]\nkappa: false\nbatch_size: 1\n",
      "an evaluation chunk's logits would hold sequences 512 x positions 8001 x states 5000"),
     ("models: [st_lstm_small]\nms: [7]\nLs: [12]\nlengths: fixed\nkappa: false\nn_val: 1000000000\n",
      "the task's sequences would hold sequences (train + validation + OOD) 1e+09 x elements 24")],
    ids=["python-tag", "steps-abc", "steps-float", "kappa-string", "ms-item", "lrs-item", "models-int", "n_max",
         "search-field", "search-int", "list", "laughs", "deep", "batch-1e12", "unknown", "m-1e6", "L-1e6",
         "device-foo", "device-meta", "model-too-large", "eval-chunk", "n_val-1e9"],
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


def test_a_length_of_a_million_is_refused_at_once_not_after_a_day_of_counting(tmp_path):
    """Checking a sweep counts the sequences of every length up to L for each search (with
    kappa, one per length): it grows as L**2.6, so L is bounded before any count."""
    import time

    start = time.perf_counter()
    text = SMALL.replace("kappa: false", "kappa: true").replace("Ls: [3]", "Ls: [1000000]")
    assert "L 1e+06 is more than" in refused(tmp_path, text)
    assert time.perf_counter() - start < 1
