"""Which knobs make label-based recall learnable on a small budget?

Runs several variants of the ``recall-cpu`` preset side by side (one process
each), for a fixed wall-clock budget, and summarises their NiH curves: the
examples each needed before the 1-after and 2-after median errors fell below
the targets. This is how the bundled configuration was chosen
(docs/reproduction.md).

    python examples/recall_sweep.py --out runs/sweep --device cuda --time-limit 450
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# The starting point: the recall-cpu preset's task with the study's 5-dim state,
# Zipf(1.5) systems per trace (1..4), i.e. the probe configuration in the issue.
BASE = ["task_cfg.d_state=5", "task_cfg.zipf_a=1.5", "task_cfg.min_systems=1"]

# name -> --set overrides applied after BASE (the recall-cpu preset is min2_d3)
VARIANTS: dict[str, list[str]] = {
    "base": [],
    "zipf0": ["task_cfg.zipf_a=0"],
    "zipf0_d3": ["task_cfg.zipf_a=0", "task_cfg.d_state=3"],
    "zipf0_p4": ["task_cfg.zipf_a=0", "task_cfg.n_pairs=4"],
    "zipf0_wide": ["task_cfg.zipf_a=0", "model.d_model=128", "model.n_layers=4", "model.n_heads=8"],
    "zipf0_cos2e-3": ["task_cfg.zipf_a=0", "lr=2e-3", "warmup_steps=1000", "lr_schedule=cosine"],
    "zipf0_d3_p4": ["task_cfg.zipf_a=0", "task_cfg.d_state=3", "task_cfg.n_pairs=4"],
    "zipf0_d3_wide": ["task_cfg.zipf_a=0", "task_cfg.d_state=3", "model.d_model=128", "model.n_layers=4", "model.n_heads=8"],
    "zipf0_d2": ["task_cfg.zipf_a=0", "task_cfg.d_state=2"],
    "zipf0_d3_cos3e-3": ["task_cfg.zipf_a=0", "task_cfg.d_state=3", "lr=3e-3", "warmup_steps=1000", "lr_schedule=cosine"],
    "min2_d3": ["task_cfg.zipf_a=0", "task_cfg.min_systems=2", "task_cfg.d_state=3"],
    "ctx40_d3": ["task_cfg.zipf_a=0", "task_cfg.d_state=3", "task_cfg.n_ctx=40", "task_cfg.max_cuts=20"],
}


def first_below(curve: list[tuple[int, float]], threshold: float) -> int | None:
    """Examples seen at the first evaluation whose error is <= threshold."""
    return next((ex for ex, err in curve if err <= threshold), None)


def summarize(run_dir: Path) -> dict:
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if line.strip() and '"eval"' in line] if (run_dir / "metrics.jsonl").exists() else []
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if line.strip() and '"examples_per_s"' in line] if (run_dir / "metrics.jsonl").exists() else []
    one = [(e["examples"], e["eval"]["nih_1_after"]) for e in evals]
    two = [(e["examples"], e["eval"]["nih_2_after"]) for e in evals]
    rates = sorted(s["examples_per_s"] for s in steps[len(steps) // 2:]) or [float("nan")]
    return {
        "curve_1_after": one, "curve_2_after": two,
        "examples_1_after_0.2": first_below(one, 0.2), "examples_2_after_0.1": first_below(two, 0.1),
        "best_1_after": min((e for _, e in one), default=None), "examples_per_s": rates[len(rates) // 2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=40000)
    parser.add_argument("--time-limit", type=float, default=3600, help="seconds before the runs are stopped")
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = {}
    for name in names:
        cmd = [sys.executable, "-m", "mechlab.cli", "train", "--preset", "recall-cpu", "--out", str(args.out / name),
               "--steps", str(args.steps), "--device", args.device, "--no-progress"]
        for override in BASE + VARIANTS[name]:
            cmd += ["--set", override]
        log = open(args.out / f"{name}.log", "w")  # noqa: SIM115
        procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + args.time_limit
    while time.time() < deadline and any(p.poll() is None for p in procs.values()):
        time.sleep(2)
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        p.wait()
    summary = {name: {"overrides": VARIANTS[name], **summarize(args.out / name)} for name in names}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for name, s in summary.items():
        print(f"{name:20s} ex/s {s['examples_per_s']:8.0f}  1-after<=0.2 at {s['examples_1_after_0.2']}  "
              f"2-after<=0.1 at {s['examples_2_after_0.1']}  best 1-after {s['best_1_after']}")


if __name__ == "__main__":
    main()
