"""mechlab: train small sequence models, look inside them, find their circuits.

The public API, re-exported by name. Every name loads on first use, so ``import mechlab``
(and ``mechlab --help``) pays for neither torch nor TransformerLens, scikit-learn, pandas
or nnsight until a name that needs them is touched::

    import mechlab
    ckpt = mechlab.load_checkpoint("run.pt")
    circuits = mechlab.load_circuits(["1-after_seed0.json", "2-after_seed0.json"])
    t = mechlab.nih(ckpt, 64)
    result = mechlab.activation_patch(ckpt.model, t.clean, t.corrupted, metric)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time every name loads on first use
    from mechlab.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
    from mechlab.models import FAMILIES, MechModel, ModelConfig, build_model, make_config, presets
    from mechlab.models.cache import MechCache
    from mechlab.models.hooked import HookedModule, hooked
    from mechlab.models.importers import from_pretrained
    from mechlab.models.names import graph_name, hook_name
    from mechlab.pipelines import load_circuits
    from mechlab.tasks.nih import NiH, nih

__version__ = "0.1.0"

# Loaded on first access: subpackages, and names -> the module that defines them.
_LAZY_MODULES = (
    "checkpoint", "evals", "label_vs_observation", "models", "patching", "pipelines", "probes",
    "prune", "sweep", "tasks", "traces", "train", "viz",
    "recall", "report",  # deprecated shims (mechlab.label_vs_observation, mechlab.pipelines)
)  # fmt: skip
_LAZY_NAMES = {
    "Checkpoint": "mechlab.checkpoint",
    "CheckpointError": "mechlab.checkpoint",
    "load_checkpoint": "mechlab.checkpoint",
    "save_checkpoint": "mechlab.checkpoint",
    "FAMILIES": "mechlab.models",
    "MechModel": "mechlab.models",
    "ModelConfig": "mechlab.models",
    "build_model": "mechlab.models",
    "make_config": "mechlab.models",
    "presets": "mechlab.models",
    "MechCache": "mechlab.models.cache",
    "HookedModule": "mechlab.models.hooked",
    "hooked": "mechlab.models.hooked",
    "from_pretrained": "mechlab.models.importers",
    "graph_name": "mechlab.models.names",
    "hook_name": "mechlab.models.names",
    "NiH": "mechlab.tasks.nih",
    "nih": "mechlab.tasks.nih",
    "ReportConfig": "mechlab.pipelines",
    "make_report": "mechlab.pipelines",
    "circuit_explorer": "mechlab.viz",
    "PatchResult": "mechlab.patching",
    "activation_patch": "mechlab.patching",
    "attribution_patch": "mechlab.patching",
    "path_patch": "mechlab.patching",
    "ClassifierProbe": "mechlab.probes",
    "RegressorProbe": "mechlab.probes",
    "collect_activations": "mechlab.probes",
    "probe_sweep": "mechlab.probes",
    "recall_targets": "mechlab.probes",
    "RecallReport": "mechlab.label_vs_observation",
    "recall_analysis": "mechlab.label_vs_observation",
    "prune_checkpoint": "mechlab.pipelines",
    "open_checkpoint": "mechlab.pipelines",
    "load_circuits": "mechlab.pipelines",  # beside load_checkpoint: where one looks first
    "Traces": "mechlab.traces",
    "PruneData": "mechlab.traces",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"mechlab.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    raise AttributeError(f"module 'mechlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_MODULES) | set(_LAZY_NAMES))


__all__ = [
    "FAMILIES",
    "Checkpoint",
    "CheckpointError",
    "ClassifierProbe",
    "HookedModule",
    "MechCache",
    "MechModel",
    "ModelConfig",
    "NiH",
    "PatchResult",
    "PruneData",
    "RecallReport",
    "RegressorProbe",
    "ReportConfig",
    "Traces",
    "__version__",
    "activation_patch",
    "attribution_patch",
    "build_model",
    "circuit_explorer",
    "collect_activations",
    "from_pretrained",
    "graph_name",
    "hook_name",
    "hooked",
    "load_checkpoint",
    "load_circuits",
    "make_config",
    "make_report",
    "nih",
    "open_checkpoint",
    "path_patch",
    "presets",
    "probe_sweep",
    "prune_checkpoint",
    "recall_analysis",
    "recall_targets",
    "save_checkpoint",
]
