"""Circuit files: drawing them (``mechlab view``) and comparing them (``mechlab overlap``)."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechlab.limits import check_elements
from mechlab.pipelines import outputs
from mechlab.pipelines.checkpoints import Source, open_checkpoint, source_path
from mechlab.pipelines.data import circuit_data
from mechlab.prune.circuit import Circuit, overlap, seed_stability

MIXED_WARNING = "comparing circuits of different checkpoints"  # the engine's warning


def load_circuits(paths: Sequence[str | Path]) -> list[Circuit]:
    """Every circuit file, each checked (one line naming the file or the field) before any
    work; a file given twice (by any path, or a copy of the same bytes) is refused: a
    circuit compared with itself would read as perfect agreement."""
    seen: dict[str, str] = {}
    loaded = []
    for path in paths:
        if not Path(path).is_file():
            raise ValueError(f"circuit {str(path)!r} not found")
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        if digest in seen:
            same = "the same file" if Path(path).resolve() == Path(seen[digest]).resolve() else "identical files"
            raise ValueError(f"{seen[digest]!r} and {str(path)!r} are {same}; give each circuit once")
        seen[digest] = str(path)
        loaded.append(Circuit.from_json(path))
    return loaded


def view_circuits(paths: Sequence[str | Path], out: str | Path, labels: Sequence[str] = (), *,
                  force: bool = False) -> Path:  # fmt: skip
    """``mechlab view``: one page drawing each circuit, with the overlap view of two or more
    on one layout first.

    Args:
        paths: Circuit JSON files.
        out: The ``.html`` file to write.
        labels: A name per circuit (default: target and seed).
        force: Replace ``out`` if it exists (never one of the circuits, nor a checkpoint).

    Returns:
        The page's path.
    """
    from mechlab.viz import circuit_figure, overlap_figure
    from mechlab.viz.figures import page_html

    if labels and len(labels) != len(paths):
        raise ValueError(f"give one --label per circuit: {len(labels)} labels for {len(paths)} circuits")
    outputs.check_output_file(out, force=force, inputs=paths, suffixes=(".html", ".htm"))
    loaded = load_circuits(paths)
    names = list(labels) or [f"{c.metadata.get('target', Path(p).stem)} (seed {c.metadata.get('seed', '?')})"
                             for c, p in zip(loaded, paths, strict=True)]  # fmt: skip
    sections: list[tuple[str, Any]] = []
    if len(loaded) >= 2:
        sections.append(("Overlap", overlap_figure(loaded, names)))
    sections += [(name, circuit_figure(c)) for name, c in zip(names, loaded, strict=True)]
    title = "Circuit" if len(loaded) == 1 else f"{len(loaded)} circuits"
    return outputs.write_text(out, page_html(title, sections))


def _check_one_checkpoint(loaded: list[Circuit], paths: Sequence[str | Path], sha: str | None,
                          ckpt: Source | None, mixed: bool) -> None:  # fmt: skip
    """Refuse (or, with ``mixed``, warn about) circuits of different checkpoints."""
    from mechlab.prune.circuit_file import checkpoint_groups, describe_groups

    groups = checkpoint_groups([c.metadata for c in loaded], [Path(p).name for p in paths])
    problems = []
    if len(groups) > 1:
        problems.append(f"the circuits come from different checkpoints ({describe_groups(groups)})")
    if sha is not None:
        others = [name for key, names in groups.items() if key != sha for name in names]
        if others:
            problems.append(f"{', '.join(others)} were not found on --ckpt {source_path(ckpt)} ({sha[:12]})")
    if not problems:
        return
    if not mixed:
        raise ValueError("; ".join(problems) + "; compare circuits of one checkpoint, or pass "
                         "--mixed-checkpoints to compare them anyway")  # fmt: skip
    warnings.warn(f"{'; '.join(problems)}: edge names match, their meaning need not", UserWarning, stacklevel=3)


def overlap_circuits(
    paths: Sequence[str | Path],
    ckpt: Source | None = None,
    *,
    n_boot: int = 2000,
    n_null: int = 1000,
    level: float = 0.95,
    exclude_writers: Sequence[str] = (),
    seed: int = 0,
    device: str | None = None,
    mixed_checkpoints: bool = False,
    json_out: str | Path | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """``mechlab overlap``: the circuits' pairwise overlaps, Jaccard with bootstrap intervals
    over seeds, the uniform and degree-preserving null models and, with ``ckpt``, each
    circuit scored on every target's held-out traces (rebuilt from the circuits' recorded
    settings).

    Args:
        paths: Two or more circuit JSON files.
        ckpt: The checkpoint the circuits come from, or its file (adds cross-evaluation).
        n_boot: Bootstrap resamples.
        n_null: Samples of each null model.
        level: Coverage of the bootstrap intervals, in (0, 1).
        exclude_writers: Writers whose edges leave the null models' edge pool (each must be
            a writer of the circuits' graph).
        seed: Seed of the bootstrap and the null models.
        device: Where the cross-evaluation runs.
        mixed_checkpoints: Compare circuits of different checkpoints (with a warning).
        json_out: Write the result here as JSON (a new file, checked before any work;
            never one of the inputs or a checkpoint).
        force: Replace ``json_out`` if it exists.

    Returns:
        ``circuits``, ``pairs`` (one :meth:`~mechlab.prune.circuit.Overlap.to_dict` per pair,
        with ``a`` and ``b``), ``within``, ``across`` (:func:`~mechlab.prune.stats.overlap_report`),
        ``excluded_writers``, ``stability`` (a :class:`~mechlab.prune.circuit.Stability`,
        or None: not in the JSON) and, with ``ckpt``, ``cross_evaluation``.
    """
    from mechlab.prune.stats import cross_evaluate, graph_edges, overlap_report

    if len(paths) < 2:
        raise ValueError("give at least two circuit files")
    if not 0 < level < 1:
        raise ValueError(f"--level must be in (0, 1), got {level}")
    check_elements("the bootstrap's resamples", {"n_boot": n_boot}, lower="--boot")
    check_elements("each null model's samples", {"n_null": n_null}, lower="--null")
    if json_out is not None:
        inputs = [*paths, *([source_path(ckpt)] if ckpt is not None else [])]
        outputs.check_output_file(json_out, force=force, inputs=inputs, option="--json")
    loaded = load_circuits(paths)
    writers = {e[0] for e in graph_edges(loaded[0])} if exclude_writers else set()
    unknown = [w for w in exclude_writers if w not in writers]
    if unknown:
        listed = ", ".join(sorted(writers)[:12]) + (", ..." if len(writers) > 12 else "")
        raise ValueError(f"--exclude-writer {unknown[0]!r} is not a writer of the circuits' graph "
                         f"(its writers: {listed}); give one of them")  # fmt: skip
    opened = None if ckpt is None else open_checkpoint(ckpt, device)
    _check_one_checkpoint(loaded, paths, None if opened is None else opened.sha256, ckpt, mixed_checkpoints)
    with warnings.catch_warnings():
        if mixed_checkpoints:  # said once, above
            warnings.filterwarnings("ignore", message=MIXED_WARNING)
        pairs = []
        for i in range(len(loaded)):
            for j in range(i + 1, len(loaded)):
                o = overlap(loaded[i], loaded[j])
                pairs.append({"a": str(paths[i]), "b": str(paths[j]), **o.to_dict()})
        by_target: dict[str, list[Circuit]] = {}
        for c in loaded:
            by_target.setdefault(str(c.metadata.get("target", "?")), []).append(c)
        multi = {t: g for t, g in by_target.items() if len(g) >= 2}
        stability = seed_stability(multi) if multi else None
        edges = [e for e in graph_edges(loaded[0]) if e[0] not in set(exclude_writers)]
        report = overlap_report(loaded, edges, n_boot=n_boot, n_null=n_null, level=level, seed=seed)
    result: dict[str, Any] = {"circuits": [str(p) for p in paths], "pairs": pairs, **report,
                              "excluded_writers": list(exclude_writers)}  # fmt: skip
    if opened is not None:
        data = circuit_data(opened, loaded[0])
        result["cross_evaluation"] = cross_evaluate(opened.model, data, loaded)
    if json_out is not None:
        outputs.write_json(json_out, result)
    return {**result, "stability": stability}
