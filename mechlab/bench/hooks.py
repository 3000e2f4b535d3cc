"""`mechlab bench hooks`: what looking inside costs.

For each model family, side by side in one run: the plain forward, a
``run_with_cache`` of every hook point, and an nnsight trace that saves the
same activations. Reported as medians and as ratios to the plain forward.
For the LSTM the unrolled (hookable) path is also timed against the fused
``torch.nn.LSTM`` path.

For the recurrent families, ``cache`` is ``run_with_cache`` as it runs: its hooks are
marked read-only, so the mixers take their fast paths and hand each per-step point its
whole trajectory once. ``cache_steps`` is the same cache with the mark taken off the
hooks, which makes every per-step point run step by step (what any hook that may write
gets, and what caching cost before).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch

from mechlab.bench.record import Table
from mechlab.bench.timing import Timing, fmt_ms, fmt_ratio, paired_ratio, time_interleaved
from mechlab.models import build_model
from mechlab.models.base import MechModel
from mechlab.models.cache import caching_hooks
from mechlab.patching.backends import load_nnsight

# The models benchmarked: the tiny recall-study transformer and recurrent models of similar size.
BENCH_MODELS: dict[str, dict] = {
    "transformer": {"preset": "tiny"},
    "lstm": {"arch": "lstm", "d_model": 128, "n_layers": 2},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 64, "d_state": 64, "n_layers": 2},
    "mamba": {"arch": "mamba", "d_model": 64, "n_layers": 2},
}

# The per-step hooks whose trajectories dwarf the plain forward's memory: hook_A is
# [batch, pos, d_state, d_state] (263 MB per layer here), hook_ssm_state
# [batch, pos, d_inner, d_state] (132 MB per layer); cache_light caches every other hook.
# The transformer's are its attention maps, [batch, head, query_pos, key_pos] (97 MB each
# per layer here): scores and pattern.
BIG_STATE_HOOKS: dict[str, str | tuple[str, ...]] = {
    "dense_ssm": "ssm.hook_A",
    "mamba": "mixer.hook_ssm_state",
    "transformer": ("attn.hook_attn_scores", "attn.hook_pattern"),
}


@dataclass
class HookBenchRow:
    """One family's medians (seconds) and ratios to the plain forward."""

    family: str
    n_params: int
    n_hooks: int
    plain: float
    cache: float
    nnsight: float
    unrolled: float | None = None  # LSTM only: the unrolled forward, hookable step by step
    cache_steps: float | None = None  # recurrent families: caching step by step (hooks unmarked)
    cache_fused: float | None = None  # LSTM only: caching from the fused kernel + recovered gates
    cache_light: float | None = None  # all but the big state hook / the attention maps
    timings: dict[str, Timing] = field(default_factory=dict)  # every contender's runs

    def ratio(self, name: str, cpu: bool = False) -> tuple[float, float, float] | None:
        """``(q1, median, q3)`` of contender ``name`` / the plain forward, run by run."""
        if name not in self.timings:
            return None
        return paired_ratio(self.timings[name], self.timings["plain"], cpu=cpu)

    @property
    def cache_steps_ratio(self) -> float | None:
        return None if self.cache_steps is None else self.cache_steps / self.plain

    @property
    def cache_ratio(self) -> float:
        return self.cache / self.plain

    @property
    def nnsight_ratio(self) -> float:
        return self.nnsight / self.plain


def cache_step_by_step(model: MechModel, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``run_with_cache``'s caching, with hooks that are not marked read-only (so every
    per-step point runs step by step, as under a hook that may write).

    Args:
        model: The model.
        x: Its input.

    Returns:
        Hook name -> activation.
    """
    cache: dict[str, torch.Tensor] = {}
    fwd, _, finalize = caching_hooks(model, cache)
    unmarked = [(name, partial(fn)) for name, fn in fwd]  # a new partial, without the mark
    with model.hooks(fwd_hooks=unmarked):
        model(x)
    finalize()
    return cache


def _nnsight_save_all(traced, x: torch.Tensor, names: list[str]) -> dict:
    """One nnsight trace that records the outputs of the hook points ``names``."""
    with traced.trace(x) as tracer:
        cache = tracer.cache(modules=[f"model.{name}" for name in names])
    return cache


def bench_family(
    family: str, batch: int = 64, n_pos: int = 251, repeats: int = 7, device: str = "cpu"
) -> HookBenchRow:
    """Benchmark one family.

    Args:
        family: A key of ``BENCH_MODELS``.
        batch: Batch size.
        n_pos: Sequence length.
        repeats: Timed runs of each contender (the median is reported).
        device: Torch device.

    Returns:
        The medians and ratios.
    """
    model: MechModel = build_model(BENCH_MODELS[family], n_ctx=max(n_pos, 1)).to(device).eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, n_pos, model.cfg.d_in, generator=gen).to(device)
    names = list(model.hook_dict)
    traced = load_nnsight()(model)

    def plain() -> None:
        with torch.no_grad():
            model(x)

    def cache() -> None:
        with torch.no_grad():
            model.run_with_cache(x)

    def nnsight_all() -> None:
        with torch.no_grad():
            _nnsight_save_all(traced, x, names)

    def cache_steps() -> None:
        with torch.no_grad():
            cache_step_by_step(model, x)

    fns = {"plain": plain, "cache": cache, "nnsight": nnsight_all}
    if family != "transformer":
        fns["cache_steps"] = cache_steps
    if family in BIG_STATE_HOOKS:
        big = BIG_STATE_HOOKS[family]

        def cache_light() -> None:
            with torch.no_grad():
                model.run_with_cache(x, names_filter=lambda name: not name.endswith(big))

        fns["cache_light"] = cache_light
    if family == "lstm":
        # The unrolled path is what hooks need; the fused path is what training uses.
        def unrolled() -> None:
            model.fused = False
            try:
                with torch.no_grad():
                    model(x)
            finally:
                model.fused = True

        def cache_fused() -> None:  # read_path "fused": what CUDA and autograd get
            for block in model.blocks:
                block.lstm.read_path = "fused"
            try:
                cache()
            finally:
                for block in model.blocks:
                    block.lstm.read_path = "auto"

        fns = {"plain": plain, "unrolled": unrolled, "cache": cache, "cache_fused": cache_fused,
               "cache_steps": cache_steps, "nnsight": nnsight_all}  # fmt: skip
    times = time_interleaved(fns, repeats=repeats, device=device)
    n_params = sum(p.numel() for p in model.parameters())
    return HookBenchRow(
        family=family,
        n_params=n_params,
        n_hooks=len(names),
        plain=times["plain"].median,
        cache=times["cache"].median,
        nnsight=times["nnsight"].median,
        unrolled=times["unrolled"].median if "unrolled" in times else None,
        cache_steps=times["cache_steps"].median if "cache_steps" in times else None,
        cache_fused=times["cache_fused"].median if "cache_fused" in times else None,
        cache_light=times["cache_light"].median if "cache_light" in times else None,
        timings=times,
    )


# The columns of `mechlab bench hooks`' table: contender (over the plain forward) and header.
RATIO_COLUMNS = (
    ("cache", "cache / plain"),
    ("nnsight", "nnsight / plain"),
    ("cache_steps", "step-by-step cache / plain"),
    ("cache_light", "cache w/o big maps / plain"),
    ("unrolled", "unrolled / fused"),
    ("cache_fused", "fused+recovered cache / plain"),
)


def hooks_table(rows: list[HookBenchRow]) -> Table:
    """``mechlab bench hooks``' table: medians [quartiles] of each contender, and its ratio to
    the plain forward run by run (median [quartiles]), wall clock and CPU time."""
    columns = ["family", "params", "hooks", "plain ms", "cache ms", "nnsight ms"]
    columns += [head for _, head in RATIO_COLUMNS] + ["cache / plain, CPU time"]
    cells, values = [], []
    for r in rows:
        ratios = [r.ratio(name) for name, _ in RATIO_COLUMNS]
        cpu = r.ratio("cache", cpu=True)
        cells.append([r.family, f"{r.n_params:,}", str(r.n_hooks), fmt_ms(r.timings["plain"]),
                      fmt_ms(r.timings["cache"]), fmt_ms(r.timings["nnsight"]),
                      *("-" if q is None else fmt_ratio(q) for q in ratios),
                      "-" if cpu is None else fmt_ratio(cpu)])  # fmt: skip
        values.append({"family": r.family, "n_params": r.n_params, "n_hooks": r.n_hooks,
                       **{f"{n}_s": t.median for n, t in r.timings.items()},
                       **{f"{n}_cpu_s": t.cpu_median for n, t in r.timings.items()},
                       **{f"{n}_ratio": q[1] for (n, _), q in zip(RATIO_COLUMNS, ratios, strict=True) if q},
                       "cache_cpu_ratio": None if cpu is None else cpu[1]})  # fmt: skip
    return Table(columns, cells, values=values)
