"""Planted circuits in random models: transformers and dense SSMs whose circuit is known.

A planted model is an ordinary mechlab model whose weights are random except where a
circuit is planted, built so that the circuit's edges are *exactly* the edges that can
change the output under interchange ablation. The residual stream has two parts:

* the **feature** part: 2-dim *slots*, slot 0 the read-in's copy of the input feature
  (a unit vector, the only input that differs between a trace and its corrupted twin)
  and one slot per circuit component, written by that component only;
* the **context** part (``d_noise`` dims): the read-in's random image of the context
  inputs (identical in the clean and corrupted traces), the position table and the
  outputs of every off-circuit component.

Every off-circuit head and MLP has random weights, reads the context part only and
writes into it (so it never sees the feature, and its output is the same in the clean
and the corrupted run: its outgoing edges are inert); its attention is by content (the
queries and keys are random projections of the context, at a scale that makes the
patterns peaked). Circuit components read the slots of their planted inputs and write
only their own slot; circuit heads also attend by content through the context part of
their queries and keys. The read-out reads each path's last slot, at a gain that sets
the path's strength, and the context part at random. The models have no normalisation
(``normalization="none"``; the dense SSM's norms are identities), like Tracr's compiled
programs: a LayerNorm would couple every reader to the feature through the variance.

Paths (``PlantedSpec.paths``; components placed at random from ``seed``):

* ``skip``: ``embed -> out``;
* ``value``: two-hop V-composition through an MLP,
  ``embed -> A.v, A -> B.v, B -> m.in, m -> out`` (head ``A`` in an earlier layer
  than ``B``, ``m`` the MLP of ``B``'s layer or a later one: a random nonlinear map);
* ``qk``: Q/K composition, ``embed -> A.v, A -> B.q, embed -> B.k, embed -> B.v,
  B -> out``: ``B``'s attention pattern depends on the features through ``A``;
* dense SSM ``chain``: ``embed -> la.in, la -> lb.in, lb -> out`` (``la < lb``, each
  a rotation of a 2-dim state by its input's angle: the state is the running sum of
  angles, a nonlinear function of the whole prefix); ``single``: ``embed -> la.in,
  la -> out``. Off-circuit layers rotate a 4-dim state by a random orthogonal map of
  the context angle and write it at random into the context part.

``strengths`` set each path's share of the output: path ``p``'s read-out gain is
calibrated so that the RMS over traces of its contribution's clean-minus-corrupted
difference is ``strengths[p]`` (so 1:10 is a tenfold difference in amplitude, a
hundredfold in squared error). The read-out's context part adds an output that every
circuit leaves alone (it is the same in both runs).

Ground truth (:func:`single_edge_effects`, :func:`check_ground_truth`): exhaustive
single-edge ablation, each effect the mean squared change of the output divided by that
of ablating every edge. Every planted edge must reach :data:`EFFECT_FLOOR` and every
other edge stay below :data:`INERT_TOLERANCE` (exact zeros in practice: an off-circuit
writer's clean and ablated outputs are bitwise equal). ``tests/prune/test_planted_family.py``
checks it for every model of :data:`PLANTED_FAMILY` and that the default search recovers
each exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from mechlab.models.dense_ssm import DenseSSM, DenseSSMConfig
from mechlab.models.transformer import Transformer, TransformerConfig
from mechlab.prune.forward import make_ablation, masked_forward, writer_outputs
from mechlab.prune.graph import build_graph
from mechlab.traces import PruneData, Traces

Edge = tuple[str, str]
TRANSFORMER_PATHS = ("skip", "value", "qk")
SSM_PATHS = ("skip", "chain", "single")
EFFECT_FLOOR = 1e-3  # every planted edge's single-edge effect, relative to ablating all
INERT_TOLERANCE = 1e-8  # every other edge's (float32 rounding of the masked forward: <= 3.2e-10 measured)
D_HEAD = 4  # dims 0-1: the feature part of q, k, v; dims 2-3: the content part
D_MLP = 8
D_CTX = 4  # context inputs of a transformer (a unit vector pair for the dense SSM)
CONTENT_SCALE = 2.0  # std of the content scores of every head (peaked patterns)


@dataclass(frozen=True)
class PlantedSpec:
    """What to plant (module docstring).

    Args:
        arch: ``"transformer"`` or ``"dense_ssm"``.
        n_layers: Layers, 2 to 4.
        n_heads: Heads per layer, 2 to 8 (transformer).
        paths: Path kinds (:data:`TRANSFORMER_PATHS` or :data:`SSM_PATHS`), each at most once.
        strengths: Each path's RMS output difference (positive; their ratio is what matters).
        d_noise: Width of the context part of the stream.
        seed: Seeds the placement and every random weight.
    """

    arch: str = "transformer"
    n_layers: int = 2
    n_heads: int = 2
    paths: tuple[str, ...] = ("skip", "value")
    strengths: tuple[float, ...] = (1.0, 1.0)
    d_noise: int = 12
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ("transformer", "dense_ssm"):
            raise ValueError(f"arch must be 'transformer' or 'dense_ssm', got {self.arch!r}")
        if not (isinstance(self.n_layers, int) and 2 <= self.n_layers <= 4):
            raise ValueError(f"n_layers must be 2, 3 or 4, got {self.n_layers!r}")
        if self.arch == "transformer" and not (isinstance(self.n_heads, int) and 2 <= self.n_heads <= 8):
            raise ValueError(f"n_heads must be an integer from 2 to 8, got {self.n_heads!r}")
        kinds = TRANSFORMER_PATHS if self.arch == "transformer" else SSM_PATHS
        if not self.paths or len(set(self.paths)) != len(self.paths) or not set(self.paths) <= set(kinds):
            raise ValueError(f"paths must be distinct kinds from {kinds}, got {self.paths!r}")
        if len(self.strengths) != len(self.paths) or not all(
            isinstance(s, (int, float)) and math.isfinite(s) and s > 0 for s in self.strengths
        ):
            raise ValueError(f"strengths must be one positive number per path, got {self.strengths!r}")
        if not (isinstance(self.d_noise, int) and self.d_noise >= 6):
            raise ValueError(f"d_noise must be an integer >= 6, got {self.d_noise!r}")


@dataclass
class PlantedModel:
    """A planted model and its circuit.

    Attributes:
        model: The model (eval mode, float32).
        edges: The planted edges (the ground truth).
        paths: Path kind -> its edges.
        spec: What was planted.
        components: Path kind -> the components it runs through, in order.
    """

    model: nn.Module
    edges: frozenset[Edge]
    paths: dict[str, frozenset[Edge]]
    spec: PlantedSpec
    components: dict[str, list[str]] = field(default_factory=dict)

    def data(self, seed: int = 0, n_train: int = 32, n_test: int = 64, n_pos: int = 6) -> PruneData:
        """Training and held-out traces with their corrupted twins (:func:`planted_data`)."""
        return planted_data(self.spec.arch, seed, n_train, n_test, n_pos)


# ---------------------------------------------------------------------------------------
# Traces
# ---------------------------------------------------------------------------------------


def _unit(n: int, n_pos: int, gen: torch.Generator) -> Tensor:
    angle = 2 * math.pi * torch.rand(n, n_pos, generator=gen)
    return torch.stack([angle.cos(), angle.sin()], dim=-1)  # [n, pos, 2]


def planted_data(
    arch: str = "transformer", seed: int = 0, n_train: int = 32, n_test: int = 64, n_pos: int = 6
) -> PruneData:
    """Traces for a planted model: ``[feature (2), context]`` per position.

    The feature is a random unit vector per position; the corrupted twin draws new
    features and keeps the context (a transformer's: ``D_CTX`` standard normals; a dense
    SSM's: a unit vector), so the context's edges are inert under interchange ablation.
    """

    def traces(n: int, s: int) -> Traces:
        gen = torch.Generator().manual_seed(s)
        feature, twin = _unit(n, n_pos, gen), _unit(n, n_pos, gen)
        context = torch.randn(n, n_pos, D_CTX, generator=gen) if arch == "transformer" else _unit(n, n_pos, gen)
        return Traces(inputs=torch.cat([feature, context], -1), corrupted=torch.cat([twin, context], -1))

    return PruneData(traces(n_train, 1000 * seed + 1), traces(n_test, 1000 * seed + 2),
                     info={"data_seed": seed, "planted": arch})  # fmt: skip


# ---------------------------------------------------------------------------------------
# Transformers
# ---------------------------------------------------------------------------------------


class _Layout:
    """Where things live in the stream: feature slots first, then the context part."""

    def __init__(self, n_slots: int, d_noise: int):
        self.n_slots = n_slots
        self.noise = slice(2 * n_slots, 2 * n_slots + d_noise)
        self.d_model = 2 * n_slots + d_noise

    def slot(self, i: int) -> slice:
        return slice(2 * i, 2 * i + 2)


def _randn(gen: torch.Generator, *shape: int, std: float = 1.0) -> Tensor:
    return std * torch.randn(*shape, generator=gen)


def _place(spec: PlantedSpec, gen: torch.Generator) -> dict[str, dict[str, tuple[int, int]]]:
    """Random distinct heads (layer, head) for each transformer path's ``A`` and ``B``."""
    L, H = spec.n_layers, spec.n_heads
    taken: set[tuple[int, int]] = set()
    placed: dict[str, dict[str, tuple[int, int]]] = {}
    for kind in spec.paths:
        if kind == "skip":
            continue
        for _ in range(1000):
            la = int(torch.randint(0, L - 1, (1,), generator=gen))
            lb = int(torch.randint(la + 1, L, (1,), generator=gen))
            a = (la, int(torch.randint(0, H, (1,), generator=gen)))
            b = (lb, int(torch.randint(0, H, (1,), generator=gen)))
            if a not in taken and b not in taken:
                break
        else:  # pragma: no cover - 2x2 heads hold the two multi-head paths
            raise ValueError(f"no free heads for path {kind!r} in {L} layers x {H} heads")
        taken |= {a, b}
        entry = {"A": a, "B": b}
        if kind == "value":
            entry["m"] = (int(torch.randint(lb, L, (1,), generator=gen)), 0)
        placed[kind] = entry
    mlps = [e["m"][0] for e in placed.values() if "m" in e]
    if len(mlps) != len(set(mlps)):  # pragma: no cover - one value path per spec
        raise ValueError("two paths share an MLP")
    return placed


def _off_circuit_head(attn: nn.Module, h: int, lay: _Layout, gen: torch.Generator) -> None:
    """Random q, k, v from the context part; the output into the context part."""
    n = lay.noise.stop - lay.noise.start
    for W, std in ((attn.W_Q, CONTENT_SCALE), (attn.W_K, 1.0), (attn.W_V, 1.0)):
        W[h, lay.noise] = _randn(gen, n, D_HEAD, std=std / math.sqrt(n))
    attn.W_O[h, :, lay.noise] = _randn(gen, D_HEAD, n, std=0.5 / math.sqrt(D_HEAD))


def _content(attn: nn.Module, h: int, lay: _Layout, gen: torch.Generator) -> None:
    """A circuit head's content attention: q, k dims 2-3 from the context part."""
    n = lay.noise.stop - lay.noise.start
    attn.W_Q[h, lay.noise, 2:] = _randn(gen, n, D_HEAD - 2, std=CONTENT_SCALE / math.sqrt(n))
    attn.W_K[h, lay.noise, 2:] = _randn(gen, n, D_HEAD - 2, std=1.0 / math.sqrt(n))


def _head_name(layer: int, head: int) -> str:
    return f"a{layer}.h{head}"


def planted_transformer(spec: PlantedSpec) -> PlantedModel:
    """A random transformer with ``spec``'s paths planted (module docstring)."""
    gen = torch.Generator().manual_seed(spec.seed)
    placed = _place(spec, gen)
    writers = ["embed"]  # circuit writers in slot order
    for kind in spec.paths:
        if kind != "skip":
            writers += [f"{kind}.A", f"{kind}.B"] + ([f"{kind}.m"] if kind == "value" else [])
    lay = _Layout(len(writers), spec.d_noise)
    slot = {w: lay.slot(i) for i, w in enumerate(writers)}
    cfg = TransformerConfig(
        d_model=lay.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, d_head=D_HEAD,
        d_mlp=D_MLP, d_in=2 + D_CTX, d_out=2, n_ctx=16, normalization="none", act_fn="gelu",
    )  # fmt: skip
    model = Transformer(cfg)
    n = spec.d_noise
    circuit_heads = {e[k] for e in placed.values() for k in ("A", "B")}
    circuit_mlps = {e["m"][0] for e in placed.values() if "m" in e}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        W_in = model.read_in.proj.weight  # [d_model, d_in]
        W_in[slot["embed"], :2] = torch.eye(2)
        W_in[lay.noise, 2:] = _randn(gen, n, D_CTX, std=1.0 / math.sqrt(D_CTX))
        model.W_pos[:, lay.noise] = _randn(gen, cfg.n_ctx, n, std=0.3)
        for layer, block in enumerate(model.blocks):
            for h in range(spec.n_heads):
                if (layer, h) not in circuit_heads:
                    _off_circuit_head(block.attn, h, lay, gen)
            mlp = block.mlp
            if layer not in circuit_mlps:
                mlp.W_in[lay.noise] = _randn(gen, n, D_MLP, std=1.0 / math.sqrt(n))
                mlp.b_in.copy_(_randn(gen, D_MLP, std=0.5))
                mlp.W_out[:, lay.noise] = _randn(gen, D_MLP, n, std=0.5 / math.sqrt(D_MLP))
        edges: dict[str, frozenset[Edge]] = {}
        components: dict[str, list[str]] = {}
        finals: dict[str, slice] = {}
        for kind in spec.paths:
            if kind == "skip":
                edges[kind], components[kind] = frozenset({("embed", "out")}), ["embed"]
                finals[kind] = slot["embed"]
                continue
            (la, ha), (lb, hb) = placed[kind]["A"], placed[kind]["B"]
            A, B = model.blocks[la].attn, model.blocks[lb].attn
            a, b = _head_name(la, ha), _head_name(lb, hb)
            # A: attends by content, averages the feature, writes its slot
            _content(A, ha, lay, gen)
            A.W_V[ha, slot["embed"], :2] = torch.eye(2)
            A.W_O[ha, :2, slot[f"{kind}.A"]] = _rotation(gen)
            _content(B, hb, lay, gen)
            B.W_O[hb, :2, slot[f"{kind}.B"]] = _rotation(gen)
            if kind == "value":
                B.W_V[hb, slot[f"{kind}.A"], :2] = torch.eye(2)  # V-composition
                lm = placed[kind]["m"][0]
                mlp = model.blocks[lm].mlp
                mlp.W_in[slot[f"{kind}.B"]] = _randn(gen, 2, D_MLP, std=2.0)
                mlp.W_in[lay.noise] = _randn(gen, n, D_MLP, std=0.5 / math.sqrt(n))
                mlp.b_in.copy_(_randn(gen, D_MLP, std=0.5))
                mlp.W_out[:, slot[f"{kind}.m"]] = _randn(gen, D_MLP, 2, std=1.0 / math.sqrt(D_MLP))
                m = f"m{lm}"
                edges[kind] = frozenset({("embed", f"{a}.v"), (a, f"{b}.v"), (b, f"{m}.in"), (m, "out")})
                components[kind] = ["embed", a, b, m]
                finals[kind] = slot[f"{kind}.m"]
            else:  # qk: B's query reads A, its key and value the feature
                B.W_Q[hb, slot[f"{kind}.A"], :2] = 3.0 * torch.eye(2)
                B.W_K[hb, slot["embed"], :2] = torch.eye(2)
                B.W_V[hb, slot["embed"], :2] = torch.eye(2)
                edges[kind] = frozenset({("embed", f"{a}.v"), (a, f"{b}.q"), ("embed", f"{b}.k"),
                                         ("embed", f"{b}.v"), (b, "out")})  # fmt: skip
                components[kind] = ["embed", a, b]
                finals[kind] = slot[f"{kind}.B"]
        model.read_out.proj.weight[:, lay.noise] = _randn(gen, 2, n, std=1.0 / math.sqrt(n))
    model.eval()
    _calibrate(model, spec, finals, lay)
    return PlantedModel(model, frozenset().union(*edges.values()), edges, spec, components)


def _rotation(gen: torch.Generator) -> Tensor:
    angle = 2 * math.pi * float(torch.rand((), generator=gen))
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s], [s, c]])


@torch.no_grad()
def _calibrate(model: nn.Module, spec: PlantedSpec, finals: dict[str, slice], lay: _Layout) -> None:
    """Set each path's read-out gain so its output difference has RMS ``strength``."""
    data = planted_data(spec.arch, seed=10_000 + spec.seed, n_train=256, n_test=1)
    clean = writer_outputs(model, data.train.inputs).sum(0)  # the final residual stream
    corrupt = writer_outputs(model, data.train.corrupted).sum(0)
    W = model.read_out.proj.weight
    for kind, strength in zip(spec.paths, spec.strengths, strict=True):
        diff = (clean - corrupt)[..., finals[kind]]  # [batch, pos, 2]
        rms = float(diff.pow(2).sum(-1).mean().sqrt())
        W[:, finals[kind]] = (strength / rms) * torch.eye(2)


# ---------------------------------------------------------------------------------------
# Dense SSMs
# ---------------------------------------------------------------------------------------


def _rotation_transition(ssm: nn.Module, reads: slice, states: slice, Q: Tensor | None = None) -> None:
    """``A(x) = Q R(angle of x[reads])`` on the state block ``states`` (2 or 4 dims):
    ``x[reads] = (cos, sin)`` of a unit vector gives a rotation (orthogonal: the state's
    norm is kept)."""
    d = states.stop - states.start
    J = torch.zeros(d, d)
    for i in range(0, d, 2):
        J[i, i + 1], J[i + 1, i] = -1.0, 1.0
    Q = torch.eye(d) if Q is None else Q
    c, s = reads.start, reads.start + 1
    ssm.W_A[states, states, c] = Q
    ssm.W_A[states, states, s] = Q @ J


def planted_dense_ssm(spec: PlantedSpec) -> PlantedModel:
    """A dense SSM with ``spec``'s paths planted (module docstring); its norms are identities."""
    gen = torch.Generator().manual_seed(spec.seed)
    L = spec.n_layers
    perm = torch.randperm(L, generator=gen).tolist()
    used: dict[str, list[int]] = {}
    free = list(perm)
    for kind in spec.paths:
        if kind == "chain":
            pair = sorted(free[:2])
            used[kind], free = pair, free[2:]
        elif kind == "single":
            used[kind], free = [free[0]], free[1:]
    if len(free) < 0 or sum(len(v) for v in used.values()) > L:  # pragma: no cover
        raise ValueError("not enough layers for the paths")
    writers = ["embed"] + [f"l{i}" for v in used.values() for i in v]
    lay = _Layout(len(writers), spec.d_noise)
    slot = {w: lay.slot(i) for i, w in enumerate(writers)}
    ctx = slice(lay.noise.start, lay.noise.start + 2)  # the context angle, written by embed only
    rest = slice(lay.noise.start + 2, lay.noise.stop)
    d_state = 4
    cfg = DenseSSMConfig(d_model=lay.d_model, n_layers=L, d_state=d_state, d_in=2 + 2, d_out=2, n_ctx=16)
    model = DenseSSM(cfg)
    for block in model.blocks:
        block.norm = nn.Identity()
    model.ln_final = nn.Identity()
    in_circuit = {i for v in used.values() for i in v}
    n_rest = rest.stop - rest.start
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        W_in = model.read_in.proj.weight
        W_in[slot["embed"], :2] = torch.eye(2)
        W_in[ctx, 2:] = torch.eye(2)
        for layer, block in enumerate(model.blocks):
            ssm = block.ssm
            if layer in in_circuit:
                continue
            Q = torch.linalg.qr(_randn(gen, d_state, d_state))[0]
            _rotation_transition(ssm, ctx, slice(0, d_state), Q)
            ssm.h_init.copy_(torch.nn.functional.normalize(_randn(gen, d_state), dim=0))
            ssm.W_out.weight[rest] = _randn(gen, n_rest, d_state, std=0.7)
        edges: dict[str, frozenset[Edge]] = {}
        components: dict[str, list[str]] = {}
        finals: dict[str, slice] = {}
        for kind in spec.paths:
            if kind == "skip":
                edges[kind], components[kind], finals[kind] = frozenset({("embed", "out")}), ["embed"], slot["embed"]
                continue
            layers = used[kind]
            source = "embed"
            path_edges = []
            for layer in layers:
                ssm = model.blocks[layer].ssm
                _rotation_transition(ssm, slot[source], slice(0, 2))
                ssm.h_init[0] = 1.0
                ssm.W_out.weight[slot[f"l{layer}"], :2] = _rotation(gen)
                path_edges.append((source, f"l{layer}.in"))
                source = f"l{layer}"
            path_edges.append((source, "out"))
            edges[kind], components[kind] = frozenset(path_edges), ["embed"] + [f"l{i}" for i in layers]
            finals[kind] = slot[source]
        model.read_out.proj.weight[:, rest] = _randn(gen, 2, n_rest, std=1.0 / math.sqrt(n_rest))
    model.eval()
    _calibrate(model, spec, finals, lay)
    return PlantedModel(model, frozenset().union(*edges.values()), edges, spec, components)


def planted_model(spec: PlantedSpec) -> PlantedModel:
    """The planted model of ``spec`` (a transformer or a dense SSM)."""
    return planted_transformer(spec) if spec.arch == "transformer" else planted_dense_ssm(spec)


# ---------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------


@torch.no_grad()
def single_edge_effects(model: nn.Module, data: PruneData) -> dict[Edge, float]:
    """Every edge's effect under interchange ablation on the held-out traces.

    Returns:
        Edge -> ``mean |f(one edge ablated) - f|^2 / mean |f(every edge ablated) - f|^2``.
    """
    graph = build_graph(model)
    x = data.test.inputs
    ablated = make_ablation(model, "interchange", data.test)
    full = masked_forward(model, graph, x, ablated, torch.ones(graph.n_edges))  # = model(x) to rounding
    gap = float((masked_forward(model, graph, x, ablated, torch.zeros(graph.n_edges)) - full).pow(2).mean())
    effects = {}
    for i, edge in enumerate(graph.edges):
        z = torch.ones(graph.n_edges)
        z[i] = 0.0
        effects[edge] = float((masked_forward(model, graph, x, ablated, z) - full).pow(2).mean()) / gap
    return effects


def check_ground_truth(
    planted: PlantedModel,
    data: PruneData | None = None,
    floor: float = EFFECT_FLOOR,
    tolerance: float = INERT_TOLERANCE,
) -> dict[str, float]:
    """Confirm the planted edges are the circuit, by exhaustive single-edge ablation.

    Args:
        planted: The planted model.
        data: Traces (default: ``planted.data()``).
        floor: Every planted edge's relative effect must be at least this.
        tolerance: Every other edge's must be at most this.

    Returns:
        ``min_planted`` and ``max_other`` relative effects, and ``n_edges``.

    Raises:
        ValueError: Naming the weakest planted edge or the strongest other edge.
    """
    effects = single_edge_effects(planted.model, planted.data() if data is None else data)
    missing = planted.edges - set(effects)
    if missing:
        raise ValueError(f"planted edges {sorted(missing)} are not in the model's graph")
    weakest = min(planted.edges, key=lambda e: effects[e])
    others = [e for e in effects if e not in planted.edges]
    strongest = max(others, key=lambda e: effects[e])
    if effects[weakest] < floor:
        raise ValueError(f"planted edge {weakest} has effect {effects[weakest]:.3g} < {floor}")
    if effects[strongest] > tolerance:
        raise ValueError(f"edge {strongest} is not planted but has effect {effects[strongest]:.3g} > {tolerance}")
    return {"min_planted": effects[weakest], "max_other": effects[strongest], "n_edges": len(effects)}


def _specs() -> dict[str, PlantedSpec]:
    T, S = "transformer", "dense_ssm"
    return {
        "t2x2-value": PlantedSpec(T, 2, 2, ("skip", "value"), (1.0, 1.0), seed=1),
        "t2x4-qk-1:3": PlantedSpec(T, 2, 4, ("skip", "qk"), (1.0, 1 / 3), seed=2),
        "t3x4-value-qk": PlantedSpec(T, 3, 4, ("skip", "value", "qk"), (1.0, 0.5, 0.3), seed=3),
        "t4x8-value-1:10": PlantedSpec(T, 4, 8, ("skip", "value"), (1.0, 0.1), seed=4),
        "t3x8-qk-skip-1:10": PlantedSpec(T, 3, 8, ("qk", "skip"), (1.0, 0.1), seed=5),
        "t4x2-value-qk-1:5": PlantedSpec(T, 4, 2, ("value", "qk", "skip"), (1.0, 0.2, 0.5), seed=6),
        "ssm3-chain-1:3": PlantedSpec(S, 3, paths=("skip", "chain"), strengths=(1.0, 1 / 3), seed=7),
        "ssm4-chain-single-1:10": PlantedSpec(S, 4, paths=("chain", "single", "skip"),
                                              strengths=(1.0, 0.3, 0.1), seed=8),  # fmt: skip
    }


PLANTED_FAMILY: dict[str, PlantedSpec] = _specs()
"""The family the default search is held to: 2-4 layers, 2-8 heads, V- and Q/K-composition,
an MLP hop, path strengths from 1:1 to 1:10, and dense SSMs."""


def build_family(family: dict, names: Iterable[str] | None, build, what: str) -> dict:
    """``{name: build(family[name])}`` for ``names`` (default: all), an unknown name refused
    in one line naming ``what`` and the known names."""
    names = list(family) if names is None else list(names)
    unknown = [n for n in names if n not in family]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; choose from {list(family)}")
    return {n: build(family[n]) for n in names}


def planted_family(names: Iterable[str] | None = None) -> dict[str, PlantedModel]:
    """The models of :data:`PLANTED_FAMILY` (or those named), built."""
    return build_family(PLANTED_FAMILY, names, planted_model, "planted models")


__all__ = [
    "EFFECT_FLOOR",
    "INERT_TOLERANCE",
    "PLANTED_FAMILY",
    "PlantedModel",
    "PlantedSpec",
    "check_ground_truth",
    "planted_data",
    "planted_dense_ssm",
    "planted_family",
    "planted_model",
    "planted_transformer",
    "single_edge_effects",
]
