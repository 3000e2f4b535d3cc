"""`mechlab bench scan`: the chunked scans against the per-step loops they replace.

For Mamba and the dense SSM (the models of ``mechlab bench hooks``), side by side in one
run: the plain forward (no gradients) and a forward+backward, each with ``scan="loop"``
(the per-step reference) and ``scan="chunked"`` (:mod:`mechlab.models.scan`); medians,
ratios loop / chunked, and how far the chunked outputs and gradients are from the loop's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mechlab.bench.hooks import BENCH_MODELS
from mechlab.bench.record import Table
from mechlab.bench.timing import Timing, fmt_ms, fmt_ratio, paired_ratio, time_interleaved
from mechlab.models import build_model
from mechlab.models.base import MechModel

SCAN_FAMILIES = ("mamba", "dense_ssm")


@dataclass
class ScanBenchRow:
    """One family's medians (seconds) and the chunked scan's distance from the loop."""

    family: str
    chunk: int
    loop_forward: float
    chunked_forward: float
    loop_backward: float  # forward + backward
    chunked_backward: float
    output_diff: float  # max |chunked - loop| of the output, relative to max |loop|
    grad_diff: float  # max over parameters of max |chunked - loop| / max |loop| of the gradient
    timings: dict[str, Timing] = field(default_factory=dict)  # contender -> every run

    @property
    def forward_speedup(self) -> float:
        return self.loop_forward / self.chunked_forward

    @property
    def backward_speedup(self) -> float:
        return self.loop_backward / self.chunked_backward


def _set_scan(model: MechModel, scan: str, chunk: int) -> None:
    model.scan = scan
    for block in model.blocks:
        block._modules[block.mixer_name].chunk = chunk


def _loss_and_grads(
    model: MechModel, x: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(x)
    out.square().mean().backward()
    return out.detach(), {
        n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None
    }


def bench_scan(
    family: str,
    batch: int = 64,
    n_pos: int = 251,
    repeats: int = 5,
    chunk: int = 16,
    device: str = "cpu",
) -> ScanBenchRow:
    """Time one family's loop and chunked scans, forward and forward+backward.

    Args:
        family: ``"mamba"`` or ``"dense_ssm"``.
        batch: Batch size.
        n_pos: Sequence length.
        repeats: Timed runs of each contender (the median is reported).
        chunk: Positions per chunk of the chunked scan.
        device: Torch device.

    Returns:
        The medians, speed-ups and distances.
    """
    if family not in SCAN_FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {list(SCAN_FAMILIES)}")
    model: MechModel = build_model(BENCH_MODELS[family], n_ctx=max(n_pos, 1)).to(device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, n_pos, model.cfg.d_in, generator=gen).to(device)

    def forward(scan: str):
        def run() -> None:
            _set_scan(model, scan, chunk)
            with torch.no_grad():
                model(x)

        return run

    def backward(scan: str):
        def run() -> None:
            _set_scan(model, scan, chunk)
            model.zero_grad(set_to_none=True)
            model(x).square().mean().backward()

        return run

    fns = {
        "loop_forward": forward("loop"),
        "chunked_forward": forward("chunked"),
        "loop_backward": backward("loop"),
        "chunked_backward": backward("chunked"),
    }
    times = time_interleaved(fns, repeats=repeats, device=device)
    _set_scan(model, "loop", chunk)
    out_loop, grads_loop = _loss_and_grads(model, x)
    _set_scan(model, "chunked", chunk)
    out_chunked, grads_chunked = _loss_and_grads(model, x)
    output_diff = ((out_chunked - out_loop).abs().max() / out_loop.abs().max()).item()
    grad_diff = max(
        ((grads_chunked[n] - g).abs().max() / g.abs().max().clamp_min(1e-30)).item()
        for n, g in grads_loop.items()
    )
    return ScanBenchRow(
        family=family,
        chunk=chunk,
        loop_forward=times["loop_forward"].median,
        chunked_forward=times["chunked_forward"].median,
        loop_backward=times["loop_backward"].median,
        chunked_backward=times["chunked_backward"].median,
        output_diff=output_diff,
        grad_diff=grad_diff,
        timings=times,
    )


def scan_table(rows: list[ScanBenchRow]) -> Table:
    """``mechlab bench scan``'s table: medians [quartiles] and loop / chunked run by run."""
    columns = ["family", "loop fwd ms", "chunked fwd ms", "loop / chunked", "loop fwd+bwd ms",
               "chunked fwd+bwd ms", "loop / chunked", "output diff", "grad diff"]  # fmt: skip
    cells, values = [], []
    for r in rows:
        t = r.timings
        fwd = paired_ratio(t["loop_forward"], t["chunked_forward"])
        bwd = paired_ratio(t["loop_backward"], t["chunked_backward"])
        cells.append([r.family, fmt_ms(t["loop_forward"]), fmt_ms(t["chunked_forward"]), fmt_ratio(fwd),
                      fmt_ms(t["loop_backward"]), fmt_ms(t["chunked_backward"]), fmt_ratio(bwd),
                      f"{r.output_diff:.1e}", f"{r.grad_diff:.1e}"])  # fmt: skip
        values.append({"family": r.family, "chunk": r.chunk, **{f"{k}_s": v.median for k, v in t.items()},
                       "forward_speedup": fwd[1], "backward_speedup": bwd[1], "output_diff": r.output_diff,
                       "grad_diff": r.grad_diff})  # fmt: skip
    return Table(columns, cells, values=values)
