"""The main job in one call: evaluate a recall checkpoint, find its circuits, explain them.

:func:`make_report` runs, on one checkpoint of the interleaved-systems task,

1. the needle-in-a-haystack evaluation and its out-of-distribution probes;
2. edge pruning of each target (default ``1-after`` and ``2-after``), several seeds each;
3. the overlap of the targets' circuits against their seed-to-seed baseline, with
   bootstrap intervals and the uniform / degree-preserving null models, and each circuit
   evaluated on the other target (cross-evaluation);
4. the label- vs observation-based recall verdicts per offset;
5. per target, whether the model does its prediction at all (median error below half the
   mean predictor's: :data:`~mechlab.evals.does_task.DOES_TASK_BELOW`); where it
   does not, the page and the summary say so first and its circuits are not interpreted;

and writes one offline ``index.html`` (every figure and number, each section with how to
read it and what its numbers say: :mod:`mechlab.viz.report_page`; plotly.js once,
in ``plotly.min.js`` beside it) plus the JSON behind it into a folder::

    DIR/index.html  DIR/plotly.min.js  DIR/report.json  DIR/eval/{nih,ood}.json
    DIR/circuits/<target>_seed<k>.json  DIR/overlap.json  DIR/recall.json

:func:`report_checkpoint` (``mechlab report``) checks every setting, the checkpoint and
the folder before any work starts, records the settings in ``report.json`` first, writes
each circuit as it is found and the page last, so that an interrupted report resumes and
a report of other settings is never mixed into the folder. The checkpoint is opened once
and every stage runs on it, on the device asked for.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from mechlab._deprecated import warn_moved
from mechlab.evals.does_task import not_done, task_status
from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import Source, lds_config, opened_once, source_path
from mechlab.pipelines.data import check_targets, circuit_data
from mechlab.pipelines.evaluate import run_suite
from mechlab.pipelines.prune import (
    PRUNE_RECIPES,
    _with_consensus,
    prune_request,
)
from mechlab.pipelines.recall import recall_checkpoint
from mechlab.pipelines.request import CircuitRequest, TraceCache
from mechlab.pipelines.resume import resume_each
from mechlab.prune.circuit import Circuit
from mechlab.prune.consensus import attach_seed_consensus
from mechlab.prune.stats import cross_evaluate, graph_edges, overlap_report
from mechlab.tasks.lds import check_batch
from mechlab.viz import figure_for_suite, recall_figure, report_page, report_text
from mechlab.viz.explorer import circuit_explorer

Log = Callable[[str], None]


@dataclass
class ReportConfig:
    """What :func:`make_report` runs.

    Attributes:
        targets: Pruning targets (``"k-after"``); at least one.
        seeds: Pruning seeds per target (each also draws its own traces); two or more give
            the seed-to-seed baseline the overlap is judged against, three or more its
            bootstrap intervals. Default two (0, 1): three make the report on the bundled
            checkpoint 1.4x as long (docs/benchmarks.md), past the README's 5 minutes.
        eval_traces: NiH traces of the evaluation and its probes.
        prune_traces: Training traces of each pruning run (held-out: twice as many).
        recall_traces: NiH traces of the recall verdicts.
        components: Also patch each head / layer in the recall analysis (the head heatmap).
        recipe: Pruning recipe (:data:`mechlab.pipelines.PRUNE_RECIPES`); its NiH
            construction is used everywhere.
        steps: Optimiser steps of each pruning run (None: the recipe's, 50 for
            ``default``, as ``mechlab prune``).
        n_boot: Bootstrap resamples of the overlap intervals.
        n_null: Samples of each null model.
    """

    targets: tuple[str, ...] = ("1-after", "2-after")
    seeds: tuple[int, ...] = (0, 1)
    eval_traces: int = 500
    prune_traces: int = 256
    recall_traces: int = 256
    components: bool = True
    recipe: str = "default"
    steps: int | None = None
    n_boot: int = 1000
    n_null: int = 500

    def __post_init__(self) -> None:
        self.targets, self.seeds = tuple(self.targets), tuple(int(s) for s in self.seeds)
        if not self.targets:
            raise ValueError("give at least one target (e.g. 1-after)")
        if len(set(self.targets)) != len(self.targets) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("targets and seeds must not repeat")
        if not self.seeds:
            raise ValueError("give at least one seed")
        for name in ("eval_traces", "prune_traces", "recall_traces", "n_boot", "n_null"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ValueError(f"steps must be a positive integer, got {self.steps!r}")
        if self.recipe not in PRUNE_RECIPES:
            raise ValueError(
                f"unknown recipe {self.recipe!r}; choose one of {list(PRUNE_RECIPES)}"
            )

    @property
    def nih(self) -> str:
        """The NiH construction of the recipe (``"study"`` or ``"uniform"``)."""
        return PRUNE_RECIPES[self.recipe]["nih"]

    @property
    def protocol(self) -> str:
        """Deprecated: the recipe (:attr:`recipe`; goes in mechlab 0.2.0)."""
        warn_moved("ReportConfig.protocol", "ReportConfig.recipe")
        return self.recipe


_dataclass_init = ReportConfig.__init__


@functools.wraps(_dataclass_init)
def _init_taking_protocol(
    self: ReportConfig, *args: Any, protocol: str | None = None, **kwargs: Any
) -> None:
    if protocol is not None:  # the recipe's old name
        warn_moved("ReportConfig(protocol=)", "ReportConfig(recipe=)")
        kwargs["recipe"] = protocol
    _dataclass_init(self, *args, **kwargs)


ReportConfig.__init__ = _init_taking_protocol  # type: ignore[method-assign]


@dataclass
class Report:
    """What :func:`make_report` computed (JSON-ready dicts) and the figures drawn from it.

    Attributes:
        checkpoint: Path of the checkpoint.
        config: The :class:`ReportConfig`.
        evals: Suite name -> :func:`mechlab.pipelines.run_suite` report.
        circuits: Target -> circuits (one per seed).
        overlap: Overlap statistics and cross-evaluation (see :func:`_overlap`).
        recall: :func:`mechlab.pipelines.recall_checkpoint` report.
        timings: Seconds per stage.
    """

    checkpoint: str
    config: ReportConfig
    evals: dict[str, dict[str, Any]]
    circuits: dict[str, list[Any]]
    overlap: dict[str, Any]
    recall: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    checkpoint_sha256: str | None = None

    def summary(self) -> dict[str, Any]:
        """The headline numbers (also ``report.json``'s ``summary``)."""
        nih = self.evals["nih"]["result"]["offsets"]
        per = self.recall["result"]["per_offset"]
        out: dict[str, Any] = {
            "task": task_status(self.evals, self.recall, list(self.circuits)),
            "nih_median": {f"{j}-after": v["median"] for j, v in nih.items()},
            "verdict": {f"{j}-after": v["verdict"] for j, v in per.items()},
            "circuits": {},
        }
        for target, found in self.circuits.items():
            metrics = [c.metadata.get("metrics", {}) for c in found]
            out["circuits"][target] = {
                "edges": [len(c.edges) for c in found],
                "faithfulness": [m.get("faithfulness") for m in metrics],
                "complement_faithfulness": [m.get("complement_faithfulness") for m in metrics],
            }
        n = len(self.config.seeds)
        out["overlap"] = {  # "jaccard": the cross-target Jaccard (mechlab.prune.circuit)
            key: {"jaccard": entry["jaccard_observed"], "null_uniform": entry["null_uniform"]["mc_mean"],
                  "null_degree": entry["null_degree"]["mc_mean"], "n_seeds": n,
                  "interval": None if not entry.get("jaccard") or entry["jaccard"].get("low") is None
                  else [entry["jaccard"]["low"], entry["jaccard"]["high"], entry["jaccard"]["level"]]}
            for key, entry in self.overlap["across"].items()
        }  # fmt: skip
        out["within"] = {t: ci["value"] for t, ci in self.overlap["within"].items()}
        return out

    def to_dict(self) -> dict[str, Any]:
        """``report.json``: the settings, the timings and the headline numbers."""
        return {"checkpoint": self.checkpoint, "config": asdict(self.config),
                "timings_s": self.timings, "summary": self.summary()}  # fmt: skip

    def figures(self) -> list[tuple[str, go.Figure]]:
        """``(title, figure)`` of the page's plotly figures, in order (the circuits are in
        :meth:`explorer`)."""
        return [("Needle in a haystack", figure_for_suite(self.evals["nih"])),
                ("Out-of-distribution probes", figure_for_suite(self.evals["ood"])),
                ("Label- vs observation-based recall", recall_figure(self.recall))]  # fmt: skip

    def explorer(self) -> Any:
        """Every circuit of the report in one :class:`~mechlab.viz.explorer.CircuitExplorer`
        (target, method and seed to choose, overlap of two, scores on hover and click)."""
        flat = [c for found in self.circuits.values() for c in found]
        labels = [f"{c.metadata.get('target')} · {c.metadata.get('method', 'prune')} · seed "
                  f"{c.metadata.get('seed')}" for c in flat]  # fmt: skip
        absent = not_done(task_status(self.evals, self.recall, list(self.circuits)))
        title = "Circuits of the report" + (
            f" ({', '.join(absent)}: circuits of a model that does not do "
            f"{'this prediction' if len(absent) == 1 else 'these predictions'}, not interpreted)" if absent else ""
        )  # fmt: skip
        return circuit_explorer(flat, labels, title)

    def findings(self) -> dict[str, list[str]]:
        """The page's conclusions, written from the numbers (:func:`mechlab.viz.report_text.findings`)."""
        return report_text.findings(self)

    def to_html(self) -> str:
        """The page: what it finds, each section with how to read it, every figure and
        table; it loads ``plotly.min.js`` from its folder (:meth:`write` puts it there)."""
        return report_page.page(self)

    def write(self, out: str | Path, *, force: bool = False) -> Path:
        """Write ``index.html`` and the JSON behind it into ``out``; returns the page's path.

        The folder is claimed as :func:`report_checkpoint` claims it: a folder holding
        another report (other settings, or circuits this one does not have) is refused,
        unless ``force`` (its files are then replaced, and its other circuits removed).
        """
        folder = outputs.OutputFolder(out, "report", force=force, inputs=[self.checkpoint])
        with folder:
            record = report_settings(self.checkpoint_sha256 or "", self.config)
            known = {f"circuits/{_stem(c.metadata['target'], c.metadata['seed'])}.json": c.metadata["settings"]
                     for found in self.circuits.values() for c in found if "settings" in c.metadata}  # fmt: skip
            _plan(folder, self.config, record, known)
            for found in self.circuits.values():
                for c in found:
                    folder.write_circuit(
                        c, f"circuits/{_stem(c.metadata['target'], c.metadata['seed'])}.json"
                    )
            return self._write_into(folder, record)

    def _write_into(self, folder: outputs.OutputFolder, record: dict[str, Any]) -> Path:
        """The circuits (again: with their consensus), the evaluation, overlap, recall and
        page files, then ``report.json`` (finished) last."""
        for found in self.circuits.values():
            for c in found:
                folder.write_circuit(
                    c, f"circuits/{_stem(c.metadata['target'], c.metadata['seed'])}.json"
                )
        for name, rep in self.evals.items():
            folder.write_json(f"eval/{name}.json", rep)
        folder.write_json("overlap.json", self.overlap)
        folder.write_json("recall.json", self.recall)
        folder.write_plotlyjs()  # the page loads it from its folder
        page = folder.write_text("index.html", self.to_html())
        folder.write_json(
            "report.json", {**self.to_dict(), **outputs.settings_record(record), "finished": True}
        )
        return page


def _overlap(ckpt: Any, circuits: dict[str, list[Any]], cfg: ReportConfig, progress: bool = False) -> dict[str, Any]:
    """Overlap statistics (pos edges excluded: they cannot matter) and cross-evaluation on
    the held-out traces of the first circuit, rebuilt from its own recorded settings
    (``progress``: the null models' and the cross-evaluation's bars)."""
    flat = [c for found in circuits.values() for c in found]
    first = flat[0]
    inert = set(first.metadata.get("inert_writers", []))  # their edges cannot matter
    edges = [e for e in graph_edges(first) if e[0] not in inert]
    report = overlap_report(flat, edges, n_boot=cfg.n_boot, n_null=cfg.n_null, progress=progress)
    data = circuit_data(
        ckpt, first, n_train=cfg.prune_traces, n_test=2 * cfg.prune_traces, protocol=cfg.nih
    )
    report["cross_evaluation"] = cross_evaluate(ckpt.model, data, flat, progress=progress)
    report["excluded_writers"] = sorted(inert)
    return report


def make_report(
    ckpt: Source,
    config: ReportConfig | None = None,
    *,
    device: str = "cpu",
    progress: bool = True,
    log: Log | None = None,
    prune_with: Callable[[str, int, Callable[[], Any]], Any] | None = None,
) -> Report:
    """Evaluate, prune, compare and explain one checkpoint of the interleaved-systems task.

    The checkpoint is opened once; every stage (evaluation, pruning, overlap, recall) runs
    on that one model, on ``device``.

    Args:
        ckpt: A checkpoint of a run on the ``lds`` task, or its file.
        config: What to run (default :class:`ReportConfig`).
        device: Where the model runs (every stage).
        progress: Show progress bars (each names its stage and target).
        log: Called with one line as each stage starts and ends (e.g. ``print``).
        prune_with: Called with ``(target, seed, prune)`` for each circuit, returns it:
            ``prune()`` finds it, or the caller reads back one found before
            (:func:`report_checkpoint` resumes this way); default: ``prune()``.

    Returns:
        The :class:`Report` (call :meth:`Report.write` to save it).

    Raises:
        ValueError: A missing or foreign checkpoint, an unknown target or recipe, or
            settings that do not fit the task: before any work.
    """
    cfg = config or ReportConfig()
    with opened_once(ckpt, device) as opened:  # opened and checked once: every stage runs on it
        traces = TraceCache(opened, report_request(cfg, progress))
        check_report(opened, cfg, traces)
        return _make_report(opened, cfg, traces, device=device, progress=progress, log=log,
                            prune_with=prune_with, path=source_path(ckpt))  # fmt: skip


def report_request(cfg: ReportConfig, progress: bool = False) -> CircuitRequest:
    """The circuit request of a report's pruning runs (each seed's: :meth:`CircuitRequest.with_seed
    <mechlab.pipelines.request.CircuitRequest.with_seed>`): its recipe, ``prune_traces``
    training traces and twice as many held out, its steps."""
    return CircuitRequest.resolve(cfg.recipe, n_train=cfg.prune_traces, n_test=2 * cfg.prune_traces,
                                  steps=cfg.steps, progress=progress)  # fmt: skip


def _make_report(opened: Any, cfg: ReportConfig, traces: TraceCache, *, device: str, progress: bool,
                 log: Log | None, prune_with: Callable[[str, int, Callable[[], Any]], Any] | None,
                 path: Path) -> Report:  # fmt: skip
    """:func:`make_report` on a checkpoint opened and checked (:func:`check_report`), each
    circuit pruned on its traces in ``traces``."""
    say = log or (lambda line: None)
    timings: dict[str, float] = {}

    start = time.perf_counter()
    say(f"evaluation: NiH and its probes, {cfg.eval_traces} traces")
    evals = {
        suite: run_suite(opened, suite, n_traces=cfg.eval_traces, protocol=cfg.nih, device=device,
                         progress=progress)
        for suite in ("nih", "ood")
    }
    timings["evaluation"] = time.perf_counter() - start

    start = time.perf_counter()
    circuits: dict[str, list[Any]] = {}
    for target in cfg.targets:
        for seed in cfg.seeds:
            say(f"pruning {target}, seed {seed}")
            find = functools.partial(prune_request, opened, traces.request.with_seed(seed), target,
                                     traces=traces.get(target, seed))  # fmt: skip
            c = find() if prune_with is None else prune_with(target, seed, find)
            circuits.setdefault(target, []).append(c)
    for (
        found
    ) in circuits.values():  # each circuit records how often its target's seeds keep each edge
        attach_seed_consensus(found)
        for c in found if len(found) >= 2 else ():  # and the seeds among its settings (a rerun
            if "settings" in c.metadata:  # with other seeds reads none of them back)
                settings = _with_consensus(c.metadata["settings"], cfg.seeds, False)
                c.metadata.update(outputs.settings_record(settings))
    timings["pruning"] = time.perf_counter() - start
    traces.clear()

    start = time.perf_counter()
    say("overlap: bootstrap, null models, cross-evaluation")
    overlap = (
        _overlap(opened, circuits, cfg, progress) if len(cfg.targets) > 1 else {"within": {}, "across": {}}
    )
    timings["overlap"] = time.perf_counter() - start

    start = time.perf_counter()
    say(f"recall verdicts, {cfg.recall_traces} traces")
    recall = recall_checkpoint(opened, device=device, n_traces=cfg.recall_traces, protocol=cfg.nih,
                               components=cfg.components, progress=progress)  # fmt: skip
    timings["recall"] = time.perf_counter() - start
    return Report(str(path), cfg, evals, circuits, overlap, recall, timings, opened.sha256)


# --------------------------------------------------------------------------- the report on disk


def check_report(ckpt: Any, cfg: ReportConfig, traces: TraceCache | None = None) -> None:
    """Raise ValueError unless the report's every stage fits ``ckpt`` (an lds checkpoint; its
    targets; every count within the size limit), in milliseconds, before any work.
    ``traces``: the pruning runs' traces, built here once per target and seed (the targets
    are checked on them, and pruned on them later); default: one trace checks the targets."""
    task = lds_config(ckpt)
    if traces is None:
        check_targets(ckpt, list(cfg.targets), protocol=cfg.nih)
    for count, name in ((cfg.eval_traces, "eval_traces"), (cfg.prune_traces, "prune_traces"),
                        (2 * cfg.prune_traces, "held-out traces (2 x prune_traces)"),
                        (cfg.recall_traces, "recall_traces")):  # fmt: skip
        check_batch(task, count, name)
    for target in cfg.targets if traces is not None else ():
        for seed in cfg.seeds:
            traces.get(target, seed)


def report_settings(checkpoint_sha256: str, cfg: ReportConfig) -> dict[str, Any]:
    """What shapes a report: its checkpoint and its :class:`ReportConfig` (``report.json``
    records them, and a report into the same folder reuses or refuses by them)."""
    return {"analysis": "report", "checkpoint_sha256": checkpoint_sha256, **asdict(cfg)}


def _stem(target: str, seed: int) -> str:
    return f"{target}_seed{seed}"


_REPORT_FILES = ("eval/nih.json", "eval/ood.json", "overlap.json", "recall.json", "index.html")
_REPORT_LAYOUT = {"report.json": None, "index.html": None, "plotly.min.js": None, "overlap.json": None,
                  "recall.json": None, "eval": ("nih.json", "ood.json"), "circuits": None}  # fmt: skip
"""What a report writes at its folder's top (circuits/ is checked by :func:`_plan` itself)."""


def _plan(folder: outputs.OutputFolder, cfg: ReportConfig, record: dict[str, Any],
          circuit_settings: dict[str, dict[str, Any]]) -> tuple[str, dict[str, str]]:  # fmt: skip
    """Check a report's folder before any work: ``report.json``'s settings, the circuits'
    (``circuit_settings``: file -> settings, where known), files of another report.

    Returns:
        ``report.json``'s status (:meth:`~mechlab.pipelines.outputs.OutputFolder.plan`) and
        each circuit file's.

    Raises:
        ValueError: Without ``force``: another report's ``report.json``, circuits of other
            settings or that this report does not make, page files without a report, or, in
            a folder without a report, files a report does not write (another command's
            outputs; left in place with ``force``). Files added to a report's folder later
            (a ``view.html``) do not stop its rerun.
    """
    status = folder.plan({"report.json": record})["report.json"]
    names = [f"circuits/{_stem(t, s)}.json" for t in cfg.targets for s in cfg.seeds]
    for name in (*names, *_REPORT_FILES, *(n.replace(".json", ".html") for n in names)):
        folder.check_path(name)
    if status == "new":  # no report here: the page files must not exist either
        folder.check_fresh(_REPORT_FILES)
    circuits = folder.plan({n: circuit_settings[n] for n in names if n in circuit_settings})
    if status == "new":  # no report here yet: another command's outputs (a prune's) are not mixed in
        folder.check_foreign(_REPORT_LAYOUT, "a report")
    others = sorted(
        p for p in folder.file("circuits").glob("*.json") if f"circuits/{p.name}" not in names
    )
    if others and not folder.force:
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        raise ValueError(f"{str(others[0])!r}{more} belongs to another report (this one makes "
                         f"{', '.join(Path(n).stem for n in names)}); pass --force to replace that report, "
                         f"or choose another --out")  # fmt: skip
    for path in others:  # --force: the other report's circuits go, so that none is mixed in
        folder.remove(f"circuits/{path.name}")
        folder.remove(f"circuits/{path.stem}.html")
    return status, circuits


@dataclass
class ReportRun:
    """What :func:`report_checkpoint` did: the page, the headline numbers, whether the report
    was read back (finished before, with the same settings), and the :class:`Report` (None
    when read back)."""

    page: Path
    summary: dict[str, Any]
    reused: bool
    report: Report | None = None
    circuits_reused: list[str] = field(default_factory=list)

    def task_warnings(self) -> list[tuple[str, str]]:
        """``(target, line)`` for each target whose prediction the model does not do (the
        summary's ``task``; :func:`mechlab.viz.report_text.task_warning`'s words): what
        ``mechlab report`` prints first."""
        return [(name, report_text.task_warning(name, status)) for name, status in self.summary.get("task", {}).items()
                if not status["does_task"]]  # fmt: skip


def report_checkpoint(
    ckpt: Source,
    out: str | Path,
    config: ReportConfig | None = None,
    *,
    force: bool = False,
    device: str = "cpu",
    progress: bool = True,
    log: Log | None = None,
) -> ReportRun:
    """``mechlab report``: :func:`make_report` into a folder, checked first and resumable.

    Before the first stage: every setting (:class:`ReportConfig`), the checkpoint, its
    targets and sizes (:func:`check_report`), and the folder (claimed: a file, ``/proc/x``,
    a folder git tracks or one holding another report is refused, in milliseconds, with
    nothing written). Then ``report.json`` records the settings (``finished: false``),
    each circuit is written as it is found, and the page and ``report.json`` (finished)
    last. A rerun with the same settings reads back a finished report, or resumes an
    unfinished one (its circuits read back); one with other settings is refused unless
    ``force``, which replaces the report.

    Args:
        ckpt: A checkpoint of the ``lds`` task, or its file.
        out: The report's folder.
        config: What to run (default :class:`ReportConfig`).
        force: Replace a report of other settings (and write into a folder git tracks).
        device: Where every stage runs.
        progress: Show progress bars.
        log: Called with one line per stage.

    Returns:
        The :class:`ReportRun`.
    """
    cfg = config or ReportConfig()
    say = log or (lambda line: None)
    folder = outputs.OutputFolder(out, "report", force=force, inputs=[source_path(ckpt)])
    tally = stops.Tally(folder.path, len(cfg.targets) * len(cfg.seeds))  # circuits written or read back
    # Ctrl-C or SIGTERM: the circuits stay, the rerun reads them back
    with stops.resumable(tally), folder, opened_once(ckpt, device) as opened:
        traces = TraceCache(opened, report_request(cfg, progress))
        check_report(opened, cfg, traces)
        record = report_settings(opened.sha256, cfg)
        circuit_settings = {
            f"circuits/{_stem(t, s)}.json": _with_consensus(
                traces.request.with_seed(s).record(opened, t, traces.get(t, s)[1]), cfg.seeds, False)
            for t in cfg.targets for s in cfg.seeds
        }  # fmt: skip
        status, circuits = _plan(folder, cfg, record, circuit_settings)
        if status == "same":
            done = outputs.read_json(folder.file("report.json"))
            if done.get("finished") is True and all(
                folder.file(n).is_file() for n in _REPORT_FILES
            ):
                say(f"report in {str(folder.path)!r} is finished with the same settings: read back")
                return ReportRun(folder.file("index.html"), done["summary"], reused=True)
        folder.write_json("report.json", {"checkpoint": str(source_path(ckpt)), "config": asdict(cfg),
                                          **outputs.settings_record(record), "finished": False})  # fmt: skip
        reused: list[str] = []

        def kept(stem: str, status: str) -> None:
            if status == "same":
                say(f"  {stem}.json: read back (same settings)")
                reused.append(f"{stem}.json")
            tally.kept.append(stem)

        def write(stem: str, circuit: Any, name: str) -> None:
            if "settings" in circuit.metadata:  # what the plan compared (with the consensus's seeds)
                circuit.metadata.update(outputs.settings_record(circuit_settings[name]))
            folder.write_circuit(circuit, name)

        def prune_with(target: str, seed: int, find: Callable[[], Any]) -> Any:
            stem = f"circuits/{_stem(target, seed)}"
            return next(resume_each(folder, circuits, {stem: stem}, read=lambda _, file: Circuit.from_json(file),
                                    compute=lambda _: find(), write=write, kept=kept)).value  # fmt: skip

        report = _make_report(opened, cfg, traces, device=device, progress=progress, log=log,
                              prune_with=prune_with, path=source_path(opened))  # fmt: skip
        page = report._write_into(folder, record)
    return ReportRun(page, report.summary(), reused=False, report=report, circuits_reused=reused)
