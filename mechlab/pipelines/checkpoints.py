"""Opening checkpoints: the one place in mechlab's analyses that reads a checkpoint file.

Every pipeline takes a :class:`~mechlab.checkpoint.Checkpoint` or a path
(:data:`Source`) and opens it here, once: a command that runs several analyses on one
checkpoint (``mechlab report``, ``mechlab prune`` with several targets and seeds) reads
the file, verifies it and builds its model one time, then hands the same
:class:`~mechlab.checkpoint.Checkpoint` to every stage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from mechlab.checkpoint import Checkpoint, load_checkpoint
from mechlab.checkpoint.loading import first_non_finite
from mechlab.models import build_model, presets
from mechlab.models.names import hook_graph_names
from mechlab.pipelines.preflight import check_checkpoint_file
from mechlab.tasks.lds import LDSConfig
from mechlab.train.config import available_presets, resolve_config
from mechlab.train.task import make_task

Source = Checkpoint | str | Path
"""A checkpoint already opened, or the path of one."""

_CHECKED: ContextVar[frozenset[int]] = ContextVar("mechlab_checked_checkpoints", default=frozenset())
"""Checkpoints (by ``id``) that a command opened and checked (:func:`opened_once`)."""


def open_checkpoint(source: Source, device: str | None = None) -> Checkpoint:
    """The checkpoint ``source`` names, opened once.

    Args:
        source: A :class:`~mechlab.checkpoint.Checkpoint` (returned as it is) or a path.
        device: Where its model goes (default: where it is; a path loads onto the CPU).

    Returns:
        The :class:`~mechlab.checkpoint.Checkpoint`, its model on ``device``.

    Raises:
        ValueError: No file at the path, or a checkpoint given opened whose model holds a
            NaN or infinite parameter (:func:`check_finite_parameters`; one line).
        mechlab.checkpoint.CheckpointError: A file that is not an intact checkpoint, or
            whose weights are not finite.
    """
    if isinstance(source, Checkpoint):  # loaded elsewhere, perhaps with allow_non_finite=True
        if id(source) not in _CHECKED.get():  # not checked already by the command running
            check_finite_parameters(source.model, f"checkpoint {str(source.path)!r}")
        if device is not None:
            source.model.to(device)
        return source
    path = check_checkpoint_file(source)
    return load_checkpoint(path, map_location=device or "cpu")  # refuses non-finite weights


@contextlib.contextmanager
def opened_once(source: Source, device: str | None = None) -> Iterator[Checkpoint]:
    """A checkpoint opened and checked once for a whole command.

    Inside the block, :func:`open_checkpoint` given this checkpoint returns it without
    checking its parameters again (every stage of the command opens it so), and still moves
    its model to a device asked for.

    Args:
        source: A checkpoint or its file.
        device: Where its model goes (as :func:`open_checkpoint`).

    Yields:
        The opened :class:`~mechlab.checkpoint.Checkpoint`.
    """
    ckpt = open_checkpoint(source, device)
    token = _CHECKED.set(_CHECKED.get() | {id(ckpt)})
    try:
        yield ckpt
    finally:
        _CHECKED.reset(token)


def check_finite_parameters(model: Any, source: str) -> None:
    """Refuse a model with a NaN or infinite parameter before any analysis runs on it.

    Every analysis of such a model finds NaN (edge scores, losses, faithfulness) and would
    blame what it measured; a checkpoint file is refused when it is read
    (:func:`mechlab.checkpoint.load_checkpoint`), and this covers the rest: a model folder
    imported with :func:`mechlab.from_pretrained`, a checkpoint loaded with
    ``allow_non_finite=True`` and handed to an analysis.

    Args:
        model: The model (a ``torch.nn.Module``).
        source: What it is, for the message (``"checkpoint 'run.pt'"``).

    Raises:
        ValueError: One line naming the first parameter (in ``named_parameters`` order)
            that holds a NaN or an infinity, and how many of its values do.
    """
    bad = first_non_finite(model.named_parameters())
    if bad is not None:
        name, count, numel = bad
        raise ValueError(
            f"{source} holds non-finite weights: parameter {name!r} has {count} NaN/inf "
            f"value(s) of {numel}; every analysis of it would find NaN: use an "
            "earlier checkpoint of the run or a healthy model"
        )


def source_path(source: Source) -> Path:
    """The file a source names (a checkpoint's own path)."""
    return source.path if isinstance(source, Checkpoint) else Path(source)


def refuse_length(ckpt: Checkpoint, length: int | None) -> None:
    """A one-line ValueError when a sequence ``length`` is given for a checkpoint whose task
    takes none (only state tracking does)."""
    if length is not None:
        raise ValueError(
            f"a length applies to state-tracking checkpoints; {str(ckpt.path)!r} was trained on "
            f"task {ckpt.task!r}"
        )


def lds_config(ckpt: Checkpoint, length: int | None = None) -> LDSConfig:
    """The checkpoint's task config; a one-line ValueError unless it is the lds task's
    (or when a sequence ``length``, which only state tracking takes, is given)."""
    refuse_length(ckpt, length)
    cfg = ckpt.task_config
    if not isinstance(cfg, LDSConfig):
        raise ValueError(
            f"checkpoint {str(ckpt.path)!r} was not trained on the lds task; NiH traces need it"
        )
    return cfg


def run_checkpoints(run_dir: str | Path, device: str | None = None) -> list[Checkpoint]:
    """Every checkpoint of a training run (``DIR/checkpoints/step_*.pt``), each opened and
    its task metadata checked before any analysis starts.

    Raises:
        ValueError: No checkpoints under ``run_dir``, or one without task metadata.
    """
    paths = sorted(Path(run_dir).glob("checkpoints/step_*.pt"))
    if not paths:
        raise ValueError(
            f"no checkpoints/step_*.pt under {str(run_dir)!r}; is it a training run directory?"
        )
    opened = [open_checkpoint(p, device) for p in paths]
    for ckpt in opened:
        ckpt.task_config  # noqa: B018 -- a one-line ValueError without task metadata
    return opened


def describe(ckpt: Source | None = None, model: str | None = None) -> dict[str, Any]:
    """What ``mechlab info`` prints: the model's architecture, size, step and hook shapes.

    Args:
        ckpt: A checkpoint to describe, or its file.
        model: Or an architecture, model preset or training preset to build fresh.

    Returns:
        ``source``, ``cfg`` (the model config), ``n_params``, ``step``, ``hooks``
        (hook name -> shape for batch 1) and ``graph_names`` (hook name -> the pruning
        graph's names of the components it holds, :func:`mechlab.models.names.hook_graph_names`).

    Raises:
        ValueError: Not exactly one of ``ckpt`` and ``model``.
    """
    if (ckpt is None) == (model is None):
        raise ValueError("give exactly one of --ckpt PATH or --model NAME")
    if ckpt is not None:
        loaded = open_checkpoint(ckpt)
        net, step, source = loaded.model, loaded.step, str(source_path(ckpt))
    else:
        net, step, source = build_model(model_config(model)), 0, f"fresh {model}"
    hooks = net.hook_shapes(batch=1)
    return {"source": source, "cfg": net.cfg, "step": step,
            "n_params": sum(p.numel() for p in net.parameters()), "hooks": hooks,
            "graph_names": _graph_names(net, list(hooks))}  # fmt: skip


def _graph_names(net: Any, hooks: list[str]) -> dict[str, str]:
    """Hook name -> the pruning graph's names it holds (empty for a model without a graph)."""
    # lazy: every pipeline opens checkpoints through this module; only describe() needs the pruning graph (networkx, scipy: ~0.8 s)
    from mechlab.prune.graph import build_graph

    try:
        graph = build_graph(net)
    except (ValueError, TypeError, AttributeError):  # a wrapped module: no pruning graph
        return {}
    return hook_graph_names(graph.summary(), hooks)


def model_config(name: str) -> str | dict[str, Any]:
    """A model name as given, or the model a training preset (``recall-cpu``) trains."""
    if name in presets() or name not in available_presets():
        return name

    cfg = resolve_config(preset=name)
    return {**cfg.model, **make_task(cfg.task, cfg.task_cfg).model_fields()}
