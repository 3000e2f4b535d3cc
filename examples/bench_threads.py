"""Median forward+backward time of the bundled model (batch 64 x 64 tokens) at N torch threads.

    python examples/bench_threads.py 2                           # OpenMP's default wait policy
    OMP_WAIT_POLICY=PASSIVE python examples/bench_threads.py 2   # what the mechlab CLI sets

Run it while another process keeps the cores busy to see what spinning threads cost.
"""

import os
import sys
import time

import torch

import mechlab


def main(threads: int, repeats: int = 15) -> float:
    """Median seconds of one forward+backward at ``threads`` threads."""
    torch.set_num_threads(threads)
    model = mechlab.load_checkpoint("examples/checkpoints/recall-cpu/last.pt").model
    x = torch.randn(64, 64, model.cfg.d_in)
    for _ in range(3):  # warm-up
        model(x).pow(2).mean().backward()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(x).pow(2).mean().backward()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    median = main(n)
    print(f"{n} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}: median {median * 1000:.1f} ms")
