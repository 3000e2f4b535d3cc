"""Data for mechlab's studies: the interleaved linear-systems recall task (``lds``), its
evaluation traces (``lds_evals``) and its analysis-ready needle-in-a-haystack traces
(``nih``); state tracking on Z_m and S_5 (``state_tracking``); induction on repeated random
tokens (``induction``); clean/corrupted prompt pairs of token models (``prompts``) and
IOI-style prompts (``ioi``).

Every task a checkpoint can be trained on is one entry of :mod:`mechlab.tasks.registry`
(:func:`get_task`): its config, targets, default corruption and pruning traces. A
checkpoint names its task in ``metadata["task"]`` and stores the task's config in
``metadata["task_cfg"]``; :func:`task_config` turns them back into the config object.

The names load their module on first use, so that the registry can be read (the checks a
command makes before torch loads) without importing the tasks.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from mechlab.tasks.registry import Task, get_task, register, task_config, task_names

if TYPE_CHECKING:  # for type checkers and IDEs; at run time every name loads on first use
    from mechlab.tasks.induction import InductionConfig, Sequences, sample_sequences
    from mechlab.tasks.induction_prune import induction_prune_data
    from mechlab.tasks.ioi import ioi_records
    from mechlab.tasks.lds import CLOSE, OBS, OPEN, START, LDSBatch, LDSConfig, sample_batch
    from mechlab.tasks.lds_evals import (
        NIH_OFFSETS,
        NIH_PROTOCOLS,
        PROBES,
        EvalTraces,
        least_squares_predict,
        needle_in_haystack,
        nih_protocol,
        uninterleaved,
    )
    from mechlab.tasks.lds_systems import SystemLibrary, make_libraries
    from mechlab.tasks.nih import NiH, default_haystack, nih
    from mechlab.tasks.prompts import (
        PromptPairs,
        load_pairs,
        load_tokenizer,
        logit_diff_metrics,
        pairs_from_records,
    )
    from mechlab.tasks.state_tracking import (
        S5_PERMUTATIONS,
        SequenceSet,
        StateTrackingConfig,
        StateTrackingData,
        compose,
        identity,
        make_data,
        normalised_accuracy,
    )

_LAZY = {
    **dict.fromkeys(("InductionConfig", "Sequences", "sample_sequences"), "mechlab.tasks.induction"),
    "induction_prune_data": "mechlab.tasks.induction_prune",
    "ioi_records": "mechlab.tasks.ioi",
    **dict.fromkeys(("CLOSE", "OBS", "OPEN", "START", "LDSBatch", "LDSConfig", "sample_batch"), "mechlab.tasks.lds"),
    **dict.fromkeys(("NIH_OFFSETS", "NIH_PROTOCOLS", "PROBES", "EvalTraces", "least_squares_predict",
                     "needle_in_haystack", "nih_protocol", "uninterleaved"), "mechlab.tasks.lds_evals"),
    **dict.fromkeys(("SystemLibrary", "make_libraries"), "mechlab.tasks.lds_systems"),
    **dict.fromkeys(("NiH", "default_haystack", "nih"), "mechlab.tasks.nih"),
    **dict.fromkeys(("PromptPairs", "load_pairs", "load_tokenizer", "logit_diff_metrics", "pairs_from_records"),
                    "mechlab.tasks.prompts"),
    **dict.fromkeys(("S5_PERMUTATIONS", "SequenceSet", "StateTrackingConfig", "StateTrackingData", "compose",
                     "identity", "make_data", "normalised_accuracy"), "mechlab.tasks.state_tracking"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "TASK_CONFIGS":  # task name -> its config class (a dataclass with from_dict/to_dict)
        return {task: get_task(task).config() for task in task_names()}
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mechlab.tasks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "TASK_CONFIGS"})


class _Package(types.ModuleType):
    """The package, whose ``nih`` stays the function :func:`mechlab.tasks.nih.nih` (as when
    every name was imported eagerly) when the import of the submodule binds its name here."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "nih" and isinstance(value, types.ModuleType):
            value = value.nih
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__all__ = [
    "CLOSE",
    "InductionConfig",
    "PromptPairs",
    "Sequences",
    "Task",
    "get_task",
    "induction_prune_data",
    "ioi_records",
    "load_pairs",
    "load_tokenizer",
    "logit_diff_metrics",
    "pairs_from_records",
    "register",
    "sample_sequences",
    "TASK_CONFIGS",
    "NiH",
    "default_haystack",
    "nih",
    "nih_protocol",
    "task_config",
    "task_names",
    "NIH_OFFSETS",
    "NIH_PROTOCOLS",
    "OBS",
    "OPEN",
    "PROBES",
    "START",
    "S5_PERMUTATIONS",
    "SequenceSet",
    "StateTrackingConfig",
    "StateTrackingData",
    "compose",
    "identity",
    "make_data",
    "normalised_accuracy",
    "EvalTraces",
    "LDSBatch",
    "LDSConfig",
    "SystemLibrary",
    "least_squares_predict",
    "make_libraries",
    "needle_in_haystack",
    "sample_batch",
    "uninterleaved",
]
