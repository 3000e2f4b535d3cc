"""A billion parameters on a laptop: import, cache and attribute a Llama-3.2-1B-shaped and a
Gemma-2-2B-shaped model, beside TransformerLens' bridge and nnsight on the same weights.

For every shape (:data:`SHAPES`: the real checkpoints' configs, or ``*-tiny`` versions of the
same design for tests) :func:`bench_lm`:

1. writes a model of random weights in bfloat16 with ``save_pretrained`` to a temporary
   folder (``AutoModelForCausalLM.from_config``: nothing is downloaded), and a clean and a
   corrupted prompt of ``n_pos`` random token ids (seeded);
2. runs each tool in a process of its own (:mod:`mechlab.bench.lm_runner`), one after the
   other, so each peak resident memory is that tool's alone: mechlab imports the folder
   (streamed, bfloat16), caches every hook on the clean prompt and, where the shape says so,
   attributes every edge with EAP-IG on the prompt pair; TransformerLens' ``TransformerBridge``
   and nnsight's ``LanguageModel`` load the folder through Hugging Face and cache (every
   hook / every decoder layer's output and the logits);
3. reports each phase's wall seconds and peak resident memory, and each competitor's ratios
   to mechlab's (time of each phase, and the peak of loading and caching). A tool that
   cannot run a shape is reported in one line with its reason instead of numbers.

The whole-run figures are one run each (a billion-parameter forward is seconds, and the
machine's memory allows one at a time), so they are provisional under load like every
benchmark (:mod:`mechlab.bench.record`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlab.bench.record import Table

COMPETITORS = ("bridge", "nnsight")
TOOL_NAMES = {"mechlab": "mechlab", "bridge": "TransformerLens bridge", "nnsight": "nnsight"}
GB = 1e9

_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip


@dataclass(frozen=True)
class LMShape:
    """A model shape: a ``transformers`` config class and its fields, and what is run on it.

    Attributes:
        name: The shape's name (``--shapes``).
        config: The ``transformers`` config class (``LlamaConfig``, ``Gemma2Config``).
        fields: Its keyword arguments (every one of the real checkpoint's that matters).
        attribute: Whether mechlab also attributes its edges with EAP-IG.
    """

    name: str
    config: str
    fields: dict[str, Any]
    attribute: bool

    def __post_init__(self) -> None:
        if not self.name or not self.config.endswith("Config"):
            raise ValueError(
                f"shape {self.name!r}: config must name a transformers config class, got {self.config!r}"
            )
        if not isinstance(self.fields.get("vocab_size"), int) or self.fields["vocab_size"] < 2:
            raise ValueError(
                f"shape {self.name!r}: fields need an integer vocab_size of at least 2"
            )


def _llama(name: str, d: int, layers: int, heads: int, kv: int, head_dim: int, d_mlp: int, vocab: int,
           max_pos: int, rope: dict[str, Any]) -> LMShape:  # fmt: skip
    return LMShape(name, "LlamaConfig", {
        "vocab_size": vocab, "hidden_size": d, "intermediate_size": d_mlp, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim, "hidden_act": "silu",
        "max_position_embeddings": max_pos, "rms_norm_eps": 1e-5, "rope_parameters": rope,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}, attribute=True)  # fmt: skip


def _gemma2(name: str, d: int, layers: int, heads: int, kv: int, head_dim: int, d_mlp: int, vocab: int,
            window: int) -> LMShape:  # fmt: skip
    return LMShape(name, "Gemma2Config", {
        "vocab_size": vocab, "hidden_size": d, "intermediate_size": d_mlp, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "sliding_window": window, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": head_dim, "tie_word_embeddings": True}, attribute=False)  # fmt: skip


# the real configs' shapes (meta-llama/Llama-3.2-1B, google/gemma-2-2b), and tiny ones of the same
# design (rope scaling; soft-caps and a window shorter than a 16-token prompt) for tests
SHAPES: dict[str, LMShape] = {
    "llama-3.2-1b": _llama("llama-3.2-1b", 2048, 16, 32, 8, 64, 8192, 128256, 131072, _LLAMA3_ROPE),
    "gemma-2-2b": _gemma2("gemma-2-2b", 2304, 26, 8, 4, 256, 9216, 256000, 4096),
    "llama-tiny": _llama(
        "llama-tiny",
        64,
        2,
        4,
        2,
        16,
        128,
        512,
        2048,
        {**_LLAMA3_ROPE, "original_max_position_embeddings": 64},
    ),  # fmt: skip
    "gemma-tiny": _gemma2("gemma-tiny", 64, 2, 4, 2, 32, 128, 512, 8),
}


@dataclass(frozen=True)
class LMBenchConfig:
    """What ``mechlab bench lm`` runs.

    Attributes:
        shapes: Names of :data:`SHAPES`.
        n_pos: Tokens of each prompt.
        threads: Torch threads of every tool's process.
        steps: EAP-IG's integration points (on the shapes that attribute).
        tools: The competitors beside mechlab (a subset of :data:`COMPETITORS`).
        seed: Seed of the random weights and prompts.
        timeout: Seconds any one tool's process may run.
    """

    shapes: tuple[str, ...]
    n_pos: int = 128
    threads: int = 2
    steps: int = 10
    tools: tuple[str, ...] = COMPETITORS
    seed: int = 0
    timeout: float = 3600.0

    def __post_init__(self) -> None:
        unknown = [s for s in self.shapes if s not in SHAPES]
        if unknown or not self.shapes:
            raise ValueError(
                f"unknown shape {unknown[0] if unknown else ''!r}; choose from {', '.join(SHAPES)}"
            )
        bad = [t for t in self.tools if t not in COMPETITORS]
        if bad:
            raise ValueError(
                f"unknown tool {bad[0]!r}; choose from {', '.join(COMPETITORS)} (mechlab always runs)"
            )
        for name, value, low in (("n_pos", self.n_pos, 2), ("threads", self.threads, 1), ("steps", self.steps, 1),
                                 ("timeout", self.timeout, 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                raise ValueError(f"{name} must be a number >= {low}, got {value!r}")
        for name in self.shapes:
            limit = SHAPES[name].fields["max_position_embeddings"]
            if self.n_pos > limit:
                raise ValueError(
                    f"n_pos {self.n_pos} is longer than shape {name!r} accepts ({limit}); give a shorter --pos"
                )


@dataclass
class ToolRun:
    """One tool's process: its phases (name -> seconds, peak RSS bytes), or why it refused."""

    tool: str
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    base_rss: int | None = None
    refused: str | None = None

    def seconds(self, *phases: str) -> float | None:
        """The seconds of ``phases``, summed (None when one of them did not run)."""
        if not phases or any(p not in self.phases for p in phases):
            return None
        return sum(self.phases[p]["seconds"] for p in phases)

    def peak(self, phases: Sequence[str] = ("load", "cache")) -> int | None:
        """The highest peak RSS over ``phases`` (None when none was measured)."""
        peaks = [self.phases[p]["peak_rss"] for p in phases if p in self.phases]
        peaks = [p for p in peaks if p is not None]
        return max(peaks) if peaks else None

    @classmethod
    def from_output(cls, tool: str, out: dict[str, Any]) -> ToolRun:
        return cls(tool, {p["name"]: p for p in out.get("phases", [])}, dict(out.get("info", {})),
                   out.get("base_rss"), out.get("refused"))  # fmt: skip


def _source_root() -> Path:
    """The folder holding the ``mechlab`` package this process imported."""
    return Path(__file__).resolve().parents[2]


def run_tool(tool: str, folder: Path, threads: int, steps: int, timeout: float) -> ToolRun:
    """Run :mod:`mechlab.bench.lm_runner` for ``tool`` in a fresh process; a process that
    fails without its JSON line (killed, out of memory, timed out) is a refusal with the
    reason."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_source_root()), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = [
        sys.executable,
        "-m",
        "mechlab.bench.lm_runner",
        tool,
        str(folder),
        str(threads),
        str(steps),
    ]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return ToolRun(tool, refused=f"did not finish within {timeout:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        err = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        why = f"its process exited with status {proc.returncode}"
        if proc.returncode < 0:
            why = f"its process was killed by signal {-proc.returncode} (out of memory?)"
        return ToolRun(tool, refused=why + (f": {err[-1][:200]}" if err else ""))
    return ToolRun.from_output(tool, json.loads(lines[-1]))


def _write_inputs(shape: LMShape, folder: Path, n_pos: int, seed: int) -> None:
    """The spec the ``write`` runner builds the model from, and the prompt pair."""
    # lazy: mechlab.cli imports this module, and mechlab --help runs without torch
    import torch

    spec = {"config": shape.config, "fields": shape.fields, "dtype": "bfloat16", "seed": seed}
    (folder / "spec.json").write_text(json.dumps(spec))
    gen = torch.Generator().manual_seed(seed)
    vocab = shape.fields["vocab_size"]
    clean = torch.randint(0, vocab, (1, n_pos), generator=gen)
    corrupted = torch.randint(0, vocab, (1, n_pos), generator=gen)
    torch.save({"clean": clean, "corrupted": corrupted}, folder / "prompts.pt")


@dataclass
class ShapeResult:
    """Every tool's run on one shape, and the model that was written."""

    shape: str
    write: ToolRun
    runs: dict[str, ToolRun]

    def ratio(self, tool: str, *phases: str) -> float | None:
        """``tool``'s seconds of ``phases`` (summed) over mechlab's (above 1: mechlab is faster)."""
        ours, theirs = self.runs["mechlab"].seconds(*phases), self.runs[tool].seconds(*phases)
        return None if not ours or theirs is None else theirs / ours

    def memory_ratio(self, tool: str) -> float | None:
        """``tool``'s peak RSS of loading and caching over mechlab's."""
        ours, theirs = self.runs["mechlab"].peak(), self.runs[tool].peak()
        return None if not ours or theirs is None else theirs / ours


def bench_shape(shape: LMShape, cfg: LMBenchConfig, workdir: Path, log: Any = None) -> ShapeResult:
    """Write ``shape``'s random checkpoint under ``workdir`` and run every tool on it."""
    folder = workdir / shape.name
    folder.mkdir()
    _write_inputs(shape, folder, cfg.n_pos, cfg.seed)
    say = log or (lambda _: None)
    say(f"{shape.name}: writing random bfloat16 weights ...")
    write = run_tool("write", folder, cfg.threads, 0, cfg.timeout)
    if write.refused:
        raise RuntimeError(f"{shape.name}: could not write the random checkpoint ({write.refused})")
    runs = {}
    steps = cfg.steps if shape.attribute else 0
    try:
        for tool in ("mechlab", *cfg.tools):
            say(f"{shape.name}: {TOOL_NAMES[tool]} ...")
            runs[tool] = run_tool(tool, folder, cfg.threads, steps, cfg.timeout)
    finally:
        shutil.rmtree(
            folder, ignore_errors=True
        )  # gigabytes: gone before the next shape is written
    return ShapeResult(shape.name, write, runs)


def bench_lm(cfg: LMBenchConfig, log: Any = None) -> list[ShapeResult]:
    """Every shape of ``cfg`` (module docstring), in a temporary folder removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="mechlab-bench-lm-") as tmp:
        return [bench_shape(SHAPES[name], cfg, Path(tmp), log) for name in cfg.shapes]


def raw_runs(results: Sequence[ShapeResult]) -> dict[str, Any]:
    """Every process's output as measured (per phase: seconds, CPU seconds, peak and final RSS)."""
    return {
        r.shape: {tool: vars(run) for tool, run in {"write": r.write, **r.runs}.items()}
        for r in results
    }


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def _gb(x: int | None) -> str:
    return "-" if x is None else f"{x / GB:.2f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


COLUMNS = ["shape", "tool", "load s", "load peak GB", "cache s", "cache peak GB", "cached", "EAP-IG s",
           "EAP-IG peak GB", "load / mechlab", "cache / mechlab", "load + cache / mechlab",
           "peak / mechlab"]  # fmt: skip
# Hugging Face's from_pretrained maps a bfloat16 safetensors file and leaves its weights in the
# mapping: they are read from the file at the first forward, the bridge's and nnsight's cache
LAZY_NOTE = ("the bridge and nnsight load through Hugging Face's from_pretrained, whose bfloat16 weights "
             "stay memory-mapped from the file until the first forward reads them: their load is "
             "little more than the mapping, their cache includes reading the weights, so compare "
             "load + cache; mechlab copies the weights into its own tensors at load")  # fmt: skip


def lm_table(results: Sequence[ShapeResult], cfg: LMBenchConfig) -> Table:
    """One row per shape and tool: each phase's seconds and peak RSS, and the ratios to
    mechlab's; a refusal is its reason in the row's note."""
    rows, values, notes = [], [], []
    for r in results:
        for tool, run in r.runs.items():
            v: dict[str, Any] = {"shape": r.shape, "tool": tool, "refused": run.refused, "base_rss": run.base_rss,
                                 "parameters": r.write.info.get("parameters"),
                                 "weight_bytes": r.write.info.get("weight_bytes"), "threads": cfg.threads, **run.info}  # fmt: skip
            for phase in ("load", "cache", "attribute"):
                v[f"{phase}_s"] = run.seconds(phase)
                v[f"{phase}_peak_rss"] = run.phases.get(phase, {}).get("peak_rss")
            v["peak_rss"] = run.peak(("load", "cache", "attribute"))
            if tool != "mechlab":
                v.update(load_ratio=r.ratio(tool, "load"), cache_ratio=r.ratio(tool, "cache"),
                         total_ratio=r.ratio(tool, "load", "cache"), memory_ratio=r.memory_ratio(tool))  # fmt: skip
            values.append(v)
            if run.refused:
                rows.append([r.shape, TOOL_NAMES[tool], *["-"] * (len(COLUMNS) - 2)])
                notes.append(f"{r.shape}, {TOOL_NAMES[tool]}: cannot run it: {run.refused}")
                continue
            cached = run.info.get("cached_tensors")
            rows.append([r.shape, TOOL_NAMES[tool], _s(v["load_s"]), _gb(v["load_peak_rss"]), _s(v["cache_s"]),
                         _gb(v["cache_peak_rss"]),
                         "-" if cached is None else f"{cached} ({run.info['cached_bytes'] / 2**20:,.0f} MiB)",
                         _s(v["attribute_s"]), _gb(v["attribute_peak_rss"]),
                         _x(v.get("load_ratio")), _x(v.get("cache_ratio")), _x(v.get("total_ratio")),
                         _x(v.get("memory_ratio"))])  # fmt: skip
    title = (f"random bfloat16 weights; a {cfg.n_pos}-token prompt (EAP-IG: a pair, {cfg.steps} steps); "
             f"{cfg.threads} torch threads; each tool in a process of its own, one run; peak: resident memory, "
             "GB = 10^9 bytes; cached: tensors (size) - mechlab's and the bridge's every hook point, nnsight "
             "every decoder layer's output and the logits")  # fmt: skip
    shapes = []
    for r in results:
        p = r.write.info
        shapes.append(f"{r.shape}: {p.get('parameters', 0):,} parameters, {p.get('weight_bytes', 0) / 2**20:,.0f} MiB "
                      f"of bfloat16 weights (written in {_s(r.write.seconds('write'))} s)")  # fmt: skip
    lazy = [LAZY_NOTE] if any(set(r.runs) - {"mechlab"} for r in results) else []
    notes = shapes + lazy + notes
    return Table(COLUMNS, rows, title=title, values=values, notes=notes)
