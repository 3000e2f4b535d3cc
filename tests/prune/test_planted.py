"""Planted circuits: hand-built models in which a known set of edges does all the work.

Every model here writes each component's output into its own 4-dim *slot* of the
residual stream as ``[v, -v]`` (``v`` 2-dim), so every write has zero mean, and its
LayerNorms have ``eps = 1e8`` and weight ``1e4``: in float32 ``var + eps`` rounds to
``eps``, so each norm is exactly ``x - mean(x) = x``, and a reader sees only what its
weights pick out of the stream. Components off the circuit write exactly zero. Inputs
are unit vectors in the plane; the interchange ablation swaps them for other unit vectors.

The family (``PLANTED``):

* ``value``: two-hop value composition, an MLP and a skip:
  embed -> a0.hA.v, a0.hA -> a1.hB.v, a1.hB -> m1.in, m1 -> out, embed -> out;
* ``qk``: a head whose query reads an earlier head and whose key and value read the
  embedding: embed -> a0.hA.v, a0.hA -> a1.hB.q, embed -> a1.hB.k, embed -> a1.hB.v,
  a1.hB -> out;
* both on a 2-layer, 2-head graph (61 edges) and a 3-layer, 4-head graph (302 edges,
  the circuit spread over layers 0 and 2);
* ``dense_ssm``: a 3-layer dense SSM whose layers 0 and 2 rotate a state by their
  input's angle (layer 1 writes zero): embed -> l0.in, l0 -> l2.in, l2 -> out,
  embed -> out (4 of 10 edges).

:func:`single_edge_effects` checks by exhaustive single-edge ablation that every planted
edge matters and every other edge is inert; the search must then recover the planted
edges exactly, at :func:`prune`'s default settings, for every seed.
"""

from __future__ import annotations

import math

import pytest
import torch

from mechlab.models.dense_ssm import DenseSSM, DenseSSMConfig
from mechlab.models.transformer import Transformer, TransformerConfig
from mechlab.prune.engine import prune
from mechlab.prune.forward import make_ablation, masked_forward
from mechlab.prune.graph import build_graph, countable_edges
from mechlab.traces import PruneData, Traces

LN_EPS, LN_WEIGHT = 1e8, 1e4  # float32: var + 1e8 == 1e8, so every norm is the identity


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def write(W: torch.Tensor, slot: int, rows: tuple[int, int], scale: float = 1.0) -> None:
    """``W[rows] -> slot`` as ``[v, -v]``: ``W`` is ``[..., d_model]`` (output side last)."""
    for i, row in enumerate(rows):
        W[row, 4 * slot + i] = scale
        W[row, 4 * slot + 2 + i] = -scale


def blank_transformer(cfg: TransformerConfig) -> Transformer:
    """A transformer that writes nothing but its input, into slot 0: every weight zero, every
    norm the identity (see the module docstring)."""
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for block in model.blocks:
            block.ln1.w.fill_(LN_WEIGHT)
            block.ln2.w.fill_(LN_WEIGHT)
        model.ln_final.w.fill_(LN_WEIGHT)
        write(model.read_in.proj.weight.T, 0, (0, 1))  # slot 0: the input
    return model


def planted_transformer(kind: str, n_layers: int = 2, n_heads: int = 2):
    """A transformer with the planted ``kind`` circuit (``"value"`` or ``"qk"``).

    Returns:
        ``(model, planted edges)``.
    """
    cfg = TransformerConfig(d_model=16, n_layers=n_layers, n_heads=n_heads, d_head=2, d_mlp=4,
                            d_in=2, d_out=2, n_ctx=8, layer_norm_eps=LN_EPS, act_fn="gelu")  # fmt: skip
    model = blank_transformer(cfg)
    first, last = 0, n_layers - 1
    hA, hB = (0, 1) if n_heads == 2 else (2, 1)
    a, b = f"a{first}.h{hA}", f"a{last}.h{hB}"
    with torch.no_grad():
        head_a, head_b = model.blocks[first].attn, model.blocks[last].attn
        head_a.W_V[hA, 0, 0], head_a.W_V[hA, 1, 1] = 1.0, 1.0  # uniform attention over slot 0
        write(head_a.W_O[hA], 1, (0, 1), 2.0)  # -> slot 1
        head_b.W_V[hB, 4 * (kind == "value"), 0] = 1.0  # value: slot 1 (value) or slot 0 (qk)
        head_b.W_V[hB, 4 * (kind == "value") + 1, 1] = 1.0
        write(head_b.W_O[hB], 2, (0, 1), 2.0)  # -> slot 2
        read_out = model.read_out.proj.weight
        if kind == "value":
            mlp = model.blocks[last].mlp  # even, so nonlinear: gelu(u) + gelu(-u)
            for i, sign in enumerate((1.0, -1.0, 1.0, -1.0)):
                mlp.W_in[8 + i // 2, i] = 3.0 * sign
            for i in range(4):
                mlp.W_out[i, 12 + i // 2], mlp.W_out[i, 14 + i // 2] = 1.0, -1.0
            read_out[0, 12], read_out[1, 13] = 1.0, 1.0  # the MLP
            read_out[0, 0], read_out[1, 1] = 0.5, 0.5  # the skip
            edges = {("embed", f"{a}.v"), (a, f"{b}.v"), (b, f"m{last}.in"), (f"m{last}", "out"),
                     ("embed", "out")}  # fmt: skip
        elif kind == "qk":
            head_b.W_Q[hB, 4, 0], head_b.W_Q[hB, 5, 1] = 3.0, 3.0  # query: slot 1
            head_b.W_K[hB, 0, 0], head_b.W_K[hB, 1, 1] = 3.0, 3.0  # key: slot 0
            read_out[0, 8], read_out[1, 9] = 1.0, 1.0
            edges = {("embed", f"{a}.v"), (a, f"{b}.q"), ("embed", f"{b}.k"), ("embed", f"{b}.v"),
                     (b, "out")}  # fmt: skip
        else:
            raise ValueError(f"unknown planted circuit {kind!r}")
    return model.eval(), edges


def planted_dense_ssm():
    """A 3-layer dense SSM: layers 0 and 2 rotate a unit state by their input's angle."""
    cfg = DenseSSMConfig(d_model=16, n_layers=3, d_state=2, d_in=2, d_out=2, n_ctx=8)
    model = DenseSSM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in [model.ln_final] + [block.norm for block in model.blocks]:
            norm.eps = LN_EPS
            norm.weight.fill_(LN_WEIGHT)
        write(model.read_in.proj.weight.T, 0, (0, 1))
        for layer, (src, dst) in ((0, (0, 1)), (2, (1, 2))):
            ssm = model.blocks[layer].ssm
            c, s = 4 * src, 4 * src + 1  # A(x) = [[x0, -x1], [x1, x0]]: a rotation
            ssm.W_A[0, 0, c], ssm.W_A[0, 1, s], ssm.W_A[1, 0, s], ssm.W_A[1, 1, c] = 1, -1, 1, 1
            ssm.h_init[0] = 1.0
            write(ssm.W_out.weight.T, dst, (0, 1))
        read_out = model.read_out.proj.weight
        read_out[0, 8], read_out[1, 9], read_out[0, 0], read_out[1, 1] = 1.0, 1.0, 0.5, 0.5
    edges = {("embed", "l0.in"), ("l0", "l2.in"), ("l2", "out"), ("embed", "out")}
    return model.eval(), edges


PLANTED = {
    "value-61": lambda: planted_transformer("value"),
    "qk-61": lambda: planted_transformer("qk"),
    "value-302": lambda: planted_transformer("value", n_layers=3, n_heads=4),
    "qk-302": lambda: planted_transformer("qk", n_layers=3, n_heads=4),
    "dense_ssm-10": planted_dense_ssm,
}


def unit_vectors(batch: int, n_pos: int, seed: int) -> torch.Tensor:
    angle = 2 * math.pi * torch.rand(batch, n_pos, generator=torch.Generator().manual_seed(seed))
    return torch.stack([angle.cos(), angle.sin()], dim=-1)  # [batch, pos, 2]


def planted_data(seed: int = 0, n_train: int = 16, n_test: int = 32, n_pos: int = 5) -> PruneData:
    def traces(n: int, s: int) -> Traces:
        return Traces(inputs=unit_vectors(n, n_pos, s), corrupted=unit_vectors(n, n_pos, s + 1))

    return PruneData(traces(n_train, 10 * seed), traces(n_test, 10 * seed + 5))


@torch.no_grad()
def single_edge_effects(model, data: PruneData) -> dict[tuple[str, str], float]:
    """Mean squared change of the output when one edge alone is ablated, for every edge."""
    graph = build_graph(model)
    x = data.test.inputs
    ablated = make_ablation(model, "interchange", data.test)
    full = model(x)
    effects = {}
    for i, edge in enumerate(graph.edges):
        z = torch.ones(graph.n_edges)
        z[i] = 0.0
        effects[edge] = float((masked_forward(model, graph, x, ablated, z) - full).pow(2).mean())
    return effects


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_edges_matter_and_every_other_edge_is_inert(name):
    model, planted = PLANTED[name]()
    effects = single_edge_effects(model, planted_data())
    assert planted <= set(effects)
    assert min(effects[e] for e in planted) > 1e-3
    assert max(v for e, v in effects.items() if e not in planted) < 1e-12


@pytest.mark.parametrize("name", list(PLANTED))
def test_default_search_recovers_the_planted_circuit_exactly(name):
    model, planted = PLANTED[name]()
    graph = build_graph(model)
    n_countable = int(countable_edges(graph, "interchange").sum())
    sparsity = 1 - len(planted) / n_countable
    for seed in range(2):  # optimiser and data seeds both vary
        circuit = prune(model, planted_data(seed), "all", sparsity, seed=seed, progress=False)
        assert set(circuit.edges) == planted, f"seed {seed}"
        metrics = circuit.metadata["metrics"]
        assert metrics["faithfulness"] > 0.999
        assert metrics["complement_faithfulness"] < 0.01
