"""The edge graph as data: writers, readers and their edges, numbered reader by reader."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from mechlab.traces import Windows


@dataclass(frozen=True)
class Writer:
    """A component whose output is added to the residual stream.

    Attributes:
        name: ``embed``, ``pos``, ``a{l}.h{h}``, ``m{l}`` or ``l{l}``, with ``@window``
            in a windowed graph (``l0@label``).
        layer: Block index, ``-1`` for the embeddings.
        kind: ``embed``, ``pos``, ``head``, ``mlp`` or ``mixer``.
        head: Head index (``head`` writers), else ``-1``.
        window: Its window's name in a windowed graph, else ``None``.
    """

    name: str
    layer: int
    kind: str
    head: int = -1
    window: str | None = None


@dataclass(frozen=True)
class Reader:
    """A place where a component reads the residual stream.

    Attributes:
        name: ``a{l}.h{h}.q|k|v``, ``m{l}.in``, ``l{l}.in`` or ``out``; in a windowed
            graph ``l{l}.in@w``, ``l{l}.state@w`` or ``out@w``.
        layer: Block index, ``n_layers`` for the read-out.
        kind: ``q``, ``k``, ``v``, ``mlp``, ``mixer``, ``state`` or ``out``.
        component: Name of the component the reader feeds (``a1.h0`` for
            ``a1.h0.q``; ``out`` for the read-out; ``l0@label`` for ``l0.state@label``).
        n_upstream: It reads writers ``first_upstream .. first_upstream + n_upstream - 1``.
        head: Head index (q/k/v readers), else ``-1``.
        first_upstream: Index of the first writer it reads (0 but in windowed graphs).
        window: Its window's name in a windowed graph, else ``None``.
        shared_by: The writers a shared reader feeds (the query heads of a key/value
            group, for ``a{l}.g{g}.k`` / ``.v``); empty for a reader that feeds
            ``component`` alone (or nothing, the read-out).
    """

    name: str
    layer: int
    kind: str
    component: str
    n_upstream: int
    head: int = -1
    first_upstream: int = 0
    window: str | None = None
    shared_by: tuple[str, ...] = ()


@dataclass
class EdgeGraph:
    """Writers, readers and edges of one model.

    Attributes:
        arch: Architecture name.
        n_layers: Number of blocks.
        n_heads: Heads per block (0 for recurrent families).
        writers: In forward order.
        readers: In forward order.
        windows: The position windows of a windowed recurrent graph, else ``()``.
        layout: A transformer's options that shape the graph, where they differ from
            GPT-2's (``n_key_value_heads``, ``positions``, ``attn_only``,
            ``parallel_attn_mlp``); recorded in :meth:`summary`.
        edges: ``(writer name, reader name)``, reader by reader, each reader's
            writers in forward order.
        edge_offset: Index of each reader's first edge, by reader name.
    """

    arch: str
    n_layers: int
    n_heads: int
    writers: list[Writer]
    readers: list[Reader]
    windows: Windows = ()
    layout: dict[str, Any] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(init=False)
    edge_offset: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.edges, self.edge_offset = [], {}
        for reader in self.readers:
            self.edge_offset[reader.name] = len(self.edges)
            upstream = self.writers[reader.first_upstream : reader.first_upstream + reader.n_upstream]
            self.edges.extend((w.name, reader.name) for w in upstream)
        self.edge_index = {edge: i for i, edge in enumerate(self.edges)}
        self.writer_index = {w.name: i for i, w in enumerate(self.writers)}
        self.reader_by_name = {r.name: r for r in self.readers}

    def feeds(self, reader: Reader | str) -> tuple[str, ...]:
        """The writers a reader feeds: its component, every head of a shared key/value
        reader's group, nothing for a read-out."""
        r = self.reader_by_name[reader] if isinstance(reader, str) else reader
        if r.shared_by:
            return r.shared_by
        return (r.component,) if r.component in self.writer_index else ()

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
        out: dict[str, Any] = {
            "arch": self.arch,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_writers": self.n_writers,
            "n_readers": self.n_readers,
            "n_edges": self.n_edges,
        }
        out.update(self.layout)
        if self.windows:
            out["windows"] = [list(w) for w in self.windows]
        return out

    def to_networkx(self) -> nx.DiGraph:
        """The full graph as a DiGraph.

        Nodes: every writer (``role="writer"``) and every reader (``role="reader"``),
        with ``layer``, ``kind`` and, for readers, ``component``. Edges: every
        maskable writer -> reader edge (``internal=False``) plus, for each reader that
        feeds a writer, the internal edge reader -> that writer (``a1.h0.q -> a1.h0``,
        ``m1.in -> m1``, ``l0.state@label -> l0@label``, a shared key/value reader to every
        head of its group; ``internal=True``) so paths
        through components can be followed. Nodes carry their ``window`` (None outside
        windowed graphs). Count maskable edges with :attr:`n_edges`.
        """
        g = nx.DiGraph(arch=self.arch, n_layers=self.n_layers, n_heads=self.n_heads)
        for w in self.writers:
            g.add_node(w.name, role="writer", layer=w.layer, kind=w.kind, window=w.window)
        for r in self.readers:
            g.add_node(
                r.name, role="reader", layer=r.layer, kind=r.kind, component=r.component,
                window=r.window,
            )  # fmt: skip
        for writer, reader in self.edges:
            g.add_edge(writer, reader, internal=False)
        for r in self.readers:
            for writer in self.feeds(r):
                g.add_edge(r.name, writer, internal=True)
        return g
