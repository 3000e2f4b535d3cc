"""Median forward+backward time of the bundled model (batch 64 x 64 tokens) at N torch threads.

    python examples/bench_threads.py 2                           # OpenMP's default wait policy
    OMP_WAIT_POLICY=PASSIVE python examples/bench_threads.py 2   # what the mechlab CLI sets

Run it while another process keeps the cores busy to see what spinning threads cost.
"""

import os, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
import mechlab
m = mechlab.load_checkpoint("examples/checkpoints/recall-cpu/last.pt").model
x = torch.randn(64, 64, m.cfg.d_in)
for _ in range(3): m(x).pow(2).mean().backward()
ts=[]
for _ in range(15):
    t=time.perf_counter(); m(x).pow(2).mean().backward(); ts.append(time.perf_counter()-t)
ts.sort(); print(sys.argv[1], os.environ.get("OMP_WAIT_POLICY"), f"median {ts[len(ts)//2]*1000:.1f} ms")
