"""run_with_cache writes its big activations into reused memory (mechlab.models.buffers)
and returns exactly what it returned without: every key, value, dtype and shape; a cache
that is kept (or any view of it) is never overwritten; autograd and inference mode work."""

import pytest
import torch

import mechlab.models.buffers as buffers
from mechlab.models import build_model
from mechlab.models.buffers import POOL, release_cache_buffers

torch.set_num_threads(1)

IO = {"d_in": 5, "d_out": 4, "n_ctx": 9}
TRANSFORMERS = {
    "gpt2": {"arch": "transformer", "d_model": 12, "n_layers": 2, "n_heads": 3, **IO},
    "rotary_grouped": {"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 4, "n_key_value_heads": 2,
                       "positional": "rotary", "rotary_dim": 2, "normalization": "RMS", "gated_mlp": True,
                       "act_fn": "silu", **IO},
    "bidirectional_attn_only": {"arch": "transformer", "d_model": 12, "n_layers": 2, "n_heads": 2, "causal": False,
                                "attn_only": True, **IO},
    "parallel_tokens": {"arch": "transformer", "d_model": 12, "n_layers": 2, "n_heads": 3,
                        "parallel_attn_mlp": True, "io": "tokens", "d_vocab": 7, "n_ctx": 9},
}  # fmt: skip
MAPS = ("hook_attn_scores", "hook_pattern")
RECURRENT = {
    "lstm": {"arch": "lstm", "d_model": 8, "n_layers": 2, **IO},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 8, "d_state": 5, "n_layers": 2, **IO},
    "mamba": {"arch": "mamba", "d_model": 8, "d_state": 3, "n_layers": 2, **IO},
}
# what each recurrent family writes into the pool: its per-step trajectories
TRAJECTORIES = {"lstm": ("lstm.hook_i", "lstm.hook_c", "lstm.hook_h"), "dense_ssm": ("ssm.hook_A", "ssm.hook_h"),
                "mamba": ("mixer.hook_ssm_state",)}  # fmt: skip


@pytest.fixture
def pool_everything(monkeypatch):
    """Pool every stored activation the model offers, however small (the tests' models are)."""
    monkeypatch.setattr(buffers, "MIN_BYTES", 0)
    monkeypatch.setattr(POOL, "enabled", True)
    release_cache_buffers()
    yield POOL
    release_cache_buffers()


def model_and_input(config: dict, dtype=torch.float32, batch: int = 3, n_pos: int = 7, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(config).to(dtype).eval()
    g = torch.Generator().manual_seed(seed + 1)
    if model.cfg.io == "tokens":
        return model, torch.randint(0, model.cfg.d_vocab, (batch, n_pos), generator=g)
    return model, torch.randn(batch, n_pos, model.cfg.d_in, generator=g, dtype=dtype)


def cached(model, x, **kwargs):
    with torch.no_grad():
        return model.run_with_cache(x, **kwargs)


def assert_same_cache(a, b):
    assert list(a.keys()) == list(b.keys())
    for name in a.keys():
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(a[name], b[name]), name


def pooled_ptrs() -> set[int]:
    return {buf.data_ptr() for bufs in POOL._buffers.values() for buf in bufs}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(TRANSFORMERS))
def test_the_pooled_cache_is_the_cache(pool_everything, name, dtype, monkeypatch):
    model, x = model_and_input(TRANSFORMERS[name], dtype)
    out, cache = cached(model, x)
    assert {cache[n].data_ptr() for n in cache.keys() if n.endswith(MAPS)} <= pooled_ptrs()
    assert POOL.held_bytes() > 0
    monkeypatch.setattr(POOL, "enabled", False)
    out_plain, cache_plain = cached(model, x)
    assert not any(cache_plain[n].data_ptr() in pooled_ptrs() for n in cache_plain.keys())
    assert torch.equal(out, out_plain)
    assert_same_cache(cache, cache_plain)
    with torch.no_grad():
        assert torch.equal(model(x), out)  # the plain forward, no hooks at all


def test_a_kept_cache_or_a_view_of_it_is_never_overwritten(pool_everything):
    model, x1 = model_and_input(TRANSFORMERS["gpt2"])
    x2 = torch.randn_like(x1)
    _, first = cached(model, x1)
    kept = {n: first[n].clone() for n in first.keys()}
    _, second = cached(model, x2)  # the first cache is alive: fresh buffers
    for n in first.keys():
        assert torch.equal(first[n], kept[n]), n
    pattern = second["blocks.1.attn.hook_pattern"][:, :, -1]  # a view keeps its buffer taken
    pattern_value = pattern.clone()
    ptrs_second = {second[n].data_ptr() for n in second.keys() if n.endswith(MAPS)}
    del second
    _, third = cached(model, x1)
    assert torch.equal(pattern, pattern_value)
    assert_same_cache(third, first)
    # the second cache's free buffers were reused (and the viewed one was not)
    ptrs_third = {third[n].data_ptr() for n in third.keys() if n.endswith(MAPS)}
    assert ptrs_third & ptrs_second
    storage = pattern.untyped_storage().data_ptr()
    assert storage not in {third[n].untyped_storage().data_ptr() for n in third.keys()}


def test_a_cache_dropped_hands_its_memory_to_the_next_call(pool_everything):
    model, x = model_and_input(TRANSFORMERS["gpt2"])
    _, cache = cached(model, x)
    ptrs = {cache[n].data_ptr() for n in cache.keys() if n.endswith(MAPS)}
    held = POOL.held_bytes()
    del cache
    for _ in range(3):
        _, cache = cached(model, x)
        assert {cache[n].data_ptr() for n in cache.keys() if n.endswith(MAPS)} == ptrs
        del cache
    assert POOL.held_bytes() == held


def test_the_pool_keeps_at_most_one_spare_set(pool_everything):
    model, x = model_and_input(TRANSFORMERS["gpt2"])
    caches = [cached(model, x)[1] for _ in range(4)]  # four sets alive
    one_set = POOL.held_bytes() // 4
    del caches
    cached(model, x)
    assert POOL.held_bytes() == 2 * one_set  # the one just returned (dropped) and a spare
    for n_pos in (4, 5, 6, 8):  # other shapes: the old ones go
        cached(model, x[:, :n_pos])
    assert POOL.held_bytes() <= 2 * one_set
    assert release_cache_buffers() > 0 and POOL.held_bytes() == 0


def test_under_autograd_and_inference_mode(pool_everything):
    model, x = model_and_input(TRANSFORMERS["gpt2"], torch.float64)
    _, reference = cached(model, x)
    out, cache = model.run_with_cache(x, incl_bwd=True, metric=lambda o: o[:, -1].sum())  # grad: no pool
    assert not {cache[n].data_ptr() for n in cache.keys()} & pooled_ptrs()
    assert "blocks.0.attn.hook_pattern_grad" in cache
    assert_same_cache(reference, type(reference)({n: cache[n] for n in reference.keys()}, model))
    del reference, cache
    with torch.inference_mode():
        _, inference = model.run_with_cache(x)
    with torch.no_grad():
        _, after = model.run_with_cache(x)  # pool buffers made in inference mode work outside it
    assert_same_cache(inference, after)


def test_torch_still_counts_the_holders_of_a_storage():
    t = torch.empty(4)
    assert buffers._storage_use_count(t) == 1
    view = t[1:]
    assert buffers._storage_use_count(t) == 2
    del view
    assert buffers._storage_use_count(t) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", list(RECURRENT))
def test_recurrent_trajectories_go_into_the_pool_and_stay_what_they_were(pool_everything, family, dtype,
                                                                          monkeypatch):  # fmt: skip
    model, x = model_and_input(RECURRENT[family], dtype)
    x2 = torch.randn_like(x)
    out, cache = cached(model, x)
    ptrs = pooled_ptrs()
    for n in cache.keys():
        if n.endswith(TRAJECTORIES[family]):
            assert cache[n].untyped_storage().data_ptr() in ptrs, n
    kept = {n: cache[n].clone() for n in cache.keys()}
    _, other = cached(model, x2)  # while the first cache lives, its memory is not reused
    for n in cache.keys():
        assert torch.equal(cache[n], kept[n]), n
    del other
    monkeypatch.setattr(POOL, "enabled", False)
    out_plain, plain = cached(model, x)
    assert torch.equal(out, out_plain)
    assert_same_cache(cache, plain)
