"""run_with_cache returns an ActivationCache whose TransformerLens methods agree with
hand computations on a tiny float64 transformer, and pos_slice slices each hook's
position axis on all four families."""

import dataclasses

import pytest
import torch
from transformer_lens.ActivationCache import ActivationCache

from mechlab.checkpoint import load_checkpoint, save_checkpoint
from mechlab.models import build_model
from mechlab.models.cache import MechCache

torch.set_num_threads(1)

TRANSFORMER = {
    "arch": "transformer", "d_model": 12, "n_layers": 2, "n_heads": 3, "d_mlp": 10,
    "d_in": 5, "d_out": 4, "n_ctx": 9,
}  # fmt: skip
FAMILIES = {
    "transformer": TRANSFORMER,
    "lstm": {"arch": "lstm", "d_model": 8, "d_hidden": 6, "n_layers": 2},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 8, "d_state": 5, "n_layers": 2},
    "mamba": {"arch": "mamba", "d_model": 8, "d_state": 3, "n_layers": 2},
}
IO = {"d_in": 5, "d_out": 4, "n_ctx": 9}


def transformer(seed: int = 0, **overrides):
    """A float64 transformer with random (not default) LayerNorm weights and biases."""
    torch.manual_seed(seed)
    model = build_model({**TRANSFORMER, **overrides}).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b", "b_O", "b_out", "b_in", "b_Q", "b_K", "b_V")):
                p.normal_(0.0 if name.endswith(".b") or "b_" in name else 1.0, 0.3)
    return model


def inputs(model, batch: int = 3, n_pos: int = 7, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    if model.cfg.io == "tokens":
        return torch.randint(0, model.cfg.d_vocab, (batch, n_pos), generator=g)
    return torch.randn(batch, n_pos, model.cfg.d_in, generator=g, dtype=model.cfg.dtype)


@pytest.fixture(params=[0, 1, 2])
def run(request):
    model = transformer(seed=request.param)
    out, cache = model.run_with_cache(inputs(model, seed=request.param + 10))
    return model, out, cache


def test_cache_is_an_activation_cache_and_still_reads_like_a_dict(run):
    model, _, cache = run
    assert isinstance(cache, MechCache) and isinstance(cache, ActivationCache)
    assert set(cache.keys()) == set(model.hook_dict)
    assert "blocks.0.hook_resid_pre" in cache and "nope" not in cache
    assert cache.get("nope") is None
    assert dict(cache.items()) == cache.cache_dict and cache == cache.cache_dict
    assert cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"]
    assert cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]
    assert cache["z", 1, "attn"] is cache["blocks.1.attn.hook_z"]


def test_decompose_resid_sums_to_the_final_residual(run):
    _, _, cache = run
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    torch.testing.assert_close(parts.sum(0), cache["blocks.1.hook_resid_post"], rtol=0, atol=1e-12)


def test_ln_applied_decomposition_projected_on_the_read_out_is_the_output(run):
    model, out, cache = run
    normalized = cache.apply_ln_to_stack(cache.decompose_resid(), layer=-1).sum(0)
    w, b = model.ln_final.w, model.ln_final.b
    W, bias = model.read_out.proj.weight, model.read_out.proj.bias  # [d_out, d_model], [d_out]
    by_hand = (normalized * w + b) @ W.T + bias  # [batch, pos, d_out]
    torch.testing.assert_close(by_hand, out, rtol=0, atol=1e-10)


def test_logit_attrs_of_a_complete_decomposition_add_up_to_each_output(run):
    model, out, cache = run
    stack = cache.decompose_resid()
    W, bias = model.read_out.proj.weight, model.read_out.proj.bias
    for k in range(model.cfg.d_out):
        attrs = cache.logit_attrs(stack, k)  # [component, batch, pos]
        const = model.ln_final.b @ W[k] + bias[k]
        torch.testing.assert_close(attrs.sum(0) + const, out[..., k], rtol=0, atol=1e-10)
    # a difference of two outputs: the constants cancel only partly
    diff = cache.logit_attrs(stack, 0, incorrect_tokens=2).sum(0)
    const = model.ln_final.b @ (W[0] - W[2]) + bias[0] - bias[2]
    torch.testing.assert_close(diff + const, out[..., 0] - out[..., 2], rtol=0, atol=1e-10)


def test_logit_attrs_of_a_token_model_per_position_targets():
    model = transformer(seed=3, io="tokens", d_vocab=11)
    ids = inputs(model)
    out, cache = model.run_with_cache(ids)
    targets = torch.randint(0, 11, ids.shape, generator=torch.Generator().manual_seed(0))
    attrs = cache.logit_attrs(cache.decompose_resid(), targets)  # [component, batch, pos]
    W, bias = model.read_out.proj.weight, model.read_out.proj.bias
    const = W[targets] @ model.ln_final.b + bias[targets]
    expected = out.gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(attrs.sum(0) + const, expected, rtol=0, atol=1e-10)


def test_stack_head_results_are_each_heads_z_times_W_O(run):
    model, _, cache = run
    heads, labels = cache.stack_head_results(layer=-1, return_labels=True)
    assert labels == [f"L{layer}H{h}" for layer in range(2) for h in range(3)]
    for layer in range(2):
        z = cache[f"blocks.{layer}.attn.hook_z"]  # [batch, pos, head, d_head]
        W_O = model.blocks[layer].attn.W_O  # [head, d_head, d_model]
        for h in range(3):
            torch.testing.assert_close(
                heads[3 * layer + h], z[:, :, h] @ W_O[h], rtol=0, atol=1e-12
            )
    attn_out = cache["blocks.1.hook_attn_out"] - model.blocks[1].attn.b_O
    torch.testing.assert_close(heads[3:].sum(0), attn_out, rtol=0, atol=1e-12)


def test_full_resid_decomposition_sums_to_the_final_residual(run):
    model, out, cache = run
    parts, labels = cache.get_full_resid_decomposition(return_labels=True)
    assert len(labels) == 2 * 3 + 2 * 10 + 3 and labels[-3:] == ["embed", "pos_embed", "bias"]
    torch.testing.assert_close(parts.sum(0), cache["resid_post", -1], rtol=0, atol=1e-11)
    # projected straight onto the read-out rows, with the LayerNorm applied
    W = model.read_out.proj.weight  # [d_out, d_model]
    proj = cache.get_full_resid_decomposition(
        apply_ln=True, project_output_onto=(W * model.ln_final.w).T
    )
    const = model.ln_final.b @ W.T + model.read_out.proj.bias
    torch.testing.assert_close(proj.sum(0) + const, out, rtol=0, atol=1e-10)


def test_accumulated_resid_and_its_logit_lens_end_at_the_output(run):
    model, out, cache = run
    resid, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"]
    assert torch.equal(resid[-1], cache["blocks.1.hook_resid_post"])
    assert torch.equal(resid[0], cache["hook_embed"] + cache["hook_pos_embed"])
    lens = cache.accumulated_resid(apply_ln=True)  # each layer through ln_final
    torch.testing.assert_close(model.read_out(lens[-1]), out, rtol=0, atol=1e-12)


def test_cfg_gives_what_transformer_lens_reads_without_changing_the_saved_config(tmp_path):
    model = build_model(TRANSFORMER)
    cfg = model.cfg
    fields = {f.name for f in dataclasses.fields(cfg)} | {"arch"}
    assert set(cfg.to_dict()) == fields
    assert (cfg.attn_only, cfg.normalization_type, cfg.positional_embedding_type) == (
        False, "LN", "standard",
    )  # fmt: skip
    assert cfg.device == torch.device("cpu") and cfg.dtype == torch.float32
    model.double()
    assert cfg.dtype == torch.float64
    assert set(cfg.to_dict()) == fields
    path = save_checkpoint(model, tmp_path / "m.pt")
    loaded = load_checkpoint(path)
    assert loaded.model.cfg.to_dict() == cfg.to_dict()
    x = inputs(model)
    torch.testing.assert_close(loaded.model.double()(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["lstm", "dense_ssm", "mamba"])
def test_recurrent_caches_read_by_name_and_refuse_transformer_methods(family):
    torch.manual_seed(0)
    model = build_model({**FAMILIES[family], **IO}).eval()
    x = inputs(model, batch=1)
    out, cache = model.run_with_cache(x)
    assert isinstance(cache, MechCache) and set(cache) == set(model.hook_dict)
    assert cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]
    torch.testing.assert_close(cache["hook_out"], out)
    with pytest.raises(ValueError, match=f"decompose_resid needs a transformer.*{family}"):
        cache.decompose_resid()
    with pytest.raises(ValueError, match="stack_head_results needs a transformer"):
        cache.stack_head_results()
    single = cache.remove_batch_dim()
    assert single["hook_embed"].shape == (7, model.cfg.d_model)


def test_run_with_cache_options_keep_working():
    model = transformer()
    x = inputs(model, batch=1)
    _, some = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_z"))
    assert set(some) == {"blocks.0.attn.hook_z", "blocks.1.attn.hook_z"}
    _, one = model.run_with_cache(x, names_filter="hook_embed", remove_batch_dim=True)
    assert list(one) == ["hook_embed"] and one["hook_embed"].shape == (7, 12)
    assert not one.has_batch_dim
    with pytest.raises(ValueError, match="batch of 1"):
        model.run_with_cache(inputs(model, batch=2), remove_batch_dim=True)
    with pytest.raises(ValueError, match="names_filter"):
        model.run_with_cache(x, names_filter=3)


def test_incl_bwd_needs_a_scalar_metric():
    model = transformer()
    x = inputs(model)
    with pytest.raises(ValueError, match="metric="):
        model.run_with_cache(x, incl_bwd=True)
    with pytest.raises(ValueError, match="scalar tensor, got \\[3, 7\\]"):
        model.run_with_cache(x, incl_bwd=True, metric=lambda out: out[..., 0])
    assert not any(p._backward_hooks or p._forward_hooks for p in model.hook_dict.values())


def test_incl_bwd_caches_the_gradient_of_every_hook():
    model = transformer()
    x = inputs(model)
    out, cache = model.run_with_cache(x, incl_bwd=True, metric=lambda o: o[:, -1, 1].sum())
    assert set(cache) == set(model.hook_dict) | {n + "_grad" for n in model.hook_dict}
    # independent: autograd of the same metric w.r.t. resid_mid of block 1, by hand
    resid = {}

    def keep(t, hook):
        resid["mid"] = t.detach().requires_grad_(True)
        return resid["mid"]

    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_mid", keep)]):
        metric = model(x)[:, -1, 1].sum()
    (grad,) = torch.autograd.grad(metric, resid["mid"])
    torch.testing.assert_close(cache["blocks.1.hook_resid_mid_grad"], grad, rtol=0, atol=1e-12)
    assert cache["blocks.1.hook_resid_mid_grad"][:, :-1].abs().max() == 0  # causal
    assert cache["hook_out_grad"][:, -1, 1].eq(1).all()


# ---------------------------------------------------------------- pos_slice


def full_and_sliced(family: str, pos_slice, incl_bwd: bool = False):
    torch.manual_seed(0)
    model = build_model({**FAMILIES[family], **IO}).double().eval()
    x = inputs(model, batch=2)
    kwargs = {"incl_bwd": incl_bwd, "metric": (lambda o: o.pow(2).sum()) if incl_bwd else None}
    _, full = model.run_with_cache(x, **kwargs)
    _, sliced = model.run_with_cache(x, pos_slice=pos_slice, **kwargs)
    return model, full, sliced


def take(tensor, dim, pos_slice):
    """The hand version of slicing the position axis (an int keeps the axis, as in TL)."""
    if isinstance(pos_slice, int):
        return tensor.narrow(dim, pos_slice % tensor.shape[dim], 1)
    if isinstance(pos_slice, list):
        return tensor.index_select(dim, torch.tensor(pos_slice))
    return tensor[(slice(None),) * dim + (pos_slice,)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("pos_slice", [2, -1, slice(1, 5, 2), [0, 3, 6]])
def test_pos_slice_slices_the_position_axis_of_every_hook(family, pos_slice):
    model, full, sliced = full_and_sliced(family, pos_slice)
    assert set(sliced) == set(full)
    for name, tensor in full.items():
        dim = 2 if name.endswith(("hook_pattern", "hook_attn_scores")) else 1
        assert model.pos_dim(name) == dim
        expected = take(tensor, dim, pos_slice)
        assert sliced[name].shape == expected.shape, name
        torch.testing.assert_close(sliced[name], expected, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("family", ["lstm", "mamba"])
def test_pos_slice_slices_gradients_too(family):
    model, full, sliced = full_and_sliced(family, [1, 4], incl_bwd=True)
    grads = [n for n in full if n.endswith("_grad")]
    assert len(grads) == len(model.hook_dict)
    for name in grads:
        expected = take(full[name], 1, [1, 4])
        torch.testing.assert_close(sliced[name], expected, rtol=0, atol=0, msg=name)
