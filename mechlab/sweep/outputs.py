"""A sweep's tables: the trial table and the search table (N*, bracket, kappa, OOD), as
rows and CSV text. :func:`mechlab.pipelines.write_outputs` writes them, with the figures,
under the sweep's folder:

- ``sweep.json``: the sweep's settings;
- ``trials.json``, ``trials.csv``: one row per trial;
- ``searches.json``, ``searches.csv``: one row per N* search;
- ``nstar.html``, ``kappa.html``, ``ood_kappa.html``: the figures
  (:mod:`mechlab.viz.sweep`).
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from mechlab._deprecated import moved_names
from mechlab.sweep.runner import SweepResult
from mechlab.sweep.spec import SearchKey
from mechlab.sweep.store import trial_key

TRIAL_COLUMNS = ("key", "model", "group", "m", "L", "format", "lengths", "n_train", "lr", "seed",
                 "steps", "batch_size", "epsilon", "val_loss", "converged", "steps_run",
                 "ood_token_acc", "ood_seq_acc", "seconds")  # fmt: skip
SEARCH_COLUMNS = ("model", "format", "lengths", "group", "m", "L", "n", "n_star", "status", "lo",
                  "hi", "ratio", "cap", "steps", "kappa", "kappa_bound", "kappa_low", "kappa_high",
                  "ood_n", "ood_token_acc", "ood_seq_acc")  # fmt: skip


def _model_label(model: dict[str, Any], spec_models: dict[str, dict[str, Any]]) -> str:
    for label, fields in spec_models.items():
        if fields == model:
            return label
    return str(model.get("name") or model.get("preset") or model.get("arch"))


def trial_rows(result: SweepResult) -> list[dict[str, Any]]:
    """One flat row per trial (:data:`TRIAL_COLUMNS`, and ``val_loss_by_length`` where the
    trial recorded it: ``trials.json`` keeps it, ``trials.csv`` has the flat columns only)."""
    models = dict(result.spec.model_table())
    rows = []
    for t in result.trials:
        s = t["spec"]
        task = s["task"]
        row = {"key": trial_key(s), "model": _model_label(s["model"], models), "group": task.get("group"),
               "m": task.get("m"), "L": task.get("L"), "format": task.get("format"),
               "lengths": task.get("lengths")}  # fmt: skip
        row.update({k: s.get(k) for k in ("n_train", "lr", "seed", "steps", "batch_size", "epsilon")})
        row.update({k: t.get(k) for k in ("val_loss", "converged", "steps_run", "ood_token_acc",
                                          "ood_seq_acc", "seconds")})  # fmt: skip
        if "val_loss_by_length" in t:  # trials trained before it was recorded have none
            row["val_loss_by_length"] = t["val_loss_by_length"]
        rows.append(row)
    return rows


def _kappa_of(result: SweepResult, key: SearchKey) -> dict[str, Any]:
    k = result.kappas.get(key)
    if k is None:
        return {"kappa": None, "kappa_bound": None, "kappa_low": None, "kappa_high": None}
    high = None if k.high is None or math.isinf(k.high) else k.high
    return {"kappa": k.value, "kappa_bound": k.bound, "kappa_low": k.low, "kappa_high": high}


def search_rows(result: SweepResult) -> list[dict[str, Any]]:
    """One flat row per N* search (:data:`SEARCH_COLUMNS`). ``n`` is the length for a
    fixed-length search and ``2..L`` for a joint one; kappa and OOD sit on the rows of
    the searches they belong to (kappa on the joint search, OOD on the main ones)."""
    rows = []
    for key, r in result.searches.items():
        row = {"model": key.model, "format": key.format, "lengths": key.lengths, "group": key.group,
               "m": key.m, "L": key.L, "n": str(key.L) if key.lengths == "fixed" else f"2..{key.L}",
               "n_star": r.n_star, "status": r.status, "lo": r.lo, "hi": r.hi, "ratio": r.ratio,
               "cap": r.cap, "steps": r.steps}  # fmt: skip
        row.update(_kappa_of(result, key))
        ood = result.ood.get(key)
        row.update({"ood_n": ood.n_train if ood else None, "ood_token_acc": ood.token_acc if ood else None,
                    "ood_seq_acc": ood.seq_acc if ood else None})  # fmt: skip
        rows.append(row)
    return rows


def csv_text(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})
    return buffer.getvalue()


__getattr__ = moved_names(__name__)  # write_outputs: mechlab.pipelines.sweep
