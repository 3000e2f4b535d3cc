"""Where things join: load a checkpoint, pick its task's data, run an analysis.

The engines below (:mod:`mechlab.prune`, the patching and probe utilities) know no
checkpoint and no task; the functions here take a checkpoint path, build the task's
traces from its metadata and call them. The CLI is a thin skin over this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechlab.checkpoint import load_checkpoint
from mechlab.prune.circuit import Circuit
from mechlab.prune.data import Target, check_target, nih_prune_data
from mechlab.prune.engine import _check_unit, prune
from mechlab.tasks import default_haystack
from mechlab.tasks.lds import LDSConfig


def prune_checkpoint(
    path: str | Path,
    target: Target,
    sparsity: float = 0.95,
    *,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = "misdirect_incorrect",
    data_seed: int = 0,
    device: str | None = None,
    **prune_kwargs: Any,
) -> Circuit:
    """Prune a checkpoint of the interleaved-systems task on needle-in-a-haystack traces.

    The NiH traces are built from the task config in the checkpoint's metadata, with
    the run's evaluation haystack (``eval_haystack`` / ``eval_seg_len``) unless given.

    Args:
        path: Checkpoint file.
        target: ``"k-after"``, ``"all"`` or a callable.
        sparsity: Edge sparsity in (0, 1).
        n_train: Training traces.
        n_test: Held-out traces for the metrics.
        n_haystack: Haystack systems.
        seg_len: Observations per haystack segment.
        corruption: How interchange-ablation traces are corrupted
            (:data:`mechlab.prune.data.CORRUPTIONS`).
        data_seed: Seed of the traces.
        device: Where to run (default: CPU).
        **prune_kwargs: Passed to :func:`prune` (``ablation``, ``steps``, ``seed``, ...).

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`; its metadata records the
        checkpoint's path and sha256.

    Raises:
        ValueError: Missing task metadata, unknown target, sparsity outside (0, 1), ...
    """
    sparsity = _check_unit("sparsity", sparsity)
    ckpt = load_checkpoint(path, map_location=device or "cpu")
    cfg = ckpt.task_config
    if not isinstance(cfg, LDSConfig):
        raise ValueError(f"checkpoint {str(path)!r} was not trained on the lds task; pruning needs NiH traces")
    default_n, default_s = default_haystack(cfg, ckpt.metadata.get("train_cfg"))
    data = nih_prune_data(
        cfg, n_train=n_train, n_test=n_test,
        n_haystack=default_n if n_haystack is None else n_haystack,
        seg_len=default_s if seg_len is None else seg_len,
        corruption=corruption, seed=data_seed,
    )  # fmt: skip
    check_target(target, data.train)
    circuit = prune(
        ckpt.model, data, target, sparsity, checkpoint_sha256=ckpt.sha256, **prune_kwargs
    )
    circuit.metadata["checkpoint"] = str(path)
    circuit.metadata["checkpoint_step"] = ckpt.step
    return circuit
