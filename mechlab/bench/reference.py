"""`mechlab bench prune --reference PATH`: mechlab's pruning step beside the Edge Pruning code's.

The reference implementation (Bhaskar et al. 2024, ``princeton-nlp/Edge-Pruning``) is
never part of mechlab: the user checks it out and gives its path. Its GPT-2 model
``src/modeling/modeling_fpt2.py`` (``FPT2LMHeadModel``; it imports ``l0.py`` beside it
and Hugging Face ``transformers`` 4.x, which mechlab's own dependencies have moved past)
runs in a process of its own (:mod:`mechlab.bench.reference_runner`), under
``python`` (default: this interpreter; give one whose ``transformers`` is 4.x). The two
processes take turns step by step (:func:`~mechlab.bench.timing.time_interleaved`; the
pipe adds well under a millisecond to each reference step).

Both sides get the same weights (a token-mode mechlab transformer with a preset's
widths, copied into GPT-2's layout with :func:`mechlab.models.export.to_hf_gpt2`), the
same batch, the same corrupted batch for interchange ablation, and the same edge
log-alphas (mechlab's, written into the reference's per-layer ``*_read_log_alphas``);
each draws its own hard-concrete noise. The reference's node masks are kept open
(log-alpha 100, which samples exactly 1), as mechlab's step has none. Before timing, the
reference is checked to reproduce mechlab's outputs with every edge kept and with every
edge ablated. One step on each side: sample masks, masked forward, KL divergence to the
full model's outputs (the reference adds its sparsity regulariser, computed in its
forward pass), backward, an Adam step on the log-alphas.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mechlab.bench.prune import peak_memory
from mechlab.bench.timing import time_interleaved
from mechlab.models import build_model
from mechlab.models.export import to_hf_gpt2
from mechlab.models.transformer import PRESETS
from mechlab.prune import masks as hc
from mechlab.prune.forward import divergence, frozen_eval, masked_forward, writer_outputs
from mechlab.prune.graph import EdgeGraph, build_graph

MODEL_FILE = Path("src") / "modeling" / "modeling_fpt2.py"
OPEN = 100.0  # a log-alpha whose hard-concrete samples are exactly 1
RUNNER = Path(__file__).with_name("reference_runner.py")


def check_reference(path: str | Path) -> Path:
    """The reference's model file in a checkout of Edge-Pruning.

    Args:
        path: The checkout's root.

    Returns:
        ``path / src/modeling/modeling_fpt2.py``.

    Raises:
        ValueError: No such file.
    """
    file = Path(path) / MODEL_FILE
    if not file.is_file():
        raise ValueError(
            f"no {MODEL_FILE} under {str(path)!r}: give the root of a checkout of "
            "princeton-nlp/Edge-Pruning"
        )
    return file


def reference_log_alphas(
    graph: EdgeGraph, log_alpha: Tensor, n_heads: int
) -> dict[str, Tensor]:
    """mechlab's edge log-alphas as the reference's parameters (node log-alphas open).

    Rows of writers a reader cannot see keep the reference's initial 10 (it multiplies them
    by 0).

    Args:
        graph: mechlab's graph of the transformer.
        log_alpha: ``[n_edges]`` in ``graph``'s edge order.
        n_heads: Heads per layer.

    Returns:
        Parameter name of ``FPT2LMHeadModel`` (with embedding nodes) -> value.
    """
    n_w, n_layers = graph.n_writers, graph.n_layers
    out: dict[str, Tensor] = {
        "transformer.token_write_log_alpha": torch.full((1,), OPEN),
        "transformer.pos_write_log_alpha": torch.full((1,), OPEN),
        "transformer.final_read_log_alphas": torch.full((n_w,), 10.0),
    }
    for layer in range(n_layers):
        prefix = f"transformer.h.{layer}."
        for kind in "qkv":
            out[f"{prefix}{kind}_read_log_alphas"] = torch.full((n_w, n_heads), 10.0)
        out[f"{prefix}mlp_read_log_alphas"] = torch.full((n_w,), 10.0)
        out[f"{prefix}attn_write_log_alphas"] = torch.full((n_heads,), OPEN)
        out[f"{prefix}mlp_write_log_alphas"] = torch.full((1,), OPEN)
    values = log_alpha.detach().cpu().float()
    for i, (writer, reader) in enumerate(graph.edges):
        w = graph.writer_index[writer]
        if reader == "out":
            out["transformer.final_read_log_alphas"][w] = values[i]
        elif reader.startswith("m"):
            out[f"transformer.h.{reader[1 : reader.index('.')]}.mlp_read_log_alphas"][w] = values[i]
        else:  # a{layer}.h{head}.{q|k|v}
            layer, head, kind = reader[1:].split(".")
            out[f"transformer.h.{layer}.{kind}_read_log_alphas"][w, int(head[1:])] = values[i]
    return out


class _ReferenceProcess:
    """The runner process: started with the data, then one pruning step per :meth:`step`."""

    def __init__(self, python: str, checkout: Path, data_file: Path, threads: int):
        # its warnings go to a file: a pipe nobody reads could fill up and stall it
        self.stderr = open(data_file.with_suffix(".stderr"), "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [python, str(RUNNER), str(checkout), str(data_file), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
        )  # fmt: skip
        first = self._line()
        if not first.startswith("ready "):
            self.close()
            raise ValueError(f"the reference process said {first!r} instead of ready")
        self.max_diff = float(first.split()[1])

    def _line(self) -> str:
        line = self.proc.stdout.readline().strip()
        if line.startswith("error: "):
            self.close()
            raise ValueError(line[len("error: ") :])
        if not line:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            self.stderr.seek(0)
            err = self.stderr.read().strip().splitlines()
            self.close()
            raise ValueError(f"the reference process ended: {err[-1] if err else 'no message'}")
        return line

    def step(self) -> None:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        if self._line() != "done":
            raise ValueError("the reference process answered out of turn")

    def memory(self) -> int:
        """Peak bytes of one reference step (its own profiler, in its process)."""
        self.proc.stdin.write("memory\n")
        self.proc.stdin.flush()
        line = self._line()
        if not line.startswith("memory "):
            raise ValueError("the reference process answered out of turn")
        return int(line.split()[1])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            if stream is not None and not stream.closed:
                try:
                    stream.close()
                except (BrokenPipeError, OSError):
                    pass


@dataclass
class ReferenceBench:
    """mechlab's pruning step beside the reference's (one config)."""

    config: dict[str, Any]
    ours_seconds: float
    reference_seconds: float
    max_output_diff: float  # the reference against mechlab, all edges kept and all ablated
    memory_ours: int | None = None  # bytes, one mechlab step (None: not measured)
    memory_reference: int | None = None  # bytes, one reference step

    @property
    def ratio(self) -> float:
        """Reference step / mechlab step (above 1: mechlab is faster)."""
        return self.reference_seconds / self.ours_seconds


def bench_reference(
    checkout: str | Path,
    preset: str = "tiny",
    batch: int = 16,
    n_pos: int = 64,
    repeats: int = 5,
    python: str | None = None,
    d_vocab: int = 64,
    seed: int = 0,
    memory: bool = False,
) -> ReferenceBench:
    """Time one pruning step of mechlab and of the reference on the same model and batch.

    Args:
        checkout: Root of a checkout of princeton-nlp/Edge-Pruning.
        preset: A transformer preset; its widths, in token mode with ``d_vocab`` tokens.
        batch: Traces per batch.
        n_pos: Positions per trace.
        repeats: Timed runs of each (medians).
        python: The interpreter that runs the reference (default: this one).
        d_vocab: Vocabulary size of the token model.
        seed: Seeds weights, batches and log-alphas.
        memory: Also measure each side's peak memory of one step (each with torch's
            profiler in its own process, before the timed runs).

    Returns:
        The :class:`ReferenceBench`.

    Raises:
        ValueError: No model file in ``checkout``, the reference does not import or does
            not reproduce mechlab's outputs.
    """
    checkout_file = check_reference(checkout)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    sizes = {k: PRESETS[preset][k] for k in ("d_model", "n_layers", "n_heads")}
    torch.manual_seed(seed)
    model = build_model("transformer", io="tokens", d_vocab=d_vocab, n_ctx=n_pos, **sizes).eval()
    graph = build_graph(model)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, d_vocab, (batch, n_pos), generator=gen)
    x_corrupt = torch.randint(0, d_vocab, (batch, n_pos), generator=gen)
    log_alpha = nn.Parameter(hc.init_log_alpha(graph.n_edges, gen))
    with frozen_eval(model):
        ablated = writer_outputs(model, x_corrupt)
        full, corrupt = model(x), model(x_corrupt)
    hf = to_hf_gpt2(model)
    data = {
        "config": hf.config.to_dict(),
        "weights": {k: v.detach().clone() for k, v in hf.state_dict().items()},
        "inputs": x, "corrupted": x_corrupt, "full": full, "corrupt": corrupt,
        "log_alphas": reference_log_alphas(graph, log_alpha, sizes["n_heads"]),
        "log_alphas_open": reference_log_alphas(graph, torch.full((graph.n_edges,), OPEN), sizes["n_heads"]),
        "log_alphas_closed": reference_log_alphas(graph, torch.full((graph.n_edges,), -OPEN), sizes["n_heads"]),
    }  # fmt: skip
    opt = torch.optim.Adam([log_alpha], lr=0.1)
    full_flat = full.flatten(0, 1)  # [batch * pos, vocab]

    def ours() -> None:
        with frozen_eval(model):
            opt.zero_grad(set_to_none=True)
            z = hc.sample_mask(log_alpha, hc.uniform_noise(graph.n_edges, gen))
            out = masked_forward(model, graph, x, ablated, z)
            divergence(out.flatten(0, 1), full_flat, "tokens").mean().backward()
            opt.step()

    with tempfile.TemporaryDirectory() as tmp:
        data_file = Path(tmp) / "reference_data.pt"
        torch.save(data, data_file)
        root = checkout_file.parents[2]
        ref = _ReferenceProcess(python or sys.executable, root, data_file, torch.get_num_threads())
        try:
            if ref.max_diff > 1e-3:
                raise ValueError(
                    f"the reference model does not reproduce mechlab's outputs (max difference "
                    f"{ref.max_diff:.3g} with every edge kept / ablated); is it the same FPT2 code?"
                )
            memory_ours = memory_reference = None
            if memory:
                memory_ours, memory_reference = peak_memory(ours), ref.memory()
            times = time_interleaved({"ours": ours, "reference": ref.step}, repeats)
        finally:
            ref.close()
    return ReferenceBench(
        config={"preset": preset, "io": "tokens", "d_vocab": d_vocab, "batch": batch,
                "n_pos": n_pos, "n_edges": graph.n_edges, **sizes},
        ours_seconds=times["ours"].median,
        reference_seconds=times["reference"].median,
        max_output_diff=ref.max_diff,
        memory_ours=memory_ours,
        memory_reference=memory_reference,
    )  # fmt: skip
