"""Edge pruning (Bhaskar et al., NeurIPS 2024): find the circuit a model uses for a target.

Modules: :mod:`~mechlab.prune.graph` (writers, readers, edges per architecture),
:mod:`~mechlab.prune.masks` (hard-concrete masks), :mod:`~mechlab.prune.forward` (writer
outputs, ablations, the masked forward pass), :mod:`~mechlab.prune.engine` (the
optimisation and the choice of edges), :mod:`~mechlab.prune.evaluate` (faithfulness and
errors of a circuit), :mod:`~mechlab.prune.circuit` (circuits, overlap, plots),
:mod:`~mechlab.prune.data` (traces and targets). The engine knows no checkpoint:
:func:`mechlab.pipelines.prune_checkpoint` loads one and builds its task's traces; the
benchmark is :func:`mechlab.bench.prune.bench_prune`.

Typical use::

    from mechlab.pipelines import prune_checkpoint
    from mechlab.prune import overlap
    a = prune_checkpoint("last.pt", "1-after", sparsity=0.95)
    b = prune_checkpoint("last.pt", "2-after", sparsity=0.95)
    print(a.metadata["metrics"]["faithfulness"], overlap(a, b).jaccard)
    a.to_json("circuits/1-after.json"); a.write_html("circuits/1-after.html")
"""

from mechlab.prune.circuit import (
    Circuit,
    Overlap,
    Stability,
    overlap,
    seed_stability,
)
from mechlab.prune.curves import FaithfulnessCurve, faithfulness_curve
from mechlab.prune.data import CORRUPTIONS, PruneData, Traces, nih_prune_data, target_mask
from mechlab.prune.engine import prune, prune_seeds
from mechlab.prune.evaluate import evaluate_circuit, evaluate_masks
from mechlab.prune.forward import ABLATIONS, make_ablation, masked_forward, writer_outputs
from mechlab.prune.graph import (
    EdgeGraph,
    build_graph,
    countable_edges,
    inert_writers,
    recurrent_edge_count,
    transformer_edge_count,
)
from mechlab.prune.joint import JointResult, ShareSweep, joint_prune, share_sweep
from mechlab.prune.stats import bootstrap_overlap, cross_evaluate, null_model

__all__ = [
    "ABLATIONS",
    "CORRUPTIONS",
    "Circuit",
    "EdgeGraph",
    "FaithfulnessCurve",
    "JointResult",
    "Overlap",
    "PruneData",
    "ShareSweep",
    "Stability",
    "Traces",
    "bootstrap_overlap",
    "build_graph",
    "countable_edges",
    "cross_evaluate",
    "evaluate_circuit",
    "evaluate_masks",
    "faithfulness_curve",
    "inert_writers",
    "joint_prune",
    "make_ablation",
    "masked_forward",
    "nih_prune_data",
    "null_model",
    "overlap",
    "prune",
    "prune_seeds",
    "recurrent_edge_count",
    "seed_stability",
    "share_sweep",
    "target_mask",
    "transformer_edge_count",
    "writer_outputs",
]
