"""mechlab.bench.prune: the pruning step and memory benchmark."""

import torch

from mechlab.bench.prune import bench_prune
from mechlab.models import build_model


def test_bench_prune_memory_below_naive_stacking():
    torch.manual_seed(0)
    model = build_model("transformer", d_model=8, n_layers=4, n_heads=2, d_in=5, d_out=3, n_ctx=16)
    result = bench_prune(model, batch=4, n_pos=8, repeats=1)
    assert result.memory_ours > 0 and result.memory_naive > 0
    assert result.memory_ratio < 1.0
    assert result.step_seconds > 0 and result.plain_seconds > 0


def test_peak_memory_keeps_the_profilers_native_lines_off_the_terminal():
    import subprocess
    import sys

    code = ("import torch; from mechlab.bench.prune import peak_memory; "
            "print(peak_memory(lambda: torch.ones(1000) * 2))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) >= 4000  # the 1000-float result was allocated
    assert "USDT" not in out.stderr and "profiler_start" not in out.stderr
