"""Where things join: load a checkpoint, pick its task's data, run an analysis.

The engines below (:mod:`mechlab.prune`, the patching and probe utilities) know no
checkpoint and no task; the functions here take a checkpoint path, build the task's
traces from its metadata and call them. The CLI is a thin skin over this module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechlab.checkpoint import Checkpoint, load_checkpoint
from mechlab.prune.circuit import Circuit
from mechlab.prune.config import PROTOCOLS
from mechlab.prune.data import (
    DEFAULT_CORRUPTION,
    PruneData,
    Target,
    check_target,
    nih_prune_data,
    target_name,
    target_positions,
)
from mechlab.prune.engine import check_prune_args, check_sparsity, prune
from mechlab.prune.graph import pruning_graph
from mechlab.prune.joint import (
    JointResult,
    ShareSweep,
    check_joint_targets,
    check_shares,
    pairwise_jaccard,
    share_sweep,
)
from mechlab.tasks import default_haystack
from mechlab.tasks import state_tracking_prune as st_prune
from mechlab.tasks.lds import LDSConfig

NIH_OF_PROTOCOL = {"default": "study", "uniform": "uniform", "study": "study"}
PRUNE_PROTOCOLS: dict[str, dict[str, Any]] = {
    name: {"nih": NIH_OF_PROTOCOL[name], "sparsity": cfg.sparsity, **cfg.overrides()}
    for name, cfg in PROTOCOLS.items()
}
"""Each protocol's NiH construction (``nih``, the data side) and its search settings (the
:class:`~mechlab.prune.config.PruneConfig` instances of :data:`mechlab.prune.config.PROTOCOLS`,
as the fields that differ from the defaults). ``default``: mechlab's default search at 95%
edge sparsity on the study's NiH (oldest system queried, misdirection to the next);
``uniform``: the same on uniformly drawn NiH traces; ``study``: the recall study's settings
(99% edge sparsity, node masks at 80%, loss 1000 x raw MSE to the ground truth, 3000 steps,
the Lagrangian) on the study's NiH."""


def prune_protocol(protocol: str, **given: Any) -> dict[str, Any]:
    """The settings a protocol prunes with, explicit settings on top.

    Args:
        protocol: A key of :data:`PRUNE_PROTOCOLS`.
        **given: Settings asked for explicitly (``sparsity`` or any :func:`prune` keyword);
            ``None`` means "not given".

    Returns:
        ``nih`` (the NiH construction), ``sparsity`` and the :func:`prune` keywords to use.
    """
    if protocol not in PRUNE_PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {list(PRUNE_PROTOCOLS)}")
    return {**PRUNE_PROTOCOLS[protocol], **{k: v for k, v in given.items() if v is not None}}


def checkpoint_prune_data(
    path: str | Path,
    *,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = "misdirect_incorrect",
    data_seed: int = 0,
    protocol: str = "study",
    device: str | None = None,
) -> tuple[Checkpoint, PruneData]:
    """A checkpoint of the interleaved-systems task and NiH pruning traces on its own task.

    Args:
        path: Checkpoint file.
        n_train: Training traces.
        n_test: Held-out traces.
        n_haystack: Haystack systems (default: the run's evaluation setting).
        seg_len: Observations per haystack segment (default: the run's).
        corruption: How interchange-ablation traces are corrupted.
        data_seed: Seed of the traces.
        protocol: NiH construction, ``"uniform"`` or ``"study"``.
        device: Where the model goes (default: CPU).

    Returns:
        ``(checkpoint, data)``; the model is on ``device``.

    Raises:
        ValueError: A checkpoint without the lds task's metadata, or settings that do not
            fit the task.
    """
    ckpt = load_checkpoint(path, map_location=device or "cpu")
    data = _nih_data(
        ckpt, n_train=n_train, n_test=n_test, n_haystack=n_haystack, seg_len=seg_len,
        corruption=corruption, data_seed=data_seed, protocol=protocol,
    )  # fmt: skip
    return ckpt, data


def _lds_config(ckpt: Checkpoint, length: int | None = None) -> LDSConfig:
    """The checkpoint's task config; a one-line ValueError unless it is the lds task's
    (or when a sequence ``length``, which only state tracking takes, is given)."""
    if length is not None:
        raise ValueError(
            f"a length applies to state-tracking checkpoints; {str(ckpt.path)!r} was trained on "
            f"task {ckpt.task!r}"
        )
    cfg = ckpt.task_config
    if not isinstance(cfg, LDSConfig):
        raise ValueError(
            f"checkpoint {str(ckpt.path)!r} was not trained on the lds task; NiH traces need it"
        )
    return cfg


def _nih_data(
    ckpt: Checkpoint,
    *,
    n_train: int,
    n_test: int,
    n_haystack: int | None,
    seg_len: int | None,
    corruption: str = "misdirect_incorrect",
    data_seed: int = 0,
    protocol: str = "study",
) -> PruneData:
    """NiH pruning traces on a loaded checkpoint's task, with the run's haystack by default."""
    cfg = _lds_config(ckpt)
    default_n, default_s = default_haystack(cfg, ckpt.metadata.get("train_cfg"))
    return nih_prune_data(
        cfg, n_train=n_train, n_test=n_test,
        n_haystack=default_n if n_haystack is None else n_haystack,
        seg_len=default_s if seg_len is None else seg_len,
        corruption=corruption, seed=data_seed, protocol=protocol,
    )  # fmt: skip


def _state_tracking_data(
    ckpt: Checkpoint,
    target: Target,
    length: int | None,
    *,
    n_train: int,
    n_test: int,
    corruption: str = DEFAULT_CORRUPTION,
    data_seed: int = 0,
) -> tuple[PruneData, Target]:
    """Pruning traces of a state-tracking checkpoint (``length`` elements, default the run's
    ``L``) and the target resolved on them; the recall default corruption means ``random``."""
    if corruption == DEFAULT_CORRUPTION:
        corruption = st_prune.DEFAULT_CORRUPTION
    data = st_prune.state_tracking_prune_data(
        ckpt.task_config, length, n_train=n_train, n_test=n_test, corruption=corruption,
        seed=data_seed, n_ctx=ckpt.model.cfg.n_ctx,
    )  # fmt: skip
    return data, st_prune.resolve_target(target, data)


def prune_checkpoint(
    path: str | Path,
    target: Target,
    sparsity: float | None = None,
    *,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = "misdirect_incorrect",
    data_seed: int | None = None,
    device: str | None = None,
    protocol: str = "default",
    loss_scale: float | None = None,
    length: int | None = None,
    **prune_kwargs: Any,
) -> Circuit:
    """Prune a checkpoint of the interleaved-systems task on needle-in-a-haystack traces.

    The NiH traces are built from the task config in the checkpoint's metadata, with
    the run's evaluation haystack (``eval_haystack`` / ``eval_seg_len``) unless given.

    Args:
        path: Checkpoint file.
        target: ``"k-after"``, ``"all"`` or a callable.
        sparsity: Edge sparsity in (0, 1); default the protocol's (0.95; study 0.99).
        n_train: Training traces.
        n_test: Held-out traces for the metrics.
        n_haystack: Haystack systems.
        seg_len: Observations per haystack segment.
        corruption: How interchange-ablation traces are corrupted
            (:data:`mechlab.prune.data.CORRUPTIONS`).
        data_seed: Seed of the traces; default the pruning ``seed``, so that a seed
            baseline varies the data as well as the optimiser.
        device: Where to run (default: CPU).
        protocol: ``"default"``, ``"uniform"`` or ``"study"`` (:data:`PRUNE_PROTOCOLS`):
            the NiH construction and the pruning settings that ``sparsity`` and
            ``prune_kwargs`` do not set (``None`` values count as not set).
        loss_scale: Multiplies the task loss (default the protocol's: 1, study 1000).
        length: Elements per sequence of a state-tracking checkpoint (default the run's
            ``L``; refused for other tasks).
        **prune_kwargs: Passed to :func:`prune` (``ablation``, ``steps``, ``seed``, ...).

    A state-tracking checkpoint (``metadata["task"] == "state_tracking"``) is pruned on
    :func:`mechlab.tasks.state_tracking_prune.state_tracking_prune_data` traces instead
    (targets ``final``, ``changed``, ``all``; ``corruption`` ``random`` (what the default
    means there) or ``x<k>``); the NiH settings are ignored.

    Returns:
        The :class:`~mechlab.prune.circuit.Circuit`; its metadata records the
        checkpoint's path and sha256, the pruning ``seed`` and the ``data_seed``.

    Raises:
        ValueError: Missing task metadata, unknown target, bad sparsity (or one that
            keeps no edge), learning rate or batch size: all before any pruning work.
    """
    settings = prune_protocol(protocol, sparsity=sparsity, loss_scale=loss_scale, **prune_kwargs)
    sparsity, nih = settings.pop("sparsity"), settings.pop("nih")
    check_prune_args(sparsity, **settings)
    data_seed = settings.get("seed", 0) if data_seed is None else data_seed
    ckpt = load_checkpoint(path, map_location=device or "cpu")
    if ckpt.task == "state_tracking":
        data, target = _state_tracking_data(ckpt, target, length, n_train=n_train, n_test=n_test,
                                            corruption=corruption, data_seed=data_seed)  # fmt: skip
    else:
        _lds_config(ckpt, length)
        data = _nih_data(
            ckpt, n_train=n_train, n_test=n_test, n_haystack=n_haystack, seg_len=seg_len,
            corruption=corruption, data_seed=data_seed, protocol=nih,
        )  # fmt: skip
    check_target(target, data.train)
    # the graph pruned (windowed for a recurrent model: its countable edges depend on the target)
    graph = pruning_graph(ckpt.model, data.train.windows, settings.get("position_aware"))
    scored = target_positions(target, data.train) if graph.windows else None
    check_sparsity(graph, settings.get("ablation", "interchange"), sparsity, scored)
    circuit = prune(ckpt.model, data, target, sparsity, checkpoint_sha256=ckpt.sha256, **settings)
    circuit.metadata["checkpoint"] = str(path)
    circuit.metadata["checkpoint_step"] = ckpt.step
    circuit.metadata["protocol"] = protocol
    return circuit


def joint_prune_checkpoint(
    path: str | Path,
    targets: Sequence[Target],
    shares: Sequence[float | str],
    seeds: Sequence[int] = (0,),
    sparsity: float | None = None,
    *,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = "misdirect_incorrect",
    device: str | None = None,
    protocol: str = "default",
    loss_scale: float | None = None,
    out_dir: str | Path | None = None,
    **prune_kwargs: Any,
) -> ShareSweep:
    """Prune several targets of a checkpoint jointly, for each sharing weight and seed.

    The traces are built as :func:`prune_checkpoint` builds them, seed ``k`` drawing its
    own (so the seeds vary data and optimiser), and every share of a seed prunes the
    same traces: the cost of sharing is measured on equal terms.

    Args:
        path: Checkpoint file.
        targets: At least two targets (``"k-after"``, ``"all"``).
        shares: Sharing weights (numbers >= 0, ``"tied"``); include 0 for the cost column.
        seeds: Pruning and data seeds.
        sparsity: Edge sparsity of every target's circuit (default the protocol's).
        n_train: Training traces.
        n_test: Held-out traces.
        n_haystack: Haystack systems.
        seg_len: Observations per haystack segment.
        corruption: How interchange-ablation traces are corrupted.
        device: Where to run.
        protocol: As :func:`prune_checkpoint`.
        loss_scale: As :func:`prune_checkpoint`.
        out_dir: Where each (share, seed)'s circuits are written as soon as they are found
            (``share-<share>/<target>_seed<k>.json``); a re-run with the same settings takes
            them from there instead of pruning again, so an interrupted sweep resumes.
        **prune_kwargs: Passed to :func:`~mechlab.prune.joint.joint_prune`.

    Returns:
        The :class:`~mechlab.prune.joint.ShareSweep`; each circuit's metadata records the
        checkpoint and the ``data_seed``.

    Raises:
        ValueError: As :func:`prune_checkpoint`, fewer than two targets, a bad share.
    """
    settings = prune_protocol(protocol, sparsity=sparsity, loss_scale=loss_scale, **prune_kwargs)
    sparsity, nih = settings.pop("sparsity"), settings.pop("nih")
    if settings.pop("node_sparsity", None) is not None:
        raise ValueError(
            f"joint pruning masks edges only, but protocol {protocol!r} or the settings ask for "
            "node masks; use --protocol default or uniform, without node sparsity"
        )
    check_prune_args(sparsity, **settings)
    shares = check_shares(shares)
    ckpt = load_checkpoint(path, map_location=device or "cpu")
    _lds_config(ckpt)

    @functools.lru_cache(maxsize=1)  # the check below and the sweep's first seed share one build
    def data_of(seed: int) -> PruneData:
        return _nih_data(
            ckpt, n_train=n_train, n_test=n_test, n_haystack=n_haystack, seg_len=seg_len,
            corruption=corruption, data_seed=seed, protocol=nih,
        )  # fmt: skip

    check_joint_targets(targets, data_of(seeds[0] if seeds else 0))
    names = [target_name(t) for t in targets]
    expected = {"checkpoint_sha256": ckpt.sha256, "protocol": protocol, "sparsity_asked": sparsity,
                **{k: v for k, v in settings.items() if k not in ("progress",)}}  # fmt: skip

    def file_of(share: float, seed: int, name: str) -> Path:
        label = "tied" if math.isinf(share) else f"{share:g}"
        return Path(out_dir) / f"share-{label}" / f"{name}_seed{seed}.json"

    def save(result: JointResult, seed: int) -> None:
        for circuit in result.circuits.values():
            circuit.metadata.update(checkpoint=str(path), checkpoint_step=ckpt.step, protocol=protocol)
        if out_dir is not None:
            for name, circuit in result.circuits.items():
                circuit.to_json(file_of(result.share, seed, name))

    def load(share: float, seed: int) -> JointResult | None:
        if out_dir is None or not all(file_of(share, seed, n).is_file() for n in names):
            return None
        try:
            circuits = {n: Circuit.from_json(file_of(share, seed, n)) for n in names}
        except (ValueError, OSError):
            return None  # unreadable: prune again (the write replaces it)
        want = {**expected, "share": "tied" if math.isinf(share) else share, "seed": seed,
                "data_seed": seed}  # fmt: skip
        for circuit in circuits.values():
            meta = circuit.metadata
            if any(k in meta and meta[k] != v for k, v in want.items()) or not meta.get("joint"):
                return None  # other settings: prune again
        return JointResult(circuits=circuits, share=share, jaccard=pairwise_jaccard(circuits))

    return share_sweep(ckpt.model, data_of, targets, shares=shares, seeds=seeds, load=load,
                       save=save, sparsity=sparsity, checkpoint_sha256=ckpt.sha256, **settings)  # fmt: skip


def check_prune_targets(
    path: str | Path,
    targets: list[Target],
    *,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    protocol: str = "study",
    length: int | None = None,
    corruption: str = DEFAULT_CORRUPTION,
) -> None:
    """Raise ValueError unless every target is valid for the checkpoint's NiH traces
    (a state-tracking checkpoint's: its traces at ``length`` with ``corruption``).

    Cheap (a few traces are drawn), so a command can check all its targets before it
    starts pruning the first.

    Args:
        path: Checkpoint file.
        targets: Targets.
        n_haystack: Haystack systems (default: the run's evaluation setting).
        seg_len: Observations per haystack segment (bounds ``k`` of ``k-after``).
        protocol: NiH construction.
        length: Elements per sequence (state-tracking checkpoints only).
        corruption: Corruption (checked for state-tracking checkpoints).
    """
    ckpt = load_checkpoint(path, map_location="cpu")
    if ckpt.task == "state_tracking":
        for target in targets:
            _state_tracking_data(ckpt, target, length, n_train=1, n_test=1, corruption=corruption)
        return
    _lds_config(ckpt, length)
    data = _nih_data(
        ckpt, n_train=1, n_test=1, n_haystack=n_haystack, seg_len=seg_len, protocol=protocol,
    )  # fmt: skip
    for target in targets:
        check_target(target, data.train)
