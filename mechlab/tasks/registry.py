"""The task registry: every task a checkpoint can be trained on, one :class:`Task` each.

A task's entry says what the analyses need of it: its config class (what a checkpoint's
``metadata["task_cfg"]`` is read back into), its targets, the corruption the recall default
stands for, whether it takes a sequence length or a NiH haystack, and how its pruning
traces are drawn. Pipelines, evaluation, the report and the sweeps look a checkpoint's task
up here (:func:`get_task`) instead of comparing task names.

This module imports no task module and no torch: the built-in entries name their
functions by module (``"mechlab.tasks.lds_prune:task_prune_data"``), loaded on first call,
so that the checks a command makes before torch loads (:mod:`mechlab.pipelines.preflight`)
can read the targets. A new task is one :func:`register` call (``docs/architecture.md``,
"How to add a task").
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_CORRUPTION = "misdirect_incorrect"
"""The corruption a command asks for when none is given (the recall task's); a task whose
:attr:`Task.default_corruption` is set reads it as its own default."""


def _load(where: str) -> Any:
    """The object named ``"module:name"`` (its module imported)."""
    module, name = where.split(":")
    return getattr(importlib.import_module(module), name)


class _Deferred:
    """A function named ``"module:name"``, imported on its first call."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _load(self.where)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.where}>"


class _Named:
    """Returns the object named ``"module:name"`` (a config class), imported when asked."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self) -> Any:
        return _load(self.where)

    def __repr__(self) -> str:
        return f"<{self.where}>"


@dataclass(frozen=True)
class Task:
    """One task of the registry.

    Attributes:
        name: The name a checkpoint records (``metadata["task"]``).
        targets: The targets it takes (``"k-after"`` stands for ``1-after``, ``2-after``, ...).
        config: Returns the task's config class (a dataclass with ``from_dict``/``to_dict``).
        prune_data: ``prune_data(cfg, target, *, n_train, n_test, corruption, seed, length,
            n_ctx, n_haystack, seg_len, nih)`` -> ``(PruneData, target)``: the pruning traces
            and the target resolved on them (keywords a task does not use are ignored).
        default_corruption: What the recall default corruption (:data:`DEFAULT_CORRUPTION`)
            means for this task (None: that default itself).
        takes_length: Takes a sequence length (``--length``); other tasks refuse one.
        haystack: ``haystack(cfg, train_cfg)`` -> ``(n_haystack, seg_len)``, the run's NiH
            haystack, for a task pruned on NiH traces (None: the task has no haystack).
        resolves_targets: Targets are resolved on the traces and named by them
            (``final_n8``), so naming one draws a trace.
        target_refusal: The one-line message for a target the task does not take, with
            ``{target!r}`` (None: the generic "unknown target" line).
        check_targets: ``check_targets(cfg, targets, *, n_haystack, seg_len, nih)`` when
            a task checks its targets on one set of traces (None: :attr:`prune_data` with
            one trace per target).
        target_weights: Training takes per-target loss weights (``target_weights``).
        wanted_refusal: The one-line message, with ``{path!r}``, when a command that takes
            this task is given a checkpoint of another (None: the generic line).
        trainer: The class the trainer builds for the task (``trainer(overrides, **loss_options)``),
            attached by :mod:`mechlab.train.task` (:func:`attach_trainer`); None: not trainable.
    """

    name: str
    targets: tuple[str, ...]
    config: Callable[[], type]
    prune_data: Callable[..., tuple[Any, Any]]
    default_corruption: str | None = None
    takes_length: bool = False
    haystack: Callable[..., tuple[int, int]] | None = None
    resolves_targets: bool = False
    target_refusal: str | None = None
    check_targets: Callable[..., None] | None = None
    target_weights: bool = False
    wanted_refusal: str | None = None
    trainer: Callable[..., Any] | None = None

    def corruption(self, given: str) -> str:
        """The corruption to draw: the task's own default for the recall default."""
        if given == DEFAULT_CORRUPTION and self.default_corruption is not None:
            return self.default_corruption
        return given


TASKS: dict[str, Task] = {}
"""Task name -> its entry, in the order registered."""


def register(task: Task, *, replace: bool = False) -> Task:
    """Add a task to the registry; returns it.

    Args:
        task: The entry.
        replace: Replace an entry of the same name (else that is a ValueError).

    Raises:
        ValueError: A task of that name is registered already.
    """
    if task.name in TASKS and not replace:
        raise ValueError(f"task {task.name!r} is registered already")
    TASKS[task.name] = task
    return task


def attach_trainer(name: str, trainer: Callable[..., Any]) -> None:
    """Give a registered task its trainer class (the training layer, above this one, calls this)."""
    TASKS[name] = dataclasses.replace(TASKS[name], trainer=trainer)


def unregister(name: str) -> None:
    """Remove a task from the registry (a test's toy task); unknown names are ignored."""
    TASKS.pop(name, None)


def get_task(name: str | None) -> Task:
    """The entry of a task; one-line ValueError for a name mechlab does not know."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {list(TASKS)}")
    return TASKS[name]


def task_config(metadata: dict[str, Any], path: str | Path = "checkpoint") -> Any:
    """The task config a checkpoint's metadata records.

    Args:
        metadata: The checkpoint's metadata (``task``, ``task_cfg``).
        path: The checkpoint's path, for the error message.

    Returns:
        The task's config object (e.g. an :class:`~mechlab.tasks.lds.LDSConfig`).

    Raises:
        ValueError: No task recorded, or one mechlab does not know.
    """
    task = metadata.get("task")
    if task is None or "task_cfg" not in metadata:
        raise ValueError(
            f"checkpoint {str(path)!r} has no task metadata ('task' and 'task_cfg'); "
            "use a checkpoint written by `mechlab train`"
        )
    if task not in TASKS:
        raise ValueError(
            f"checkpoint {str(path)!r} was trained on task {task!r}, which mechlab does not "
            f"know; known tasks: {sorted(TASKS)}"
        )
    values = metadata["task_cfg"]
    if not isinstance(values, dict):
        raise ValueError(f"checkpoint {str(path)!r} has a task_cfg that is not a mapping")
    try:  # a file may ask for anything: every field and size is checked here, before any use
        return TASKS[task].config().from_dict(values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {str(path)!r} records an unusable {task} task_cfg: {err}") from None


def task_names() -> tuple[str, ...]:
    """The registered tasks' names, in the order registered."""
    return tuple(TASKS)


register(Task(
    "lds", ("k-after", "all"), _Named("mechlab.tasks.lds:LDSConfig"),
    _Deferred("mechlab.tasks.lds_prune:task_prune_data"),
    haystack=_Deferred("mechlab.tasks.nih:default_haystack"),
    check_targets=_Deferred("mechlab.tasks.lds_prune:check_task_targets"), target_weights=True,
    wanted_refusal="checkpoint {path!r} was not trained on the lds task; NiH traces need it",
))  # fmt: skip
register(Task(
    "state_tracking", ("final", "changed", "all"), _Named("mechlab.tasks.state_tracking:StateTrackingConfig"),
    _Deferred("mechlab.tasks.state_tracking_prune:task_prune_data"), default_corruption="random",
    takes_length=True, resolves_targets=True,
))  # fmt: skip
register(Task(
    "induction", ("all",), _Named("mechlab.tasks.induction:InductionConfig"),
    _Deferred("mechlab.tasks.induction_prune:task_prune_data"), default_corruption="resample",
    target_refusal="target {target!r} is not one of the induction task's; use all (the predictable "
    "positions of the repeat)",
))  # fmt: skip
register(Task(
    "bilingual", ("start", "continue"), _Named("mechlab.tasks.bilingual:BilingualConfig"),
    _Deferred("mechlab.tasks.translation_pairs:task_prune_data"), default_corruption="label_swap",
    target_refusal="target {target!r} is not one of the bilingual task's; use start (the query's first "
    "answer) or continue (its second)",
))  # fmt: skip
