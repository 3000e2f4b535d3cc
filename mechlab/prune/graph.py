"""The computational graph that edge pruning masks: writers, readers and the edges between them.

A *writer* is a component whose output is added to the residual stream; a *reader* is a
place where a component takes its input from the stream. Every (writer, reader) pair in
which the writer comes before the reader is an *edge*, and edge pruning gives each edge
its own mask (Bhaskar et al. 2024, "Finding Transformer Circuits with Edge Pruning").

Transformer (``E`` embedding writers, ``L`` layers, ``H`` heads)::

    writers  embed, pos, a{l}.h{h}, m{l}                    E + L (H + 1)
    readers  a{l}.h{h}.q / .k / .v, m{l}.in, out            L (3H + 1) + 1
    edges    head readers of layer l read the writers of layers < l and the embeddings;
             m{l}.in also reads the heads of layer l; out reads every writer

    n_edges = 3H [L E + (H + 1) L (L - 1) / 2]              (q, k, v of every head)
            + [L E + (H + 1) L (L - 1) / 2 + L H]           (MLP inputs)
            + [E + L (H + 1)]                               (read-out)

(GPT-2 small, E = 2, L = H = 12: 158 writers and 32,936 edges, the paper's numbers.)
``E = 2`` here: the read-in (``embed``) and the position table (``pos``) are separate
writers.

The transformer's options (:class:`~mechlab.models.transformer.TransformerConfig`) change
the graph so: with rotary positions there is no ``pos`` writer (``E = 1``: positions enter
inside attention, no component writes them into the stream); an attention-only model has
no ``m{l}`` writers and no ``m{l}.in`` readers (``M = 0`` MLP writers per layer instead of
1); with a parallel residual ``m{l}.in`` reads what the heads of layer ``l`` read (not
those heads); and with ``G = n_key_value_heads < H`` grouped key/value heads the K and V
inputs of a group are *one* reader each, ``a{l}.g{g}.k`` / ``a{l}.g{g}.v``, shared by the
group's query heads ``a{l}.h{gH/G} .. a{l}.h{(g+1)H/G - 1}`` (masking the edge ``w ->
a{l}.g{g}.k`` changes the keys of every head of the group, as the model computes one key
per group), while every query head keeps its own ``a{l}.h{h}.q``. With ``S = L E + (H + M)
L (L - 1) / 2`` (the head readers' upstream writers, summed over layers)::

    n_edges = (H + 2G) S                                    (q of every head, k and v of every group)
            + M [S + L H]        (sequential)  or  M S      (parallel: the MLP reads no head of its layer)
            + [E + L (H + M)]                               (read-out)

which is the formula above for ``G = H``, ``M = 1``, sequential
(:func:`transformer_edge_count`).

LSTM, dense SSM, Mamba (residual stacks ``resid += mixer(norm(resid))``)::

    writers  embed, l{l}          (l{l} = layer l's mixer output)    L + 1
    readers  l{l}.in, out         (l{l}.in = layer l's input, before its norm)
    n_edges = sum_l (1 + l) + (L + 1) = (L + 1)(L + 2) / 2

The same stacks with *position windows* ``w_0, ..., w_{K-1}`` (consecutive position
ranges covering the sequence, e.g. NiH's ``haystack``, ``label``, ``continuation``;
:func:`windowed_recurrent_graph`)::

    writers  embed@w, l{l}@w       (the read-in / layer l's output at w's positions)   K (L + 1)
    readers  l{l}.in@w, out@w      (layer l's input / the read-out at w's positions)
             l{l}.state@w          (w != w_0: layer l's recurrent state entering w)
    edges    within each window as above (the residual stream at position t holds only
             writers' outputs at t), plus one state edge l{l}@w -> l{l}.state@w' per
             layer and pair of consecutive windows w -> w' (layer l's state at the end
             of w, carried into w')
    n_edges = K (L + 1)(L + 2) / 2 + (K - 1) L

Writers are numbered in forward order (window by window in a windowed graph), and every
reader reads a *contiguous range* of that order (writers ``first_upstream ..
first_upstream + n_upstream - 1``; a prefix, ``first_upstream = 0``, except in a
windowed graph, whose readers read their window's writers and whose state readers read
one writer); edges are numbered reader by reader, so the edges of reader ``r`` are
``edge_offset[r] .. edge_offset[r] + n_upstream[r] - 1``. The masked forward pass
relies on both facts. The graph as data (:class:`Writer`, :class:`Reader`,
:class:`EdgeGraph`) is :mod:`mechlab.prune.edge_graph`'s; this module builds it by these rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import networkx as nx
import torch

from mechlab.models.base import ModelConfig
from mechlab.models.registry import graph_kind, prunable_families, recurrent_families
from mechlab.prune.edge_graph import EdgeGraph, Reader, Writer
from mechlab.traces import Windows, check_windows

# What each family's graph is lives in its registry entry (mechlab.models.registry.Family.graph);
# these are the built-in families' answers, kept for the code that imports them.
RECURRENT_ARCHS = recurrent_families()
ARCHS = prunable_families()
QKV = ("q", "k", "v")


def _config(model_or_cfg: Any) -> ModelConfig:
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    if not isinstance(cfg, ModelConfig):
        raise TypeError(
            f"expected a mechlab model or ModelConfig, got {type(model_or_cfg).__name__}"
        )
    if graph_kind(cfg.arch) is None:
        raise ValueError(f"edge pruning supports {prunable_families()}, not {cfg.arch!r}")
    return cfg


def _arch_sizes(model_or_cfg: Any) -> tuple[str, int, int]:
    cfg = _config(model_or_cfg)
    return cfg.arch, cfg.n_layers, getattr(cfg, "n_heads", 0) if graph_kind(cfg.arch) == "transformer" else 0


def transformer_layout(cfg: ModelConfig) -> dict[str, Any]:
    """The graph options of a transformer config (:func:`transformer_graph`'s keywords).

    Raises:
        ValueError: Post-sublayer norms that are not RMSNorms, or with an attention output
            bias: a head's edge is its share ``w * result_h / s`` of the RMSNorm's output
            (:mod:`mechlab.prune.forward`), which a LayerNorm's centring or a bias's
            ``w * b_O / s`` (no head's, and no constant) would not be.
    """
    if getattr(cfg, "post_norms", False) and (cfg.normalization != "RMS" or cfg.attn_out_bias):
        raise ValueError(
            "edge graphs of norms after the sublayers need RMSNorms without an attention output "
            f"bias (a head's edge is its share w * result_h / rms of the normed output); this model "
            f"has normalization={cfg.normalization!r}, attn_out_bias={cfg.attn_out_bias}"
        )
    return {
        "n_key_value_heads": getattr(cfg, "n_key_value_heads", None) or cfg.n_heads,
        "positions": getattr(cfg, "positional", "learned") == "learned",
        "attn_only": bool(getattr(cfg, "attn_only", False)),
        "parallel_attn_mlp": bool(getattr(cfg, "parallel_attn_mlp", False)),
    }


def build_graph(model_or_cfg: Any, windows: Windows | None = None) -> EdgeGraph:
    """The edge graph of a mechlab model (or of its config).

    Args:
        model_or_cfg: A mechlab model or its :class:`~mechlab.models.base.ModelConfig`.
        windows: Position windows ``(name, start, end)`` for a recurrent model's windowed
            graph (:func:`windowed_recurrent_graph`); None for the plain graph.

    Returns:
        The :class:`EdgeGraph` (see the module docstring for the layout).

    Raises:
        ValueError: Windows for a transformer, or malformed windows.
    """
    cfg = _config(model_or_cfg)
    if graph_kind(cfg.arch) == "transformer":
        if windows is not None:
            raise ValueError("position windows apply to recurrent models (lstm, dense_ssm, mamba), not transformers")
        return transformer_graph(cfg.n_layers, cfg.n_heads, **transformer_layout(cfg))
    if windows is not None:
        return windowed_recurrent_graph(cfg.arch, cfg.n_layers, windows)
    return recurrent_graph(cfg.arch, cfg.n_layers)


def graph_from_summary(info: dict[str, Any]) -> EdgeGraph:
    """Rebuild a graph from its :meth:`EdgeGraph.summary` (a circuit's ``metadata["graph"]``).

    Raises:
        ValueError: No or an unknown architecture, or a recorded edge count the rebuilt
            graph does not have.
    """
    arch = info.get("arch")
    if graph_kind(arch) == "transformer":
        options = {k: info[k] for k in ("n_key_value_heads", "positions", "attn_only", "parallel_attn_mlp") if k in info}
        graph = transformer_graph(int(info["n_layers"]), int(info["n_heads"]), **options)
    elif graph_kind(arch) == "recurrent" and info.get("windows"):
        graph = windowed_recurrent_graph(arch, int(info["n_layers"]), info["windows"])
    elif graph_kind(arch) == "recurrent":
        graph = recurrent_graph(arch, int(info["n_layers"]))
    else:
        raise ValueError(f"unknown architecture {arch!r} in the graph summary")
    if "n_edges" in info and graph.n_edges != int(info["n_edges"]):
        raise ValueError(
            f"rebuilt graph has {graph.n_edges} edges, the summary records {info['n_edges']}"
        )
    return graph


def pruning_graph(
    model_or_cfg: Any, windows: Windows | None = None, position_aware: bool | None = None
) -> EdgeGraph:
    """The graph edge pruning uses: windowed for a recurrent model whose traces have windows.

    Args:
        model_or_cfg: A mechlab model or its config.
        windows: The traces' windows (:attr:`mechlab.traces.Traces.windows`), or None.
        position_aware: ``None`` (default): the windowed graph when the model is
            recurrent and ``windows`` are given, else the plain one; ``True``: the
            windowed graph (an error when it cannot be built); ``False``: the plain graph.

    Returns:
        The :class:`EdgeGraph`.
    """
    arch = _arch_sizes(model_or_cfg)[0]
    if position_aware is None:
        position_aware = graph_kind(arch) == "recurrent" and windows is not None
    if not position_aware:
        return build_graph(model_or_cfg)
    if graph_kind(arch) != "recurrent":
        raise ValueError(f"position_aware graphs are for recurrent models {recurrent_families()}, not {arch!r}")
    if windows is None:
        raise ValueError("position_aware=True needs traces with windows (Traces.windows)")
    return build_graph(model_or_cfg, windows)


def transformer_graph(
    n_layers: int,
    n_heads: int,
    *,
    n_key_value_heads: int | None = None,
    positions: bool = True,
    attn_only: bool = False,
    parallel_attn_mlp: bool = False,
) -> EdgeGraph:
    """Edge graph of a transformer (see the module docstring).

    Args:
        n_layers: ``L``.
        n_heads: ``H`` query heads per layer.
        n_key_value_heads: ``G`` key/value heads (dividing ``H``); None or ``H``: one
            K and one V reader per head, else one per group (``a{l}.g{g}.k``).
        positions: A ``pos`` writer (a learned position table) beside ``embed``.
        attn_only: No MLPs.
        parallel_attn_mlp: ``m{l}.in`` reads what layer ``l``'s heads read.
    """
    G = n_heads if n_key_value_heads is None else int(n_key_value_heads)
    if G <= 0 or n_heads % G:
        raise ValueError(f"n_key_value_heads={G} must divide n_heads={n_heads}")
    if attn_only and parallel_attn_mlp:
        raise ValueError("an attn_only graph has no MLP to run in parallel")
    per_group = n_heads // G
    writers = [Writer("embed", -1, "embed")] + ([Writer("pos", -1, "pos")] if positions else [])
    readers = []
    for layer in range(n_layers):
        n_up = len(writers)  # heads read the embeddings and all earlier layers
        for h in range(n_heads):
            readers.append(Reader(f"a{layer}.h{h}.q", layer, "q", f"a{layer}.h{h}", n_up, h))
        for kind in ("k", "v"):
            for g in range(G):
                if G == n_heads:
                    readers.append(Reader(f"a{layer}.h{g}.{kind}", layer, kind, f"a{layer}.h{g}", n_up, g))
                    continue
                heads = tuple(f"a{layer}.h{h}" for h in range(g * per_group, (g + 1) * per_group))
                readers.append(Reader(
                    f"a{layer}.g{g}.{kind}", layer, kind, f"a{layer}.g{g}", n_up, g, shared_by=heads,
                ))  # fmt: skip
        writers.extend(Writer(f"a{layer}.h{h}", layer, "head", h) for h in range(n_heads))
        if not attn_only:
            n_mlp = n_up if parallel_attn_mlp else len(writers)
            readers.append(Reader(f"m{layer}.in", layer, "mlp", f"m{layer}", n_mlp))
            writers.append(Writer(f"m{layer}", layer, "mlp"))
    readers.append(Reader("out", n_layers, "out", "out", len(writers)))
    layout: dict[str, Any] = {}
    if G != n_heads:
        layout["n_key_value_heads"] = G
    if not positions:
        layout["positions"] = False
    if attn_only:
        layout["attn_only"] = True
    if parallel_attn_mlp:
        layout["parallel_attn_mlp"] = True
    return EdgeGraph("transformer", n_layers, n_heads, writers, readers, layout=layout)


def recurrent_graph(arch: str, n_layers: int) -> EdgeGraph:
    """Edge graph of a residual stack of mixers (LSTM, dense SSM, Mamba)."""
    if graph_kind(arch) != "recurrent":
        raise ValueError(f"not a recurrent family: {arch!r}; choose one of {recurrent_families()}")
    writers = [Writer("embed", -1, "embed")]
    readers = []
    for layer in range(n_layers):
        readers.append(Reader(f"l{layer}.in", layer, "mixer", f"l{layer}", len(writers)))
        writers.append(Writer(f"l{layer}", layer, "mixer"))
    readers.append(Reader("out", n_layers, "out", "out", len(writers)))
    return EdgeGraph(arch, n_layers, 0, writers, readers)


def windowed_recurrent_graph(arch: str, n_layers: int, windows: Windows) -> EdgeGraph:
    """Edge graph of a residual mixer stack split into position windows (module docstring).

    Args:
        arch: ``lstm``, ``dense_ssm`` or ``mamba``.
        n_layers: ``L``.
        windows: ``(name, start, end)`` ranges (see :func:`check_windows`).

    Returns:
        The :class:`EdgeGraph`, with :attr:`EdgeGraph.windows` set.
    """
    if graph_kind(arch) != "recurrent":
        raise ValueError(f"not a recurrent family: {arch!r}; choose one of {recurrent_families()}")
    windows = check_windows(windows)
    writers: list[Writer] = []
    readers: list[Reader] = []
    previous: str | None = None
    for name, _, _ in windows:
        first = len(writers)  # this window's embed@name
        writers.append(Writer(f"embed@{name}", -1, "embed", window=name))
        for layer in range(n_layers):
            if previous is not None:  # the state of l{layer}@previous, carried into this window
                state_of = first - (n_layers + 1) + 1 + layer
                readers.append(Reader(
                    f"l{layer}.state@{name}", layer, "state", f"l{layer}@{name}", 1,
                    first_upstream=state_of, window=name,
                ))  # fmt: skip
            readers.append(Reader(
                f"l{layer}.in@{name}", layer, "mixer", f"l{layer}@{name}", len(writers) - first,
                first_upstream=first, window=name,
            ))  # fmt: skip
            writers.append(Writer(f"l{layer}@{name}", layer, "mixer", window=name))
        readers.append(Reader(
            f"out@{name}", n_layers, "out", f"out@{name}", len(writers) - first,
            first_upstream=first, window=name,
        ))  # fmt: skip
        previous = name
    return EdgeGraph(arch, n_layers, 0, writers, readers, windows)


def transformer_edge_count(
    n_layers: int,
    n_heads: int,
    n_embed: int = 2,
    *,
    n_key_value_heads: int | None = None,
    attn_only: bool = False,
    parallel_attn_mlp: bool = False,
) -> int:
    """Closed formula for the number of edges of a transformer (see the module docstring).

    Args:
        n_layers: ``L``.
        n_heads: ``H``.
        n_embed: ``E``, embedding writers (2: read-in and positions; 1 with rotary positions).
        n_key_value_heads: ``G`` (default ``H``).
        attn_only: No MLPs (``M = 0``).
        parallel_attn_mlp: Each MLP reads what its layer's heads read.

    Returns:
        ``(H + 2G) S + M [S + L H] + [E + L (H + M)]`` with ``S = L E + (H + M) L (L - 1) / 2``
        (``M S`` for the MLP inputs with a parallel residual).
    """
    L, H, E = n_layers, n_heads, n_embed
    G = H if n_key_value_heads is None else n_key_value_heads
    M = 0 if attn_only else 1
    head_upstream = L * E + (H + M) * L * (L - 1) // 2  # S, summed over layers
    mlp = M * (head_upstream + (0 if parallel_attn_mlp else L * H))
    return (H + 2 * G) * head_upstream + mlp + (E + L * (H + M))


def recurrent_edge_count(n_layers: int, n_windows: int = 0) -> int:
    """Closed formula for a residual mixer stack: ``(L + 1)(L + 2) / 2``; with ``K =
    n_windows`` position windows ``K (L + 1)(L + 2) / 2 + (K - 1) L``."""
    per_window = (n_layers + 1) * (n_layers + 2) // 2
    if n_windows == 0:
        return per_window
    return n_windows * per_window + (n_windows - 1) * n_layers


# ---------------------------------------------------------------------------------------
# Names -> positions (used by the circuit plot)
# ---------------------------------------------------------------------------------------

_HEAD = re.compile(r"a(\d+)\.h(\d+)")
_GROUP = re.compile(r"a(\d+)\.g(\d+)")
_MLP = re.compile(r"m(\d+)")
_LAYER = re.compile(r"l(\d+)")


def window_of(node: str) -> str | None:
    """The window of a node of a windowed graph (``l0.in@label -> label``), else None."""
    return node.split("@", 1)[1] if "@" in node else None


def component_of(node: str) -> str:
    """The component a node belongs to: ``a1.h0.q -> a1.h0``, ``m1.in -> m1``,
    ``l0.state@label -> l0@label``, others unchanged."""
    base, at, window = node.partition("@")
    if base.endswith((".q", ".k", ".v", ".in", ".state")):
        base = base.rsplit(".", 1)[0]
    return base + at + window


def parse_component(name: str) -> tuple[str, int, int]:
    """``(kind, layer, head)`` of a component name (``head`` is -1 when not a head).

    Kinds: ``embed``, ``pos``, ``head``, ``group`` (``a{l}.g{g}``, the shared key/value
    input of group ``g``; its "head" is the group index), ``mlp``, ``mixer``, ``out``. A window suffix
    (``l0@label``) is ignored; :func:`window_of` reads it.
    """
    name = name.split("@", 1)[0]
    if name in ("embed", "pos", "out"):
        return name, -1, -1
    if m := _HEAD.fullmatch(name):
        return "head", int(m.group(1)), int(m.group(2))
    if m := _GROUP.fullmatch(name):  # the shared K/V input of a key/value group
        return "group", int(m.group(1)), int(m.group(2))
    if m := _MLP.fullmatch(name):
        return "mlp", int(m.group(1)), -1
    if m := _LAYER.fullmatch(name):
        return "mixer", int(m.group(1)), -1
    raise ValueError(f"not a component name: {name!r}")


# ---------------------------------------------------------------------------------------
# Edges that cannot matter under an ablation
# ---------------------------------------------------------------------------------------

# A writer whose ablated output equals its clean output on every trace: the position
# table does not depend on the input, so its output on a corrupted trace (interchange)
# and its mean over traces at each position (mean) are its clean output.
_INERT_KINDS = {"interchange": ("pos",), "mean": ("pos",), "zero": ()}


def inert_writers(graph: EdgeGraph, ablation: str) -> list[str]:
    """Writers whose edges cannot matter under ``ablation`` (clean and ablated outputs agree).

    Args:
        graph: The edge graph.
        ablation: ``"interchange"``, ``"mean"`` or ``"zero"``.

    Returns:
        Writer names (``["pos"]`` for a transformer under interchange or mean ablation).
    """
    if ablation not in _INERT_KINDS:
        raise ValueError(f"unknown ablation {ablation!r}; choose one of {tuple(_INERT_KINDS)}")
    return [w.name for w in graph.writers if w.kind in _INERT_KINDS[ablation]]


def target_windows(graph: EdgeGraph, target_positions: Iterable[int] | None) -> list[str]:
    """The windows of a windowed graph that hold a target position (all when None).

    Args:
        graph: The edge graph (``[]`` when it has no windows).
        target_positions: Positions (prediction indices) that are scored, or None.
    """
    if target_positions is None:
        return [name for name, _, _ in graph.windows]
    at = {int(p) for p in target_positions}
    return [name for name, start, end in graph.windows if any(start <= p < end for p in at)]


def unreachable_edges(graph: EdgeGraph, target_positions: Iterable[int] | None) -> torch.Tensor:
    """``[n_edges]`` bool: edges of a windowed graph from which no scored output can be reached.

    An edge matters only through the read-out of a window that holds a target position
    (``out@w``), directly or through a chain of components and state edges; the others
    (the read-outs of windows without targets, everything in windows after the last
    target) cannot change the scored outputs. All False for a graph without windows
    or when ``target_positions`` is None.
    """
    if not graph.windows or target_positions is None:
        return torch.zeros(graph.n_edges, dtype=torch.bool)
    sinks = [f"out@{name}" for name in target_windows(graph, target_positions)]
    g = graph.to_networkx()
    live = set(sinks).union(*(nx.ancestors(g, s) for s in sinks))
    return torch.tensor([r not in live for _, r in graph.edges], dtype=torch.bool)


def countable_edges(
    graph: EdgeGraph, ablation: str, target_positions: Iterable[int] | None = None
) -> torch.Tensor:
    """``[n_edges]`` bool: the edges that can matter under ``ablation`` and for the targets.

    Not from an inert writer (:func:`inert_writers`) and, in a windowed graph with
    ``target_positions`` given, not unreachable from the scored outputs
    (:func:`unreachable_edges`). These are the edges a sparsity counts and a circuit
    may hold.

    Args:
        graph: The edge graph.
        ablation: ``"interchange"``, ``"mean"`` or ``"zero"``.
        target_positions: Scored positions (prediction indices), or None.
    """
    inert = set(inert_writers(graph, ablation))
    from_inert = torch.tensor([w in inert for w, _ in graph.edges], dtype=torch.bool)
    return ~from_inert & ~unreachable_edges(graph, target_positions)
