"""`mechlab bench prune`: one pruning step against a plain training step, and the masked
pass's peak memory against the naive scheme that stacks every upstream writer per layer.

The scale rows (a GPT-2-small-shaped transformer, a Mamba of the 130M shape) are
:func:`bench_prune` on :func:`scale_model`; ``docs/benchmarks.md`` gives the commands."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.bench.cpu_memory import profiled_peak
from mechlab.bench.timing import time_interleaved
from mechlab.models import build_model
from mechlab.models.registry import graph_kind, presets
from mechlab.prune import masks as hc
from mechlab.prune.forward import (
    _attention,
    _edge_block,
    _layer_norm,
    divergence,
    frozen_eval,
    masked_forward,
    writer_outputs,
)
from mechlab.prune.graph import build_graph


def _naive_forward(model, graph, x, ablated, z) -> Tensor:
    """The stacking scheme, for comparison only: at every reader group, stack the outputs
    of *all* upstream writers (clean and ablated) into new tensors and mix them.

    Transformers of GPT-2's graph layout only (a position table, one key/value head per
    head, sequential MLP blocks). Memory grows about as ``layers x writers x batch x pos x d``.
    """
    cfg = model.cfg
    H = cfg.n_heads
    batch, n_pos = x.shape[:2]
    clean: list[Tensor] = []
    const: Tensor | float = 0.0

    def read(z_block: Tensor) -> Tensor:
        n_up = z_block.shape[1]
        X = torch.stack(clean[:n_up])  # [n_up, batch, pos, d], a new stack at every layer
        X_abl = ablated[:n_up].expand_as(X)
        mixed = torch.einsum("rw,wbtd->rbtd", z_block, X) + torch.einsum(
            "rw,wbtd->rbtd", 1 - z_block, X_abl
        )
        return mixed + const

    clean += [model.read_in(x), model.W_pos[:n_pos].expand(batch, n_pos, -1)]
    for layer, block in enumerate(model.blocks):
        x_in = _layer_norm(block.ln1, read(_edge_block(z, graph, f"a{layer}.h0.q", 3 * H)))
        clean += list(_attention(block.attn, x_in, (H, H, H)).unbind(0))
        const = const if block.attn.b_O is None else const + block.attn.b_O
        clean.append(
            block.mlp(_layer_norm(block.ln2, read(_edge_block(z, graph, f"m{layer}.in", 1))[0]))
        )
    return model.read_out(_layer_norm(model.ln_final, read(_edge_block(z, graph, "out", 1))[0]))


@contextmanager
def _native_stderr_silenced():
    """Send what native code writes to file descriptor 2 to /dev/null meanwhile (the
    profiler's ``USDT: ... profiler_start`` lines); Python's own stderr is flushed first."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_memory(fn: Callable[[], Any], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated while ``fn()`` runs (above what was allocated before).

    CUDA: the caching allocator's peak. CPU: the allocation timeline of
    ``torch.profiler`` (``profile_memory=True``), replayed to find the peak.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before

    with _native_stderr_silenced():
        return profiled_peak(fn)


@dataclass
class PruneBench:
    """Memory and time of edge pruning against baselines (one config)."""

    config: dict[str, Any]
    memory_ours: int | None  # bytes, masked forward + backward (None: not measured)
    memory_naive: int | None  # bytes, stacking scheme, forward + backward
    step_seconds: float  # one pruning step (sample masks, masked forward, backward, updates)
    plain_seconds: float  # plain forward + backward of the model's parameters, same batch
    memory_recompute: int | None = None  # bytes, masked forward + backward, recompute=True
    straightforward_seconds: float | None = None  # the same step on the autograd path
    memory_plain: int | None = None  # bytes, the plain forward + backward (recurrent models)
    timings: dict[str, Any] = field(default_factory=dict)  # contender -> Timing (every run)

    @property
    def memory_ratio(self) -> float | None:
        """Ours / naive (below 1 is better); None where naive stacking was not measured."""
        return None if not self.memory_naive else self.memory_ours / self.memory_naive

    @property
    def memory_recompute_ratio(self) -> float | None:
        """Ours with reader inputs recomputed / naive."""
        if not self.memory_naive or self.memory_recompute is None:
            return None
        return self.memory_recompute / self.memory_naive

    @property
    def time_ratio(self) -> float:
        """Pruning step / plain forward+backward (goal: <= 2)."""
        return self.step_seconds / self.plain_seconds


def bench_prune(
    model: nn.Module | None = None,
    batch: int = 32,
    n_pos: int = 64,
    repeats: int = 5,
    device: str = "cpu",
    seed: int = 0,
    memory: bool = True,
    straightforward: bool = False,
) -> PruneBench:
    """Measure the masked pass against the naive stacking scheme and a plain training step.

    A recurrent model (LSTM, dense SSM, Mamba) has no stacking scheme to compare with and
    no fast path: its pruning step (on the plain graph, the straightforward masked
    forward) is measured against the plain forward+backward in time and, with
    ``memory``, in peak memory (``memory_plain``).

    Args:
        model: A mechlab model (default: the ``tiny`` transformer preset, d=72, 3 layers,
            6 heads).
        batch: Traces per batch.
        n_pos: Positions per trace.
        repeats: Timed runs (medians).
        device: ``cpu`` or ``cuda``.
        seed: Seed of the random inputs and masks.
        memory: Measure peak memory (ours, ours recomputing reader inputs, naive); the
            naive scheme's grows with layers squared (several GB for the ``big`` preset).
        straightforward: Also time the step on the straightforward autograd path
            (``masked_forward(..., fast=False)``), interleaved with the others.

    Returns:
        The :class:`PruneBench`.
    """
    torch.manual_seed(seed)
    model = (model or build_model("tiny")).to(device)
    cfg = model.cfg
    transformer = graph_kind(cfg.arch) == "transformer"
    if straightforward and not transformer:
        raise ValueError("straightforward=True times the transformer's autograd path; a "
                         f"{cfg.arch} has only that path")
    graph = build_graph(model)
    gen = torch.Generator().manual_seed(seed)
    if cfg.io == "continuous":
        x = torch.randn(batch, n_pos, cfg.d_in, generator=gen).to(device)
        x_corrupt = torch.randn(batch, n_pos, cfg.d_in, generator=gen).to(device)
    else:
        x = torch.randint(0, cfg.d_vocab, (batch, n_pos), generator=gen).to(device)
        x_corrupt = torch.randint(0, cfg.d_vocab, (batch, n_pos), generator=gen).to(device)
    log_alpha = nn.Parameter(hc.init_log_alpha(graph.n_edges, gen).to(device))
    with frozen_eval(model):
        ablated = writer_outputs(model, x_corrupt)
        reference = model(x)

        def ours(**options: bool) -> None:
            z = hc.sample_mask(log_alpha, hc.uniform_noise(graph.n_edges, gen).to(device))
            out = masked_forward(model, graph, x, ablated, z, **options)
            divergence(out, reference, cfg.io).mean().backward()

        def naive() -> None:
            z = hc.sample_mask(log_alpha, hc.uniform_noise(graph.n_edges, gen).to(device))
            out = _naive_forward(model, graph, x, ablated, z)
            divergence(out, reference, cfg.io).mean().backward()

        memory_ours = memory_recompute = memory_naive = memory_plain = None
        if memory:
            memory_ours = peak_memory(ours, device)
            if transformer:
                memory_recompute = peak_memory(lambda: ours(recompute=True), device)
                if not graph.layout:  # the stacking scheme is written for GPT-2's layout
                    memory_naive = peak_memory(naive, device)
        opt = torch.optim.Adam([log_alpha], lr=0.1)

        def pruning_step(**options: bool) -> None:
            opt.zero_grad(set_to_none=True)
            ours(**options)
            opt.step()

    model.train()
    params = list(model.parameters())

    def plain_step() -> None:
        for p in params:
            p.grad = None
        divergence(model(x), reference, cfg.io).mean().backward()

    def timed(**options: bool) -> Callable[[], None]:
        def run() -> None:
            with frozen_eval(model):
                pruning_step(**options)

        return run

    if memory and not transformer:
        memory_plain = peak_memory(plain_step, device)
    fns = {"prune": timed(), "plain": plain_step}
    if straightforward:
        fns["straightforward"] = timed(fast=False)
    timings = time_interleaved(fns, repeats, device=device)
    for p in params:
        p.grad = None
    model.eval()
    return PruneBench(
        config={"arch": cfg.arch, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
                "n_heads": getattr(cfg, "n_heads", 0), "batch": batch, "n_pos": n_pos,
                "n_edges": graph.n_edges, "device": str(device)},
        memory_ours=memory_ours,
        memory_naive=memory_naive,
        step_seconds=timings["prune"].median,
        plain_seconds=timings["plain"].median,
        memory_recompute=memory_recompute,
        straightforward_seconds=timings["straightforward"].median if straightforward else None,
        memory_plain=memory_plain,
        timings=timings,
    )  # fmt: skip


def scale_model(preset: str, n_pos: int, d_vocab: int = 64, seed: int = 0) -> nn.Module:
    """A random token-mode model of a preset's widths, as the scale rows of
    ``docs/benchmarks.md`` use: ``gpt2_small_shape`` (12 x 768, 12 heads, 32,936 edges) or
    ``mamba_130m_shape`` (24 x 768, 325 edges), with ``d_vocab`` tokens (the reference
    bench's 64, not the real 50k: the trunk is the real shape, the vocabulary is not).

    Args:
        preset: A transformer or Mamba preset name.
        n_pos: Positions (the model's ``n_ctx``).
        d_vocab: Vocabulary size.
        seed: Seed of the random weights.
    """
    known = presets()
    if preset not in known:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(known)}")
    arch, fields = known[preset]
    widths = {k: v for k, v in fields.items() if k not in ("io", "d_in", "d_out", "n_ctx")}
    torch.manual_seed(seed)
    return build_model(arch, **widths, io="tokens", d_vocab=d_vocab, n_ctx=n_pos).eval()
