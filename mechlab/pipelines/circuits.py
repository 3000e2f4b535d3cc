"""Circuit files: drawing them (``mechlab view``) and comparing them (``mechlab overlap``)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechlab.circuit_methods import DEFAULT_METHOD, is_edge_pruning
from mechlab.limits import check_elements
from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import Source, open_checkpoint, source_path
from mechlab.pipelines.data import circuit_data
from mechlab.prune.circuit import (
    CROSS_TARGET_JACCARD,
    EDGE_JACCARD,
    SEED_BASELINE_JACCARD,
    Circuit,
    Overlap,
    interval_text,
    overlap,
    seed_stability,
)
from mechlab.prune.circuit_file import checkpoint_groups, describe_groups
from mechlab.prune.stats import cross_evaluate, graph_edges, overlap_report
from mechlab.viz.explorer import circuit_explorer

MIXED_WARNING = "comparing circuits of different checkpoints"  # the engine's warning


def load_circuits(paths: Sequence[str | Path]) -> list[Circuit]:
    """Read circuit files as ``mechlab view`` and ``overlap`` do (also ``mechlab.load_circuits``):
    each checked (one line naming the file or the field) before any work; a file given twice
    (by any path, or a copy of the same bytes) is refused: a circuit compared with itself
    would read as perfect agreement.

    Args:
        paths: Circuit JSON files (``mechlab prune``'s ``<target>_seed<k>.json``).

    Returns:
        The :class:`~mechlab.prune.Circuit` of each file, in the order given.
    """
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
    """``mechlab view``: the circuit explorer of the circuits (:func:`mechlab.viz.circuit_explorer`):
    choose target, method and seed, compare two (shared / only A / only B), filter by score
    and stability, hover or click for scores; one offline file, plotly.js inside. It opens
    on the first circuit compared with another (:func:`first_comparison`: another target's
    of the same seed, when the circuits have two or more targets; else another method's).

    Args:
        paths: Circuit JSON files.
        out: The ``.html`` file to write.
        labels: A name per circuit (default: target, method and seed).
        force: Replace ``out`` if it exists (never one of the circuits, nor a checkpoint).

    Returns:
        The page's path.
    """
    if labels and len(labels) != len(paths):
        raise ValueError(f"give one --label per circuit: {len(labels)} labels for {len(paths)} circuits")
    outputs.check_output_file(out, force=force, inputs=paths, suffixes=(".html", ".htm"))
    loaded = load_circuits(paths)
    explorer = circuit_explorer(loaded, list(labels) or None)
    page = explorer.to_html("inline", start=0, compare=first_comparison(loaded))
    return outputs.write_text(out, page)


def first_comparison(circuits: Sequence[Circuit]) -> int | None:
    """The circuit ``mechlab view`` compares the first one with when the page opens (the
    page switches either). Circuits of two or more targets compare the targets: the first
    circuit with the first of another target of the same seed and method where there is
    one (``1-after_seed0`` with ``2-after_seed0``, however the files are ordered, e.g. by a
    shell's ``*.json``); one target's circuits of two or more methods compare the methods
    (the same seed); one target's and method's circuits compare the first two given (seed
    with seed). None for one circuit.
    """
    if len(circuits) < 2:
        return None
    meta = [c.metadata for c in circuits]
    first = meta[0]
    others = [i for i, c in enumerate(circuits) if _group(c) != _group(circuits[0])]
    if not others:
        return 1

    def rank(i: int) -> tuple[bool, bool, bool, int]:  # another target, the same seed, the same method, first given
        m = meta[i]
        return (str(m.get("target")) == str(first.get("target")), m.get("seed") != first.get("seed"),
                m.get("method", DEFAULT_METHOD) != first.get("method", DEFAULT_METHOD), i)  # fmt: skip

    return min(others, key=rank)


def _group(circuit: Circuit, default: str = "?") -> str:
    """A circuit's group: its target, and its method when that is not edge pruning
    (``1-after``, ``1-after eap-ig``): circuits of one group are seeds of one search."""
    meta = circuit.metadata
    method = meta.get("method", DEFAULT_METHOD)
    return str(meta.get("target", default)) + ("" if is_edge_pruning(method) else f" {method}")


def _by_group(circuits: list[Circuit]) -> list[Circuit]:
    """The circuits with ``metadata["target"]`` replaced by their group (:func:`_group`), for
    the statistics that group circuits by target; the originals are left as they are."""
    return [dataclasses.replace(c, metadata={**c.metadata, "target": _group(c)}) for c in circuits]


def _check_one_checkpoint(loaded: list[Circuit], paths: Sequence[str | Path], sha: str | None,
                          ckpt: Source | None, mixed: bool) -> None:  # fmt: skip
    """Refuse (or, with ``mixed``, warn about) circuits of different checkpoints (``ckpt``:
    the checkpoint they are read against, opened or its file, or None)."""
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
    progress: bool = False,
    log: Any = None,
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
        json_out: Write the result here as JSON (never one of the inputs or a checkpoint).
        progress: Show a progress bar for each null model and the cross-evaluation.
        log: Called with one line as each stage starts (e.g. ``print``).
        force: Replace ``json_out`` if it exists.

    Returns:
        ``circuits``, ``pairs`` (one :meth:`~mechlab.prune.circuit.Overlap.to_dict` per pair,
        with ``a`` and ``b``), ``within``, ``across`` (:func:`~mechlab.prune.stats.overlap_report`),
        ``excluded_writers``, ``stability`` (a :class:`~mechlab.prune.circuit.Stability`,
        or None: not in the JSON) and, with ``ckpt``, ``cross_evaluation``.

    Raises:
        Unwritten: A signal (Ctrl-C, SIGTERM) stopped it before the end: ``json_out`` is
            written only at the end, so nothing was written.
    """
    if len(paths) < 2:
        raise ValueError("give at least two circuit files")
    if not 0 < level < 1:
        raise ValueError(f"--level must be in (0, 1), got {level}")
    say = log or (lambda line: None)
    check_elements("the bootstrap's resamples", {"n_boot": n_boot}, lower="--boot")
    check_elements("each null model's samples", {"n_null": n_null}, lower="--null")
    if json_out is not None:
        inputs = [*paths, *([source_path(ckpt)] if ckpt is not None else [])]
        outputs.check_output_file(json_out, force=force, inputs=inputs, option="--json")
    with stops.written_at_end(json_out):  # Ctrl-C or SIGTERM: one line, nothing written
        loaded = load_circuits(paths)
        writers = {e[0] for e in graph_edges(loaded[0])} if exclude_writers else set()
        unknown = [w for w in exclude_writers if w not in writers]
        if unknown:
            listed = ", ".join(sorted(writers)[:12]) + (", ..." if len(writers) > 12 else "")
            raise ValueError(f"--exclude-writer {unknown[0]!r} is not a writer of the circuits' graph "
                             f"(its writers: {listed}); give one of them")  # fmt: skip
        if ckpt is not None:
            say(f"opening {source_path(ckpt)}")
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
                by_target.setdefault(_group(c), []).append(c)
            multi = {t: g for t, g in by_target.items() if len(g) >= 2}
            stability = seed_stability(multi) if multi else None
            edges = [e for e in graph_edges(loaded[0]) if e[0] not in set(exclude_writers)]
            say(f"bootstrap ({n_boot} resamples of each target's circuits) and null models ({n_null} samples each)")
            report = overlap_report(_by_group(loaded), edges, n_boot=n_boot, n_null=n_null, level=level, seed=seed,
                                    progress=progress)  # fmt: skip
        result: dict[str, Any] = {"circuits": [str(p) for p in paths], "pairs": pairs, **report,
                                  "excluded_writers": list(exclude_writers)}  # fmt: skip
        if opened is not None:
            say(f"cross-evaluation: every circuit on every target, on the held-out traces of {Path(paths[0]).name}")
            data = circuit_data(opened, loaded[0])
            result["cross_evaluation"] = cross_evaluate(opened.model, data, loaded, progress=progress)
        if json_out is not None:
            outputs.write_json(json_out, result)
        return {**result, "stability": stability}


# --------------------------------------------------------------------- the printed statistics


def pair_line(a: str, b: str, o: Overlap, seeds: tuple[Any, Any] | None = None) -> str:
    """One pair of circuits, as ``mechlab prune`` prints it: their edge Jaccard (one seed each)."""
    which = f", seed {seeds[0]} vs seed {seeds[1]}" if seeds else ""
    if o.n_edges_a == 0 or o.n_edges_b == 0:
        return f"{a} vs {b}{which}: {EDGE_JACCARD} not defined, a circuit is empty ({o.n_edges_a} and {o.n_edges_b} edges)"
    return (f"{a} vs {b}{which}: {EDGE_JACCARD} {o.jaccard:.3f} ({o.n_shared_edges} shared edges), "
            f"overlap coefficient {o.overlap_coefficient:.3f}")  # fmt: skip


def _n_circuits(report: dict[str, Any], name: str) -> int:
    """A target's circuits: ``n_circuits``, or (files written before it was recorded) the
    count its seed-baseline interval names, or 1 when it has no seed baseline."""
    if name in report.get("n_circuits", {}):
        return int(report["n_circuits"][name])
    found = re.search(r"(\d+) circuits", str(report["within"].get(name, {}).get("resampled", "")))
    return int(found.group(1)) if found else 2 if name in report["within"] else 1


def overlap_lines(report: dict[str, Any]) -> list[str]:
    """The overlap statistics of :func:`~mechlab.prune.stats.overlap_report` (or
    :func:`overlap_circuits`) as ``mechlab overlap`` prints them: each target's seed-baseline
    Jaccard and each pair's cross-target Jaccard (with an interval only from
    :data:`~mechlab.prune.circuit.MIN_SEEDS_FOR_INTERVAL` seeds per target), then the nulls."""
    counts = {name: _n_circuits(report, name) for name in report["within"]}
    lines = []
    for name, ci in report["within"].items():
        n = counts[name]
        lines.append(f"{name}: {SEED_BASELINE_JACCARD} {ci['value']:.3f}, {interval_text(ci, n)}")
    for key, entry in report["across"].items():
        a, b = key.split(" vs ")
        n = min(_n_circuits(report, a), _n_circuits(report, b))
        lines.append(f"{key}: {CROSS_TARGET_JACCARD} {entry['jaccard_observed']:.3f}, "
                     f"{interval_text(entry['jaccard'], n)}")  # fmt: skip
        lines.append(f"  cross-target overlap coefficient {entry['overlap_coefficient_observed']:.3f}, "
                     f"{interval_text(entry['overlap_coefficient'], n)}")  # fmt: skip
        for kind in ("uniform", "degree"):
            nm = entry[f"null_{kind}"]
            exact = "" if nm["expected_exact"] is None else f", exact {nm['expected_exact']:.3f}"
            lines.append(f"  {kind} null ({nm['n_universe']} edges): {CROSS_TARGET_JACCARD} {nm['mc_mean']:.3f} +- "
                         f"{nm['mc_std']:.3f}{exact}; observed at percentile {100 * nm['percentile']:.1f}, "
                         f"P(null >= obs) {nm['p_greater']:.4f}, P(null <= obs) {nm['p_less']:.4f}")  # fmt: skip
    return lines


def report_overlap_line(key: str, o: dict[str, Any], within: dict[str, float], n_seeds: int = 0) -> str:
    """One pair of targets of ``mechlab report``'s printed summary (``report.json``'s
    ``summary``), in the names and interval words of ``mechlab overlap``; ``n_seeds``
    where the summary does not record it (a report written before it did)."""
    n = o.get("n_seeds", n_seeds)
    ci = None if not o.get("interval") else dict(zip(("low", "high", "level"), o["interval"], strict=True))
    seeds = ", ".join(f"{t} {v:.3f}" for t, v in within.items())
    return (f"{key}: {CROSS_TARGET_JACCARD} {o['jaccard']:.3f}, {interval_text(ci, n)} (uniform null "
            f"{o['null_uniform']:.3f}, degree null {o['null_degree']:.3f})"
            + (f"; {SEED_BASELINE_JACCARD} {seeds}" if seeds else ""))  # fmt: skip
