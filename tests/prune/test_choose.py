"""mechlab.prune.choose: from optimised masks to a circuit of open edges on complete paths."""

from __future__ import annotations

import math

import torch

from mechlab.prune.choose import binarize
from mechlab.prune.graph import build_graph
from mechlab.prune.search import MaskResult
from tests.prune.test_engine import small_model


def test_binarize_keeps_only_open_edges_on_complete_paths_and_says_so():
    graph = build_graph(small_model("lstm", n_layers=3))  # 10 edges
    # l0.in: 0 embed; l1.in: 1 embed, 2 l0; l2.in: 3 embed, 4 l0, 5 l1; out: 6 embed, 7 l0, 8 l1, 9 l2
    # deterministic mask > 0 iff log_alpha > log(1/11) = -2.398: edges 0, 3, 7 are open
    la = torch.full((10,), -5.0)
    la[[0, 3, 7]] = torch.tensor([0.5, 3.0, -2.0])
    result = MaskResult(la, None, [])
    b = binarize(graph, result, 0.5, None)  # asks for 5 edges
    assert b.n_wanted == 5 and b.n_open == 3 and b.limited_by_open_edges
    # edge 3 (embed -> l2.in) is open but l2 has no open way to the read-out
    assert b.n_open_on_paths == 2 and b.edges.nonzero().flatten().tolist() == [0, 7]
    b = binarize(graph, result, 0.8, None)  # asks for 2: top-k would take 3 and 0, no path
    assert b.edges.nonzero().flatten().tolist() == [0, 7] and not b.limited_by_open_edges
    assert not b.limited_by_paths
    b = binarize(graph, result, 0.9, None)  # asks for 1: no single edge is a path
    assert not b.edges.any() and b.limited_by_paths and b.edge_threshold == math.inf
    countable = torch.ones(10, dtype=torch.bool)
    countable[7] = False  # an inert edge is never kept, and not counted
    b = binarize(graph, result, 0.8, None, countable)
    assert b.n_countable == 9 and not b.edges.any()
