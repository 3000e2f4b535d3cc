"""Edge pruning (Bhaskar et al., NeurIPS 2024): find the circuit a model uses for a target.

Modules: :mod:`~mechlab.prune.graph` (writers, readers, edges per architecture),
:mod:`~mechlab.prune.masks` (hard-concrete masks), :mod:`~mechlab.prune.forward` (writer
outputs, ablations, the masked forward pass), :mod:`~mechlab.prune.engine` (the
optimisation and the choice of edges), :mod:`~mechlab.prune.evaluate` (faithfulness and
errors of a circuit), :mod:`~mechlab.prune.circuit` (circuits and overlap: plain data;
their figures are in :mod:`mechlab.viz`). The traces and targets it reads are
:mod:`mechlab.traces`. The methods the field compares edge pruning with score the same
graph through the same masked forward: :mod:`~mechlab.prune.attribution` (EAP, EAP-IG over
the edge masks or the inputs), :mod:`~mechlab.prune.exact` (exact single-edge ablation),
:mod:`~mechlab.prune.acdc` (greedy ACDC); :mod:`~mechlab.prune.methods` makes one circuit
per method (:func:`find_circuit`). The engine knows no task and no checkpoint:
:func:`mechlab.pipelines.prune_checkpoint` loads one and builds its task's traces
(:mod:`mechlab.tasks.lds_prune`, :mod:`mechlab.tasks.state_tracking_prune`); the
benchmark is :func:`mechlab.bench.prune.bench_prune`.

Typical use::

    import mechlab.viz
    from mechlab.pipelines import prune_checkpoint
    from mechlab.prune import overlap
    a = prune_checkpoint("last.pt", "1-after", sparsity=0.95)
    b = prune_checkpoint("last.pt", "2-after", sparsity=0.95)
    print(a.metadata["metrics"]["faithfulness"], overlap(a, b).jaccard)
    a.to_json("circuits/1-after.json")
    mechlab.viz.write_html(mechlab.viz.circuit_figure(a), "circuits/1-after.html")
"""

from mechlab._deprecated import moved_names
from mechlab.prune.acdc import ACDC_MAX_EDGES, AcdcResult, acdc_search
from mechlab.prune.attribution import (
    ATTRIBUTION_METHODS,
    METRICS,
    EdgeScores,
    attribute,
)
from mechlab.prune.circuit import (
    Circuit,
    Overlap,
    Stability,
    jaccard,
    overlap,
    seed_stability,
)
from mechlab.prune.config import RECIPES, PruneConfig
from mechlab.prune.consensus import (
    attach_consensus,
    attach_seed_consensus,
    consensus_prune,
    consensus_scores,
)
from mechlab.prune.curves import FaithfulnessCurve, faithfulness_curve
from mechlab.prune.engine import prune, prune_seeds
from mechlab.prune.evaluate import evaluate_circuit, evaluate_masks, target_outputs
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
from mechlab.prune.methods import METHODS, circuit_from_scores, circuit_scores_of, find_circuit
from mechlab.prune.stability import (
    STABILITY_BAR,
    BootstrapStability,
    bootstrap_stability,
    method_stability,
)
from mechlab.prune.stats import bootstrap_overlap, cross_evaluate, null_model
from mechlab.traces import PruneData, Traces, target_mask

__all__ = [
    "RECIPES",
    "PruneConfig",
    "attach_consensus",
    "attach_seed_consensus",
    "consensus_prune",
    "consensus_scores",
    "ABLATIONS",
    "ACDC_MAX_EDGES",
    "ATTRIBUTION_METHODS",
    "METHODS",
    "METRICS",
    "STABILITY_BAR",
    "AcdcResult",
    "BootstrapStability",
    "Circuit",
    "EdgeGraph",
    "EdgeScores",
    "FaithfulnessCurve",
    "JointResult",
    "Overlap",
    "PruneData",
    "ShareSweep",
    "Stability",
    "Traces",
    "acdc_search",
    "attribute",
    "bootstrap_overlap",
    "bootstrap_stability",
    "build_graph",
    "circuit_from_scores",
    "circuit_scores_of",
    "countable_edges",
    "cross_evaluate",
    "evaluate_circuit",
    "evaluate_masks",
    "faithfulness_curve",
    "find_circuit",
    "inert_writers",
    "jaccard",
    "joint_prune",
    "make_ablation",
    "masked_forward",
    "method_stability",
    "null_model",
    "overlap",
    "prune",
    "prune_seeds",
    "recurrent_edge_count",
    "seed_stability",
    "share_sweep",
    "target_mask",
    "target_outputs",
    "transformer_edge_count",
    "writer_outputs",
]

__getattr__ = moved_names(__name__)  # nih_prune_data, CORRUPTIONS: mechlab.tasks.lds_prune
