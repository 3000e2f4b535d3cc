"""Starting vs continuing a translation across a language model's training checkpoints.

A *series* is a set of checkpoint folders of one model (``save_pretrained`` folders, such
as the revisions OLMo, OLMo 2 and Pythia publish), or of mechlab checkpoint files of one
run (``step_0000100.pt``, as ``checkpoint_every`` writes them; their tokenizer is a
``save_pretrained`` tokenizer in the files' folder or given apart), ordered by training
step: the step is read from each name (``step20000-tokens84B``, ``step_1000``,
``global_step300``: the digits after ``step``), or from a manifest (a JSON list of
``{"folder": ..., "step": ...}``, or a TSV of ``folder<TAB>step`` lines; paths relative to
the manifest's own).

:func:`translation_across_training` builds the prompts once
(:mod:`mechlab.tasks.translation`: symbolic and semantic labels, plain and misdirected),
scores every checkpoint with :func:`mechlab.evals.translation.start_vs_continue` into
``OUT/step_<step>.json`` (written atomically with its settings record; a rerun reads back
the checkpoints already scored, so a stopped run resumes per checkpoint), then writes
``OUT/across.json`` (per step the reports; per label kind and position each curve's
emergence step; the start-continue gaps; the verdict) and ``OUT/across.html``
(:func:`mechlab.viz.translation.translation_figure`).

**Emergence.** A curve (start or continue accuracy of one label kind over steps) emerges at
the first step whose mean accuracy reaches ``threshold``; its interval runs from the first
step whose bootstrap upper bound reaches it to the first step whose lower bound does
(``None``: not within the series).

**Verdict** (the study's claim: with symbolic labels the start emerges later than the
continuation, with semantic labels the gap disappears): *holds* when the symbolic start's
interval lies wholly after the symbolic continuation's and the semantic intervals overlap;
*fails* when the symbolic start emerges no later than its continuation, or the semantic
start's interval lies wholly after its continuation's; *undecided* otherwise (a curve that
never emerges, or overlapping symbolic intervals).

Refused, one line each and before anything is written: folders of different architectures
(their ``config.json`` differ beyond names and versions; for checkpoint files, their model
configs differ) or tokenizers (their tokenizer files differ), folders mixed with checkpoint
files, names without a step and no manifest, two folders of one step, a word the
tokenizer cannot encode, a label that is a word of the word list.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mechlab.checkpoint import load_checkpoint
from mechlab.evals.translation import start_vs_continue
from mechlab.pipelines import outputs, stops
from mechlab.pipelines.prompts import open_model
from mechlab.tasks.prompts import TOKENIZER_FILES, load_tokenizer
from mechlab.tasks.translation import SYMBOLS, WordList, episodes, load_words, usable_words
from mechlab.viz.translation import translation_figure

STEP = re.compile(r"step[_-]?(\d+)", re.IGNORECASE)
CONFIG_IGNORED = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash")
"""config.json keys that may differ between checkpoints of one model."""
KINDS = ("symbolic", "semantic")
POSITIONS = ("start", "continue")


def parse_step(name: str) -> int | None:
    """The training step in a checkpoint folder's name (``step20000-tokens84B`` -> 20000),
    or None."""
    match = STEP.search(name)
    return int(match.group(1)) if match else None


def _manifest(path: Path) -> list[tuple[int, Path]]:
    if not path.is_file():
        raise ValueError(f"manifest {str(path)!r} is not a file")
    text = path.read_text(encoding="utf-8")
    rows: list[tuple[Any, Any]] = []
    try:
        data = json.loads(text)
        if not isinstance(data, list) or not all(isinstance(r, dict) and {"folder", "step"} <= set(r) for r in data):
            raise ValueError
        rows = [(r["folder"], r["step"]) for r in data]
    except ValueError:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise ValueError(f"manifest {str(path)!r} line {number}: want 'folder<TAB>step' (or a JSON list "
                                 f"of {{'folder', 'step'}}), got {line!r}") from None  # fmt: skip
            rows.append((fields[0], fields[1]))
    series = []
    for folder, step in rows:
        try:
            number = int(step)
        except (TypeError, ValueError):
            raise ValueError(f"manifest {str(path)!r}: step {step!r} of {folder!r} is not a whole number") from None
        if isinstance(step, bool) or number < 0:
            raise ValueError(f"manifest {str(path)!r}: step {step!r} of {folder!r} is not a whole number")
        where = Path(folder)
        series.append((number, where if where.is_absolute() else path.parent / where))
    return series


def checkpoint_series(
    checkpoints: str | Path | Sequence[str | Path], manifest: str | Path | None = None
) -> list[tuple[int, Path]]:
    """The checkpoint folders of a series, ordered by step.

    Args:
        checkpoints: A folder whose subfolders holding ``config.json`` are the checkpoints,
            or the checkpoint folders themselves (ignored when ``manifest`` is given).
        manifest: A file listing folder and step (see the module's docstring).

    Returns:
        ``(step, folder)`` pairs, by step.

    Raises:
        ValueError: One line: no checkpoint, a folder without config.json, a name without
            a step (and no manifest), two folders of one step.
    """
    if manifest is not None:
        series = _manifest(Path(manifest))
    else:
        if isinstance(checkpoints, (str, Path)):
            parent = Path(checkpoints)
            if not parent.is_dir():
                raise ValueError(f"checkpoints {str(parent)!r} is not a folder")
            folders = sorted(p for p in parent.iterdir() if (p / "config.json").is_file())
            folders = folders or sorted(p for p in parent.iterdir() if _is_checkpoint_file(p))
            if not folders:
                raise ValueError(f"{str(parent)!r} holds no checkpoint (a subfolder with config.json, or "
                                 "mechlab checkpoint files named by step)")  # fmt: skip
        else:
            folders = [Path(p) for p in checkpoints]
        series = []
        for folder in folders:
            step = parse_step(folder.name)
            if step is None:
                raise ValueError(f"checkpoint folder {folder.name!r} names no step (as in step20000-tokens84B); "
                                 "rename it or give a manifest of folder and step")  # fmt: skip
            series.append((step, folder))
    if not series:
        raise ValueError("no checkpoint folders given")
    for _, folder in series:
        if folder.is_file():
            if not _is_checkpoint_file(folder):
                raise ValueError(f"{str(folder)!r} is not a checkpoint folder or a mechlab checkpoint file "
                                 f"({', '.join(outputs.CHECKPOINT_SUFFIXES)})")  # fmt: skip
        elif not (folder / "config.json").is_file():
            raise ValueError(f"checkpoint folder {str(folder)!r} has no config.json")
    if len({folder.is_file() for _, folder in series}) > 1:
        raise ValueError("the series mixes save_pretrained folders and mechlab checkpoint files; "
                         "a series is one model's checkpoints, all of one kind")  # fmt: skip
    series.sort(key=lambda pair: pair[0])
    for a, b in zip(series, series[1:], strict=False):
        if a[0] == b[0]:
            raise ValueError(f"two checkpoint folders of step {a[0]}: {str(a[1])!r} and {str(b[1])!r}")
    return series


def _is_checkpoint_file(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in outputs.CHECKPOINT_SUFFIXES


def _config(folder: Path) -> dict[str, Any]:
    if folder.is_file():  # a mechlab checkpoint: its model's config
        try:
            return dict(load_checkpoint(folder).config.to_dict())
        except (OSError, ValueError) as err:
            reason = " ".join(str(err).split())[:160]
            raise ValueError(f"cannot read the checkpoint {str(folder)!r}: {reason}") from None
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {str(folder / 'config.json')!r}: {err}") from None
    return {k: v for k, v in data.items() if k not in CONFIG_IGNORED}


def _tokenizer_files(folder: Path) -> dict[str, str]:
    if folder.is_file():  # checkpoint files share their folder's (or the given) tokenizer
        return {}
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in TOKENIZER_FILES if (folder / name).is_file()}  # fmt: skip


def check_one_model(series: Sequence[tuple[int, Path]]) -> None:
    """Refuse a series whose folders hold different architectures or tokenizers.

    Raises:
        ValueError: One line naming the two folders and the first difference.
    """
    step0, first = series[0]
    config0, files0 = _config(first), _tokenizer_files(first)
    for step, folder in series[1:]:
        config = _config(folder)
        if config != config0:
            key = sorted(k for k in set(config) | set(config0) if config.get(k) != config0.get(k))[0]
            raise ValueError(f"the checkpoints of steps {step0} and {step} are different architectures ({key}: "
                             f"{config0.get(key)!r} vs {config.get(key)!r}); a series is one model's checkpoints")  # fmt: skip
        files = _tokenizer_files(folder)
        shared = set(files) & set(files0)
        if any(files[name] != files0[name] for name in shared):
            name = sorted(n for n in shared if files[n] != files0[n])[0]
            raise ValueError(f"the checkpoints of steps {step0} and {step} have different tokenizers ({name} "
                             "differs); a series is one model's checkpoints")  # fmt: skip


def emergence(steps: Sequence[int], curve: Sequence[dict[str, float]], threshold: float) -> dict[str, int | None]:
    """When a curve first reaches ``threshold`` (see the module's docstring).

    Args:
        steps: The steps, ascending.
        curve: Per step ``{"mean", "low", "high"}``.
        threshold: The accuracy to reach.

    Returns:
        ``step`` (the mean's first crossing), ``low`` (the upper bound's) and ``high``
        (the lower bound's); None where never.
    """

    def first(key: str) -> int | None:
        return next((s for s, point in zip(steps, curve, strict=True) if point[key] >= threshold), None)

    return {"step": first("mean"), "low": first("high"), "high": first("low")}


def verdict(emerged: dict[str, dict[str, dict[str, int | None]]], threshold: float) -> str:
    """The study's claim judged from the emergence steps (see the module's docstring).

    Args:
        emerged: Kind -> position -> :func:`emergence`'s result.
        threshold: The threshold, for the line.

    Returns:
        One line starting with ``holds``, ``fails`` or ``undecided``.
    """

    def said(kind: str) -> str:
        parts = []
        for pos in POSITIONS:
            e = emerged[kind][pos]
            parts.append(f"{pos} {e['step']} [{e['low']}, {e['high']}]" if e["step"] is not None else f"{pos} never")
        return f"{kind}: " + ", ".join(parts)

    numbers = f"(emergence at accuracy {threshold:g}; {said('symbolic')}; {said('semantic')})"
    missing = [f"{kind} {pos}" for kind in KINDS for pos in POSITIONS
               if None in (emerged[kind][pos]["low"], emerged[kind][pos]["high"])]  # fmt: skip
    sym, sem = emerged["symbolic"], emerged["semantic"]
    if sym["start"]["step"] is not None and sym["continue"]["step"] is not None \
            and sym["start"]["step"] <= sym["continue"]["step"]:  # fmt: skip
        return f"fails: the symbolic start emerges no later than its continuation {numbers}"
    if not missing and sem["start"]["low"] > sem["continue"]["high"]:
        return f"fails: with semantic labels the start still emerges after the continuation {numbers}"
    if missing:
        return f"undecided: {', '.join(missing)} never reach(es) the threshold with confidence {numbers}"
    if sym["start"]["low"] > sym["continue"]["high"] and sem["start"]["low"] <= sem["continue"]["high"] \
            and sem["continue"]["low"] <= sem["start"]["high"]:  # fmt: skip
        return f"holds: symbolic start emerges after its continuation, semantic start with it {numbers}"
    return f"undecided: the symbolic start and continuation intervals overlap {numbers}"


def summarize(reports: dict[int, dict[str, Any]], threshold: float) -> dict[str, Any]:
    """``across.json``'s content from the per-step reports.

    Returns:
        ``steps``, ``threshold``, ``curves`` (kind -> position -> per step mean/low/high of
        accuracy), ``gap`` (kind -> per step start minus continue mean accuracy),
        ``emergence`` (kind -> position -> :func:`emergence`), ``misdirection`` (kind ->
        position -> per step the share of misdirected prompts following the label, with its
        interval; kinds without misdirected prompts left out), ``verdict`` and ``reports``.
    """
    steps = sorted(reports)
    curves = {kind: {pos: [reports[s][kind][f"{pos}_acc"] for s in steps] for pos in POSITIONS} for kind in KINDS}
    gap = {kind: [c["start"][i]["mean"] - c["continue"][i]["mean"] for i in range(len(steps))]
           for kind, c in curves.items()}  # fmt: skip
    emerged = {kind: {pos: emergence(steps, curves[kind][pos], threshold) for pos in POSITIONS} for kind in KINDS}
    misdirection = {kind: {pos: [reports[s][f"misdirected_{kind}"][f"{pos}_follows_label"] for s in steps]
                           for pos in POSITIONS}
                    for kind in KINDS if all(f"misdirected_{kind}" in reports[s] for s in steps)}  # fmt: skip
    return {"steps": steps, "threshold": threshold, "curves": curves, "gap": gap, "emergence": emerged,
            "misdirection": misdirection, "verdict": verdict(emerged, threshold),
            "reports": {str(s): reports[s] for s in steps}}  # fmt: skip


def _tokenizer(tokenizer: Any, series: Sequence[tuple[int, Path]]) -> Any:
    if tokenizer is None:
        first = series[0][1]
        return load_tokenizer(first.parent if first.is_file() else first)
    if isinstance(tokenizer, (str, Path)):
        return load_tokenizer(tokenizer)
    return tokenizer


def translation_across_training(
    checkpoints: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    manifest: str | Path | None = None,
    tokenizer: Any = None,
    words: str | Path | WordList | None = None,
    symbols: Sequence[str] = SYMBOLS,
    n_prompts: int = 64,
    k: int = 4,
    n_query: int = 3,
    seed: int = 0,
    threshold: float = 0.5,
    batch_size: int = 8,
    n_boot: int = 1000,
    force: bool = False,
    load_model: Callable[[Path], Any] | None = None,
    on_checkpoint: Callable[[int, str], None] | None = None,
) -> dict[str, Any]:
    """Score every checkpoint of a series and judge the study's claim (module docstring).

    Args:
        checkpoints: A folder of checkpoint folders, or the folders (see
            :func:`checkpoint_series`).
        out: The output folder (resumed per checkpoint).
        manifest: A file of folder and step, instead of steps in folder names.
        tokenizer: A tokenizer, or its folder (default: the first checkpoint's folder, or
            the folder of checkpoint files).
        words: A word list (TSV path or :class:`~mechlab.tasks.translation.WordList`;
            default: the bundled one).
        symbols: The pool of symbolic labels.
        n_prompts: Prompts per set (symbolic, semantic, and their misdirected sets).
        k: Example pairs per language.
        n_query: Query items per prompt.
        seed: Seed of the prompts and the bootstrap.
        threshold: The accuracy at which a curve emerges.
        batch_size: Prompts per forward pass.
        n_boot: Bootstrap resamples.
        force: Replace step files of other settings (and write where git tracks files).
        load_model: Folder or file -> model (default:
            :func:`mechlab.pipelines.prompts.open_model`: a folder imported with
            :func:`mechlab.models.importers.from_pretrained`, a file loaded as a mechlab
            checkpoint).
        on_checkpoint: Called with ``(step, "scored" or "reused")`` per checkpoint.

    Returns:
        The summary written to ``across.json`` (:func:`summarize`).

    Raises:
        ValueError: One line, nothing written (see the module's docstring).
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    series = checkpoint_series(checkpoints, manifest)
    check_one_model(series)
    tok = _tokenizer(tokenizer, series)
    listed = words if isinstance(words, WordList) else load_words(words)
    kept, _ = usable_words(listed, tok)
    prompts = {}
    for i, kind in enumerate(KINDS):
        prompts[kind] = episodes(kept, tok, n=n_prompts, kind=kind, k=k, n_query=n_query, seed=seed + i,
                                 symbols=symbols)  # fmt: skip
        if len(kept.languages) > 1:
            prompts[f"misdirected_{kind}"] = episodes(kept, tok, n=n_prompts, kind=kind, k=k, n_query=n_query,
                                                      seed=seed + 10 + i, symbols=symbols, misdirect=True)  # fmt: skip
    prompt_sha = hashlib.sha256(json.dumps({name: [e.tokens for e in eps] for name, eps in prompts.items()})
                                .encode()).hexdigest()  # fmt: skip
    if load_model is None:
        def load_model(path: Path) -> Any:
            return open_model(path)[0]

    folder = outputs.OutputFolder(out, "translation", force=force, inputs=[f for _, f in series])
    records = {
        # the checkpoint by name and content, not by where this copy of it lies
        step: {"step": step, "folder": path.name, "config": _config(path),
               "weights": [(path.name, outputs.file_sha256(path))] if path.is_file() else
                          sorted((p.name, p.stat().st_size) for p in path.iterdir() if p.is_file()
                                 and p.suffix in outputs.CHECKPOINT_SUFFIXES),
               "prompts_sha256": prompt_sha, "n_boot": n_boot, "seed": seed}
        for step, path in series
    }  # fmt: skip
    reports: dict[int, dict[str, Any]] = {}
    tally = stops.Tally(folder.path, len(series), unit="checkpoint")
    with stops.resumable(tally), folder:
        folder.check_path("across.json")
        folder.check_path("across.html")
        status = folder.plan({f"step_{step}.json": records[step] for step, _ in series})
        for step, path in series:
            name = f"step_{step}.json"
            if status[name] == "same":
                reports[step] = outputs.read_json(folder.file(name))["report"]
                how = "reused"
            else:
                model = load_model(path)
                reports[step] = start_vs_continue(model, prompts, batch_size=batch_size, n_boot=n_boot, seed=seed)
                del model
                folder.write_json(name, {"step": step, "folder": str(path), "report": reports[step],
                                         **outputs.settings_record(records[step])})  # fmt: skip
                how = "scored"
            tally.kept.append(f"step {step}")
            if on_checkpoint is not None:
                on_checkpoint(step, how)
        summary = summarize(reports, threshold)

        folder.write_json("across.json", summary)
        folder.write_figure(translation_figure(summary), "across.html")
    return summary
