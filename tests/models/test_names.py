"""One name per component: graph names and hook names map both ways, on every family, and
every hook name a graph node maps to is a hook the model has."""

from __future__ import annotations

import re

import pytest

from mechlab.models import build_model
from mechlab.models.names import graph_name, hook_graph_names, hook_name
from mechlab.prune.graph import (
    build_graph,
    component_of,
    transformer_graph,
    windowed_recurrent_graph,
)


def nodes(graph) -> set[str]:
    names = {w.name for w in graph.writers} | {r.name for r in graph.readers}
    return names | {component_of(r.name) for r in graph.readers}


def hook_of_model(model, hook: str) -> bool:
    base = re.sub(r"\[\d+\]$", "", hook.split(" @ ")[0])
    return base in model.hook_dict


@pytest.mark.parametrize("arch", ["tiny", "lstm", "dense_ssm", "mamba"])
def test_every_node_of_every_family_maps_to_a_hook_of_the_model_and_back(arch):
    model = build_model(arch if arch == "tiny" else {"arch": arch, "d_model": 16, "n_layers": 2})
    graph = build_graph(model)
    summary = graph.summary()
    for node in nodes(graph):
        hook = hook_name(node, summary)
        assert hook_of_model(model, hook), (node, hook)
        assert graph_name(hook, summary) == node, (node, hook)


def test_the_names_the_issue_names():
    assert hook_name("a0.h4") == "blocks.0.attn.hook_result[4]"
    assert graph_name("blocks.0.attn.hook_result[4]") == "a0.h4"
    assert hook_name("a2.h1.q") == "blocks.2.attn.hook_q[1]"
    assert hook_name("m1") == "blocks.1.hook_mlp_out" and hook_name("m1.in") == "blocks.1.hook_resid_mid"
    assert graph_name("blocks.0.attn.hook_pattern") is None  # not a node of the graph
    assert graph_name("blocks.0.attn.hook_result") is None  # a head needs its index


def test_windowed_grouped_and_parallel_graphs():
    windows = (("haystack", 0, 5), ("label", 5, 6), ("continuation", 6, 9))
    summary = windowed_recurrent_graph("lstm", 2, windows).summary()
    assert hook_name("l1.state@label", summary) == "blocks.1.lstm.hook_c @ label"
    assert graph_name("blocks.1.lstm.hook_c @ label", summary) == "l1.state@label"
    for node in nodes(windowed_recurrent_graph("mamba", 1, windows)):
        assert graph_name(hook_name(node, {"arch": "mamba"}), {"arch": "mamba"}) == node
    grouped = transformer_graph(2, 4, n_key_value_heads=2)
    summary = grouped.summary()
    for node in nodes(grouped) - {"a0.g0", "a0.g1", "a1.g0", "a1.g1"}:  # a group: its k and v readers
        assert graph_name(hook_name(node, summary), summary) == node, node
    assert hook_name("a1.g0", summary) == "blocks.1.attn.hook_k[0]"
    parallel = transformer_graph(2, 2, parallel_attn_mlp=True).summary()
    assert hook_name("m1.in", parallel) == "blocks.1.hook_resid_pre"
    assert graph_name("blocks.1.hook_resid_pre", parallel) == "m1.in"
    with pytest.raises(ValueError, match="not a pruning-graph name"):
        hook_name("blocks.0.hook_mlp_out")


def test_info_lists_graph_names_beside_hooks():
    model = build_model("tiny")
    table = hook_graph_names(build_graph(model).summary(), list(model.hook_dict))
    assert table["blocks.0.attn.hook_result"].startswith("a0.h0 .. a0.h")
    assert table["blocks.1.hook_mlp_out"] == "m1" and table["hook_embed"] == "embed"
    assert "blocks.0.attn.hook_pattern" not in table
