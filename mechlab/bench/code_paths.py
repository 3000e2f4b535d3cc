"""The code each benchmark exercises: what must not change for its record to stay current.

One entry per benchmark name (a record's ``bench``): git pathspecs relative to the
repository root, globs allowed (``*`` also crosses ``/``). Each list names the benchmark's
own module and the timing helpers, the engine modules it times and the model files it
builds; :mod:`mechlab.bench.stale` reports a record as older than the code when any of
these files changed since the commit it measured. Keep a list honest when a benchmark
starts timing something new.
"""

from __future__ import annotations

# the families and what they are built from (not the importers, exporters or tracr)
MODELS = [f"mechlab/models/{name}.py" for name in (
    "__init__", "base", "buffers", "cache", "hooked", "names", "recurrence", "registry", "scan", "stack",
    "transformer", "transformer_config", "sublayers", "norms", "rotary", "lstm", "dense_ssm", "mamba")]  # fmt: skip
TIMING = ["mechlab/bench/timing.py"]
PRUNE_ENGINE = ["mechlab/prune/forward.py", "mechlab/prune/ablation.py", "mechlab/prune/mixing.py", "mechlab/prune/masks.py",
                "mechlab/prune/graph.py", "mechlab/prune/edge_graph.py", "mechlab/traces.py"]  # fmt: skip

CODE_PATHS: dict[str, list[str]] = {
    # caching hooks beside the plain forward and nnsight, every family
    "hooks": ["mechlab/bench/hooks.py", "mechlab/patching/backends.py", *TIMING, *MODELS],
    # the recurrent families' scans (the hooks benchmark's models)
    "scan": ["mechlab/bench/scan.py", "mechlab/bench/hooks.py", *TIMING, *MODELS],
    # one pruning step (masked forward + backward) vs plain forward+backward, and its memory
    "prune": ["mechlab/bench/prune.py", "mechlab/bench/commands.py", "mechlab/bench/cpu_memory.py",
              *TIMING, *PRUNE_ENGINE, *MODELS],  # fmt: skip
    # our pruning step beside Edge Pruning's on the same GPT-2 weights
    "prune-reference": ["mechlab/bench/reference.py", "mechlab/bench/reference_runner.py",
                        "mechlab/bench/commands.py", *TIMING, *PRUNE_ENGINE, *MODELS],  # fmt: skip
    # training steps: the trainer, its task and batches
    "train": ["mechlab/bench/train.py", "mechlab/train/*.py", "mechlab/tasks/*.py", *TIMING, *MODELS],
    # vmapped ensemble training vs one trial at a time
    "ensemble": ["mechlab/bench/ensemble.py", "mechlab/bench/commands.py", "mechlab/train/ensemble.py",
                 "mechlab/train/trials.py", "mechlab/train/seeding.py", "mechlab/tasks/state_tracking.py",
                 *TIMING, *MODELS],  # fmt: skip
    # a billion-parameter import, cache and EAP-IG beside the bridge and nnsight
    "lm": ["mechlab/bench/lm.py", "mechlab/bench/lm_runner.py", "mechlab/models/importers.py",
           "mechlab/models/hf_config.py", "mechlab/models/hf_rope.py", "mechlab/models/hf_weights.py",
           "mechlab/models/hf_loaders.py", "mechlab/models/hf_files.py", "mechlab/prune/attribution.py", "mechlab/prune/objective.py",
           *PRUNE_ENGINE, *MODELS],  # fmt: skip
    # import time and the CLI's --help: what the package and its commands import at start
    "startup": ["mechlab/bench/startup.py", "mechlab/__init__.py", "mechlab/__main__.py", "mechlab/cli/*.py",
                "pyproject.toml"],  # fmt: skip
}


def code_paths(bench: str) -> list[str] | None:
    """The pathspecs benchmark ``bench`` exercises, or None when it declares none."""
    paths = CODE_PATHS.get(bench)
    return None if paths is None else list(paths)
