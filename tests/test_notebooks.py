"""The example notebooks run top to bottom (nbclient), without a warning, and each matches
its script twin. What runs them: ``pip install -e '.[notebooks]'``.

``examples/notebooks/NN_name.py`` (jupytext percent format) is the source and runs as a
plain script; ``NN_name.ipynb`` is the same cells as a notebook, without outputs.
Regenerate the notebooks with ``jupytext --to ipynb examples/notebooks/0*.py``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed: pip install -e '.[notebooks]'")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed: pip install -e '.[notebooks]'")
jupytext = pytest.importorskip("jupytext", reason="jupytext is not installed: pip install -e '.[notebooks]'")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "examples" / "notebooks"
SCRIPTS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def test_there_are_the_five_notebooks():
    names = [p.stem for p in SCRIPTS]
    assert names == ["01_quickstart", "02_circuits", "03_recall", "04_custom_patching", "05_translation"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_notebook_matches_its_script(script):
    notebook = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    from_script = jupytext.read(script)
    cells = [(c.cell_type, c.source) for c in notebook.cells]
    assert cells == [(c.cell_type, c.source) for c in from_script.cells], (
        f"{script.name} and its .ipynb differ; run jupytext --to ipynb {script}"
    )
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_notebook_runs(script, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "2"))
    notebook = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # a failing cell raises CellExecutionError
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    # no warning reaches the reader (tqdm's "IProgress not found" before ipywidgets was in the extra)
    stderr = [o["text"] for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    assert not [t for t in stderr if "warn" in t.lower()], stderr
    # figures are saved as plotly's mimetype, inlined HTML and (kaleido) a static PNG
    figures = [o["data"] for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures or script.stem.startswith("04")
    for data in figures:
        assert "text/html" in data
        if importlib.util.find_spec("kaleido") is not None:
            assert "image/png" in data
