"""Circuits of a state-tracking checkpoint at several lengths, and how much they share.

For each length ``n`` and pruning seed the checkpoint is pruned on traces of ``n``
elements whose corrupted copy changes one element (``mechlab prune --length n``; the data
of :mod:`mechlab.tasks.state_tracking_prune`); then the circuits of two lengths are
compared as two targets (Jaccard with bootstrap intervals over seeds and the uniform and
degree-preserving null models, :func:`mechlab.prune.stats.overlap_report`, over the edges
the sparsity counts) and each circuit is scored at the other lengths (cross-length
faithfulness: does the circuit found at ``n = 4`` carry the model at ``n = 6``?).

Writes ``<target>_n<n>_seed<k>.json`` (every circuit), ``summary.json`` (metrics, overlap
statistics, cross-length faithfulness, the model's accuracy per length) and one offline
page, ``<target>_seed<k>_lengths.html``, drawing the first seed's circuits at every length
on one layout (each page inlines plotly, ~5 MB, so one page per run instead of one per
circuit; ``mechlab view`` draws any other). Prints a summary::

    python examples/state_tracking_circuits.py --ckpt examples/checkpoints/st-dense-ssm-cpu/last.pt \\
        --out circuits/state-tracking/dense_ssm --lengths 4 6 --seeds 0 1 2 --sparsity 0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import warnings
from pathlib import Path

import torch

from mechlab.checkpoint import load_checkpoint
from mechlab.io import atomic_write_text
from mechlab.pipelines import prune_checkpoint
from mechlab.pipelines.circuits import overlap_lines
from mechlab.prune.evaluate import evaluate_circuit
from mechlab.prune.graph import countable_edges, pruning_graph
from mechlab.prune.stats import overlap_report
from mechlab.tasks import state_tracking as st
from mechlab.tasks.state_tracking_prune import resolve_target, state_tracking_prune_data
from mechlab.traces import target_positions
from mechlab.viz import circuit_figure, overlap_figure
from mechlab.viz.figures import page_html


def model_accuracy(ckpt, length: int, n: int = 2000, seed: int = 12345) -> dict[str, float]:
    """The full model's accuracy on ``n`` fresh sequences of ``length`` elements."""
    cfg = ckpt.task_config
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.n_states, (n, length), generator=g)  # [n, length]
    states = torch.from_numpy(st.states_of(cfg, x.numpy()))
    seqs = st.SequenceSet(x, states, torch.full((n,), length, dtype=torch.long))
    return st.set_accuracy(ckpt.model, cfg, seqs)


def countable_universe(ckpt, data, target) -> list[tuple[str, str]]:
    """The edges the sparsity counts for ``target`` on ``data`` (inert and unreachable ones left out)."""
    graph = pruning_graph(ckpt.model, data.train.windows)
    fn = resolve_target(target, data)
    scored = target_positions(fn, data.train) if graph.windows else None
    keep = countable_edges(graph, "interchange", scored)
    return [e for e, k in zip(graph.edges, keep.tolist(), strict=True) if k]


def on_one_layout(circuit, reference):
    """A copy of ``circuit`` for drawing beside ``reference``: a recurrent graph's windows
    keep their names across lengths (so do the edges) but not their positions, which the
    overlap view would take for another graph; the copy records ``reference``'s graph."""
    metadata = {**circuit.metadata, "graph": reference.metadata["graph"]}
    return dataclasses.replace(circuit, metadata=metadata)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4, 6])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", default="final")
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--steps", type=int, default=None, help="Optimiser steps (default: prune's, 200).")
    parser.add_argument("--boot", type=int, default=2000)
    parser.add_argument("--null", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--force", action="store_true", help="Overwrite what --out holds.")
    args = parser.parse_args(argv)
    if (args.out / "summary.json").exists() and not args.force:
        parser.error(f"{args.out} already holds circuits; pass --force to overwrite them")
    torch.set_num_threads(args.threads)
    steps = {} if args.steps is None else {"steps": args.steps}
    ckpt = load_checkpoint(args.ckpt)
    circuits, rows = {}, []
    for n in args.lengths:
        for s in args.seeds:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                c = prune_checkpoint(args.ckpt, args.target, args.sparsity, length=n, seed=s,
                                     progress=False, **steps)  # fmt: skip
            stem = f"{c.metadata['target']}_seed{s}"
            c.to_json(args.out / f"{stem}.json")
            circuits.setdefault(n, []).append(c)
            m = c.metadata["metrics"]
            rows.append({"length": n, "seed": s, "edges": c.n_edges, "faithfulness": m["faithfulness"],
                         "complement_faithfulness": m["complement_faithfulness"],
                         "warnings": [str(w.message) for w in caught]})  # fmt: skip
            print(f"{stem}: {c.n_edges} edges, faithfulness {m['faithfulness']:.3f}, "
                  f"complement {m['complement_faithfulness']:.3f}", flush=True)
    data = {n: state_tracking_prune_data(ckpt.task_config, n, seed=0, n_ctx=ckpt.model.cfg.n_ctx)
            for n in args.lengths}  # fmt: skip
    universe = countable_universe(ckpt, data[max(args.lengths)], args.target)
    everything = [c for n in args.lengths for c in circuits[n]]
    report = overlap_report(everything, universe, n_boot=args.boot, n_null=args.null, seed=0)
    cross = []
    for na in args.lengths:
        for nb in args.lengths:
            fn = resolve_target(args.target, data[nb])
            scores = [evaluate_circuit(ckpt.model, data[nb], c, target=fn) for c in circuits[na]]
            cross.append({"found_at": na, "evaluated_at": nb,
                          "faithfulness": [r["faithfulness"] for r in scores],
                          "complement_faithfulness": [r["complement_faithfulness"] for r in scores]})  # fmt: skip
    summary = {
        "checkpoint": str(args.ckpt), "checkpoint_sha256": ckpt.sha256, "arch": ckpt.model.cfg.arch,
        "task_cfg": ckpt.task_config.to_dict(), "target": args.target, "sparsity": args.sparsity,
        "steps": circuits[args.lengths[0]][0].metadata["steps"], "lengths": args.lengths, "seeds": args.seeds,
        "model_accuracy": {n: model_accuracy(ckpt, n) for n in args.lengths},
        "circuits": rows, "n_universe": len(universe), "overlap": report, "cross_length": cross,
    }  # fmt: skip
    atomic_write_text(args.out / "summary.json", json.dumps(summary, indent=1, allow_nan=True))
    # one offline page (plotly inlined, ~5 MB): the first seed's circuit at every length, overlaid
    first = [on_one_layout(circuits[n][0], circuits[args.lengths[0]][0]) for n in args.lengths]
    names = [f"n = {n} (seed {args.seeds[0]})" for n in args.lengths]
    page = page_html(f"{args.target}: circuits at n = {', '.join(map(str, args.lengths))}",
                     [("Overlap", overlap_figure(first, names)),
                      *((name, circuit_figure(c)) for name, c in zip(names, first, strict=True))])  # fmt: skip
    atomic_write_text(args.out / f"{args.target}_seed{args.seeds[0]}_lengths.html", page)
    print(f"universe: {len(universe)} countable edges")
    for line in overlap_lines(report):  # the names and interval rule of mechlab overlap
        print(line)
    for r in cross:
        f = r["faithfulness"]
        print(f"found at n={r['found_at']}, scored at n={r['evaluated_at']}: faithfulness "
              f"{sum(f) / len(f):.3f} (min {min(f):.3f})")


if __name__ == "__main__":
    main()
