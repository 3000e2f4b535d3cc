"""The goal beside each benchmark row: met when the row's figure meets it, missed with the
cause the same run measured (the cache without its big maps, CPU time, the buffers)."""

from mechlab.bench import goals, tables
from mechlab.bench.record import BenchRecord, Table


def test_the_transformer_cache_must_beat_1_05x_and_nnsight():
    row = {"family": "transformer", "cache_ratio": 1.03, "nnsight_ratio": 1.40, "cache_light_ratio": 0.99}
    assert goals.hooks_goal(row).startswith("<= 1.05x and below nnsight: **met** (1.03x")
    slow = {**row, "cache_ratio": 1.30, "cache_cpu_ratio": 1.25}
    text = goals.hooks_goal(slow)
    assert text.startswith("<= 1.05x and below nnsight: missed (1.30x)") and "without the attention maps 0.99x" in text
    beaten = {**row, "cache_ratio": 1.04, "nnsight_ratio": 1.02}
    assert "missed (1.04x): nnsight 1.02x is below it" in goals.hooks_goal(beaten)
    waiting = {"family": "lstm", "cache_ratio": 1.7, "nnsight_ratio": 3.0, "cache_cpu_ratio": 1.4}
    assert "in CPU time 1.40x: the wall clock's excess is waiting" in goals.hooks_goal(waiting)
    assert goals.hooks_goal({"family": "mamba", "cache_ratio": 1.49, "nnsight_ratio": 1.2}).startswith("<= 1.50x: **met**")
    assert goals.hooks_goal({"family": "other", "cache_ratio": 9.0}) == "-"


def test_a_pruning_miss_says_what_the_two_buffers_take_of_naive():
    row = {"preset": "medium", "step_ratio": 1.9, "step_cpu_ratio": 1.9, "step_s": 1.9, "plain_s": 1.0,
           "memory_ratio": 0.36, "memory_recompute_ratio": 0.22, "memory_goal": 2 / 12, "n_writers": 109,
           "d_model": 128, "memory_naive": 1_000 * 2**20}
    text = goals.prune_goal({**row, "batch": 16, "n_pos": 64})
    floor = 2 * 109 * 16 * 64 * 128 * 4 / (1_000 * 2**20)  # 2 float32 [n_writers, batch*pos*d] buffers
    assert text.startswith("step <= 2x: **met** (1.90x); memory <= 0.17 of naive: missed (0.22)")
    assert f"are {floor:.2f} of naive by themselves" in text
    slow = goals.prune_goal({**row, "step_ratio": 2.4, "step_cpu_ratio": 2.3, "step_s": 2.4, "memory_goal": 0.5})
    assert "step <= 2x: missed (2.40x): the mixing products and per-reader LayerNorms add 1,400 ms" in slow
    assert "memory <= 0.50 of naive: **met** (0.22)" in slow
    assert goals.prune_goal({"preset": "big", "step_ratio": 4.7}) == "step: no goal beyond medium (4.70x here)"


def test_the_page_shows_the_goal_column_computed_from_the_rows_numbers():
    table = Table(["family", "cache / plain"], [["transformer", "1.20x"], ["lstm", "1.40x"]],
                  values=[{"family": "transformer", "cache_ratio": 1.2, "nnsight_ratio": 1.3},
                          {"family": "lstm", "cache_ratio": 1.4, "nnsight_ratio": 3.0}])  # fmt: skip
    machine = {"threads": 1, "interop_threads": 1, "device": "cpu", "cpu_model": "cpu", "cores": 2, "torch": "2",
               "blas": "mkl", "lapack": "mkl"}  # fmt: skip
    rec = BenchRecord("hooks", "mechlab bench hooks", {}, machine, {"before": [0.1] * 3, "after": [1.0] * 3},
                      "2026-12-01T00:00:00", 1.0, [table])  # fmt: skip
    text = tables.render(rec)
    assert "| family | cache / plain | goal |" in text
    assert "| transformer | 1.20x | <= 1.05x and below nnsight: missed (1.20x)" in text
    assert "| lstm | 1.40x | <= 1.50x: **met** (1.40x, nnsight 3.00x) |" in text
    assert goals.row_goals("ensemble", table.values, {}) is None
    rec.load["provisional"] = True
    assert "| lstm | 1.40x | (provisional) <= 1.50x: **met**" in tables.render(rec)
