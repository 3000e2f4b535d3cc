"""Complete paths and the choice of whole paths from a ranking (mechlab.prune.paths)."""

import pytest
import torch

from mechlab.prune.graph import build_graph
from mechlab.prune.paths import live_edges, select_on_paths
from tests.prune.test_engine import small_model


def test_live_edges_by_hand():
    graph = build_graph(small_model("lstm", n_layers=3))
    edges = torch.zeros(10, dtype=torch.bool)
    edges[[0, 4, 9, 2, 6]] = True  # embed->l0->l2->out, l0->l1.in (l1 leads nowhere), embed->out
    assert live_edges(graph, edges).nonzero().flatten().tolist() == [0, 4, 6, 9]
    edges = torch.zeros(10, dtype=torch.bool)
    edges[[5, 9]] = True  # l1 -> l2 -> out, but nothing reaches l1 from the input
    assert not live_edges(graph, edges, "interchange").any()
    # under mean and zero ablation a component whose inputs are all ablated still acts
    assert live_edges(graph, edges, "mean").nonzero().flatten().tolist() == [5, 9]
    assert live_edges(graph, edges, "zero").nonzero().flatten().tolist() == [5, 9]


def test_select_on_paths_takes_a_whole_path_of_two_tied_ones():
    graph = build_graph(small_model("lstm", n_layers=2))
    # l0.in: 0 embed; l1.in: 1 embed, 2 l0; out: 3 embed, 4 l0, 5 l1
    # paths of two edges: embed->l0->out (0, 4) and embed->l1->out (1, 5); scores interleave
    scores = torch.tensor([0.50, 0.48, -9.0, -9.0, 0.46, 0.49])
    eligible = scores > 0
    top2 = set(torch.topk(scores, 2).indices.tolist())
    assert top2 == {0, 5}  # one edge of each path: nothing would be carried
    kept, tau = select_on_paths(graph, scores, eligible, 2)
    assert kept.nonzero().flatten().tolist() == [1, 5] and tau == pytest.approx(0.48)
    kept, _ = select_on_paths(graph, scores, eligible, 4)
    assert kept.nonzero().flatten().tolist() == [0, 1, 4, 5]
    kept, _ = select_on_paths(graph, scores, eligible, 3)  # the second path does not fit
    assert kept.nonzero().flatten().tolist() == [1, 5]


def test_a_shared_key_reader_carries_to_every_head_of_its_group():
    from mechlab.prune.graph import transformer_graph

    g = transformer_graph(1, 4, n_key_value_heads=2, positions=False)
    edges = torch.zeros(g.n_edges, dtype=torch.bool)
    edges[[g.edge_index[("embed", "a0.g0.k")], g.edge_index[("a0.h1", "out")]]] = True
    assert live_edges(g, edges).sum() == 2  # the k input of group 0 feeds h1, which reaches the out
    edges[g.edge_index[("embed", "a0.g1.v")]] = True  # group 1 feeds h2, h3: no way to the out
    live = live_edges(g, edges)
    assert live.sum() == 2 and not live[g.edge_index[("embed", "a0.g1.v")]]
