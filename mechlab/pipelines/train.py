"""Training runs (``mechlab train``): the settings of a new or resumed run, and the run.

The trainer (:mod:`mechlab.train`) writes its own run directory (checkpoints, metrics,
``config.yaml``) and resumes it exactly; here the command's settings become its config.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mechlab.train
from mechlab.pipelines.outputs import OutputFolder
from mechlab.train import resolve_config
from mechlab.train.trainer import TrainingStopped

__all__ = ["TrainingStopped", "run_config", "train_run"]


def run_config(out: str | Path | None = None, resume: str | Path | None = None, *, force: bool = False,
               **settings: Any) -> tuple[Any, Path]:  # fmt: skip
    """The :class:`~mechlab.train.TrainConfig` of a run and its directory.

    Args:
        out: The new run's directory.
        resume: Or the directory of a run to continue (its ``config.yaml`` is the base,
            ``settings`` on top); then ``out``, if given, must be the same.
        **settings: :func:`mechlab.train.resolve_config`'s arguments (``preset``,
            ``config_file``, ``overrides``, ``task``, ``steps``, ``device``, ...; a resumed
            run takes neither ``preset``, ``config_file`` nor ``task``).
        force: Train into (or resume) a directory that holds files git tracks (refused
            otherwise: a bundled run is never overwritten by accident).

    Returns:
        ``(config, run directory)``.

    Raises:
        ValueError: No directory, two different ones, nothing to resume, a directory git
            tracks (without ``force``), or bad settings.
    """
    if resume is not None or out is not None:  # a file, an input, a tracked folder: refused now
        inputs = [settings["config_file"]] if settings.get("config_file") is not None else []
        OutputFolder(resume if resume is not None else out, "train", force=force, inputs=inputs,
                     option="--resume" if resume is not None else "--out")  # fmt: skip

    if resume is not None:
        resume = Path(resume)
        if out is not None and Path(out) != resume:
            raise ValueError("give the run directory once: --resume DIR (without a different --out)")
        saved = resume / "config.yaml"
        if not saved.is_file():
            raise ValueError(f"nothing to resume: {str(saved)!r} does not exist")
        for key in ("preset", "config_file", "task"):
            settings.pop(key, None)
        return resolve_config(config_file=saved, **settings), resume
    if out is None:
        raise ValueError("give --out DIR for the run (or --resume DIR to continue one)")
    return resolve_config(**settings), Path(out)


def train_run(cfg: Any, out: str | Path, resume: bool = False, progress: bool = True,
              on_start: Callable[[], None] | None = None) -> Any:  # fmt: skip
    """Train (or resume) the run; returns the :class:`~mechlab.train.TrainResult`.
    ``on_start`` is called once every setting is checked, before anything is written.

    Raises:
        mechlab.train.TrainingStopped: The NaN guard stopped the run.
    """
    return mechlab.train.train(cfg, out, resume=resume, progress=progress, on_start=on_start)
