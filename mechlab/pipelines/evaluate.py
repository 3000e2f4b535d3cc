"""Evaluating a checkpoint (``mechlab eval``): the NiH suites on its own task and device.

The suites (:mod:`mechlab.evals.suites`) compute on a model and a task config; here a
checkpoint is opened, its haystack defaults to the run's evaluation setting (shrunk to fit
the model: :func:`mechlab.pipelines.data.haystack`, as pruning and recall do), and the
model runs on the device asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mechlab.checkpoint import Checkpoint
from mechlab.evals.suites import SUITES, evaluate_model, nih_errors, summarize
from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import (
    Source,
    lds_config,
    open_checkpoint,
    run_checkpoints,
    source_path,
)
from mechlab.pipelines.data import haystack
from mechlab.pipelines.resume import read_result, resume_each
from mechlab.progress import tqdm
from mechlab.tasks.lds import check_batch, make_libraries
from mechlab.tasks.lds_evals import nih_protocol
from mechlab.viz import figure_for_suite


def run_suite(
    source: Source,
    suite: str,
    n_traces: int = 1000,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    seed: int = 0,
    protocol: str = "study",
    trials: int | None = None,
    device: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run a suite on a checkpoint (``dynamics``: on the run directory the checkpoint is in).

    Args:
        source: A checkpoint of the lds task, or its file.
        suite: One of :data:`~mechlab.evals.suites.SUITES`.
        n_traces: Traces (with ``trials``: examples).
        n_haystack: Haystack systems (default: the run's evaluation setting, shrunk to
            fit ``n_ctx`` and ``n_pairs``).
        seg_len: Observations per segment (default: the run's).
        seed: Seed of the traces.
        protocol: The NiH construction (``"study"`` or ``"uniform"``).
        trials: Initial-state trials per example (``nih``/``ood``).
        device: Where the model runs (default: where it is; a path loads onto the CPU).
        progress: Show progress bars (``ood``: its runs; ``dynamics``: the checkpoints).

    Returns:
        ``{"suite", "checkpoint", "sha256", "step", "seed", "result"}``.
    """
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose one of {list(SUITES)}")
    nih_protocol(protocol)  # validate before loading anything
    if trials is not None and suite in ("dynamics", "uninterleaved"):
        raise ValueError(f"trials (per-example aggregation) applies to the nih and ood suites, not {suite!r}")
    ckpt = open_checkpoint(source, device)
    cfg = lds_config(ckpt)
    n_haystack, seg_len = haystack(ckpt, n_haystack, seg_len)
    path = source_path(source)
    if suite == "dynamics":
        result = eval_dynamics(_run_dir(path), min(n_traces, 500), n_haystack, seg_len, seed,
                               protocol=protocol, device=device, progress=progress)  # fmt: skip
    else:
        result = evaluate_model(ckpt.model, cfg, make_libraries(cfg)[1], suite, n_traces, n_haystack,
                                seg_len, seed, protocol=protocol, trials=trials, progress=progress)  # fmt: skip
    return {"suite": suite, "checkpoint": str(path), "sha256": ckpt.sha256, "step": ckpt.step,
            "seed": seed, "result": result}  # fmt: skip


def eval_dynamics(
    run_dir: str | Path,
    n_traces: int = 500,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    seed: int = 0,
    progress: bool = True,
    protocol: str = "study",
    device: str | None = None,
) -> dict[str, Any]:
    """Every checkpoint of a run through the NiH suite: error vs examples seen.

    Args:
        run_dir: A training run directory (``checkpoints/step_*.pt``).
        n_traces: Traces per checkpoint.
        n_haystack: Haystack systems (default: the first checkpoint's run setting).
        seg_len: Observations per segment (default as ``n_haystack``).
        seed: Seed of the traces (the same traces for every checkpoint).
        progress: Show a progress bar.
        protocol: NiH construction, ``"uniform"`` or ``"study"``.
        device: Where the models run.

    Returns:
        ``{"examples": [...], "steps": [...], "offsets": {offset: [median per checkpoint]},
        "q1": {...}, "q3": {...}}``.
    """
    ckpts = run_checkpoints(run_dir, device)
    n_haystack, seg_len = haystack(ckpts[0], n_haystack, seg_len)
    out: dict[str, Any] = {"steps": [], "examples": [], "offsets": {}, "q1": {}, "q3": {}}
    task_cfg, test_lib = None, None
    for ckpt in tqdm(ckpts, disable=not progress, desc="checkpoints"):
        cfg = lds_config(ckpt)
        if task_cfg != cfg:
            task_cfg, test_lib = cfg, make_libraries(cfg)[1]
        errs = nih_errors(ckpt.model, task_cfg, test_lib, n_traces, n_haystack, seg_len,
                          torch.Generator().manual_seed(seed), protocol=protocol)  # fmt: skip
        out["steps"].append(ckpt.step)
        out["examples"].append(ckpt.examples_seen)
        for j, e in errs.items():
            s = summarize(e)
            out["offsets"].setdefault(str(j), []).append(s["median"])
            out["q1"].setdefault(str(j), []).append(s["q1"])
            out["q3"].setdefault(str(j), []).append(s["q3"])
    return out


def suite_settings(ckpt: Checkpoint, path: Path, suite: str, *, n_traces: int = 1000,
                   n_haystack: int | None = None, seg_len: int | None = None, seed: int = 0,
                   protocol: str = "study", trials: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Every setting that shapes a suite's report (the run's haystack resolved; for
    ``dynamics`` the digest of each of the run's checkpoints): what ``<suite>.json``
    records, and a rerun compares."""
    n, s = haystack(ckpt, n_haystack, seg_len)
    out: dict[str, Any] = {"analysis": "eval", "checkpoint_sha256": ckpt.sha256, "suite": suite,
                           "n_traces": n_traces, "n_haystack": n, "seg_len": s, "seed": seed,
                           "protocol": protocol, "trials": trials}  # fmt: skip
    if suite == "dynamics":
        run_dir = _run_dir(path)
        out["n_traces"] = min(n_traces, 500)
        out["run_checkpoints"] = {p.name: outputs.file_sha256(p) for p in sorted(run_dir.glob("checkpoints/step_*.pt"))}
    return out


def evaluate_checkpoint(
    source: Source,
    suites: Sequence[str] = ("nih",),
    out: str | Path | None = None,
    *,
    on_suite: Callable[[str, dict[str, Any], Path, Path], None] | None = None,
    on_start: Callable[[str], None] | None = None,
    on_reuse: Callable[[str, Path], None] | None = None,
    force: bool = False,
    **settings: Any,
) -> dict[str, dict[str, Any]]:
    """``mechlab eval``: each suite's JSON and figure (``<suite>.json``, ``<suite>.html``).

    Every setting, the output folder (claimed: locked, nothing of other settings in it)
    and, for ``dynamics``, the run's checkpoints are checked before the first suite runs.
    Each ``<suite>.json`` records its settings (:func:`suite_settings`); a rerun reads back
    a suite of the same settings instead of running it again, and refuses one of other
    settings, naming them (replaced with ``force``). A signal (Ctrl-C, SIGTERM) raises
    :class:`~mechlab.pipelines.stops.Interrupted` naming the suites kept.

    Args:
        source: A checkpoint of the lds task, or its file (opened once).
        suites: Suites (``["all"]``: every one).
        out: Folder (default: ``mechlab-out/<run>/eval``).
        on_suite: Called with ``(suite, report, json_path, html_path)`` after each write
            (or read back).
        on_reuse: Called with ``(suite, json_path)`` for a suite read back.
        force: Replace suites of other settings (and write into a folder git tracks).
        on_start: Called with the suite's name as it starts (progress for the terminal).
        **settings: :func:`run_suite`'s (``n_traces``, ``n_haystack``, ``seg_len``,
            ``seed``, ``protocol``, ``trials`` (nih and ood only), ``device``).

    Returns:
        Suite -> report.
    """
    suites = list(SUITES) if list(suites) == ["all"] else list(suites)
    for name in suites:
        if name not in SUITES:
            raise ValueError(f"unknown suite {name!r}; choose from {list(SUITES)} or all")
    if len(set(suites)) != len(suites):
        raise ValueError(f"suites must not repeat, got {suites}")
    nih_protocol(settings.get("protocol", "study"))
    trials = settings.pop("trials", None)
    if trials is not None and not any(name in ("nih", "ood") for name in suites):
        raise ValueError(f"trials (per-example aggregation) applies to the nih and ood suites, not {suites}")
    device = settings.pop("device", None)
    path = source_path(source)
    folder = outputs.OutputFolder(Path(out) if out is not None else outputs.default_out(path, "eval"), "eval",
                                  force=force, inputs=[path])  # fmt: skip
    reports = {}
    tally = stops.Tally(folder.path, len(suites), unit="suite")  # Ctrl-C or SIGTERM: the suites written stay
    with stops.resumable(tally), folder:
        ckpt = open_checkpoint(source, device)
        cfg = lds_config(ckpt)
        n = settings.get("n_traces", 1000)
        check_batch(cfg, n, "n_traces")  # every suite's size, before the first runs
        if trials is not None:
            check_batch(cfg, n * trials, f"n_traces ({n} examples x {trials} trials)")
        if "dynamics" in suites and not any(_run_dir(path).glob("checkpoints/step_*.pt")):
            raise ValueError(f"the dynamics suite needs the run's checkpoints/step_*.pt; there are none under "
                             f"{str(_run_dir(path))!r}")  # fmt: skip
        records = {name: suite_settings(ckpt, path, name, trials=trials if name in ("nih", "ood") else None,
                                        **{k: v for k, v in settings.items() if k != "n_traces"}, n_traces=n)
                   for name in suites}  # fmt: skip
        for name in suites:
            folder.check_path(f"{name}.html")
        status = folder.plan({f"{name}.json": records[name] for name in suites})

        def kept(name: str, state: str) -> None:
            tally.kept.append(name)
            if state == "same" and on_reuse is not None:
                on_reuse(name, folder.file(f"{name}.json"))

        def compute(name: str) -> dict[str, Any]:
            if on_start is not None:
                on_start(name)
            return run_suite(ckpt, name, trials=trials if name in ("nih", "ood") else None, device=device,
                             **settings)  # fmt: skip

        for done in resume_each(
            folder, status, {name: name for name in suites}, read=lambda _, path: read_result(path),
            compute=compute, kept=kept,
            write=lambda name, report, file: folder.write_json(file, {**report, **outputs.settings_record(records[name])}),
            draw=lambda _, report, file: folder.write_figure(figure_for_suite(report), file),
        ):  # fmt: skip
            reports[done.key] = done.value
            if on_suite is not None:
                on_suite(done.key, done.value, done.json_path, done.html_path)
    return reports


def _run_dir(path: Path) -> Path:
    """The run directory of a checkpoint file (``DIR/last.pt``, ``DIR/checkpoints/step_*.pt``)."""
    run_dir = path.resolve().parent
    return run_dir.parent if run_dir.name == "checkpoints" else run_dir
