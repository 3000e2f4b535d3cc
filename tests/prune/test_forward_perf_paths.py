"""The masked forward's fast path (mechlab.prune.mixing) against the straightforward one:
same values and same mask gradients (float64), what it keeps for the backward pass, and
when it steps aside."""

from __future__ import annotations

import pytest
import torch

from mechlab.models import build_model
from mechlab.prune.forward import frozen_eval, masked_forward, writer_outputs
from mechlab.prune.graph import build_graph

VARIANTS = {
    "layernorm": {},
    "no_norm_relu_bidirectional": {"normalization": "none", "act_fn": "relu", "causal": False},
    # the options of imported models (Llama: RMSNorm, rotary, SwiGLU, grouped key/value
    # heads, no biases; Pythia: partial rotary, parallel residual) and attention-only
    "llama": {"normalization": "RMS", "positional": "rotary", "gated_mlp": True, "act_fn": "silu",
              "n_heads": 4, "d_head": 4, "n_key_value_heads": 2, "qkv_bias": False, "attn_out_bias": False,
              "mlp_bias": False},
    "neox": {"positional": "rotary", "rotary_dim": 2, "parallel_attn_mlp": True, "act_fn": "gelu"},
    "attn_only": {"attn_only": True},
    # the options added for Qwen3 (query/key norms), OLMo (weightless LayerNorms, clip_qkv
    # that bites) and GPT-J (rotary on adjacent pairs), with a scaled rotary
    "qk_norm_clip": {"normalization": "LNPre", "positional": "rotary", "qk_norm": True, "clip_qkv": 0.03,
                     "rotary_adjacent_pairs": True, "rotary_scaling": {"rope_type": "linear", "factor": 2.0},
                     "parallel_attn_mlp": True, "n_heads": 4, "d_head": 4, "n_key_value_heads": 2},
    # norms after the sublayers: OLMo 2's (no pre-norms, query/key norms over every head) and
    # Gemma's (pre- and post-norms, soft-capping that bites, a window of 3 under 7 positions,
    # local and global rotary bases, scores over sqrt(3))
    "olmo2": {"normalization": "RMS", "positional": "rotary", "pre_norms": False, "post_norms": True,
              "qk_norm": True, "qk_norm_over": "all", "gated_mlp": True, "act_fn": "silu", "n_heads": 4,
              "d_head": 4, "n_key_value_heads": 2, "attn_out_bias": False},
    "gemma": {"normalization": "RMS", "positional": "rotary", "post_norms": True, "qk_norm": True,
              "attn_scale": 3**0.5, "attn_softcap": 0.5, "final_softcap": 0.5, "sliding_window": 3,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
              "rotary_base_local": 10.0, "gated_mlp": True, "n_heads": 4, "d_head": 4,
              "n_key_value_heads": 2, "qkv_bias": False, "attn_out_bias": False, "mlp_bias": False},
}
# every ablation and node-mask setting on the first two, one setting each on the options
CASES = [(v, a, n) for v in list(VARIANTS)[:2] for a in ("interchange", "mean") for n in (False, True)]
CASES += [("llama", "interchange", True), ("neox", "mean", True), ("attn_only", "interchange", False),
          ("qk_norm_clip", "interchange", True), ("olmo2", "interchange", True), ("gemma", "mean", True),
          ("gemma", "interchange", False)]  # fmt: skip


def transformer(seed: int = 0, **fields):
    torch.manual_seed(seed)
    base = {"d_model": 12, "n_layers": 3, "n_heads": 3, "d_in": 4, "d_out": 3, "n_ctx": 8}
    return build_model("transformer", **{**base, **fields}).double().eval()


def rand(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=gen, dtype=torch.float64)


def run(model, graph, x, ablated, z, node, **options):
    """Output and the gradients of a fixed random functional of it w.r.t. both masks."""
    z = z.clone().requires_grad_(True)
    node = None if node is None else node.clone().requires_grad_(True)
    out = masked_forward(model, graph, x, ablated, z, node, **options)
    weights = rand(*out.shape, seed=99)
    (out * weights).sum().backward()
    return out.detach(), z.grad, None if node is None else node.grad


@pytest.mark.parametrize("variant,ablation,nodes", CASES)
def test_fast_path_equals_the_straightforward_one(variant, ablation, nodes):
    model = transformer(**VARIANTS[variant])
    graph = build_graph(model)
    x = torch.randn(3, 7, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x_corrupt = torch.randn(3, 7, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ablated = writer_outputs(model, x_corrupt)
    if ablation == "mean":
        ablated = ablated.mean(dim=1, keepdim=True)  # one value for every trace
    z = rand(graph.n_edges, seed=3)
    node = rand(graph.n_writers, seed=4) if nodes else None
    with frozen_eval(model):
        plain = run(model, graph, x, ablated, z, node, fast=False)
        for recompute in (False, True):
            fast = run(model, graph, x, ablated, z, node, fast=True, recompute=recompute)
            for a, b in zip(fast, plain, strict=True):
                if b is not None:
                    assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), (a - b).abs().max()
    assert plain[1].abs().sum() > 0  # the gradients compared are not all zero


def test_fast_path_on_a_token_model_and_its_edge_gradients_by_finite_differences():
    model = transformer(io="tokens", d_vocab=7)
    graph = build_graph(model)
    x = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(1))
    ablated = writer_outputs(model, torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(2)))
    z0 = rand(graph.n_edges, seed=3)
    picks = [graph.edge_index[e] for e in [("embed", "a2.h0.q"), ("a0.h1", "a1.h2.k"),
             ("pos", "a1.h0.v"), ("a1.h2", "m1.in"), ("m0", "out"), ("a2.h1", "out")]]  # fmt: skip

    def f(sub: torch.Tensor) -> torch.Tensor:
        z = z0.clone()
        z[picks] = sub
        return masked_forward(model, graph, x, ablated, z).pow(2).sum()

    with frozen_eval(model):
        sub = z0[picks].clone().requires_grad_(True)
        assert torch.autograd.gradcheck(f, (sub,), eps=1e-6, atol=1e-6)
        z = z0.clone().requires_grad_(True)
        fast = masked_forward(model, graph, x, ablated, z)
        slow = masked_forward(model, graph, x, ablated, z, fast=False)
    assert torch.allclose(fast, slow, rtol=1e-10, atol=1e-12)


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd keeps for the backward pass while ``fn()`` runs."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def test_recompute_keeps_no_reader_inputs_and_still_gives_the_same_gradients():
    model = transformer(d_model=16, n_layers=2, n_heads=4)
    graph = build_graph(model)
    x = torch.randn(4, 8, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ablated = writer_outputs(model, torch.randn(4, 8, 4, dtype=torch.float64))
    z = rand(graph.n_edges, seed=3).requires_grad_(True)
    one_reader_input = 4 * 8 * 16 * 8  # [batch, pos, d] float64 bytes
    with frozen_eval(model):
        kept = saved_bytes(lambda: masked_forward(model, graph, x, ablated, z))
        recomputed = saved_bytes(lambda: masked_forward(model, graph, x, ablated, z, recompute=True))
    # without recompute the q/k/v, MLP and read-out readers' inputs (3*4 + 1 per layer, + 1) are kept
    assert kept - recomputed >= (2 * 13 + 1) * one_reader_input
    with frozen_eval(model):
        run_a = run(model, graph, x, ablated, z.detach(), None, recompute=True)
        run_b = run(model, graph, x, ablated, z.detach(), None, recompute=False)
    assert torch.equal(run_a[0], run_b[0]) and torch.allclose(run_a[1], run_b[1], rtol=1e-12)


def test_a_trainable_parameter_takes_the_straightforward_path_and_gets_its_gradient():
    model = transformer()
    graph = build_graph(model)
    x = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ablated = writer_outputs(model, torch.randn(2, 5, 4, dtype=torch.float64))
    z = rand(graph.n_edges, seed=3)
    for p in model.parameters():
        p.requires_grad_(False)
    w_q = model.blocks[1].attn.W_Q
    w_q.requires_grad_(True)  # e.g. someone fine-tuning through the masked pass
    masked_forward(model, graph, x, ablated, z).pow(2).sum().backward()
    assert w_q.grad is not None and w_q.grad.abs().sum() > 0
