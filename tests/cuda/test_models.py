"""Models, hooks, caching, nnsight, patching and probes on the accelerator against the CPU.

Tolerances (float32, TF32 off): outputs and cached activations agree to ``rtol 1e-4,
atol 1e-5`` (reduction order differs between devices; measured differences are float
rounding, about 1e-6); float64 runs to ``1e-10``.
"""

from __future__ import annotations

import copy

import pytest
import torch

import mechlab
from mechlab.patching import activation_patch

N_POS, D_IN, D_OUT = 9, 5, 3
FAMILIES = {
    "transformer": {"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2, "init_std": 0.3},
    "transformer_tokens": {"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2,
                           "io": "tokens", "d_vocab": 11},
    "lstm": {"arch": "lstm", "d_model": 8, "n_layers": 2},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 8, "n_layers": 2},
    "mamba": {"arch": "mamba", "d_model": 8, "n_layers": 2},
}  # fmt: skip
RTOL, ATOL = 1e-4, 1e-5


def make(family: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = {"d_in": D_IN, "d_out": D_OUT, "n_ctx": 16, **FAMILIES[family]}
    if cfg.get("io") == "tokens":
        cfg.pop("d_in"), cfg.pop("d_out")
    return mechlab.build_model(cfg).eval()


def inputs(model: torch.nn.Module, batch: int = 4, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if model.cfg.io == "tokens":
        return torch.randint(0, model.cfg.d_vocab, (batch, N_POS), generator=g)
    return torch.randn(batch, N_POS, D_IN, generator=g)


def pair(family: str, accel: torch.device):
    cpu = make(family)
    return cpu, copy.deepcopy(cpu).to(accel)


def close(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    a, b = a.detach().cpu(), b.detach().cpu()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.allclose(a, b, rtol=RTOL, atol=ATOL), (what, float((a - b).abs().max()))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_forward_matches_the_cpu(family, accel):
    cpu, dev = pair(family, accel)
    x = inputs(cpu)
    with torch.no_grad():
        close(dev(x.to(accel)), cpu(x), family)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_cached_activation_matches_the_cpu(family, accel):
    """run_with_cache of every hook (attention maps and recurrent states included: the
    read-only fast paths run here, cuDNN's LSTM among them)."""
    cpu, dev = pair(family, accel)
    x = inputs(cpu)
    with torch.no_grad():
        out_c, cache_c = cpu.run_with_cache(x)
        out_d, cache_d = dev.run_with_cache(x.to(accel))
    close(out_d, out_c, "output")
    assert set(cache_d.keys()) == set(cache_c.keys())
    for name in cache_c.keys():
        assert cache_d[name].device.type == accel.type, name
        close(cache_d[name], cache_c[name], name)


@pytest.mark.parametrize("family", ["transformer", "lstm", "dense_ssm", "mamba"])
def test_gradients_of_cached_activations_match_the_cpu(family, accel):
    cpu, dev = pair(family, accel)
    x = inputs(cpu)

    def metric(out):
        return out[:, -1, 0].sum()

    _, grads_c = cpu.run_with_cache(x, incl_bwd=True, metric=metric)
    _, grads_d = dev.run_with_cache(x.to(accel), incl_bwd=True, metric=metric)
    names = [n for n in grads_c.keys() if n.endswith("_grad")]
    assert names
    for name in names:
        close(grads_d[name], grads_c[name], name)


@pytest.mark.parametrize("family", ["transformer", "lstm", "mamba"])
def test_a_writing_hook_patches_the_same_way(family, accel):
    cpu, dev = pair(family, accel)
    x = inputs(cpu)
    name = "blocks.0.hook_resid_post" if family == "transformer" else "blocks.0.hook_mixer_out"

    def zero(act, hook):
        return torch.zeros_like(act)

    with torch.no_grad():
        a = cpu.run_with_hooks(x, fwd_hooks=[(name, zero)])
        b = dev.run_with_hooks(x.to(accel), fwd_hooks=[(name, zero)])
        plain = cpu(x)
    close(b, a, name)
    assert not torch.allclose(a, plain)  # the patch changed the output


@pytest.mark.parametrize("backend", ["hooks", "nnsight"])
@pytest.mark.parametrize("family", ["transformer", "lstm"])
def test_activation_patching_matches_the_cpu(family, backend, accel):
    cpu, dev = pair(family, accel)
    clean = inputs(cpu, seed=2)
    corrupted = clean + 0.5 * inputs(cpu, seed=3)

    def metric(out):
        return out[:, -1, 0].mean()

    a = activation_patch(cpu, clean, corrupted, metric, positions=[N_POS - 2, N_POS - 1],
                         backend=backend, progress=False)  # fmt: skip
    b = activation_patch(dev, clean.to(accel), corrupted.to(accel), metric,
                         positions=[N_POS - 2, N_POS - 1], backend=backend, progress=False)  # fmt: skip
    assert a.components == b.components
    close(b.values, a.values, "patch values")


def test_nnsight_traces_a_model_on_the_accelerator(accel):
    from nnsight import NNsight

    cpu, dev = pair("transformer", accel)
    x = inputs(cpu)
    saved = {}
    for name, model, xs in (("cpu", cpu, x), ("dev", dev, x.to(accel))):
        traced = NNsight(model)
        with traced.trace(xs):
            saved[name] = traced.blocks[1].hook_resid_post.output.save()
    close(saved["dev"], saved["cpu"], "nnsight hook_resid_post")


def test_probe_features_collected_on_the_accelerator_match(accel):
    from mechlab.probes import collect_activations

    cpu, dev = pair("lstm", accel)
    x = inputs(cpu, batch=10)
    hooks = ["blocks.0.lstm.hook_h", "blocks.1.hook_mixer_out"]
    a = collect_activations(cpu, x, hooks, positions=[3, 8], batch_size=4, progress=False)
    b = collect_activations(dev, x.to(accel), hooks, positions=[3, 8], batch_size=4, progress=False)
    for name in hooks:
        assert b[name].device.type == "cpu"  # probes get their features on the CPU
        close(b[name], a[name], name)


def test_a_checkpoint_saved_from_the_accelerator_loads_on_the_cpu(accel, tmp_path):
    _, dev = pair("mamba", accel)
    path = tmp_path / "gpu.pt"
    mechlab.save_checkpoint(dev, path, step=3, note="saved from the accelerator")
    ckpt = mechlab.load_checkpoint(path)
    assert next(ckpt.model.parameters()).device.type == "cpu"
    x = inputs(ckpt.model)
    with torch.no_grad():
        close(dev(x.to(accel)), ckpt.model(x), "reloaded")


IMPORTED = ["gpt2", "neox", "llama", "qwen2", "mamba",
            "llama-llama3", "llama-yarn", "qwen3", "olmo", "phi3", "gptj", "olmo2", "gemma2", "gemma3"]  # fmt: skip


@pytest.mark.parametrize("name", IMPORTED)
def test_imported_models_match_hugging_face_on_the_accelerator(accel, name):
    from tests.models.hf_models import hf_model, tokens

    hf = hf_model(name)
    model = mechlab.from_pretrained(hf)
    x = tokens()
    with torch.no_grad():
        cpu = model(x)
        on_accel = model.to(accel)(x.to(accel)).cpu()
        hf_accel = hf.to(accel)(x.to(accel)).logits.cpu()
    torch.testing.assert_close(on_accel, cpu, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(on_accel, hf_accel, rtol=RTOL, atol=ATOL)
