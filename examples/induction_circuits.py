"""The induction circuit of a checkpoint trained on the induction task, found four ways.

1. Attention patterns (:func:`mechlab.evals.induction.head_scores`): every head's
   previous-token and induction score; the top previous-token head of layer 0 (``P``) and
   the top induction head of the last layer (``I``) are the heads the circuit should run
   through.
2. Per-head activation patching (:func:`mechlab.patching.activation_patch`, noising: the
   clean run with one head's output, at every position, taken from the corrupted run):
   the fraction of the clean metric (mean log-probability of the correct next token at the
   predictable positions) that is left, per head.
3. Edge pruning (:func:`mechlab.pipelines.prune_checkpoint`, target ``all`` = the predictable
   positions, interchange ablation, the corrupted traces other draws of the task) over seeds.
4. Every attribution method of :func:`mechlab.prune.find_circuit` (EAP, EAP-IG, EAP-IG
   over the inputs, exact ablation, ACDC), when this mechlab has it, at the same edge
   budget as pruning's seed 0.

Each circuit is checked for the five edges of the textbook circuit through ``P`` and ``I``
(:func:`mechlab.evals.induction.induction_edges`) and for the induction heads it holds the
whole circuit through (:func:`mechlab.evals.induction.induction_chains`); it *recovers* the
circuit when there is at least one and all are induction heads. Writes ``all_seed<k>.json``
(pruning, as ``mechlab prune --ckpt CKPT --target all --seed k --sparsity S`` writes them),
``<method>.json`` (each attribution method), ``summary.json`` (scores, patching, each
circuit's metrics, roles and chains, the exact single-edge effects of the top edges)
and ``induction.html`` (one offline page: attention patterns of ``P`` and ``I``, the
patching bars and pruning's seed-0 circuit; it inlines plotly, ~5 MB, and is not
committed; ``--svg docs/figures`` writes the three figures as SVG too). From the repository
root, ~3 min of CPU (10 min on a loaded 2-core machine)::

    python examples/induction_circuits.py --ckpt examples/checkpoints/induction-cpu/last.pt \\
        --out circuits/induction-cpu --svg docs/figures
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from mechlab.checkpoint import load_checkpoint
from mechlab.evals.induction import head_scores, induction_chains, recovered_roles
from mechlab.io import atomic_write_text
from mechlab.patching import activation_patch
from mechlab.pipelines import prune_checkpoint
from mechlab.tasks.induction import sample_sequences
from mechlab.tasks.induction_prune import TARGET, induction_prune_data
from mechlab.viz import circuit_figure
from mechlab.viz.figures import page_html

INDUCTION_HEAD = 0.9  # a head whose induction score is above this is an induction head

try:  # the attribution methods (issue 18)
    from mechlab.prune.methods import METHODS, find_circuit
except ImportError:  # an older mechlab: pruning only
    METHODS, find_circuit = ("prune",), None


def log_prob_metric(targets: torch.Tensor, mask: torch.Tensor):
    """Mean log-probability of ``targets`` at the ``mask`` positions of a ``[batch, pos, vocab]`` output."""

    def metric(logits: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(logits.float(), dim=-1)
        picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return picked[mask].mean()

    return metric


def per_head_patching(model, cfg, n: int = 256, seed: int = 1) -> dict:
    """Noising patch of each head's output (all positions at once): the normalised metric
    per head, ``[layer][head]`` (1: nothing lost; 0: as bad as the corrupted run)."""
    gen = torch.Generator().manual_seed(seed)
    clean = sample_sequences(cfg, n, gen)
    corrupted = sample_sequences(cfg, n, gen)
    hooks = [f"blocks.{layer}.attn.hook_result" for layer in range(model.cfg.n_layers)]
    result = activation_patch(
        model, clean.tokens, corrupted.tokens, log_prob_metric(clean.targets, clean.scored),
        hooks=hooks, positions="all", heads=True, direction="noise", progress=False,
    )  # fmt: skip
    normalized = result.normalized[:, 0]
    grid = normalized.view(model.cfg.n_layers, model.cfg.n_heads)
    return {"normalized": grid.tolist(), "clean_metric": result.clean_metric,
            "corrupted_metric": result.corrupted_metric}  # fmt: skip


def describe(circuit, scores, previous_head: int, induction_head: int, n_layers: int) -> dict:
    meta = circuit.metadata
    n_heads = scores.induction.shape[1]
    chains = induction_chains(circuit.edges, previous_head, n_heads, n_layers)
    return {
        "n_edges": circuit.n_edges,
        "faithfulness": meta["metrics"]["faithfulness"],
        "complement_faithfulness": meta["metrics"]["complement_faithfulness"],
        "roles_top_heads": recovered_roles(circuit.edges, previous_head, induction_head, n_layers),
        "chains": chains,
        "recovered": bool(chains) and set(chains) <= set(induction_heads(scores, n_layers)),
        "edges": sorted(f"{w} -> {r}" for w, r in circuit.edges),
    }


def induction_heads(scores, n_layers: int) -> list[int]:
    """The last layer's heads whose induction score is above :data:`INDUCTION_HEAD`."""
    row = scores.induction[n_layers - 1]
    return [h for h in range(row.shape[0]) if float(row[h]) > INDUCTION_HEAD]


def pattern_figure(model, cfg, previous_head: int, induction_head: int) -> go.Figure:
    """The attention patterns of the two heads on one sequence."""
    seq = sample_sequences(cfg, 1, torch.Generator().manual_seed(5))
    last = model.cfg.n_layers - 1
    names = ["blocks.0.attn.hook_pattern", f"blocks.{last}.attn.hook_pattern"]
    with torch.no_grad():
        _, cache = model.run_with_cache(seq.tokens, names_filter=names)
    n = int(seq.first_len[0])
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        f"a0.h{previous_head}: previous-token head", f"a{last}.h{induction_head}: induction head "
        f"(repeat starts at {n + 1})"))  # fmt: skip
    for col, (name, head) in enumerate(zip(names, (previous_head, induction_head), strict=True), 1):
        fig.add_trace(go.Heatmap(z=cache[name][0, head].numpy(), colorscale="Blues", zmin=0, zmax=1,
                                 showscale=col == 2, colorbar={"title": "attention"}), row=1, col=col)  # fmt: skip
        fig.update_xaxes(title_text="key position", row=1, col=col)
        fig.update_yaxes(title_text="query position", autorange="reversed", row=1, col=col)
    fig.update_layout(width=1100, height=520)
    return fig


def patching_figure(patching: dict) -> go.Figure:
    fig = go.Figure()
    for layer, row in enumerate(patching["normalized"]):
        fig.add_trace(go.Bar(x=[f"a{layer}.h{h}" for h in range(len(row))], y=row, name=f"layer {layer}"))
    fig.update_layout(title="Per-head noising: fraction of the clean log-probability left",
                      yaxis_title="normalised metric (1: nothing lost)", width=1000, height=450)  # fmt: skip
    return fig


def write_svgs(folder: Path, model, cfg, prev_head: int, ind_head: int, patching: dict, circuit) -> None:
    """The page's three figures as static SVG files (for docs/induction.md)."""
    folder.mkdir(parents=True, exist_ok=True)
    pattern_figure(model, cfg, prev_head, ind_head).write_image(folder / "induction-patterns.svg")
    patching_figure(patching).write_image(folder / "induction-patching.svg")
    fig = circuit_figure(circuit)
    fig.update_layout(width=1000, height=600)
    fig.write_image(folder / "induction-circuit.svg")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--steps", type=int, default=None, help="Optimiser steps (default: prune's, 200).")
    parser.add_argument("--n-train", type=int, default=256)
    parser.add_argument("--n-test", type=int, default=512)
    parser.add_argument("--force", action="store_true", help="Overwrite what --out holds.")
    parser.add_argument("--svg", type=Path, default=None,
                        help="Also write the three figures as SVG into this folder (kaleido).")
    args = parser.parse_args(argv)
    if (args.out / "summary.json").exists() and not args.force:
        parser.error(f"{args.out} already holds circuits; pass --force to overwrite them")
    torch.set_num_threads(1)
    ckpt = load_checkpoint(args.ckpt)
    if ckpt.metadata.get("task") != "induction":
        parser.error(f"{args.ckpt} was not trained on the induction task")
    model, cfg = ckpt.model.eval(), ckpt.task_config
    L = model.cfg.n_layers

    scores = head_scores(model, cfg, n_sequences=512)
    prev_head, prev_score = scores.top("previous_token", 0)
    ind_head, ind_score = scores.top("induction", L - 1)
    print(f"previous-token head a0.h{prev_head} ({prev_score:.3f}), induction head "
          f"a{L - 1}.h{ind_head} ({ind_score:.3f})")
    patching = per_head_patching(model, cfg)

    args.out.mkdir(parents=True, exist_ok=True)
    sizes = {"n_train": args.n_train, "n_test": args.n_test}
    circuits, summary = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # each circuit keeps its warnings in its metadata
        for seed in args.seeds:  # as `mechlab prune --ckpt ... --target all --seed k` finds them
            circuits[f"all_seed{seed}"] = prune_checkpoint(
                ckpt, TARGET, args.sparsity, seed=seed, progress=False, **sizes,
                **({} if args.steps is None else {"steps": args.steps}),
            )
    budget = circuits[f"all_seed{args.seeds[0]}"].n_edges
    data = induction_prune_data(cfg, seed=args.seeds[0], **sizes)  # the first seed's traces
    for method in METHODS:
        if method == "prune" or find_circuit is None:
            continue
        circuits[method] = find_circuit(model, data, TARGET, method, n_edges=budget,
                                        checkpoint_sha256=ckpt.sha256)  # fmt: skip
        circuits[method].metadata.update(checkpoint=str(args.ckpt), data_seed=args.seeds[0])
    for name, circuit in circuits.items():
        circuit.to_json(args.out / f"{name}.json")
        entry = summary[name] = describe(circuit, scores, prev_head, ind_head, L)
        flags = " ".join(f"{k}={'y' if v else 'n'}" for k, v in entry["roles_top_heads"].items())
        print(f"{name:14s} {circuit.n_edges:3d} edges  faithfulness {entry['faithfulness']:.3f}  "
              f"chains through {entry['chains']}  top pair: {flags}")
    record = {
        "checkpoint": str(args.ckpt), "task_cfg": cfg.to_dict(), "sparsity": args.sparsity,
        "steps": circuits[f"all_seed{args.seeds[0]}"].metadata["steps"], "n_train": args.n_train, "n_test": args.n_test,
        "heads": {"previous_token": prev_head, "induction": ind_head},
        "induction_heads": induction_heads(scores, L), "induction_head_threshold": INDUCTION_HEAD,
        "scores": scores.to_dict(), "patching": patching, "circuits": summary,
    }  # fmt: skip
    if "exact" in circuits:  # every edge ablated alone: the effects of the 12 largest
        effects = circuits["exact"].metadata["attribution"]["scores"]
        record["exact_effects"] = [
            [f"{w} -> {r}", v] for w, r, v in sorted(effects, key=lambda e: -abs(e[2]))[:12]
        ]
    atomic_write_text(args.out / "summary.json", json.dumps(record, indent=1) + "\n")
    page = page_html("Induction circuit", [
        ("Attention patterns", pattern_figure(model, cfg, prev_head, ind_head)),
        ("Per-head patching", patching_figure(patching)),
        ("Edge pruning, seed 0", circuit_figure(circuits[f"all_seed{args.seeds[0]}"])),
    ])  # fmt: skip
    atomic_write_text(args.out / "induction.html", page)
    if args.svg is not None:
        write_svgs(args.svg, model, cfg, prev_head, ind_head, patching, circuits[f"all_seed{args.seeds[0]}"])
    print(f"wrote {len(circuits)} circuits, summary.json and induction.html to {args.out}")


if __name__ == "__main__":
    main()
