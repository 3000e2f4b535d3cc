"""The methods table of docs/pruning.md ("Methods side by side"): every circuit-finding
method on the bundled checkpoint's 1-after and 2-after targets (MIB's CPR and CMD, the
circuit at 25 edges, seconds, peak memory) and its exact recoveries on planted models and
compiled Tracr programs.

    nice -n 19 python examples/bench_methods.py --threads 1 \
        [--ckpt examples/checkpoints/recall-cpu/last.pt] \
        [--planted tests.prune.planted_cases:cases] [--seeds 0,1] [--tracr-seeds 0,1,2] \
        [--methods prune,eap,eap-ig,eap-ig-inputs,exact,acdc] [--out methods.json]

``--planted MODULE:FUNCTION`` names the planted generator: a function of the seeds that
returns :class:`mechlab.bench.methods.PlantedCase` items (run from the repository root to
use the test suite's). ``--planted none`` and ``--tracr-seeds none`` leave those columns out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch

from mechlab.bench.methods import bench_methods, tracr_cases
from mechlab.io import atomic_write_text
from mechlab.pipelines import checkpoint_prune_data
from mechlab.prune.methods import METHODS


def _seeds(text: str) -> list[int]:
    return [] if text == "none" else [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", default="examples/checkpoints/recall-cpu/last.pt")
    parser.add_argument("--targets", default="1-after,2-after")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--planted", default="tests.prune.planted_cases:cases")
    parser.add_argument("--seeds", default="0,1", help="seeds of the planted cases")
    parser.add_argument("--tracr-seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the table's JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    planted = []
    if args.planted != "none":
        sys.path.insert(0, str(Path.cwd()))
        module, _, name = args.planted.partition(":")
        planted = getattr(importlib.import_module(module), name)(_seeds(args.seeds))
    tracr = tracr_cases(seeds=_seeds(args.tracr_seeds)) if _seeds(args.tracr_seeds) else []
    ckpt, data = checkpoint_prune_data(args.ckpt)
    table = bench_methods(ckpt.model, data, args.targets.split(","), methods, planted=planted,
                          tracr=tracr)  # fmt: skip
    table.info.update(checkpoint=args.ckpt, checkpoint_sha256=ckpt.sha256, command=sys.argv)
    print(table.to_markdown())
    info = table.info
    print(f"\nload average {info['loadavg_start']} -> {info['loadavg_end']}, "
          f"{info['torch_threads']} thread(s), {info['seconds']:.0f} s")  # fmt: skip
    for kind, rows in (("planted", table.planted), ("tracr", table.tracr)):
        for method, rec in rows.items():
            if rec.misses:
                print(f"{kind} {method} missed: {', '.join(rec.misses)}")
    if args.out:
        atomic_write_text(args.out, json.dumps(table.to_dict(), indent=1, default=str))


if __name__ == "__main__":
    main()
