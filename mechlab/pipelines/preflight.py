"""Checks that need neither torch nor a model: what a command refuses at once.

The commands (:mod:`mechlab.cli`) run these before they import the pipeline they call (and
with it torch, TransformerLens and the model), so that a misspelt target, a missing
checkpoint or an output folder that is a file answers in a fraction of a second, not after
the imports and the checkpoint's load (half a minute on a fresh clone). Each check here is
the cheap part of one the pipeline makes again, in full, with the model at hand (a target's
``k`` against the traces' segment length, a state-tracking target against the format):
this module refuses only what the full check would refuse too, with the same words where
the pipeline has them.

The checkpoint's task is read from its file without building anything
(:func:`checkpoint_task`): the metadata of a ``.pt`` file is unpickled with every tensor
left out and nothing but plain values allowed, that of a ``.safetensors`` file is read from
the JSON beside it.
"""

from __future__ import annotations

import difflib
import json
import pickle
import re
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from mechlab.pipelines import outputs
from mechlab.tasks.registry import TASKS


class _TaskTargets(Mapping[str, tuple[str, ...]]):
    """Task name -> its targets, read from :mod:`mechlab.tasks.registry` when asked."""

    def __getitem__(self, name: str) -> tuple[str, ...]:
        if name not in TASKS:
            raise KeyError(name)
        return TASKS[name].targets

    def __iter__(self) -> Iterator[str]:
        return iter(list(TASKS))

    def __len__(self) -> int:
        return len(TASKS)


TASK_TARGETS: Mapping[str, tuple[str, ...]] = _TaskTargets()
"""The targets of each registered task (:attr:`mechlab.tasks.registry.Task.targets`;
``k-after``: ``1-after``, ``2-after``, ...)."""

RECIPES = ("default", "uniform", "fast", "thorough", "study")
"""The pruning recipes (:data:`mechlab.pipelines.prune.PRUNE_RECIPES`)."""

NIH_CONSTRUCTIONS = ("uniform", "study")
"""The NiH constructions (:data:`mechlab.tasks.lds_evals.NIH_PROTOCOLS`)."""

EVAL_SUITES = ("uninterleaved", "nih", "ood", "dynamics")
"""The suites of ``mechlab eval`` (:data:`mechlab.evals.suites.SUITES`)."""

_K_AFTER = re.compile(r"(\d+)-after")  # as mechlab.traces
_MAX_PICKLE = 64 * 2**20  # a checkpoint's data.pkl above this is left to the full load
_MAX_SIDECAR = 16 * 2**20


def check_checkpoint_file(path: str | Path) -> Path:
    """Refuse a checkpoint path that names no file (:func:`~mechlab.pipelines.checkpoints.open_checkpoint`'s
    words); returns the path."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(
            f"checkpoint {str(path)!r} is a folder; give a mechlab checkpoint file, or a Hugging Face "
            "save_pretrained folder with --model"
        )
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} not found")
    return path


def check_checkpoint(path: str | Path, *, task: str | None = None, targets: Sequence[str] = ()) -> str | None:
    """A checkpoint file (:func:`check_checkpoint_file`), the task it records (``task``: the
    one the command takes; the pipeline's words when it records another) and ``targets``
    against that task (:func:`check_targets`). Returns the task read, or None."""
    path = check_checkpoint_file(path)
    found = checkpoint_task(path)
    if found not in TASK_TARGETS:  # none recorded, or a task mechlab does not know: the load says which
        found = None
    if task is not None and found is not None and found != task:
        wanted = TASKS[task].wanted_refusal if task in TASKS else None
        if wanted is not None:  # the pipeline's words (e.g. checkpoints.lds_config)
            raise ValueError(wanted.format(path=str(path)))
        raise ValueError(f"checkpoint {str(path)!r} was trained on task {found!r}, not {task!r}")
    check_targets(targets, found if found is not None else task)
    return found


def check_suites(suites: Sequence[str]) -> None:
    """Refuse an unknown or repeated evaluation suite (``mechlab eval --suite``; the words of
    :func:`~mechlab.pipelines.evaluate.evaluate_checkpoint`)."""
    chosen = list(EVAL_SUITES) if list(suites) == ["all"] else list(suites)
    for name in chosen:
        if name not in EVAL_SUITES:
            near = difflib.get_close_matches(name, EVAL_SUITES, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise ValueError(f"unknown suite {name!r}; choose from {list(EVAL_SUITES)} or all{hint}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"suites must not repeat, got {chosen}")


def check_recipe(recipe: str) -> None:
    """Refuse an unknown pruning recipe (``--recipe``)."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {list(RECIPES)}")


def check_nih(nih: str) -> None:
    """Refuse an unknown NiH construction (``--nih``; the words of
    :func:`mechlab.tasks.lds_evals.nih_protocol`)."""
    if nih not in NIH_CONSTRUCTIONS:
        raise ValueError(f"unknown NiH protocol {nih!r}; choose one of {list(NIH_CONSTRUCTIONS)}")


def check_input_file(path: str | Path, what: str) -> Path:
    """Refuse an input path that is missing or a folder (``what``: ``"circuit"``, ``"pairs file"``)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a folder; give a file")
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} not found")
    return path


def check_run_dir(path: str | Path) -> Path:
    """Refuse a path that is not a training run directory with ``checkpoints/step_*.pt``
    (:func:`~mechlab.pipelines.checkpoints.run_checkpoints`' words)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"run directory {str(path)!r} not found")
    if not any(path.glob("checkpoints/step_*.pt")):
        raise ValueError(f"no checkpoints/step_*.pt under {str(path)!r}; is it a training run directory?")
    return path


def checkpoint_task(path: str | Path) -> str | None:
    """The task a checkpoint file records (``metadata["task"]``), read without torch; None
    when the file does not say (no task recorded, not a zip checkpoint, a file this reader
    does not take apart): the full load then decides."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".safetensors":
            metadata = _sidecar_metadata(path)
        else:
            metadata = _pickled_metadata(path)
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, RecursionError):
        return None
    task = metadata.get("task") if isinstance(metadata, dict) else None
    return task if isinstance(task, str) else None


def check_targets(targets: Sequence[str], task: str | None = None) -> None:
    """Refuse a target whose name no task takes, or (``task`` known) the checkpoint's task
    does not take; one line, with the nearest valid name when one is close."""
    for target in targets:
        if task in TASK_TARGETS:
            allowed = TASK_TARGETS[task]
            where = f" (the checkpoint's task is {task})"
        else:
            allowed = tuple(dict.fromkeys(t for names in TASK_TARGETS.values() for t in names))
            where = ""
        m = _K_AFTER.fullmatch(target)
        if m is not None and "k-after" in allowed and int(m.group(1)) < 1:
            raise ValueError(f"target {target!r}: k must be at least 1 (observations after the query label)")
        if _takes(allowed, target):
            continue
        refusal = TASKS[task].target_refusal if task in TASKS else None
        if refusal is not None:  # the pipeline's words (the task's prune_data)
            raise ValueError(refusal.format(target=target))
        names = [("k-after (e.g. 1-after, 2-after)" if t == "k-after" else t) for t in allowed]
        choices = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        near = _nearest(target, allowed)
        hint = f"; did you mean {near}?" if near else ""
        raise ValueError(f"unknown target {target!r}{where}; use {choices}{hint}")


def _takes(allowed: tuple[str, ...], target: str) -> bool:
    if _K_AFTER.fullmatch(target) is not None:
        return "k-after" in allowed
    return target in allowed and target != "k-after"


def _nearest(target: str, allowed: tuple[str, ...]) -> str | None:
    names = [n for n in allowed if n != "k-after"]
    if "k-after" in allowed:
        digits = re.match(r"\d+", target)
        names += [f"{digits.group(0) if digits else 1}-after"]
    found = difflib.get_close_matches(target.strip().lower(), names, n=1, cutoff=0.6)
    return found[0] if found else None


def check_folder(out: str | Path | None, command: str, *, source: str | Path, what: str, force: bool = False,
                 inputs: Iterable[str | Path] = ()) -> Path:  # fmt: skip
    """The checks of :class:`~mechlab.pipelines.outputs.OutputFolder` on a command's output
    folder (``out``, default ``mechlab-out/<run of source>/<what>``), nothing written: a
    file, one of the inputs, a place no folder can be made, a folder git tracks (without
    ``force``). Returns the folder."""
    folder = Path(out) if out is not None else outputs.default_out(source, what)
    outputs.OutputFolder(folder, command, force=force, inputs=[source, *inputs])
    return folder


def check_output_file(path: str | Path, *, force: bool = False, inputs: Iterable[str | Path] = (),
                      option: str = "--out", suffixes: Sequence[str] = ()) -> Path:  # fmt: skip
    """:func:`mechlab.pipelines.outputs.check_output_file` (a single output file), here so
    that a command finds every cheap check in one module."""
    return outputs.check_output_file(path, force=force, inputs=inputs, option=option, suffixes=suffixes)


# --------------------------------------------------------------------------- reading metadata


class _Left:
    """Whatever torch would rebuild (a tensor, a storage): left out, never built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


def _left(*args: Any, **kwargs: Any) -> _Left:
    return _Left()


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain values and OrderedDicts; torch's tensors, storages and dtypes become
    :class:`_Left` placeholders; any other global is refused (nothing of the file runs)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch" or module.startswith("torch."):
            return _Left if name.endswith("Storage") else _left
        raise pickle.UnpicklingError(f"{module}.{name} is not a plain value")

    def persistent_load(self, pid: Any) -> _Left:
        return _Left()


def _pickled_metadata(path: Path) -> Any:
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        entry = next((e for e in archive.infolist() if e.filename.endswith("/data.pkl")), None)
        if entry is None or entry.compress_type != zipfile.ZIP_STORED or entry.file_size > _MAX_PICKLE:
            return None
        payload = _PlainUnpickler(archive.open(entry)).load()
    return payload.get("metadata") if isinstance(payload, dict) else None


def _sidecar_metadata(path: Path) -> Any:
    for sidecar in (path.with_suffix(".json"), path.parent / "config.json"):
        if sidecar.is_file():
            if sidecar.stat().st_size > _MAX_SIDECAR:
                return None
            data = json.loads(sidecar.read_text(encoding="utf-8"))
            return data.get("metadata") if isinstance(data, dict) else None
    return None
