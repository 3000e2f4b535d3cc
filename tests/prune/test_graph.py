"""Tests of mechlab.prune.graph: writers, readers, edges and the closed-form edge counts."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

from mechlab.models.dense_ssm import DenseSSMConfig
from mechlab.models.lstm import LSTMConfig
from mechlab.models.mamba import MambaConfig
from mechlab.models.transformer import TransformerConfig
from mechlab.prune.graph import (
    build_graph,
    component_of,
    countable_edges,
    graph_from_summary,
    parse_component,
    recurrent_edge_count,
    recurrent_graph,
    target_windows,
    transformer_edge_count,
    transformer_graph,
    unreachable_edges,
    window_of,
    windowed_recurrent_graph,
)


def reads(writer: str, reader: str) -> bool:
    """The edge rule written out independently of the graph builder."""
    wkind, wlayer, _ = parse_component(writer)
    rcomp = component_of(reader)
    rkind, rlayer, _ = parse_component(rcomp)
    if rkind == "out":
        return True
    if wkind in ("embed", "pos"):
        return True
    if rkind == "head":  # heads read strictly earlier layers
        return wlayer < rlayer
    if rkind == "mlp":  # MLP l reads earlier layers and the heads of its own layer
        return wlayer < rlayer or (wlayer == rlayer and wkind == "head")
    if rkind == "mixer":
        return wlayer < rlayer
    raise AssertionError(reader)


def test_gpt2_small_numbers_from_the_paper():
    g = transformer_graph(12, 12)
    assert g.n_writers == 158  # 144 heads + 12 MLPs + token and position embeddings
    assert g.n_edges == 32936
    assert transformer_edge_count(12, 12) == 32936


@pytest.mark.parametrize("n_layers,n_heads", [(1, 1), (1, 4), (2, 2), (3, 6), (5, 3), (12, 8)])
def test_transformer_edge_count_formula(n_layers, n_heads):
    g = transformer_graph(n_layers, n_heads)
    assert g.n_edges == transformer_edge_count(n_layers, n_heads)
    assert g.n_writers == 2 + n_layers * (n_heads + 1)
    assert g.n_readers == n_layers * (3 * n_heads + 1) + 1
    # the formula is not symmetric in L and H: a mix-up of n_layers and n_heads is caught
    if n_layers != n_heads:
        assert transformer_edge_count(n_heads, n_layers) != g.n_edges or n_layers * n_heads == 1


@pytest.mark.parametrize("n_layers,n_heads", [(1, 2), (2, 2), (3, 4)])
def test_transformer_edges_follow_the_rule(n_layers, n_heads):
    g = transformer_graph(n_layers, n_heads)
    expected = {(w.name, r.name) for w in g.writers for r in g.readers if reads(w.name, r.name)}
    assert set(g.edges) == expected
    assert len(g.edges) == len(expected)  # no duplicates
    # every reader's writers are a prefix of the writer order, as the masked pass assumes
    for r in g.readers:
        start = g.edge_offset[r.name]
        assert [w for w, _ in g.edges[start : start + r.n_upstream]] == [
            w.name for w in g.writers[: r.n_upstream]
        ]


@pytest.mark.parametrize("arch", ["lstm", "dense_ssm", "mamba"])
@pytest.mark.parametrize("n_layers", [1, 2, 3, 6])
def test_recurrent_edge_count_formula(arch, n_layers):
    g = recurrent_graph(arch, n_layers)
    assert g.n_edges == recurrent_edge_count(n_layers) == (n_layers + 1) * (n_layers + 2) // 2
    assert g.n_writers == n_layers + 1  # embed + every layer
    expected = {(w.name, r.name) for w in g.writers for r in g.readers if reads(w.name, r.name)}
    assert set(g.edges) == expected


def test_build_graph_from_models_and_configs():
    t = TransformerConfig(d_model=8, n_layers=3, n_heads=2, d_in=3, d_out=2, n_ctx=8)
    assert build_graph(t).n_edges == transformer_edge_count(3, 2)
    for cfg in (
        LSTMConfig(d_model=8, n_layers=2, d_in=3, d_out=2, n_ctx=8),
        DenseSSMConfig(d_model=8, n_layers=2, d_state=3, d_in=3, d_out=2, n_ctx=8),
        MambaConfig(d_model=8, n_layers=2, d_state=3, d_in=3, d_out=2, n_ctx=8),
    ):
        g = build_graph(cfg)
        assert g.arch == cfg.arch and g.n_edges == 6
    with pytest.raises(TypeError):
        build_graph("transformer")


# ---------------------------------------------------------------------------------------
# Windowed recurrent graphs
# ---------------------------------------------------------------------------------------

NIH = (("haystack", 0, 20), ("label", 20, 21), ("continuation", 21, 28))


def windowed_reads(writer: str, reader: str, order: list[str]) -> bool:
    """The windowed edge rule written out independently of the graph builder."""
    w_base, w_window = writer.split("@")
    r_base, r_window = reader.split("@")
    if r_base.endswith(".state"):  # l{l}@previous window -> l{l}.state@window
        previous = order.index(r_window) - 1
        return previous >= 0 and w_window == order[previous] and w_base == r_base[: -len(".state")]
    return w_window == r_window and reads(w_base, r_base)


def windows_of(n: int) -> tuple[tuple[str, int, int], ...]:
    return tuple((f"w{k}", 2 * k, 2 * k + 2) for k in range(n))


@pytest.mark.parametrize("arch", ["lstm", "dense_ssm", "mamba"])
@pytest.mark.parametrize("n_layers", [1, 2, 3])
@pytest.mark.parametrize("n_windows", [1, 2, 3, 5])
def test_windowed_edge_count_formula_and_rule(arch, n_layers, n_windows):
    windows = windows_of(n_windows)
    g = windowed_recurrent_graph(arch, n_layers, windows)
    K, L = n_windows, n_layers
    assert g.n_edges == recurrent_edge_count(L, K) == K * (L + 1) * (L + 2) // 2 + (K - 1) * L
    assert g.n_writers == K * (L + 1)
    assert g.n_readers == K * (L + 1) + (K - 1) * L
    order = [name for name, _, _ in windows]
    expected = {(w.name, r.name) for w in g.writers for r in g.readers
                if windowed_reads(w.name, r.name, order)}  # fmt: skip
    assert set(g.edges) == expected and len(g.edges) == len(expected)
    # every reader reads a contiguous range of the writer order, as the masked pass assumes
    for r in g.readers:
        start = g.edge_offset[r.name]
        assert [w for w, _ in g.edges[start : start + r.n_upstream]] == [
            w.name for w in g.writers[r.first_upstream : r.first_upstream + r.n_upstream]
        ]
    assert g.windows == windows and g.summary()["windows"] == [list(w) for w in windows]


def test_one_layer_nih_graph_has_eleven_edges_and_the_state_chain():
    g = build_graph(LSTMConfig(d_model=8, n_layers=1, d_in=3, d_out=2, n_ctx=32), NIH)
    assert g.n_edges == 11
    assert ("l0@haystack", "l0.state@label") in g.edge_index
    assert ("l0@label", "l0.state@continuation") in g.edge_index
    assert ("l0@haystack", "l0.state@continuation") not in g.edge_index  # only through the label
    assert ("embed@haystack", "out@label") not in g.edge_index  # a position holds its own writers
    nxg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(nxg)
    assert nxg.has_edge("l0.state@label", "l0@label") and nxg.edges["l0.state@label", "l0@label"]["internal"]
    assert nx.has_path(nxg, "embed@haystack", "out@continuation")
    assert not nx.has_path(nxg, "embed@label", "out@haystack")
    assert nxg.nodes["l0@label"]["window"] == "label"


def test_plain_graph_is_unchanged_without_windows():
    cfg = DenseSSMConfig(d_model=8, n_layers=2, d_state=3, d_in=3, d_out=2, n_ctx=8)
    g = build_graph(cfg)
    assert g.edges == recurrent_graph("dense_ssm", 2).edges and not g.windows
    assert "windows" not in g.summary()
    with pytest.raises(ValueError, match="recurrent"):
        build_graph(TransformerConfig(d_model=8, n_layers=1, n_heads=2, d_in=3, d_out=2, n_ctx=8), NIH)


def test_windowed_names_parse():
    assert component_of("l0.in@label") == "l0@label"
    assert component_of("l1.state@continuation") == "l1@continuation"
    assert component_of("out@haystack") == "out@haystack"
    assert component_of("a1.h0.q") == "a1.h0"  # unchanged outside windows
    assert parse_component("l2@label") == ("mixer", 2, -1)
    assert parse_component("embed@haystack") == ("embed", -1, -1)
    assert parse_component("out@label") == ("out", -1, -1)
    assert window_of("l0.state@label") == "label" and window_of("l0") is None


@pytest.mark.parametrize(
    "positions, windows, n_unreachable",
    [
        ([20], ["label"], 6),  # 1-after: out@haystack's 2 edges and the continuation's 4
        ([21], ["continuation"], 4),  # 2-after: the read-outs of haystack and label
        ([20, 21], ["label", "continuation"], 2),
        (None, ["haystack", "label", "continuation"], 0),
    ],
)
def test_edges_that_reach_no_target_read_out_do_not_count(positions, windows, n_unreachable):
    g = build_graph(LSTMConfig(d_model=8, n_layers=1, d_in=3, d_out=2, n_ctx=32), NIH)
    assert target_windows(g, positions) == windows
    unreachable = unreachable_edges(g, positions)
    assert int(unreachable.sum()) == n_unreachable
    assert torch.equal(countable_edges(g, "interchange", positions), ~unreachable)
    if positions == [20]:
        kept = {e for e, u in zip(g.edges, unreachable.tolist(), strict=True) if not u}
        assert kept == {("embed@haystack", "l0.in@haystack"), ("l0@haystack", "l0.state@label"),
                        ("embed@label", "l0.in@label"), ("embed@label", "out@label"),
                        ("l0@label", "out@label")}  # fmt: skip
    # a graph without windows never excludes an edge for its targets
    plain = recurrent_graph("lstm", 1)
    assert not unreachable_edges(plain, positions).any()


# --- the transformer options of imported models ------------------------------------------

OPTION_GRID = [
    dict(n_layers=L, n_heads=H, n_key_value_heads=G, positions=pos, attn_only=ao, parallel_attn_mlp=par)
    for L, H in [(1, 2), (2, 4), (3, 6)]
    for G in sorted({H, H // 2, 1})
    for pos in (True, False)
    for ao, par in [(False, False), (False, True), (True, False)]
]


def option_reads(writer: str, reader, g) -> bool:
    """The edge rule with the options, written out independently of the builder."""
    wkind, wlayer, _ = parse_component(writer)
    if reader.kind == "out" or wkind in ("embed", "pos"):
        return True
    if reader.kind in "qkv":
        return wlayer < reader.layer
    if g.layout.get("parallel_attn_mlp"):
        return wlayer < reader.layer
    return wlayer < reader.layer or (wlayer == reader.layer and wkind == "head")


@pytest.mark.parametrize("options", OPTION_GRID, ids=lambda o: "-".join(f"{v}" for v in o.values()))
def test_option_graphs_follow_the_closed_form_and_the_rule(options):
    g = transformer_graph(**options)
    L, H, G = options["n_layers"], options["n_heads"], options["n_key_value_heads"]
    E, M = 1 + options["positions"], 0 if options["attn_only"] else 1
    assert g.n_edges == transformer_edge_count(
        L, H, E, n_key_value_heads=G, attn_only=options["attn_only"],
        parallel_attn_mlp=options["parallel_attn_mlp"],
    )  # fmt: skip
    # the closed form written out once more, from the module docstring
    S = L * E + (H + M) * L * (L - 1) // 2
    mlp = M * (S + (0 if options["parallel_attn_mlp"] else L * H))
    assert g.n_edges == (H + 2 * G) * S + mlp + E + L * (H + M)
    assert g.n_writers == E + L * (H + M) and g.n_readers == L * (H + 2 * G + M) + 1
    expected = {(w.name, r.name) for w in g.writers for r in g.readers if option_reads(w.name, r, g)}
    assert set(g.edges) == expected and len(g.edges) == len(expected)
    assert graph_from_summary(g.summary()).edges == g.edges


def test_grouped_key_value_readers_are_shared_by_their_query_heads():
    g = transformer_graph(2, 4, n_key_value_heads=2)
    layer1 = [r.name for r in g.readers if r.layer == 1]
    assert layer1 == [f"a1.h{h}.q" for h in range(4)] + ["a1.g0.k", "a1.g1.k", "a1.g0.v", "a1.g1.v", "m1.in"]
    assert g.feeds("a1.g1.v") == ("a1.h2", "a1.h3") and g.feeds("a1.h3.q") == ("a1.h3",)
    assert g.feeds("out") == () and parse_component("a1.g1") == ("group", 1, 1)
    nxg = g.to_networkx()
    internal = {(u, v) for u, v, d in nxg.edges(data=True) if d["internal"]}
    assert {("a1.g0.k", "a1.h0"), ("a1.g0.k", "a1.h1"), ("a1.g1.k", "a1.h3")} <= internal
    assert ("a1.g0.k", "a1.h2") not in internal
    assert nx.has_path(nxg, "a0.h0", "a1.h1") and nx.is_directed_acyclic_graph(nxg)
    assert g.summary()["n_key_value_heads"] == 2


def test_graphs_built_from_imported_style_configs():
    llama = TransformerConfig(d_model=16, n_layers=2, n_heads=4, n_key_value_heads=1, positional="rotary",
                              normalization="RMS", gated_mlp=True)  # fmt: skip
    g = build_graph(llama)
    assert [w.name for w in g.writers[:2]] == ["embed", "a0.h0"]  # no position writer
    assert g.n_edges == transformer_edge_count(2, 4, 1, n_key_value_heads=1)
    neox = build_graph(TransformerConfig(d_model=16, n_layers=2, n_heads=2, positional="rotary",
                                         rotary_dim=2, parallel_attn_mlp=True))  # fmt: skip
    assert neox.reader_by_name["m1.in"].n_upstream == neox.reader_by_name["a1.h0.q"].n_upstream == 4
    attn_only = build_graph(TransformerConfig(d_model=16, n_layers=2, n_heads=2, attn_only=True))
    assert not any(w.kind == "mlp" for w in attn_only.writers)
    assert attn_only.n_edges == transformer_edge_count(2, 2, attn_only=True) == 3 * 2 * (4 + 2) + 6
    # the default graph is GPT-2's, and its summary has no layout keys (old circuits match)
    assert set(build_graph(TransformerConfig(d_model=16, n_heads=2)).summary()) == {
        "arch", "n_layers", "n_heads", "n_writers", "n_readers", "n_edges"}
