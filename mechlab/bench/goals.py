"""The goals each benchmark row is held to, and the verdict beside it: met, or missed with
the measured reason, computed from the row's own figures at render time.

``docs/benchmarks.md`` renders these as a last column (:func:`mechlab.bench.tables.render`),
so a regenerated table can never claim a goal its numbers miss. The goals are the ones
set for caching and pruning and the ones the page stated before (scans, start-up); ``bench train``
states its goals in its own notes. A reason says what the same run measured beside the
missed figure (the cache without the big maps, the CPU-time ratio, the two buffers every
pruning step must hold); the profiles behind them are in the page's prose.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CACHE_GOAL = {"transformer": 1.05, "lstm": 1.5, "dense_ssm": 1.5, "mamba": 1.5}
PRUNE_STEP_GOAL = 2.0  # pruning step / plain forward+backward, through the medium preset
PRUNE_GOAL_PRESETS = ("tiny", "small", "medium")
SCAN_GOAL = 3.0  # loop / chunked
STARTUP_GOAL = 1.0  # seconds
LM_MEMORY_GOAL = 24 * 10**9  # bytes: a billion-parameter model imported, cached, attributed within 24 GB
LM_THREADS = 2  # ... on two cores

BIG_MAPS = {"transformer": "the attention maps", "dense_ssm": "`hook_A`", "mamba": "`hook_ssm_state`"}
BIG_MAPS_COST = {
    "transformer": "writing the attention maps (scores and pattern, [batch, head, pos, pos] per layer)",
    "dense_ssm": "forming and writing every transition A(x_t) ([batch, pos, d_state, d_state] per layer), "
                 "which the plain forward never forms",  # fmt: skip
    "mamba": "writing every scan state ([batch, pos, d_inner, d_state] per layer) where the plain forward "
             "keeps one",  # fmt: skip
}


def _x(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f}x"


def _load_or_work(v: dict[str, Any], ratio_key: str, cpu_key: str, goal: float) -> str | None:
    """The miss is the wall clock's alone (CPU time meets the goal): waiting, not work."""
    cpu = v.get(cpu_key)
    if cpu is not None and cpu <= goal < v[ratio_key]:
        return f"in CPU time {_x(cpu)}: the wall clock's excess is waiting for a core, not work"
    return None


def hooks_goal(v: dict[str, Any]) -> str:
    """``run_with_cache`` of every hook vs the plain forward (and beside nnsight)."""
    family, ratio, nn = v["family"], v.get("cache_ratio"), v.get("nnsight_ratio")
    goal = CACHE_GOAL.get(family)
    if goal is None or ratio is None:
        return "-"
    beat = family != "transformer" or nn is None or ratio < nn
    head = f"<= {goal:.2f}x" + (" and below nnsight" if family == "transformer" else "")
    if ratio <= goal and beat:
        return f"{head}: **met** ({_x(ratio)}, nnsight {_x(nn)})"
    why = []
    if ratio > goal:
        light = v.get("cache_light_ratio")
        if light is not None and light <= goal:
            why.append(f"without {BIG_MAPS[family]} {_x(light)}: the cost is {BIG_MAPS_COST[family]}")
        elif family == "lstm" and v.get("unrolled_ratio") is not None:
            why.append(f"the step loop that writes every gate and state where the fused kernel writes only h "
                       f"(the unrolled forward alone {_x(v['unrolled_ratio'])})")  # fmt: skip
        waiting = _load_or_work(v, "cache_ratio", "cache_cpu_ratio", goal)
        if waiting:
            why.append(waiting)
    if not beat:
        why.append(f"nnsight {_x(nn)} is below it")
    return f"{head}: missed ({_x(ratio)}): " + "; ".join(why or ["no measured cause beside it; see the text"])


def prune_goal(v: dict[str, Any]) -> str:
    """Pruning step vs plain forward+backward (<= 2x), memory vs naive stacking (<= 2 / layers)."""
    parts = []
    step = v.get("step_ratio")
    if step is not None:
        if v.get("preset") not in PRUNE_GOAL_PRESETS:
            parts.append(f"step: no goal beyond medium ({_x(step)} here)")
        elif step <= PRUNE_STEP_GOAL:
            parts.append(f"step <= 2x: **met** ({_x(step)})")
        else:
            why = _load_or_work(v, "step_ratio", "step_cpu_ratio", PRUNE_STEP_GOAL) or (
                f"the mixing products and per-reader LayerNorms add {(v['step_s'] - v['plain_s']) * 1e3:,.0f} ms "
                f"to the plain step's {v['plain_s'] * 1e3:,.0f} (profiled in the text)")  # fmt: skip
            parts.append(f"step <= 2x: missed ({_x(step)}): {why}")
    ratios = [r for r in (v.get("memory_ratio"), v.get("memory_recompute_ratio")) if r is not None]
    goal = v.get("memory_goal")
    if ratios and goal is not None:
        best = min(ratios)
        if best <= goal:
            parts.append(f"memory <= {goal:.2f} of naive: **met** ({best:.2f})")
        else:
            floor = _buffers_share(v)
            why = "" if floor is None else (
                f": the writer-difference buffer and its gradient, both alive when the backward pass starts, "
                f"are {floor:.2f} of naive by themselves")  # fmt: skip
            parts.append(f"memory <= {goal:.2f} of naive: missed ({best:.2f}){why}")
    return "; ".join(parts) or "-"


def _buffers_share(v: dict[str, Any]) -> float | None:
    """2 x [n_writers, batch * pos * d_model] float32 over the naive scheme's peak."""
    keys = ("n_writers", "batch", "n_pos", "d_model", "memory_naive")
    if any(v.get(k) is None for k in keys):
        return None
    return 2 * v["n_writers"] * v["batch"] * v["n_pos"] * v["d_model"] * 4 / v["memory_naive"]


SCAN_REASON = {
    "mamba": "the loop is bound by its elementwise work per state element, not by Python (profiled in the text)",
    "dense_ssm": "every order of the bilinear map costs the same multiply-adds, at the CPU's GEMM rate "
                 "(measured in the text)",  # fmt: skip
}


def scan_goal(v: dict[str, Any]) -> str:
    """The chunked scan vs the per-step loop, forward and forward+backward (3x faster)."""
    fwd, bwd = v.get("forward_speedup"), v.get("backward_speedup")
    if fwd is None or bwd is None:
        return "-"
    if min(fwd, bwd) >= SCAN_GOAL:
        return f"3x faster: **met** ({_x(fwd)}, {_x(bwd)})"
    return f"3x faster: missed ({_x(fwd)} forward, {_x(bwd)} with backward): {SCAN_REASON.get(v['family'], 'see text')}"


def startup_goal(v: dict[str, Any]) -> str:
    """Every command answers within a second."""
    t = v.get("median_s")
    if t is None:
        return "-"
    return f"< 1 s: **met** ({t:.2f} s)" if t < STARTUP_GOAL else f"< 1 s: missed ({t:.2f} s)"


def lm_goal(v: dict[str, Any]) -> str:
    """mechlab's whole run of a billion-parameter shape (import, cache, EAP-IG where run)
    within 24 GB of resident memory on two threads; a competitor's row has no goal."""
    if v.get("tool") != "mechlab":
        return "-"
    if v.get("refused"):
        return f"<= 24 GB on {LM_THREADS} threads: missed (it did not run: {v['refused']})"
    peak = v.get("peak_rss")
    if peak is None or v.get("threads") != LM_THREADS:
        return f"no goal: {v.get('threads')} threads" if peak is not None else "-"
    verdict = "**met**" if peak <= LM_MEMORY_GOAL else "missed"
    return f"<= 24 GB on {LM_THREADS} threads: {verdict} ({peak / 1e9:.1f} GB)"


ROW_GOALS: dict[str, Callable[[dict[str, Any]], str]] = {
    "hooks": hooks_goal,
    "prune": prune_goal,
    "scan": scan_goal,
    "startup": startup_goal,
    "lm": lm_goal,
}


def row_goals(bench: str, values: list[dict[str, Any]], settings: dict[str, Any]) -> list[str] | None:
    """The goal cell of every row of a ``bench`` table, or None when it has no row goals.

    Args:
        bench: The record's benchmark name.
        values: The table's raw numbers, one dict per row.
        settings: The run's options (batch and positions fill in what a row leaves out).
    """
    fn = ROW_GOALS.get(bench)
    if fn is None or not values:
        return None
    extra = {k: settings[k] for k in ("batch", "n_pos") if k in settings}
    return [fn({**extra, **v}) for v in values]
