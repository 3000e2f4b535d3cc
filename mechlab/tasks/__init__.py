"""Data for mechlab's studies: the interleaved linear-systems recall task (``lds``), its
evaluation traces (``lds_evals``) and its analysis-ready needle-in-a-haystack traces
(``nih``); state tracking on Z_m and S_5 (``state_tracking``); induction on repeated random
tokens (``induction``); clean/corrupted prompt pairs of token models (``prompts``) and
IOI-style prompts (``ioi``).

A checkpoint names its task in ``metadata["task"]`` and stores the task's config in
``metadata["task_cfg"]``; :func:`task_config` turns them back into the config object.
"""

from pathlib import Path
from typing import Any

from mechlab.tasks.induction import InductionConfig, Sequences, sample_sequences
from mechlab.tasks.induction_prune import induction_prune_data
from mechlab.tasks.ioi import ioi_records
from mechlab.tasks.lds import (
    CLOSE,
    OBS,
    OPEN,
    START,
    LDSBatch,
    LDSConfig,
    sample_batch,
)
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

# task name -> its config class (a dataclass with from_dict/to_dict)
TASK_CONFIGS: dict[str, type] = {
    "lds": LDSConfig, "state_tracking": StateTrackingConfig, "induction": InductionConfig,
}  # fmt: skip


def task_config(metadata: dict[str, Any], path: str | Path = "checkpoint") -> Any:
    """The task config a checkpoint's metadata records.

    Args:
        metadata: The checkpoint's metadata (``task``, ``task_cfg``).
        path: The checkpoint's path, for the error message.

    Returns:
        The task's config object (e.g. an :class:`LDSConfig`).

    Raises:
        ValueError: No task recorded, or one mechlab does not know.
    """
    task = metadata.get("task")
    if task is None or "task_cfg" not in metadata:
        raise ValueError(
            f"checkpoint {str(path)!r} has no task metadata ('task' and 'task_cfg'); "
            "use a checkpoint written by `mechlab train`"
        )
    if task not in TASK_CONFIGS:
        raise ValueError(
            f"checkpoint {str(path)!r} was trained on task {task!r}, which mechlab does not "
            f"know; known tasks: {sorted(TASK_CONFIGS)}"
        )
    values = metadata["task_cfg"]
    if not isinstance(values, dict):
        raise ValueError(f"checkpoint {str(path)!r} has a task_cfg that is not a mapping")
    try:  # a file may ask for anything: every field and size is checked here, before any use
        return TASK_CONFIGS[task].from_dict(values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {str(path)!r} records an unusable {task} task_cfg: {err}") from None

__all__ = [
    "CLOSE",
    "InductionConfig",
    "PromptPairs",
    "Sequences",
    "induction_prune_data",
    "ioi_records",
    "load_pairs",
    "load_tokenizer",
    "logit_diff_metrics",
    "pairs_from_records",
    "sample_sequences",
    "TASK_CONFIGS",
    "NiH",
    "default_haystack",
    "nih",
    "nih_protocol",
    "task_config",
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
