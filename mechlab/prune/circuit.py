"""Circuits found by edge pruning: the data structure and overlaps (plain data, no figures).

A :class:`Circuit` is a set of kept edges ``(writer, reader)`` of a model's
:class:`~mechlab.prune.graph.EdgeGraph`, each with its score (the deterministic
hard-concrete mask value), the components they touch, and metadata (checkpoint
sha256, target, ablation, sparsity asked and reached, seed, steps, metrics).

Its metrics (faithfulness, errors) are computed by :mod:`mechlab.prune.evaluate`.

Its figure is drawn by :func:`mechlab.viz.circuits.circuit_figure` (``mechlab view``);
this module imports no plotting library.

Overlap (:func:`overlap`): shared edges, Jaccard (:func:`jaccard`, the one
implementation every comparison of circuits uses), overlap coefficient, shared
components. :func:`seed_stability` compares prunings of one target with different
seeds (how well two prunings of the same target agree) with prunings of different
targets, so an observed low cross-target overlap can be judged against the
seed-to-seed baseline. The names and the interval rule of these statistics
(:data:`EDGE_JACCARD`, :data:`CROSS_TARGET_JACCARD`, :data:`SEED_BASELINE_JACCARD`,
:data:`MIN_SEEDS_FOR_INTERVAL`) are defined here, once, for every command and page.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from mechlab._deprecated import moved_names, resolve, warn_moved
from mechlab.io import atomic_write_text
from mechlab.prune.circuit_file import read_circuit_file, validate_circuit_dict
from mechlab.prune.graph import component_of, parse_component, window_of

FORMAT = "mechlab-circuit"
VERSION = 1
_KIND_ORDER = {"embed": 0, "pos": 1, "head": 2, "group": 3, "mlp": 4, "mixer": 2, "out": 5}


def _component_key(name: str, windows: Sequence[str] = ()) -> tuple[int, int, int, int]:
    """Forward order: window (in ``windows``' order), layer, kind, head."""
    kind, layer, head = parse_component(name)
    layer = 10**6 if kind == "out" else layer
    window = window_of(name)
    rank = list(windows).index(window) if window in windows else 0
    return (rank, layer, _KIND_ORDER[kind], head)


def _window_names(graph_info: Mapping[str, Any]) -> list[str]:
    """Window names, in order, of a graph summary (``[]`` without windows)."""
    return [w[0] for w in graph_info.get("windows", [])]


@dataclass
class Circuit:
    """A pruned circuit.

    Attributes:
        edges: ``(writer, reader) -> score`` of every kept edge (score = the
            deterministic mask value in [0, 1]).
        nodes: Components in the circuit (writers with a kept outgoing edge,
            components whose readers have a kept incoming edge; embeddings and
            ``out`` included), in forward order.
        metadata: Plain values: ``checkpoint_sha256``, ``target``, ``ablation``,
            ``sparsity_asked``, ``sparsity_reached``, ``seed``, ``steps``, ``metrics``,
            ``graph`` (arch and sizes), ...
        log_alpha: ``(writer, reader) -> log_alpha`` for *every* edge of the graph
            (lets a circuit be re-thresholded), or None.
    """

    edges: dict[tuple[str, str], float]
    nodes: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    log_alpha: dict[tuple[str, str], float] | None = None

    @classmethod
    def from_edges(
        cls,
        edges: Mapping[tuple[str, str], float],
        metadata: dict[str, Any] | None = None,
        log_alpha: Mapping[tuple[str, str], float] | None = None,
    ) -> Circuit:
        """Build a circuit from its kept edges (the nodes are derived from them)."""
        edges = {(str(w), str(r)): float(s) for (w, r), s in edges.items()}
        touched = {w for w, _ in edges} | {component_of(r) for _, r in edges}
        windows = _window_names((metadata or {}).get("graph", {}))
        nodes = sorted(touched, key=lambda n: _component_key(n, windows))
        return cls(
            edges, nodes, dict(metadata or {}), None if log_alpha is None else dict(log_alpha)
        )

    @property
    def n_edges(self) -> int:
        return len(self.edges)

    @property
    def n_nodes(self) -> int:
        """Components in the circuit, embedding nodes included."""
        return len(self.nodes)

    def edge_set(self) -> set[tuple[str, str]]:
        return set(self.edges)

    # -- conversions --------------------------------------------------------------
    def to_networkx(self) -> nx.DiGraph:
        """The circuit as a DiGraph.

        Nodes: writers and readers (as in :meth:`EdgeGraph.to_networkx`) touched by a
        kept edge, with ``role`` and ``component``. Edges: the kept edges with their
        ``score`` (``internal=False``), plus the internal edges reader -> component
        (``a1.h0.q -> a1.h0``, ``internal=True``) where that component is a writer in
        the circuit, so paths from ``embed`` to ``out`` can be followed.
        """
        g = nx.DiGraph(**{k: v for k, v in self.metadata.get("graph", {}).items()})
        for (writer, reader), score in self.edges.items():
            g.add_node(writer, role="writer", component=writer)
            g.add_node(reader, role="reader", component=component_of(reader))
            g.add_edge(writer, reader, score=score, internal=False)
        writers = {w for w, _ in self.edges}
        for node, data in list(g.nodes(data=True)):
            if (
                data["role"] == "reader"
                and data["component"] in writers
                and node != data["component"]
            ):
                g.add_edge(node, data["component"], internal=True)
        return g

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "nodes": list(self.nodes),
            "edges": [[w, r, s] for (w, r), s in self.edges.items()],
            "metadata": self.metadata,
        }
        if self.log_alpha is not None:
            out["log_alpha"] = [[w, r, v] for (w, r), v in self.log_alpha.items()]
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "circuit") -> Circuit:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: ``values`` does not follow the circuit schema
                (:mod:`mechlab.prune.circuit_file`); one line naming the field.
        """
        return cls._from_valid_dict(validate_circuit_dict(values, source))

    @classmethod
    def _from_valid_dict(cls, values: dict[str, Any]) -> Circuit:
        edges = {(w, r): float(s) for w, r, s in values["edges"]}
        log_alpha = values.get("log_alpha")
        if log_alpha is not None:
            log_alpha = {(w, r): float(v) for w, r, v in log_alpha}
        return cls(edges, list(values["nodes"]), dict(values.get("metadata", {})), log_alpha)

    def to_json(self, path: str | Path) -> Path:
        """Write the circuit as JSON, atomically (temporary file, then rename)."""
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1, allow_nan=True))

    @classmethod
    def from_json(cls, path: str | Path) -> Circuit:
        """Read a circuit written by :meth:`to_json`.

        Raises:
            ValueError: The file cannot be read, is not JSON, or does not follow the
                circuit schema; one line naming the file (and the field).
        """
        values = read_circuit_file(path)  # size, depth and schema checked
        return cls._from_valid_dict(values)

    # -- deprecated: figures live in mechlab.viz ------------------------------------
    def plot(self, title: str | None = None) -> Any:
        """Deprecated: use :func:`mechlab.viz.circuit_figure` (goes in mechlab 0.2.0)."""
        warn_moved("Circuit.plot()", "mechlab.viz.circuit_figure(circuit)")
        return resolve("mechlab.viz.circuits:circuit_figure")(self, title)

    def write_html(self, path: str | Path) -> Path:
        """Deprecated: use ``mechlab.viz.write_html(mechlab.viz.circuit_figure(circuit), path)``
        (goes in mechlab 0.2.0)."""
        warn_moved("Circuit.write_html()", "mechlab.viz.write_html(circuit_figure(circuit), path)")
        figure = resolve("mechlab.viz.circuits:circuit_figure")(self)
        return resolve("mechlab.viz.figures:write_html")(figure, path)


# ---------------------------------------------------------------------------------------
# Overlap and seed stability
# ---------------------------------------------------------------------------------------


@dataclass
class Overlap:
    """How much two circuits share.

    Attributes:
        n_edges_a, n_edges_b: Edges of each circuit.
        shared_edges: Edges in both.
        jaccard: ``|A & B| / |A | B|`` of the edge sets (1.0 for two empty circuits).
        overlap_coefficient: ``|A & B| / min(|A|, |B|)`` (0.0 when one is empty).
        shared_nodes: Components in both.
        node_jaccard: Jaccard of the component sets.
    """

    n_edges_a: int
    n_edges_b: int
    shared_edges: list[tuple[str, str]]
    jaccard: float
    overlap_coefficient: float
    shared_nodes: list[str]
    node_jaccard: float

    @property
    def n_shared_edges(self) -> int:
        return len(self.shared_edges)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shared_edges"] = [list(e) for e in self.shared_edges]
        out["n_shared_edges"] = self.n_shared_edges
        return out


def jaccard(a: Iterable[Any], b: Iterable[Any]) -> float:
    """``|A & B| / |A | B|`` of two sets (of edges, nodes, ...); 1.0 when both are empty.

    The one Jaccard of mechlab: :func:`overlap`, :func:`seed_stability`, joint pruning and
    the figures use it.
    """
    a = a if isinstance(a, (set, frozenset)) else set(a)
    b = b if isinstance(b, (set, frozenset)) else set(b)
    shared = len(a & b)
    union = len(a) + len(b) - shared
    return 1.0 if union == 0 else shared / union


# ---------------------------------------------------------------------------------------
# The overlap statistics: one definition, one name each, used by prune, overlap, view and
# the report (docs/concepts.md, "Overlap statistics", says the same)
# ---------------------------------------------------------------------------------------

EDGE_JACCARD = "edge Jaccard"
"""Of two circuits (one seed each): ``|A & B| / |A | B|`` of their edge sets (:func:`jaccard`)."""
CROSS_TARGET_JACCARD = "cross-target Jaccard"
"""Of two targets: the mean edge Jaccard over every pair of one circuit of each target (every
seed of one with every seed of the other); the headline overlap of two targets."""
SEED_BASELINE_JACCARD = "seed-baseline Jaccard"
"""Of one target: the mean edge Jaccard over every pair of its circuits of different seeds
(how well two prunings of the target agree; a cross-target Jaccard must be below it to mean
more than pruning noise)."""
SHOWN_JACCARD = "edge Jaccard of the edges shown"
"""In the circuit explorer: the edge Jaccard of the two circuits compared, over the edges
its filters leave (the edge Jaccard of that one pair when nothing is filtered)."""
MIN_SEEDS_FOR_INTERVAL = 3
"""An interval over seeds needs at least this many circuits of each target compared: a
bootstrap over two circuits has two distinct values (two seeds once gave ``[0.786, 0.786]``),
so with fewer no interval is computed or shown anywhere."""
INTERVAL = "percentile bootstrap over seeds"
"""The intervals: each target's circuits resampled with replacement (independently per
target), the statistic recomputed, the percentiles at the level asked (95% by default)."""


def has_interval(*seeds_per_target: int) -> bool:
    """Whether circuits of these counts per target get an interval (each at least
    :data:`MIN_SEEDS_FOR_INTERVAL`)."""
    return bool(seeds_per_target) and min(seeds_per_target) >= MIN_SEEDS_FOR_INTERVAL


def no_interval(n_seeds: int) -> str:
    """Why there is no interval, in the words every command and page uses."""
    return (f"no interval ({n_seeds} seed{'' if n_seeds == 1 else 's'} per target; an interval "
            f"needs {MIN_SEEDS_FOR_INTERVAL})")  # fmt: skip


def interval_text(ci: Mapping[str, Any] | None, n_seeds: int) -> str:
    """``95% interval [0.601, 0.701]`` (:data:`INTERVAL`), or :func:`no_interval`'s words
    when ``ci`` is None, has no bounds, or rests on fewer than :data:`MIN_SEEDS_FOR_INTERVAL` seeds."""
    if ci is None or ci.get("low") is None or not has_interval(n_seeds):
        return no_interval(n_seeds)
    return f"{100 * ci['level']:g}% interval [{ci['low']:.3f}, {ci['high']:.3f}]"


def _check_same_graph(a: Circuit, b: Circuit) -> None:
    ga, gb = a.metadata.get("graph"), b.metadata.get("graph")
    if ga is not None and gb is not None:
        # a transformer's layout keys (n_key_value_heads, ...) are recorded only when they
        # differ from GPT-2's, so a missing key is the default on both sides
        keys = ("arch", "n_layers", "n_heads", "n_key_value_heads", "positions", "attn_only",
                "parallel_attn_mlp")  # fmt: skip
        if any(ga.get(k) != gb.get(k) for k in keys):
            raise ValueError(
                f"circuits come from different graphs ({[ga.get(k) for k in keys]} vs "
                f"{[gb.get(k) for k in keys]}); their edges cannot be compared"
            )


def overlap(a: Circuit, b: Circuit) -> Overlap:
    """Shared edges and nodes of two circuits of the same model graph.

    Args:
        a: A circuit.
        b: Another circuit of a model with the same graph.

    Returns:
        The :class:`Overlap`.

    Raises:
        ValueError: The circuits' recorded graphs differ.

    Warns:
        UserWarning: The circuits record different checkpoints (edge names match
            across checkpoints of one shape, their meaning need not).
    """
    _check_same_graph(a, b)
    sha_a, sha_b = a.metadata.get("checkpoint_sha256"), b.metadata.get("checkpoint_sha256")
    if sha_a and sha_b and sha_a != sha_b:
        warnings.warn(
            f"comparing circuits of different checkpoints ({str(sha_a)[:12]} vs {str(sha_b)[:12]}): "
            "the same edge names need not mean the same computation",
            UserWarning,
            stacklevel=2,
        )
    ea, eb = a.edge_set(), b.edge_set()
    shared = ea & eb
    smallest = min(len(ea), len(eb))
    na, nb = set(a.nodes), set(b.nodes)
    return Overlap(
        n_edges_a=len(ea),
        n_edges_b=len(eb),
        shared_edges=sorted(shared),
        jaccard=jaccard(ea, eb),
        overlap_coefficient=len(shared) / smallest if smallest else 0.0,
        shared_nodes=sorted(na & nb, key=_component_key),
        node_jaccard=jaccard(na, nb),
    )


@dataclass
class Stability:
    """Seed-to-seed agreement within targets against overlap across targets.

    Attributes:
        within: Target -> its :data:`SEED_BASELINE_JACCARD` (mean pairwise edge Jaccard of
            its prunings, different seeds).
        across: ``"a vs b"`` -> :data:`CROSS_TARGET_JACCARD` (mean edge Jaccard over all
            pairs, one of ``a``, one of ``b``).
        within_mean: Mean of ``within``.
        across_mean: Mean of ``across``.
        across_below_within: True when every across-target mean is below every
            within-target mean: the targets' circuits differ more than two prunings of
            one target do.
    """

    within: dict[str, float]
    across: dict[str, float]
    within_mean: float
    across_mean: float
    across_below_within: bool

    def summary(self) -> str:
        """One paragraph for a report."""
        parts = [f"{t} {v:.3f}" for t, v in self.within.items()]
        if not self.across:
            return f"{SEED_BASELINE_JACCARD.capitalize()}: {', '.join(parts)} (one target: no {CROSS_TARGET_JACCARD})."
        cross = [f"{k}: {CROSS_TARGET_JACCARD} {v:.3f}" for k, v in self.across.items()]
        verdict = (
            "lower than the seed-to-seed agreement, so the targets' circuits differ beyond pruning noise"
            if self.across_below_within
            else "not lower than the seed-to-seed agreement of every target, so the difference may be pruning noise"
        )
        return (
            f"{SEED_BASELINE_JACCARD.capitalize()}: {', '.join(parts)}. {'; '.join(cross)}: the "
            f"{CROSS_TARGET_JACCARD} is {verdict}."
        )


def seed_stability(circuits: Mapping[str, Sequence[Circuit]]) -> Stability:
    """Mean pairwise Jaccard within each target (across seeds) and across targets.

    Args:
        circuits: Target name -> circuits of that target pruned with different seeds
            (at least two per target; at least two targets for the across part).

    Returns:
        The :class:`Stability`.
    """
    if not circuits:
        raise ValueError("seed_stability needs circuits of at least one target")
    within = {}
    for name, group in circuits.items():
        if len(group) < 2:
            raise ValueError(
                f"target {name!r} has {len(group)} circuit(s); seed stability needs >= 2"
            )
        pairs = list(itertools.combinations(group, 2))
        within[name] = sum(overlap(a, b).jaccard for a, b in pairs) / len(pairs)
    across = {}
    for (na, ga), (nb, gb) in itertools.combinations(circuits.items(), 2):
        values = [overlap(a, b).jaccard for a in ga for b in gb]
        across[f"{na} vs {nb}"] = sum(values) / len(values)
    within_mean = sum(within.values()) / len(within)
    across_mean = sum(across.values()) / len(across) if across else float("nan")
    below = bool(across) and max(across.values()) < min(within.values())
    return Stability(within, across, within_mean, across_mean, below)


__getattr__ = moved_names(__name__)  # plot_circuit: mechlab.viz.circuits.circuit_figure
