"""Picking a checkpoint's task and data: the traces an analysis of it runs on.

The run's evaluation haystack (``eval_haystack``/``eval_seg_len``, shrunk to fit the
model by :func:`mechlab.tasks.nih.default_haystack`, the one source of the defaults) is
what every analysis uses unless told otherwise; a circuit's held-out traces are rebuilt
from the settings the circuit records (:func:`circuit_data`).
"""

from __future__ import annotations

from typing import Any

from mechlab.checkpoint import Checkpoint
from mechlab.pipelines.checkpoints import Source, lds_config, open_checkpoint, refuse_length
from mechlab.tasks.lds_prune import nih_prune_data
from mechlab.tasks.nih import default_haystack
from mechlab.tasks.registry import DEFAULT_CORRUPTION, Task, get_task, task_names
from mechlab.traces import PruneData, Target


def haystack(ckpt: Checkpoint, n_haystack: int | None = None,
             seg_len: int | None = None) -> tuple[int, int]:  # fmt: skip
    """``(n_haystack, seg_len)`` of a recall checkpoint's NiH traces: the given ones, else
    the run's evaluation setting shrunk to fit (:func:`mechlab.tasks.nih.default_haystack`)."""
    train_cfg = ckpt.metadata.get("train_cfg")
    default_n, default_s = default_haystack(
        lds_config(ckpt), train_cfg if isinstance(train_cfg, dict) else None
    )
    return (default_n if n_haystack is None else n_haystack, default_s if seg_len is None else seg_len)


def nih_data(
    ckpt: Checkpoint,
    *,
    n_train: int,
    n_test: int,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = DEFAULT_CORRUPTION,
    data_seed: int = 0,
    protocol: str = "study",
) -> PruneData:
    """NiH pruning traces on an opened checkpoint's task, with the run's haystack by default."""
    n, s = haystack(ckpt, n_haystack, seg_len)
    return nih_prune_data(
        lds_config(ckpt), n_train=n_train, n_test=n_test, n_haystack=n, seg_len=s,
        corruption=corruption, seed=data_seed, protocol=protocol,
    )  # fmt: skip


def task_data(
    ckpt: Checkpoint,
    target: Target,
    *,
    n_train: int,
    n_test: int,
    length: int | None = None,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    nih: str = "study",
    corruption: str = DEFAULT_CORRUPTION,
    data_seed: int = 0,
) -> tuple[PruneData, Target]:
    """Pruning traces of an opened checkpoint's own task (its entry of
    :mod:`mechlab.tasks.registry`) and the target resolved on them.

    ``length`` is refused unless the task takes one; the NiH settings (``n_haystack``,
    ``seg_len``: default the run's, ``nih``) apply to a task with a haystack and are
    ignored by the others; the recall default corruption means the task's own default.
    """
    task = checkpoint_task(ckpt, length)
    return task.prune_data(
        ckpt.task_config, target, n_train=n_train, n_test=n_test, corruption=task.corruption(corruption),
        seed=data_seed, length=length, nih=nih, **task_haystack(task, ckpt, n_haystack, seg_len),
        **({"n_ctx": ckpt.model.cfg.n_ctx} if task.takes_length else {}),  # a length must fit the context
    )  # fmt: skip


def checkpoint_task(ckpt: Checkpoint, length: int | None = None) -> Task:
    """The registry's entry of an opened checkpoint's task; one-line ValueError without task
    metadata, for a task mechlab does not know, or for a ``length`` the task does not take."""
    task = get_task(ckpt.task) if ckpt.task in task_names() else None
    if task is None or not task.takes_length:
        refuse_length(ckpt, length)
    ckpt.task_config  # noqa: B018 -- a one-line ValueError without (usable) task metadata
    return get_task(ckpt.task)


def task_haystack(task: Task, ckpt: Checkpoint, n_haystack: int | None, seg_len: int | None) -> dict[str, Any]:
    """``n_haystack`` and ``seg_len`` (the run's unless given) of a task with a haystack, else nothing."""
    if task.haystack is None:
        return {}
    train_cfg = ckpt.metadata.get("train_cfg")
    default_n, default_s = task.haystack(ckpt.task_config, train_cfg if isinstance(train_cfg, dict) else None)
    return {"n_haystack": default_n if n_haystack is None else n_haystack,
            "seg_len": default_s if seg_len is None else seg_len}  # fmt: skip


def state_tracking_data(
    ckpt: Checkpoint,
    target: Target,
    length: int | None,
    *,
    n_train: int,
    n_test: int,
    corruption: str = DEFAULT_CORRUPTION,
    data_seed: int = 0,
) -> tuple[PruneData, Target]:
    """Pruning traces of a state-tracking checkpoint and the target resolved on them
    (:func:`task_data`, kept for its callers)."""
    return task_data(ckpt, target, length=length, n_train=n_train, n_test=n_test, corruption=corruption,
                     data_seed=data_seed)  # fmt: skip


def induction_data(
    ckpt: Checkpoint,
    target: Target,
    *,
    n_train: int,
    n_test: int,
    corruption: str = DEFAULT_CORRUPTION,
    data_seed: int = 0,
) -> PruneData:
    """Pruning traces of an induction checkpoint (:func:`task_data`, kept for its callers)."""
    return task_data(ckpt, target, n_train=n_train, n_test=n_test, corruption=corruption, data_seed=data_seed)[0]


def checkpoint_prune_data(
    source: Source,
    *,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = DEFAULT_CORRUPTION,
    data_seed: int = 0,
    protocol: str = "study",
    device: str | None = None,
) -> tuple[Checkpoint, PruneData]:
    """A checkpoint of the interleaved-systems task and NiH pruning traces on its own task.

    Args:
        source: A checkpoint or its file.
        n_train: Training traces.
        n_test: Held-out traces.
        n_haystack: Haystack systems (default: the run's evaluation setting).
        seg_len: Observations per haystack segment (default: the run's).
        corruption: How interchange-ablation traces are corrupted.
        data_seed: Seed of the traces.
        protocol: NiH construction, ``"study"`` or ``"uniform"``.
        device: Where the model goes (default: a path loads onto the CPU).

    Returns:
        ``(checkpoint, data)``; the model is on ``device``.

    Raises:
        ValueError: A checkpoint without the lds task's metadata, or settings that do not
            fit the task.
    """
    ckpt = open_checkpoint(source, device)
    data = nih_data(
        ckpt, n_train=n_train, n_test=n_test, n_haystack=n_haystack, seg_len=seg_len,
        corruption=corruption, data_seed=data_seed, protocol=protocol,
    )  # fmt: skip
    return ckpt, data


def circuit_data(ckpt: Checkpoint, circuit: Any, *, n_train: int = 256, n_test: int = 512,
                 protocol: str = "uniform") -> PruneData:  # fmt: skip
    """The traces a circuit of ``ckpt`` was pruned and scored on, rebuilt from the settings
    its metadata records (``metadata["data"]``: traces, haystack, segment length,
    corruption, data seed, NiH construction); ``n_train``/``n_test``/``protocol`` stand in for
    settings a circuit does not record (circuits that predate ``nih_protocol`` were
    pruned on uniform NiH)."""
    info = circuit.metadata.get("data", {})
    return nih_data(
        ckpt, n_train=int(info.get("n_train", n_train)), n_test=int(info.get("n_test", n_test)),
        n_haystack=info.get("n_haystack"), seg_len=info.get("seg_len"),
        corruption=info.get("corruption", DEFAULT_CORRUPTION),
        data_seed=int(info.get("data_seed", 0)), protocol=info.get("nih_protocol", protocol),
    )  # fmt: skip


def check_targets(
    ckpt: Checkpoint,
    targets: list[Target],
    *,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    protocol: str = "study",
    length: int | None = None,
    corruption: str = DEFAULT_CORRUPTION,
) -> None:
    """Raise ValueError unless every target is valid for an opened checkpoint's traces (a
    state-tracking checkpoint's: its traces at ``length`` with ``corruption``). Cheap (a
    trace or two is drawn), so a command checks all its targets before the first prune."""
    task = checkpoint_task(ckpt, length)
    if task.check_targets is not None:  # one set of traces for every target
        task.check_targets(ckpt.task_config, list(targets), nih=protocol,
                           **task_haystack(task, ckpt, n_haystack, seg_len))  # fmt: skip
        return
    for target in targets:
        task_data(ckpt, target, n_train=1, n_test=1, length=length, corruption=corruption)


def sample_data(
    ckpt: Checkpoint,
    target: Target,
    *,
    length: int | None = None,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    nih: str = "study",
    corruption: str = DEFAULT_CORRUPTION,
) -> tuple[PruneData, Target]:
    """One training and one held-out trace of an opened checkpoint's task, and the target
    resolved on them: enough to build a target's (windowed) graph and check a budget."""
    return task_data(ckpt, target, n_train=1, n_test=1, length=length, n_haystack=n_haystack,
                     seg_len=seg_len, nih=nih, corruption=corruption)  # fmt: skip


def check_prune_targets(source: Source, targets: list[Target], **settings: Any) -> None:
    """:func:`check_targets` on a checkpoint or its file (``protocol``, ``n_haystack``,
    ``seg_len``, ``length``, ``corruption``)."""
    check_targets(open_checkpoint(source), targets, **settings)

