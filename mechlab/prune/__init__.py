"""Edge pruning (Bhaskar et al., NeurIPS 2024): find the circuit a model uses for a target.

Modules: :mod:`~mechlab.prune.graph` (writers, readers, edges per architecture),
:mod:`~mechlab.prune.masks` (hard-concrete masks), :mod:`~mechlab.prune.engine`
(masked forward pass, optimisation, benchmarks), :mod:`~mechlab.prune.circuit`
(circuits, metrics, overlap, plots), :mod:`~mechlab.prune.data` (pruning traces and
targets for the interleaved-systems task).

Typical use::

    from mechlab.prune import prune_checkpoint, overlap
    a = prune_checkpoint("last.pt", "1-after", sparsity=0.95)
    b = prune_checkpoint("last.pt", "2-after", sparsity=0.95)
    print(a.metadata["metrics"]["faithfulness"], overlap(a, b).jaccard)
    a.to_json("circuits/1-after.json"); a.write_html("circuits/1-after.html")
"""

from mechlab.prune.circuit import (
    Circuit,
    Overlap,
    Stability,
    evaluate_circuit,
    evaluate_masks,
    overlap,
    prune_seeds,
    seed_stability,
)
from mechlab.prune.data import CORRUPTIONS, PruneData, Traces, nih_prune_data, target_mask
from mechlab.prune.engine import (
    ABLATIONS,
    bench_prune,
    make_ablation,
    masked_forward,
    prune,
    prune_checkpoint,
    writer_outputs,
)
from mechlab.prune.graph import (
    EdgeGraph,
    build_graph,
    recurrent_edge_count,
    transformer_edge_count,
)

__all__ = [
    "ABLATIONS",
    "CORRUPTIONS",
    "Circuit",
    "EdgeGraph",
    "Overlap",
    "PruneData",
    "Stability",
    "Traces",
    "bench_prune",
    "build_graph",
    "evaluate_circuit",
    "evaluate_masks",
    "make_ablation",
    "masked_forward",
    "nih_prune_data",
    "overlap",
    "prune",
    "prune_checkpoint",
    "prune_seeds",
    "recurrent_edge_count",
    "seed_stability",
    "target_mask",
    "transformer_edge_count",
    "writer_outputs",
]
