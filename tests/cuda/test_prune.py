"""The masked forward (both paths, mask gradients included) and a pruning run on the
accelerator against the CPU.

Everything here runs in float64 on both devices, so the two agree to about 1e-10 and a
pruning run's masks follow the same trajectory (the engine draws its noise and batches
from a CPU generator on every device, so only arithmetic differs).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import mechlab
from mechlab.prune import PruneData, Traces, build_graph, masked_forward, prune, writer_outputs
from mechlab.prune.forward import frozen_eval, make_ablation

N_POS, D_IN, D_OUT = 7, 4, 3
FAMILIES = {
    "transformer": {"arch": "transformer", "d_model": 12, "n_layers": 3, "n_heads": 3},
    "transformer_tokens": {"arch": "transformer", "d_model": 12, "n_layers": 2, "n_heads": 2,
                           "io": "tokens", "d_vocab": 7},
    # the options imported models need (Llama: RMSNorm, rotary, SwiGLU, grouped key/value
    # heads; Pythia: partial rotary, parallel residual) and the attention-only option
    "transformer_llama": {"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 4,
                          "n_key_value_heads": 2, "normalization": "RMS", "positional": "rotary",
                          "gated_mlp": True, "act_fn": "silu", "io": "tokens", "d_vocab": 7},
    "transformer_neox": {"arch": "transformer", "d_model": 12, "n_layers": 2, "n_heads": 2,
                         "positional": "rotary", "rotary_dim": 2, "parallel_attn_mlp": True},
    "transformer_attn_only": {"arch": "transformer", "d_model": 12, "n_layers": 2, "n_heads": 3,
                              "attn_only": True},
    "lstm": {"arch": "lstm", "d_model": 8, "n_layers": 2},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 8, "n_layers": 2},
    "mamba": {"arch": "mamba", "d_model": 8, "n_layers": 2},
}  # fmt: skip


def make(family: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = {"d_in": D_IN, "d_out": D_OUT, "n_ctx": 8, **FAMILIES[family]}
    if cfg.get("io") == "tokens":
        cfg.pop("d_in"), cfg.pop("d_out")
    return mechlab.build_model(cfg).double().eval()


def inputs(model, batch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if model.cfg.io == "tokens":
        return torch.randint(0, model.cfg.d_vocab, (batch, N_POS), generator=g)
    return torch.randn(batch, N_POS, D_IN, generator=g, dtype=torch.float64)


def run(model, graph, x, ablated, z, **options):
    """Output and the mask gradient of a fixed random functional of it."""
    z = z.clone().requires_grad_(True)
    out = masked_forward(model, graph, x, ablated, z, **options)
    weights = torch.rand(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    (out * weights.to(out.device)).sum().backward()
    return out.detach().cpu(), z.grad.cpu()


def close(a, b, what, tol=1e-10):
    assert torch.allclose(a.cpu(), b.cpu(), rtol=tol, atol=tol), (what, float((a.cpu() - b.cpu()).abs().max()))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("ablation", ["interchange", "mean"])
def test_masked_forward_and_its_mask_gradients_match_the_cpu(family, ablation, accel):
    cpu = make(family)
    dev = copy.deepcopy(cpu).to(accel)
    graph = build_graph(cpu)
    x, x_corrupt = inputs(cpu, 3, 1), inputs(cpu, 3, 2)
    z = torch.rand(graph.n_edges, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    paths = [{"fast": False}]
    if family.startswith("transformer"):  # the fast mixing path, with and without recompute
        paths += [{"fast": True, "recompute": False}, {"fast": True, "recompute": True}]
    results = {}
    for name, model, xs, xc in (("cpu", cpu, x, x_corrupt), ("dev", dev, x.to(accel), x_corrupt.to(accel))):
        with frozen_eval(model), torch.no_grad():
            ablated = writer_outputs(model, xc)
            if ablation == "mean":
                ablated = ablated.mean(dim=1, keepdim=True)
        with frozen_eval(model):
            results[name] = [run(model, graph, xs, ablated, z, **p) for p in paths]
    for p, (out_c, grad_c), (out_d, grad_d) in zip(paths, results["cpu"], results["dev"], strict=True):
        close(out_d, out_c, f"{family} {p} output")
        close(grad_d, grad_c, f"{family} {p} mask gradient")
        assert grad_c.abs().sum() > 0
    # the fast path on the accelerator equals the straightforward path there
    for out_d, grad_d in results["dev"][1:]:
        close(out_d, results["dev"][0][0], "fast vs plain output on the accelerator")
        close(grad_d, results["dev"][0][1], "fast vs plain gradient on the accelerator")


def test_all_ones_and_all_zeros_masks_give_the_clean_and_the_ablated_run(accel):
    model = make("transformer").to(accel)
    graph = build_graph(model)
    x, x_corrupt = inputs(model, 3, 1).to(accel), inputs(model, 3, 2).to(accel)
    with frozen_eval(model), torch.no_grad():
        ablated = writer_outputs(model, x_corrupt)
        ones = masked_forward(model, graph, x, ablated, torch.ones(graph.n_edges, device=accel, dtype=torch.float64))
        zeros = masked_forward(model, graph, x, ablated, torch.zeros(graph.n_edges, device=accel, dtype=torch.float64))
        close(ones, model(x), "all ones", 1e-9)
        close(zeros, model(x_corrupt), "all zeros", 1e-9)


def _data(model, seed: int) -> PruneData:
    def traces(s):
        return Traces(inputs(model, 48, s), corrupted=inputs(model, 48, s + 100))

    return PruneData(traces(seed), traces(seed + 1), {"task": "random"})


@pytest.mark.parametrize("family", ["transformer", "lstm"])
def test_a_pruning_run_follows_the_cpu_run(family, accel):
    cpu = make(family)
    dev = copy.deepcopy(cpu).to(accel)
    data = _data(cpu, 5)
    settings = dict(sparsity=0.7, steps=40, batch_size=16, seed=2, progress=False)
    with warnings.catch_warnings():  # a random model at 40 steps may draw the engine's
        warnings.filterwarnings("ignore", message=".*the search likely failed.*")  # warning
        a = prune(cpu, data, "all", **settings)
        b = prune(dev, data, "all", **settings)
    la_a, la_b = a.log_alpha, b.log_alpha
    assert la_a.keys() == la_b.keys()
    worst = max(abs(la_a[e] - la_b[e]) for e in la_a)
    assert worst < 1e-6, worst
    assert set(a.edges) == set(b.edges)
    for key in ("faithfulness", "complement_faithfulness"):
        assert a.metadata["metrics"][key] == pytest.approx(b.metadata["metrics"][key], abs=1e-8)


def test_make_ablation_on_the_accelerator_matches(accel):
    cpu = make("mamba")
    dev = copy.deepcopy(cpu).to(accel)
    data = _data(cpu, 7)
    graph = build_graph(cpu)
    for ablation in ("interchange", "mean", "zero"):
        with frozen_eval(cpu), torch.no_grad():
            a = make_ablation(cpu, ablation, data.train, graph=graph)
        with frozen_eval(dev), torch.no_grad():
            b = make_ablation(dev, ablation, data.train.to(accel), graph=graph)
        close(b, a, ablation)
