"""Sweeps (``mechlab sweep``): the settings, the run, and the tables and figures written.

The search, the runner and the trial store are :mod:`mechlab.sweep`'s; here the settings
of a command (a YAML file under the flags) become a :class:`~mechlab.sweep.SweepSpec`,
and a finished sweep's tables and figures are written under its folder:

- ``sweep.json``: the sweep's settings (a config ``mechlab sweep --config`` reads back);
- ``settings.json``: the settings record (the spec and the trial function, hashed): a
  rerun into the folder compares it (:func:`check_previous`);
- ``trials.json``, ``trials.csv``: one row per trial;
- ``searches.json``, ``searches.csv``: one row per N* search;
- ``nstar.html``, ``kappa.html``, ``ood_kappa.html``: the figures (:mod:`mechlab.viz.sweep`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mechlab.devices import check_device
from mechlab.pipelines import outputs, stops
from mechlab.sweep import SweepSpec, run_sweep
from mechlab.sweep.executors import check_address
from mechlab.sweep.outputs import SEARCH_COLUMNS, TRIAL_COLUMNS, csv_text, search_rows, trial_rows
from mechlab.sweep.runner import DEFAULT_TRIAL, UNITS, SweepResult, resolve_function
from mechlab.sweep.spec import read_settings


def sweep_spec(config: str | Path | None = None, settings: dict[str, Any] | None = None,
               search: dict[str, Any] | None = None) -> Any:  # fmt: skip
    """The :class:`~mechlab.sweep.SweepSpec` of a YAML file's settings with ``settings``
    (top-level keys) and ``search`` (the N* search's knobs) on top.

    Raises:
        ValueError: A missing, oversized, malformed or hostile file (read by
            :func:`mechlab.sweep.spec.read_settings`: tags, depth and aliases checked), or
            settings :class:`~mechlab.sweep.SweepSpec` refuses.
    """
    values: dict[str, Any] = {} if config is None else read_settings(config)  # safe, within limits
    values.update(settings or {})
    knobs = dict(values.pop("search", None) or {})
    knobs.update(search or {})
    return SweepSpec.from_dict({**values, "search": knobs})


def write_outputs(result: SweepResult, out: str | Path | outputs.OutputFolder,
                  figures: bool = True) -> dict[str, Path]:  # fmt: skip
    """Write the tables (JSON and CSV) and, with ``figures``, the HTML figures.

    Args:
        result: What :func:`mechlab.sweep.run_sweep` returned.
        out: The sweep's folder.
        figures: Also write the plotly figures.

    Returns:
        Name -> path of every file written.
    """
    if not isinstance(out, outputs.OutputFolder):
        with outputs.OutputFolder(out, "sweep") as folder:
            return write_outputs(result, folder, figures)
    trials, searches = trial_rows(result), search_rows(result)
    paths = {
        "sweep": out.write_json("sweep.json", result.spec.to_dict(), newline=True, default=str),
        "trials_json": out.write_json("trials.json", trials, newline=True),
        "trials_csv": out.write_text("trials.csv", csv_text(trials, TRIAL_COLUMNS)),
        "searches_json": out.write_json("searches.json", searches, newline=True),
        "searches_csv": out.write_text("searches.csv", csv_text(searches, SEARCH_COLUMNS)),
    }
    if figures:
        # lazy: the figures are drawn after the sweep; mechlab.viz adds transformers and scipy (~2 s) to the spec's checks
        from mechlab.viz.sweep import kappa_figure, n_star_figure, ood_kappa_figure

        paths["nstar"] = out.write_figure(n_star_figure(searches), "nstar.html")
        paths["kappa"] = out.write_figure(kappa_figure(searches), "kappa.html")
        paths["ood_kappa"] = out.write_figure(ood_kappa_figure(searches), "ood_kappa.html")
    return paths


def check_run(units: str = "trial", local: bool = False, address: str | None = None,
              device: str | None = None, trial: Any = None) -> None:  # fmt: skip
    """Raise ValueError unless the run settings of a sweep make sense (before any work): with
    ``device`` (the spec's) and no cluster ``address``, the trials run on this machine, which
    must have that device; ``trial`` (a ``module:function`` name) must import."""
    if units not in UNITS:
        raise ValueError(f"unknown --units {units!r}; choose {' or '.join(UNITS)}")
    if local and address is not None:
        raise ValueError("give --local or --address, not both")
    if not local:
        check_address(address)
    if device is not None and address is None:
        check_device(device)
    if trial is not None:
        resolve_function(trial)


def sweep_settings(spec: Any, trial: Any) -> dict[str, Any]:
    """What shapes a sweep's results beyond each trial's own spec: the spec and the trial
    function (``settings.json`` records them)."""
    name = trial if isinstance(trial, str) else f"{trial.__module__}:{trial.__qualname__}"
    return {"analysis": "sweep", "spec": json.loads(json.dumps(spec.to_dict(), default=str)), "trial": name}


def check_previous(folder: outputs.OutputFolder, settings: dict[str, Any]) -> str | None:
    """Compare a sweep folder's ``settings.json`` with this run's, before any trial.

    Returns:
        None (a fresh folder), or the line to print: the sweep resumes (same settings), or
        its settings differ (every finished trial is keyed by its own spec, so the trials
        whose specs match are reused and only the tables are made anew).

    Raises:
        ValueError: Without ``force``, trials of another trial function (their results would
            be taken as this one's).
    """
    path = folder.check_path("settings.json")
    if not path.exists():
        return None
    record = outputs.read_record(path)
    old = record["settings"] if record is not None else {}
    if record is not None and record["settings_sha256"] == outputs.settings_record(settings)["settings_sha256"]:
        return f"resuming the sweep in {str(folder.path)!r} (same settings): finished trials are reused"
    if old.get("trial") != settings["trial"] and not folder.force:
        raise ValueError(f"{str(folder.path)!r} holds trials of trial function {old.get('trial')!r}, not "
                         f"{settings['trial']!r}; their results would be reused as this one's: choose another "
                         "--out, or pass --force to reuse them anyway")  # fmt: skip
    changed = outputs.differences(old.get("spec", {}), settings["spec"])
    return (f"the sweep in {str(folder.path)!r} ran other settings ({changed}): trials whose specs match "
            "are reused, the others run, and the tables are made anew for these settings")


def run_and_write(spec: Any, out: str | Path, *, local: bool = False, address: str | None = None,
                  force: bool = False, config: str | Path | None = None,
                  on_note: Callable[[str], None] | None = None, **run: Any) -> tuple[SweepResult, dict[str, Path]]:  # fmt: skip
    """Run a sweep (resuming from its trial store) and write its tables and figures.

    Everything is checked before the first write: the run settings and the device on this
    machine (:func:`check_run`); the spec checked itself (sizes, models, device name) when
    it was made. The folder is then
    claimed (:class:`~mechlab.pipelines.outputs.OutputFolder`: locked,
    so two sweeps cannot write into it at once; a folder git tracks is refused unless
    ``force``) and its ``settings.json`` compared (:func:`check_previous`).

    Args:
        spec: The :class:`~mechlab.sweep.SweepSpec`.
        out: The sweep's folder.
        local: Run in this process, one trial at a time (no Ray).
        address: The Ray cluster to join (not with ``local``).
        force: Write into a folder git tracks; reuse trials of another trial function.
        config: The config file the spec was read from (never written).
        on_note: Called with the line :func:`check_previous` returns.
        **run: :func:`mechlab.sweep.run_sweep`'s other settings.

    Returns:
        ``(result, paths written)``.

    Raises:
        Interrupted: A signal (Ctrl-C, SIGTERM) stopped it; it names the trials in
            ``trials/``, which a rerun reads back (the tables are written at the end).
    """
    units, trial = run.get("units", "trial"), run.get("trial", DEFAULT_TRIAL)
    check_run(units, local, address, device=spec.device, trial=trial)
    if run.get("trials") is not None:
        check_run(units, local, address, trial=run["trials"])
    settings = sweep_settings(spec, trial)
    folder = outputs.OutputFolder(out, "sweep", force=force, inputs=[config] if config is not None else [])
    tally = stops.Tally(folder.file("trials"), None, unit="trial")  # Ctrl-C or SIGTERM: finished trials stay
    with stops.resumable(tally), folder:
        note = check_previous(folder, settings)
        if note is not None and on_note is not None:
            on_note(note)
        folder.write_json("settings.json", outputs.settings_record(settings), newline=True)
        try:
            result = run_sweep(spec, out, local=local, address=address, **run)
        except KeyboardInterrupt:  # every finished trial is in trials/ (this run's and earlier ones)
            tally.kept.extend(path.stem for path in sorted(folder.file("trials").glob("*.json")))
            raise
        return result, write_outputs(result, folder)
