"""From optimised masks to a circuit: keep the open edges on complete paths, within the budget.

:func:`binarize` turns a search's masks into binary edge and node masks
(:class:`BinaryMasks`: at most ``round((1 - sparsity) n)`` of the highest-mask open
edges among the ``n`` countable ones, whole input-to-read-out paths only, and why fewer
were kept); :func:`check_sparsity` refuses a budget that keeps no edge before any work;
:func:`faithfulness_warning` says when a circuit's held-out numbers mean the search failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mechlab.prune import masks as hc
from mechlab.prune.graph import EdgeGraph, countable_edges
from mechlab.prune.paths import live_edges, select_on_paths
from mechlab.prune.search import MaskResult

WARN_FAITHFULNESS = 0.1  # warn below this faithfulness ...
WARN_COMPLEMENT = 0.9  # ... or above this complement faithfulness


@dataclass
class BinaryMasks:
    """The circuit as masks: kept edges and nodes, and how they were chosen.

    Attributes:
        edges: ``[n_edges]`` bool, the kept edges (all open and on a complete path).
        nodes: ``[n_writers]`` bool, the kept writers.
        edge_threshold: On ``log_alpha`` (``inf`` when no edge is kept).
        node_threshold: On the nodes' ``log_alpha``, or None without node masks.
        n_countable: Edges the sparsity counts (those not from an inert writer).
        n_open: Countable edges that are open (and whose writer is kept).
        n_wanted: Edges the asked sparsity keeps; more than ``n_open`` when limited.
        n_open_on_paths: Open edges on a complete path through open edges
            (:func:`live_edges`); the others could not change the output.
    """

    edges: Tensor
    nodes: Tensor
    edge_threshold: float
    node_threshold: float | None
    n_countable: int
    n_open: int
    n_wanted: int
    n_open_on_paths: int = -1

    @property
    def limited_by_open_edges(self) -> bool:
        """Whether fewer edges than asked are kept because too few are open."""
        return self.n_open < self.n_wanted

    @property
    def limited_by_paths(self) -> bool:
        """Whether fewer edges than asked (and open) are kept because the next ones by
        ``log_alpha`` would not all lie on complete paths within the quota."""
        return int(self.edges.sum()) < min(self.n_wanted, self.n_open)


def binarize(
    graph: EdgeGraph,
    result: MaskResult,
    sparsity: float,
    node_sparsity: float | None,
    countable: Tensor | None = None,
    ablation: str = "interchange",
) -> BinaryMasks:
    """Choose the circuit: whole paths of open edges of highest mask, within the quota.

    Nodes first (when node masks were trained): keep the ``round((1 - node_sparsity) n)``
    writers of highest ``log_alpha`` among the open ones. Then edges: among the
    countable, open edges (deterministic mask > 0) whose writer is kept, at most
    ``round((1 - sparsity) n_countable)``, ranked by ``log_alpha`` (which orders them
    as the deterministic mask does, without the ties of its clamp) and kept only where
    they complete a path from the input to the read-out (:func:`select_on_paths`);
    fewer when fewer are open (:attr:`BinaryMasks.limited_by_open_edges`) or when the
    next path does not fit (:attr:`BinaryMasks.limited_by_paths`).

    Args:
        graph: The edge graph.
        result: The optimised masks.
        sparsity: Edge sparsity over the countable edges.
        node_sparsity: Writer sparsity, or None.
        countable: ``[n_edges]`` bool, the edges the sparsity counts (default: all).
        ablation: The ablation the masks were trained under (where paths may start).

    Returns:
        The :class:`BinaryMasks`.
    """
    nodes = torch.ones(graph.n_writers, dtype=torch.bool)
    node_threshold = None
    if result.node_log_alpha is not None and node_sparsity is not None:
        node_la = result.node_log_alpha.cpu()
        open_nodes = hc.deterministic_mask(node_la) > 0
        n_nodes = min(hc.keep_count(graph.n_writers, node_sparsity), int(open_nodes.sum()))
        node_threshold = hc.bisect_threshold(node_la, n_nodes, open_nodes)
        nodes = (node_la.double() >= node_threshold) & open_nodes
    countable = torch.ones(graph.n_edges, dtype=torch.bool) if countable is None else countable
    edge_writer = torch.tensor([graph.writer_index[w] for w, _ in graph.edges])
    edge_la = result.edge_log_alpha.cpu()
    eligible = nodes[edge_writer] & countable.cpu() & (hc.deterministic_mask(edge_la) > 0)
    n_countable, n_open = int(countable.sum()), int(eligible.sum())
    n_wanted = hc.keep_count(n_countable, sparsity)
    edges, edge_threshold = select_on_paths(
        graph, edge_la, eligible, min(n_wanted, n_open), ablation
    )
    n_on_paths = int(live_edges(graph, eligible, ablation).sum())
    return BinaryMasks(
        edges, nodes, edge_threshold, node_threshold, n_countable, n_open, n_wanted, n_on_paths
    )


def check_sparsity(
    graph: EdgeGraph, ablation: str, sparsity: float, positions: list[int] | None = None
) -> int:
    """Raise ValueError unless ``sparsity`` keeps at least one countable edge; returns how many.

    Args:
        graph: The edge graph.
        ablation: The ablation (it decides which edges count, see
            :func:`mechlab.prune.graph.countable_edges`).
        sparsity: Edge sparsity in (0, 1).
        positions: The scored positions (in a windowed graph they decide which edges
            can matter), or None.

    Returns:
        The number of edges the sparsity keeps.
    """
    n = int(countable_edges(graph, ablation, positions).sum())
    n_keep = hc.keep_count(n, sparsity)
    if n_keep < 1:
        possible = ", ".join(f"{1 - k / n:.4g}" for k in range(1, min(n, 3) + 1))
        raise ValueError(
            f"sparsity {sparsity} keeps no edge of this {graph.arch} graph's {n} countable edges "
            f"(of {graph.n_edges}); use at most {1 - 0.5 / n:.4g} (1 - k/{n} keeps k: {possible}, ...)"
        )
    return n_keep


def faithfulness_warning(metrics: dict[str, Any]) -> str | None:
    """A one-line warning when a circuit explains nothing or its complement explains all.

    Args:
        metrics: The metrics of :func:`mechlab.prune.evaluate.evaluate_masks`.

    Returns:
        The warning, or None when faithfulness >= 0.1 and complement faithfulness <= 0.9.
    """
    faith = metrics.get("faithfulness", float("nan"))
    complement = metrics.get("complement_faithfulness", float("nan"))
    problems = []
    if faith < WARN_FAITHFULNESS:
        problems.append(f"faithfulness {faith:.3f} < {WARN_FAITHFULNESS}")
    if complement > WARN_COMPLEMENT:
        problems.append(f"complement faithfulness {complement:.3f} > {WARN_COMPLEMENT}")
    if not problems:
        return None
    return (
        f"circuit for {metrics.get('target')!r}: {' and '.join(problems)}; the search likely "
        "failed (try more steps, a lower sparsity or another seed)"
    )


__all__ = ["WARN_COMPLEMENT", "WARN_FAITHFULNESS", "BinaryMasks", "binarize", "check_sparsity", "faithfulness_warning"]
