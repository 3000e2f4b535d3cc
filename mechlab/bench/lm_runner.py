"""One tool's side of ``mechlab bench lm``: a process of its own, so its peak memory is its own.

Run as ``python -m mechlab.bench.lm_runner TOOL FOLDER THREADS STEPS`` by
:func:`mechlab.bench.lm.bench_lm`. ``FOLDER`` holds a Hugging Face ``save_pretrained``
checkpoint and ``prompts.pt`` (the clean and corrupted prompts, token ids, loaded with
``weights_only=True``); ``TOOL`` is one of :data:`TOOLS`:

- ``write``: ``FOLDER/spec.json`` (a config class and its fields) -> a model of random
  weights in the config's dtype, written with ``save_pretrained`` (phase ``write``);
- ``mechlab``: :func:`mechlab.from_pretrained` of the folder (streamed, in the checkpoint's
  dtype, with the size limit raised to :data:`MAX_ELEMENTS`; phase ``load``),
  ``run_with_cache`` of every hook on the clean prompt (``cache``), and with ``STEPS`` > 0
  EAP-IG on the prompt pair with ``STEPS`` integration points (``attribute``);
- ``bridge``: ``AutoModelForCausalLM.from_pretrained`` of the folder in its dtype (eager
  attention, which the bridge needs for its attention hooks) wrapped in TransformerLens'
  ``TransformerBridge`` (``build_bridge_from_module``: no tokenizer, nothing downloaded;
  ``load``), then ``run_with_cache`` (``cache``);
- ``nnsight``: the same Hugging Face model in nnsight's ``LanguageModel`` (with a one-word
  tokenizer: the prompts are token ids; ``load``), then one trace that caches every decoder
  layer's output and the logits (``tracer.cache``; ``cache``).

Each phase is measured alone: the process's peak resident memory (``VmHWM``, reset to the
resident memory before the phase through ``/proc/self/clear_refs``) and its wall and CPU
seconds. It prints one JSON line, ``{"tool", "base_rss", "phases": [...], "info"}`` (the
resident memory after its imports, then per phase ``name``, ``seconds``, ``cpu_seconds``,
``peak_rss``, ``rss_after``), or ``{"tool", "refused": REASON}`` when the tool cannot run
the model (one line: the exception's type and message).
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

TOOLS = ("write", "mechlab", "bridge", "nnsight")
# mechlab's size limit for these imports: 2^32 elements, above Gemma-2-2B's 2.6e9 (the default
# limit, 2^31, refuses it and says how to raise it; the other tools have no limit)
MAX_ELEMENTS = 2**32
METHOD = "eap-ig"  # mechlab's attribution: EAP-IG, interchange ablation, loss over every position
# what each tool imports before its phases are measured (import time is reported apart)
IMPORTS = {
    "write": ("transformers",),
    "mechlab": (
        "mechlab.models.importers",
        "mechlab.prune.attribution",
        "transformers",
    ),
    "bridge": ("transformers", "transformer_lens.model_bridge.sources"),
    "nnsight": ("transformers", "nnsight"),
}


def _status(key: str) -> int | None:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``), or None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Set the high-water mark back to the resident memory now (Linux 4.0+)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class Phases:
    """The phases measured so far."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` timed, its peak resident memory measured; returns what it returns."""
        gc.collect()
        reset = _reset_peak()
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        peak = _status("VmHWM") if reset else None
        self.rows.append({"name": name, "seconds": seconds, "cpu_seconds": cpu, "peak_rss": peak,
                          "rss_after": _status("VmRSS")})  # fmt: skip
        return out


def _write(folder: Path, phases: Phases, info: dict[str, Any]) -> None:
    # lazy: each tool's process loads only its own libraries (its memory is measured)
    import transformers

    spec = json.loads((folder / "spec.json").read_text())
    config = getattr(transformers, spec["config"])(**spec["fields"])
    dtype = getattr(torch, spec["dtype"])

    def build() -> Any:
        torch.manual_seed(spec.get("seed", 0))
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.save_pretrained(folder)
        return model

    model = phases.run("write", build)
    info["parameters"] = sum(p.numel() for p in model.parameters())
    info["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())


def _prompts(folder: Path) -> tuple[Any, Any]:
    prompts = torch.load(folder / "prompts.pt", weights_only=True)
    return prompts["clean"], prompts["corrupted"]


def _cached(cache: Any) -> tuple[int, int]:
    """How many tensors a cache holds and their bytes."""
    values = [v for v in dict(cache).values() if isinstance(v, torch.Tensor)]
    return len(values), sum(v.numel() * v.element_size() for v in values)


def _mechlab(folder: Path, steps: int, phases: Phases, info: dict[str, Any]) -> None:
    # lazy: each tool's process loads only its own libraries (its memory is measured)
    from mechlab.models.importers import from_pretrained
    from mechlab.prune.attribution import attribute
    from mechlab.traces import Traces

    clean, corrupted = _prompts(folder)
    model = phases.run("load", lambda: from_pretrained(folder, max_elements=MAX_ELEMENTS))
    info["dtype"] = str(next(model.parameters()).dtype)
    with torch.no_grad():
        _, cache = phases.run("cache", lambda: model.run_with_cache(clean))
    info["cached_tensors"], info["cached_bytes"] = _cached(cache)
    del cache
    if steps > 0:
        traces = Traces(inputs=clean, corrupted=corrupted)
        scores = phases.run(
            "attribute", lambda: attribute(model, traces, "all", METHOD, steps=steps, batch_size=1)
        )
        info.update(method=METHOD, steps=steps, edges=int(scores.graph.n_edges),
                    scores_finite=bool(torch.isfinite(scores.scores).all()))  # fmt: skip


def _hf_model(folder: Path) -> Any:
    # lazy: each tool's process loads only its own libraries (its memory is measured)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        folder, dtype="auto", attn_implementation="eager"
    ).eval()


def _bridge(folder: Path, phases: Phases, info: dict[str, Any]) -> None:
    # lazy: each tool's process loads only its own libraries (its memory is measured)
    from transformer_lens.model_bridge.sources import build_bridge_from_module

    clean, _ = _prompts(folder)

    def load() -> Any:
        hf = _hf_model(folder)
        return build_bridge_from_module(
            hf, hf.config.architectures[0], hf_config=hf.config, model_name=folder.name
        )

    bridge = phases.run("load", load)
    info["dtype"] = str(next(bridge.parameters()).dtype)
    with torch.no_grad():
        _, cache = phases.run("cache", lambda: bridge.run_with_cache(clean))
    info["cached_tensors"], info["cached_bytes"] = _cached(cache)


def _tokenizer() -> Any:
    """A one-word tokenizer: nnsight's ``LanguageModel`` wants one, and the prompts are ids."""
    # lazy: each tool's process loads only its own libraries (its memory is measured)
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", pad_token="<unk>")


def _nnsight(folder: Path, phases: Phases, info: dict[str, Any]) -> None:
    # lazy: optional dependency (the nnsight extra); each tool's process loads only its own libraries
    from nnsight import LanguageModel

    clean, _ = _prompts(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LanguageModel's deprecation notice

        def load() -> tuple[Any, Any]:
            hf = _hf_model(folder)
            return hf, LanguageModel(hf, tokenizer=_tokenizer())

        hf, lm = phases.run("load", load)
    info["dtype"] = str(next(hf.parameters()).dtype)
    n_layers = hf.config.num_hidden_layers
    modules = [f"model.model.layers.{i}" for i in range(n_layers)] + ["model.lm_head"]

    def trace() -> Any:
        with lm.trace(clean) as tracer:
            cache = tracer.cache(modules=modules)
        return cache

    with torch.no_grad():
        cache = phases.run("cache", trace)
    outputs = [cache[name].output for name in modules]
    tensors = [o[0] if isinstance(o, tuple) else o for o in outputs]
    info["cached_tensors"] = len(tensors)
    info["cached_bytes"] = sum(t.numel() * t.element_size() for t in tensors)


def main(argv: list[str]) -> dict[str, Any]:
    """Measure ``TOOL``'s phases on ``FOLDER`` (module docstring); returns the JSON object.

    Args:
        argv: ``[TOOL, FOLDER, THREADS, STEPS]``.
    """
    tool, folder, threads, steps = argv

    torch.set_num_threads(int(threads))
    phases, info = Phases(), {}
    start = time.perf_counter()
    try:
        for name in IMPORTS.get(tool, ()):
            importlib.import_module(name)
    except ImportError as exc:
        return {"tool": tool, "refused": f"not installed: {exc.name or exc}"}
    info["imports_seconds"] = time.perf_counter() - start
    gc.collect()
    base = _status("VmRSS")
    try:
        if tool == "write":
            _write(Path(folder), phases, info)
        elif tool == "mechlab":
            _mechlab(Path(folder), int(steps), phases, info)
        elif tool == "bridge":
            _bridge(Path(folder), phases, info)
        elif tool == "nnsight":
            _nnsight(Path(folder), phases, info)
        else:
            return {
                "tool": tool,
                "refused": f"unknown tool {tool!r}; choose from {', '.join(TOOLS)}",
            }
    except Exception as exc:  # noqa: BLE001 - a tool that cannot run the model: its reason, one line
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return {"tool": tool, "refused": f"{type(exc).__name__}: {first}", "phases": phases.rows}
    return {
        "tool": tool,
        "base_rss": base,
        "phases": phases.rows,
        "info": info,
        "threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
