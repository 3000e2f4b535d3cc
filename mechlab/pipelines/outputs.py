"""Writing outputs: every file a pipeline (and so every command) writes goes through here.

One module, so that the output policy (what may be overwritten, locks, resume keyed by
the settings) is decided in one place. Every write is atomic (a temporary file, then a
rename: :func:`mechlab.io.atomic_write_text`), and a pipeline computes what it can before
it writes, so bad input leaves nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mechlab.io import atomic_write_text


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (folders created); returns the path."""
    return atomic_write_text(path, text)


def write_json(path: str | Path, data: Any, *, newline: bool = False, default: Any = None) -> Path:
    """Write ``data`` as indented JSON (``indent=1``; NaN and infinities as ``NaN``,
    ``Infinity``), atomically.

    Args:
        path: The file.
        data: JSON-ready values.
        newline: End the file with a newline.
        default: ``json.dumps``'s ``default`` (how to write other values).
    """
    text = json.dumps(data, indent=1, default=default)
    return write_text(path, text + "\n" if newline else text)


def write_figure(figure: Any, path: str | Path) -> Path:
    """Write a plotly figure as an offline HTML page that loads the folder's one
    ``plotly.min.js`` (:func:`write_plotlyjs`), not a 4.8 MB copy of its own."""
    from mechlab.viz.figures import figure_html

    write_plotlyjs(Path(path).parent)
    return write_text(path, figure_html(figure, plotlyjs="directory"))


def write_plotlyjs(folder: str | Path) -> Path:
    """``folder/plotly.min.js``, the one copy of plotly.js the folder's pages load
    (written when missing or different; the same file is left alone)."""
    from mechlab.viz.figures import write_plotlyjs as write_once

    return write_once(folder, writer=write_text)


def write_circuit(circuit: Any, path: str | Path) -> Path:
    """Write a :class:`~mechlab.prune.circuit.Circuit` as JSON (what ``Circuit.from_json`` reads)."""
    return write_json(path, circuit.to_dict())


def write_circuit_figure(circuit: Any, path: str | Path, title: str | None = None) -> Path:
    """Write a circuit's graph (:func:`mechlab.viz.circuit_figure`) as offline HTML."""
    from mechlab.viz.circuits import circuit_figure

    return write_figure(circuit_figure(circuit, title), path)


def beside(ckpt: str | Path, folder: str) -> Path:
    """The default output folder of a command: ``folder`` beside the checkpoint file."""
    return Path(ckpt).resolve().parent / folder
