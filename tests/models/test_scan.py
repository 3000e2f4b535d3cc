"""The chunked scans of mechlab.models.scan against plain per-step loops written here,
values and gradients (torch.autograd), float64 and float32."""

from __future__ import annotations

import pytest
import torch

from mechlab.models.scan import dense_scan, linear_recurrence, selective_scan


def loop_linear(a, b, h0):
    h, out = h0, []
    for t in range(a.shape[1]):
        h = a[:, t] * h + b[:, t]
        out.append(h)
    return torch.stack(out, 1)


def loop_selective(x, delta, A, B, C, h0):
    """Mamba's recurrence as written in the paper, one step at a time."""
    h, ys = h0, []
    for t in range(x.shape[1]):
        h = (
            torch.exp(delta[:, t, :, None] * A) * h
            + (delta[:, t] * x[:, t])[:, :, None] * B[:, t, None, :]
        )
        ys.append((h * C[:, t, None, :]).sum(-1))
    return torch.stack(ys, 1), h


def loop_dense(x, W, h0):
    h, out = h0, []
    for t in range(x.shape[1]):
        A = torch.einsum("ijk,bk->bij", W, x[:, t])  # A(x_t)[i, j] = W[i, j, :] . x_t
        h = torch.einsum("bij,bj->bi", A, h)
        out.append(h)
    return torch.stack(out, 1)


def grads(fn, inputs):
    """Gradients of a fixed random projection of fn(*inputs) with respect to every input."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out = out if isinstance(out, torch.Tensor) else out[0]
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * weights).sum().backward()
    return [leaf.grad for leaf in leaves]


def selective_inputs(dtype, batch=3, n_pos=23, d_inner=5, d_state=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n_pos, d_inner, generator=g, dtype=dtype)
    delta = torch.nn.functional.softplus(
        torch.randn(batch, n_pos, d_inner, generator=g, dtype=dtype)
    )
    A = -torch.rand(d_inner, d_state, generator=g, dtype=dtype) * 3
    B = torch.randn(batch, n_pos, d_state, generator=g, dtype=dtype)
    C = torch.randn(batch, n_pos, d_state, generator=g, dtype=dtype)
    h0 = torch.randn(batch, d_inner, d_state, generator=g, dtype=dtype)
    return x, delta, A, B, C, h0


@pytest.mark.parametrize("seed", [0, 1])
def test_linear_recurrence_equals_the_loop_values_and_gradients(seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(2, 19, 6, generator=g, dtype=torch.float64)
    b = torch.randn(2, 19, 6, generator=g, dtype=torch.float64)
    h0 = torch.randn(2, 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(
        linear_recurrence(a, b, h0), loop_linear(a, b, h0), rtol=1e-12, atol=1e-12
    )
    with torch.no_grad():  # the in-place path
        torch.testing.assert_close(
            linear_recurrence(a, b, h0), loop_linear(a, b, h0), rtol=1e-12, atol=1e-12
        )
    for got, want in zip(
        grads(linear_recurrence, (a, b, h0)), grads(loop_linear, (a, b, h0)), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    zeros = linear_recurrence(a, b)  # h0 None means zeros
    torch.testing.assert_close(
        zeros, loop_linear(a, b, torch.zeros_like(h0)), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-11), (torch.float32, 2e-5)])
@pytest.mark.parametrize("chunk", [1, 5, 16, 40])
def test_selective_scan_equals_the_loop_values_and_gradients(dtype, tol, chunk):
    inputs = selective_inputs(dtype)
    y_ref, h_ref = loop_selective(*inputs)
    for grad_mode in (True, False):  # the autograd path and the in-place path
        with torch.set_grad_enabled(grad_mode):
            y, h, states = selective_scan(*inputs, chunk=chunk, keep_states=True)
        torch.testing.assert_close(y, y_ref, rtol=tol, atol=tol)
        torch.testing.assert_close(h, h_ref, rtol=tol, atol=tol)
        torch.testing.assert_close(states[:, -1], h_ref, rtol=tol, atol=tol)
    # every kept state: the loop's states, step by step
    x, delta, A, B, C, h0 = inputs
    _, h3 = loop_selective(x[:, :4], delta[:, :4], A, B[:, :4], C[:, :4], h0)
    torch.testing.assert_close(states[:, 3], h3, rtol=tol, atol=tol)

    def chunked(*args):
        return selective_scan(*args, chunk=chunk)[0]

    for got, want in zip(grads(chunked, inputs), grads(loop_selective, inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_selective_scan_starts_from_zeros_without_h0():
    x, delta, A, B, C, h0 = selective_inputs(torch.float64)
    y, _, _ = selective_scan(x, delta, A, B, C, chunk=6)
    torch.testing.assert_close(y, loop_selective(x, delta, A, B, C, torch.zeros_like(h0))[0])


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-11), (torch.float32, 1e-5)])
@pytest.mark.parametrize("chunk", [1, 6, 16, 50])
def test_dense_scan_equals_the_loop_values_and_gradients(dtype, tol, chunk):
    g = torch.Generator().manual_seed(chunk)
    d_state, d_model = 5, 4
    x = torch.randn(2, 21, d_model, generator=g, dtype=dtype)
    W = (
        torch.randn(d_state, d_state, d_model, generator=g, dtype=dtype)
        / (d_state * d_model) ** 0.5
    )
    h0 = torch.randn(2, d_state, generator=g, dtype=dtype)
    want = loop_dense(x, W, h0)
    for grad_mode in (True, False):
        with torch.set_grad_enabled(grad_mode):
            states, transitions = dense_scan(x, W, h0, chunk=chunk, keep_transitions=True)
            alone, none = dense_scan(x, W, h0, chunk=chunk)
        assert none is None
        torch.testing.assert_close(states, want, rtol=tol, atol=tol)
        torch.testing.assert_close(alone, want, rtol=tol, atol=tol)
        torch.testing.assert_close(
            transitions, torch.einsum("ijk,btk->btij", W, x), rtol=tol, atol=tol
        )

    def chunked(*args):
        return dense_scan(*args, chunk=chunk)[0]

    for got, want_grad in zip(
        grads(chunked, (x, W, h0)), grads(loop_dense, (x, W, h0)), strict=True
    ):
        torch.testing.assert_close(got, want_grad, rtol=tol, atol=tol)


def test_dense_scan_broadcasts_a_shared_initial_state():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 9, 4, generator=g, dtype=torch.float64)
    W = torch.randn(5, 5, 4, generator=g, dtype=torch.float64)
    h_init = torch.randn(5, generator=g, dtype=torch.float64)
    got, _ = dense_scan(x, W, h_init, chunk=4)
    torch.testing.assert_close(got, loop_dense(x, W, h_init.expand(3, 5)))


@pytest.mark.parametrize("chunk", [0, -2, 1.5, True])
def test_bad_chunk_is_refused_in_one_line(chunk):
    x, delta, A, B, C, _ = selective_inputs(torch.float32)
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        selective_scan(x, delta, A, B, C, chunk=chunk)


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="same shape"):
        linear_recurrence(torch.ones(2, 3, 4), torch.ones(2, 3, 5))


@pytest.mark.parametrize("family", ["mamba", "dense_ssm"])
def test_bench_scan_reports_the_chunked_scan_equal_to_the_loop(family):
    """`mechlab bench scan` on a tiny batch: the distances it reports are float rounding."""
    from mechlab.bench.scan import bench_scan

    row = bench_scan(family, batch=2, n_pos=9, repeats=1, chunk=4)
    assert row.output_diff < 1e-5 and row.grad_diff < 1e-4
    assert min(row.loop_forward, row.chunked_forward, row.loop_backward, row.chunked_backward) > 0
    with pytest.raises(ValueError, match="unknown family"):
        bench_scan("transformer")


def test_bench_hooks_times_the_step_by_step_and_light_caches():
    from mechlab.bench.hooks import bench_family

    row = bench_family("dense_ssm", batch=2, n_pos=6, repeats=1)
    assert row.cache_steps is not None and row.cache_light is not None and row.cache_fused is None
