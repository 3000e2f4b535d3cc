"""Pruning several targets of a checkpoint jointly (``mechlab prune --share``): one
sweep over sharing weights, its circuits written and resumable.

:func:`joint_prune_checkpoint` runs :func:`mechlab.prune.joint_prune` at every sharing
weight and seed on the checkpoint's own task traces; :func:`joint_prune_targets` is the
command's pipeline. Single-target pruning is :mod:`mechlab.pipelines.prune`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import (
    Source,
    lds_config,
    open_checkpoint,
    source_path,
)
from mechlab.pipelines.data import (
    haystack,
    nih_data,
)
from mechlab.pipelines.prune import (
    FAITHFULNESS_WARNING,
    _recipe,
    _run_defaults,
    prune_recipe,
)
from mechlab.prune.circuit import Circuit
from mechlab.prune.config import JOINT_CONFIG, resolved_settings
from mechlab.prune.engine import check_prune_args
from mechlab.prune.joint import (
    JointResult,
    ShareSweep,
    check_joint_targets,
    check_shares,
    joint_prune,
    pairwise_jaccard,
    share_sweep,
)
from mechlab.tasks.lds_prune import DEFAULT_CORRUPTION
from mechlab.traces import PruneData, Target, target_name


def joint_prune_checkpoint(
    source: Source,
    targets: Sequence[Target],
    shares: Sequence[float | str],
    seeds: Sequence[int] = (0,),
    sparsity: float | None = None,
    *,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = DEFAULT_CORRUPTION,
    device: str | None = None,
    recipe: str = "default",
    loss_scale: float | None = None,
    out_dir: str | Path | outputs.OutputFolder | None = None,
    force: bool = False,
    kept: list[str] | None = None,
    **prune_kwargs: Any,
) -> ShareSweep:
    """Prune several targets of a checkpoint jointly, for each sharing weight and seed.

    The traces are built as :func:`prune_checkpoint` builds them, seed ``k`` drawing its
    own (so the seeds vary data and optimiser), and every share of a seed prunes the
    same traces: the cost of sharing is measured on equal terms.

    Args:
        source: A checkpoint or its file.
        targets: At least two targets (``"k-after"``, ``"all"``).
        shares: Sharing weights (numbers >= 0, ``"tied"``); include 0 for the cost column.
        seeds: Pruning and data seeds.
        sparsity: Edge sparsity of every target's circuit (default the recipe's).
        n_train: Training traces.
        n_test: Held-out traces.
        n_haystack: Haystack systems.
        seg_len: Observations per haystack segment.
        corruption: How interchange-ablation traces are corrupted.
        device: Where to run.
        recipe: As :func:`prune_checkpoint`.
        loss_scale: As :func:`prune_checkpoint`.
        out_dir: Where each (share, seed)'s circuits are written as soon as they are found
            (``share-<share>/<target>_seed<k>.json``; a folder, claimed for the run, or an
            :class:`~mechlab.pipelines.outputs.OutputFolder` already claimed); a re-run
            takes a circuit from there instead of pruning again only when the file records
            the same settings (checkpoint, traces, haystack, corruption, share, seed and
            every pruning setting), so an interrupted sweep resumes, and a file of other
            settings is refused before any work (recomputed with ``force``).
        force: Recompute and replace circuit files of other settings.
        kept: A list to which the stems of a (share, seed)'s circuits
            (``share-<share>/<target>_seed<k>``) are added once all of them are in
            ``out_dir`` (written or read back): what a rerun reads back, for the line of an
            interrupted run.
        **prune_kwargs: Passed to :func:`~mechlab.prune.joint.joint_prune`.

    Returns:
        The :class:`~mechlab.prune.joint.ShareSweep`; each circuit's metadata records the
        checkpoint and the ``data_seed``.

    Raises:
        ValueError: As :func:`prune_checkpoint`, fewer than two targets, a bad share.
    """
    recipe = _recipe(recipe, prune_kwargs, "joint_prune_checkpoint")
    settings = prune_recipe(recipe, sparsity=sparsity, loss_scale=loss_scale, **prune_kwargs)
    sparsity, nih = settings.pop("sparsity"), settings.pop("nih")
    if settings.pop("node_sparsity", None) is not None:
        raise ValueError(
            f"joint pruning masks edges only, but recipe {recipe!r} or the settings ask for "
            "node masks; use --recipe default or uniform, without node sparsity"
        )
    check_prune_args(sparsity, **settings)
    shares = check_shares(shares)
    if len(set(seeds)) != len(seeds) or len(set(shares)) != len(shares):
        raise ValueError("shares and seeds must not repeat")
    if out_dir is None or isinstance(out_dir, outputs.OutputFolder):
        folder = out_dir
        claimed: Any = contextlib.nullcontext()
    else:
        folder = claimed = outputs.OutputFolder(
            out_dir, "prune --share", force=force, inputs=[source_path(source)]
        )
    with claimed:
        ckpt = open_checkpoint(source, device)
        lds_config(ckpt)
        path = str(source_path(source))

        @functools.lru_cache(
            maxsize=1
        )  # the check below and the sweep's first seed share one build
        def data_of(seed: int) -> PruneData:
            return nih_data(
                ckpt, n_train=n_train, n_test=n_test, n_haystack=n_haystack, seg_len=seg_len,
                corruption=corruption, data_seed=seed, protocol=nih,
            )  # fmt: skip

        check_joint_targets(targets, data_of(seeds[0] if seeds else 0))
        names = [target_name(t) for t in targets]
        n, s = haystack(ckpt, n_haystack, seg_len)
        common = {"analysis": "joint-prune", "checkpoint_sha256": ckpt.sha256, "targets": names,
                  "recipe": recipe, "nih": nih, "sparsity": sparsity, "n_train": n_train, "n_test": n_test,
                  "n_haystack": n, "seg_len": s, "corruption": corruption,
                  **_run_defaults(joint_prune, settings), **resolved_settings(settings, JOINT_CONFIG, sparsity=False)}  # fmt: skip

        def record(share: float, seed: int, name: str) -> dict[str, Any]:
            return {**common, "target": name, "share": share, "seed": seed, "data_seed": seed}

        def stem_of(share: float, seed: int, name: str) -> str:
            return f"{share_label(share)}/{name}_seed{seed}"

        def file_of(share: float, seed: int, name: str) -> str:
            return f"{stem_of(share, seed, name)}.json"

        def keep(share: float, seed: int) -> None:
            if kept is not None and folder is not None:
                kept.extend(stem_of(share, seed, n) for n in names)

        plan = {
            file_of(sh, sd, nm): record(sh, sd, nm) for sd in seeds for sh in shares for nm in names
        }
        status = folder.plan(plan) if folder is not None else {}

        def save(result: JointResult, seed: int) -> None:
            for name, circuit in result.circuits.items():
                circuit.metadata.update(checkpoint=path, checkpoint_step=ckpt.step, protocol=recipe,
                                        **outputs.settings_record(record(result.share, seed, name)))  # fmt: skip
                if folder is not None:
                    folder.write_circuit(circuit, file_of(result.share, seed, name))
            keep(result.share, seed)

        def load(share: float, seed: int) -> JointResult | None:
            if not all(status.get(file_of(share, seed, n)) == "same" for n in names):
                return None
            circuits = {n: Circuit.from_json(folder.file(file_of(share, seed, n))) for n in names}
            folder.reused.extend(folder.file(file_of(share, seed, n)) for n in names)
            keep(share, seed)
            return JointResult(circuits=circuits, share=share, jaccard=pairwise_jaccard(circuits))

        return share_sweep(ckpt.model, data_of, targets, shares=shares, seeds=seeds, load=load,
                           save=save, sparsity=sparsity, checkpoint_sha256=ckpt.sha256, **settings)  # fmt: skip


def share_label(share: float) -> str:
    """The folder of a share's joint circuits: ``share-<share>`` (``share-tied``)."""
    return "share-tied" if math.isinf(share) else f"share-{share:g}"


@dataclass
class JointRun:
    """What :func:`joint_prune_targets` found and wrote: the sweep, its folder, the table
    (``joint.json``), each circuit by its stem (``share-<share>/<target>_seed<k>``) and the
    stems read back: found before with the same settings (an interrupted run resumed)."""

    sweep: ShareSweep
    out: Path
    table: Path
    circuits: dict[str, Circuit]
    reused: list[str] = field(default_factory=list)


def joint_prune_targets(
    source: Source,
    targets: Sequence[Target],
    shares: Sequence[float | str],
    seeds: Sequence[int] = (0,),
    out: str | Path | None = None,
    *,
    force: bool = False,
    **settings: Any,
) -> JointRun:
    """``mechlab prune --share``: the share sweep of one opened checkpoint, its circuits
    (``joint/share-<share>/<target>_seed<k>.json`` and ``.html``) and ``joint/joint.json``.

    Args:
        source: A checkpoint or its file (opened once).
        targets: Two or more targets.
        shares: Sharing weights.
        seeds: Seeds.
        out: The folder whose ``joint/`` is written (default: ``mechlab-out/<run>/circuits``).
        force: Recompute and replace circuit files of other settings.
        **settings: As :func:`joint_prune_checkpoint`.

    Raises:
        Interrupted: A signal (Ctrl-C, SIGTERM) stopped it; it names the circuits whose
            (share, seed) was finished, which a rerun reads back (the figures and
            ``joint.json`` are drawn at the end).
    """
    if len(targets) < 2:
        raise ValueError(
            f"--share prunes targets jointly: give two or more --target, got {list(targets)}"
        )
    base = Path(out) if out is not None else outputs.default_out(source_path(source), "circuits")
    folder = outputs.OutputFolder(
        base / "joint", "prune --share", force=force, inputs=[source_path(source)]
    )
    tally = stops.Tally(folder.path, len(shares) * len(seeds) * len(targets))  # Ctrl-C or SIGTERM: they stay
    with stops.resumable(tally), folder:
        ckpt = open_checkpoint(source, settings.pop("device", None))
        with warnings.catch_warnings():  # each circuit keeps its warnings in its metadata
            warnings.filterwarnings("ignore", message=FAITHFULNESS_WARNING, category=UserWarning)
            sweep = joint_prune_checkpoint(ckpt, targets, shares, seeds, out_dir=folder, kept=tally.kept,
                                           **settings)  # fmt: skip
        circuits = {}
        for result in sweep.results:  # the JSON files were written as each result was found
            for name, circuit in result.circuits.items():
                stem = f"{share_label(result.share)}/{name}_seed{circuit.metadata['seed']}"
                if (
                    folder.file(f"{stem}.json") not in folder.reused
                    or not folder.file(f"{stem}.html").is_file()
                ):
                    folder.write_circuit_figure(circuit, f"{stem}.html")
                circuits[stem] = circuit
        table = folder.write_json("joint.json", sweep.to_dict())
    reused = [stem for stem in circuits if folder.file(f"{stem}.json") in folder.reused]
    return JointRun(sweep, folder.path, table, circuits, reused)
