"""Sweeps (``mechlab sweep``): the settings, the run, and the tables and figures written.

The search, the runner and the trial store are :mod:`mechlab.sweep`'s; here the settings
of a command (a YAML file under the flags) become a :class:`~mechlab.sweep.SweepSpec`,
and a finished sweep's tables and figures are written under its folder:

- ``sweep.json``: the sweep's settings;
- ``trials.json``, ``trials.csv``: one row per trial;
- ``searches.json``, ``searches.csv``: one row per N* search;
- ``nstar.html``, ``kappa.html``, ``ood_kappa.html``: the figures (:mod:`mechlab.viz.sweep`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechlab.pipelines import outputs
from mechlab.sweep.outputs import SEARCH_COLUMNS, TRIAL_COLUMNS, csv_text, search_rows, trial_rows
from mechlab.sweep.runner import SweepResult


def sweep_spec(config: str | Path | None = None, settings: dict[str, Any] | None = None,
               search: dict[str, Any] | None = None) -> Any:  # fmt: skip
    """The :class:`~mechlab.sweep.SweepSpec` of a YAML file's settings with ``settings``
    (top-level keys) and ``search`` (the N* search's knobs) on top.

    Raises:
        ValueError: A missing or malformed file, or settings :class:`~mechlab.sweep.SweepSpec`
            refuses.
    """
    import yaml

    from mechlab.sweep import SweepSpec

    values: dict[str, Any] = {}
    if config is not None:
        if not Path(config).is_file():
            raise ValueError(f"sweep config {str(config)!r} not found")
        values = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{config}: a sweep config is a mapping of settings")
    values.update(settings or {})
    knobs = dict(values.pop("search", None) or {})
    knobs.update(search or {})
    return SweepSpec.from_dict({**values, "search": knobs})


def write_outputs(result: SweepResult, out: str | Path, figures: bool = True) -> dict[str, Path]:
    """Write the tables (JSON and CSV) and, with ``figures``, the HTML figures.

    Args:
        result: What :func:`mechlab.sweep.run_sweep` returned.
        out: The sweep's folder.
        figures: Also write the plotly figures.

    Returns:
        Name -> path of every file written.
    """
    out = Path(out)
    trials, searches = trial_rows(result), search_rows(result)
    paths = {
        "sweep": outputs.write_json(out / "sweep.json", result.spec.to_dict(), newline=True, default=str),
        "trials_json": outputs.write_json(out / "trials.json", trials, newline=True),
        "trials_csv": outputs.write_text(out / "trials.csv", csv_text(trials, TRIAL_COLUMNS)),
        "searches_json": outputs.write_json(out / "searches.json", searches, newline=True),
        "searches_csv": outputs.write_text(out / "searches.csv", csv_text(searches, SEARCH_COLUMNS)),
    }
    if figures:
        from mechlab.viz.sweep import kappa_figure, n_star_figure, ood_kappa_figure

        paths["nstar"] = outputs.write_figure(n_star_figure(searches), out / "nstar.html")
        paths["kappa"] = outputs.write_figure(kappa_figure(searches), out / "kappa.html")
        paths["ood_kappa"] = outputs.write_figure(ood_kappa_figure(searches), out / "ood_kappa.html")
    return paths


def check_run(units: str = "trial", local: bool = False, address: str | None = None) -> None:
    """Raise ValueError unless the run settings of a sweep make sense (before any work)."""
    from mechlab.sweep.executors import check_address
    from mechlab.sweep.runner import UNITS

    if units not in UNITS:
        raise ValueError(f"unknown --units {units!r}; choose {' or '.join(UNITS)}")
    if local and address is not None:
        raise ValueError("give --local or --address, not both")
    if not local:
        check_address(address)


def run_and_write(spec: Any, out: str | Path, *, local: bool = False, address: str | None = None,
                  **run: Any) -> tuple[SweepResult, dict[str, Path]]:  # fmt: skip
    """Run a sweep (resuming from its trial store) and write its tables and figures.

    Args:
        spec: The :class:`~mechlab.sweep.SweepSpec`.
        out: The sweep's folder.
        local: Run in this process, one trial at a time (no Ray).
        address: The Ray cluster to join (not with ``local``).
        **run: :func:`mechlab.sweep.run_sweep`'s other settings.

    Returns:
        ``(result, paths written)``.
    """
    from mechlab.sweep import run_sweep

    check_run(run.get("units", "trial"), local, address)
    result = run_sweep(spec, out, local=local, address=address, **run)
    return result, write_outputs(result, out)
