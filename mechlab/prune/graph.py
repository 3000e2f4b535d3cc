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

LSTM, dense SSM, Mamba (residual stacks ``resid += mixer(norm(resid))``)::

    writers  embed, l{l}          (l{l} = layer l's mixer output)    L + 1
    readers  l{l}.in, out         (l{l}.in = layer l's input, before its norm)
    n_edges = sum_l (1 + l) + (L + 1) = (L + 1)(L + 2) / 2

Writers are numbered in forward order, and every reader reads a *prefix* of that order
(its ``n_upstream`` first writers); edges are numbered reader by reader, so the edges of
reader ``r`` are ``edge_offset[r] .. edge_offset[r] + n_upstream[r] - 1``. The masked
forward pass relies on both facts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch

from mechlab.models.base import ModelConfig

RECURRENT_ARCHS = ("lstm", "dense_ssm", "mamba")
ARCHS = ("transformer", *RECURRENT_ARCHS)
QKV = ("q", "k", "v")


@dataclass(frozen=True)
class Writer:
    """A component whose output is added to the residual stream.

    Attributes:
        name: ``embed``, ``pos``, ``a{l}.h{h}``, ``m{l}`` or ``l{l}``.
        layer: Block index, ``-1`` for the embeddings.
        kind: ``embed``, ``pos``, ``head``, ``mlp`` or ``mixer``.
        head: Head index (``head`` writers), else ``-1``.
    """

    name: str
    layer: int
    kind: str
    head: int = -1


@dataclass(frozen=True)
class Reader:
    """A place where a component reads the residual stream.

    Attributes:
        name: ``a{l}.h{h}.q|k|v``, ``m{l}.in``, ``l{l}.in`` or ``out``.
        layer: Block index, ``n_layers`` for the read-out.
        kind: ``q``, ``k``, ``v``, ``mlp``, ``mixer`` or ``out``.
        component: Name of the component the reader feeds (``a1.h0`` for
            ``a1.h0.q``; ``out`` for the read-out).
        n_upstream: It reads writers ``0 .. n_upstream - 1``.
        head: Head index (q/k/v readers), else ``-1``.
    """

    name: str
    layer: int
    kind: str
    component: str
    n_upstream: int
    head: int = -1


@dataclass
class EdgeGraph:
    """Writers, readers and edges of one model.

    Attributes:
        arch: Architecture name.
        n_layers: Number of blocks.
        n_heads: Heads per block (0 for recurrent families).
        writers: In forward order.
        readers: In forward order.
        edges: ``(writer name, reader name)``, reader by reader, each reader's
            writers in forward order.
        edge_offset: Index of each reader's first edge, by reader name.
    """

    arch: str
    n_layers: int
    n_heads: int
    writers: list[Writer]
    readers: list[Reader]
    edges: list[tuple[str, str]] = field(init=False)
    edge_offset: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.edges, self.edge_offset = [], {}
        for reader in self.readers:
            self.edge_offset[reader.name] = len(self.edges)
            self.edges.extend((w.name, reader.name) for w in self.writers[: reader.n_upstream])
        self.edge_index = {edge: i for i, edge in enumerate(self.edges)}
        self.writer_index = {w.name: i for i, w in enumerate(self.writers)}
        self.reader_by_name = {r.name: r for r in self.readers}

    @property
    def n_edges(self) -> int:
        return len(self.edges)

    @property
    def n_writers(self) -> int:
        """Writer nodes, the embedding nodes included."""
        return len(self.writers)

    @property
    def n_readers(self) -> int:
        return len(self.readers)

    def summary(self) -> dict[str, Any]:
        """Plain-dict description (stored in every circuit's metadata)."""
        return {
            "arch": self.arch,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_writers": self.n_writers,
            "n_readers": self.n_readers,
            "n_edges": self.n_edges,
        }

    def to_networkx(self) -> nx.DiGraph:
        """The full graph as a DiGraph.

        Nodes: every writer (``role="writer"``) and every reader (``role="reader"``),
        with ``layer``, ``kind`` and, for readers, ``component``. Edges: every
        maskable writer -> reader edge (``internal=False``) plus, for each reader that
        feeds a writer, the internal edge reader -> that writer (``a1.h0.q -> a1.h0``,
        ``m1.in -> m1``; ``internal=True``) so paths through components can be followed.
        Count maskable edges with :attr:`n_edges`.
        """
        g = nx.DiGraph(arch=self.arch, n_layers=self.n_layers, n_heads=self.n_heads)
        for w in self.writers:
            g.add_node(w.name, role="writer", layer=w.layer, kind=w.kind)
        for r in self.readers:
            g.add_node(r.name, role="reader", layer=r.layer, kind=r.kind, component=r.component)
        for writer, reader in self.edges:
            g.add_edge(writer, reader, internal=False)
        for r in self.readers:
            if r.component in self.writer_index:
                g.add_edge(r.name, r.component, internal=True)
        return g


def _arch_sizes(model_or_cfg: Any) -> tuple[str, int, int]:
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    if not isinstance(cfg, ModelConfig):
        raise TypeError(
            f"expected a mechlab model or ModelConfig, got {type(model_or_cfg).__name__}"
        )
    if cfg.arch not in ARCHS:
        raise ValueError(f"edge pruning supports {ARCHS}, not {cfg.arch!r}")
    return cfg.arch, cfg.n_layers, getattr(cfg, "n_heads", 0) if cfg.arch == "transformer" else 0


def build_graph(model_or_cfg: Any) -> EdgeGraph:
    """The edge graph of a mechlab model (or of its config).

    Args:
        model_or_cfg: A mechlab model or its :class:`~mechlab.models.base.ModelConfig`.

    Returns:
        The :class:`EdgeGraph` (see the module docstring for the layout).
    """
    arch, n_layers, n_heads = _arch_sizes(model_or_cfg)
    if arch == "transformer":
        return transformer_graph(n_layers, n_heads)
    return recurrent_graph(arch, n_layers)


def transformer_graph(n_layers: int, n_heads: int) -> EdgeGraph:
    """Edge graph of a transformer with separate ``embed`` and ``pos`` writers."""
    writers = [Writer("embed", -1, "embed"), Writer("pos", -1, "pos")]
    readers = []
    for layer in range(n_layers):
        n_up = len(writers)  # heads read the embeddings and all earlier layers
        for kind in QKV:
            for h in range(n_heads):
                readers.append(
                    Reader(f"a{layer}.h{h}.{kind}", layer, kind, f"a{layer}.h{h}", n_up, h)
                )
        writers.extend(Writer(f"a{layer}.h{h}", layer, "head", h) for h in range(n_heads))
        readers.append(Reader(f"m{layer}.in", layer, "mlp", f"m{layer}", len(writers)))
        writers.append(Writer(f"m{layer}", layer, "mlp"))
    readers.append(Reader("out", n_layers, "out", "out", len(writers)))
    return EdgeGraph("transformer", n_layers, n_heads, writers, readers)


def recurrent_graph(arch: str, n_layers: int) -> EdgeGraph:
    """Edge graph of a residual stack of mixers (LSTM, dense SSM, Mamba)."""
    if arch not in RECURRENT_ARCHS:
        raise ValueError(f"not a recurrent family: {arch!r}; choose one of {RECURRENT_ARCHS}")
    writers = [Writer("embed", -1, "embed")]
    readers = []
    for layer in range(n_layers):
        readers.append(Reader(f"l{layer}.in", layer, "mixer", f"l{layer}", len(writers)))
        writers.append(Writer(f"l{layer}", layer, "mixer"))
    readers.append(Reader("out", n_layers, "out", "out", len(writers)))
    return EdgeGraph(arch, n_layers, 0, writers, readers)


def transformer_edge_count(n_layers: int, n_heads: int, n_embed: int = 2) -> int:
    """Closed formula for the number of edges of a transformer (see the module docstring).

    Args:
        n_layers: ``L``.
        n_heads: ``H``.
        n_embed: ``E``, embedding writers (2: read-in and positions).

    Returns:
        ``3H [L E + (H+1) L (L-1)/2] + [L E + (H+1) L (L-1)/2 + L H] + [E + L (H+1)]``.
    """
    L, H, E = n_layers, n_heads, n_embed
    head_upstream = L * E + (H + 1) * L * (L - 1) // 2  # summed over layers
    return 3 * H * head_upstream + (head_upstream + L * H) + (E + L * (H + 1))


def recurrent_edge_count(n_layers: int) -> int:
    """Closed formula for a residual mixer stack: ``(L + 1)(L + 2) / 2``."""
    return (n_layers + 1) * (n_layers + 2) // 2


# ---------------------------------------------------------------------------------------
# Names -> positions (used by the circuit plot)
# ---------------------------------------------------------------------------------------

_HEAD = re.compile(r"a(\d+)\.h(\d+)")
_MLP = re.compile(r"m(\d+)")
_LAYER = re.compile(r"l(\d+)")


def component_of(node: str) -> str:
    """The component a node belongs to: ``a1.h0.q -> a1.h0``, ``m1.in -> m1``, others unchanged."""
    if node.endswith((".q", ".k", ".v", ".in")):
        return node.rsplit(".", 1)[0]
    return node


def parse_component(name: str) -> tuple[str, int, int]:
    """``(kind, layer, head)`` of a component name (``head`` is -1 when not a head).

    Kinds: ``embed``, ``pos``, ``head``, ``mlp``, ``mixer``, ``out``.
    """
    if name in ("embed", "pos", "out"):
        return name, -1, -1
    if m := _HEAD.fullmatch(name):
        return "head", int(m.group(1)), int(m.group(2))
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


def countable_edges(graph: EdgeGraph, ablation: str) -> torch.Tensor:
    """``[n_edges]`` bool: the edges that can matter under ``ablation`` (not from an inert writer).

    These are the edges a sparsity counts and a circuit may hold.
    """
    inert = set(inert_writers(graph, ablation))
    return torch.tensor([w not in inert for w, _ in graph.edges], dtype=torch.bool)
