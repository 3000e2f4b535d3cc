"""nnsight is an extra (``mechlab[nnsight]``): without it the base install patches with hooks,
and asking for nnsight names the extra in one line. Its absence is simulated here
(``sys.modules["nnsight"] = None`` makes ``import nnsight`` fail); nothing is uninstalled."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mechlab.cli import main
from mechlab.patching import activation_patch
from mechlab.patching.backends import make_backend
from tests.patching.helpers import last_output, make_model, make_pair


@pytest.fixture()
def no_nnsight(monkeypatch):
    monkeypatch.setitem(sys.modules, "nnsight", None)


def test_the_nnsight_backend_without_nnsight_names_the_extra(no_nnsight):
    model = make_model("transformer")
    with pytest.raises(ImportError, match=r"pip install 'mechlab\[nnsight\]'"):
        make_backend("nnsight", model)


def test_hooks_patching_runs_without_nnsight(no_nnsight):
    model = make_model("transformer")
    clean, corrupted = make_pair()
    result = activation_patch(model, clean, corrupted, last_output, hooks=["hook_embed"])
    assert torch.isfinite(torch.as_tensor(result.values)).all()


def test_bench_hooks_without_nnsight_is_one_line_naming_the_extra(no_nnsight, capsys):
    code = main(["bench", "hooks", "--families", "transformer", "--batch", "1", "--pos", "2",
                 "--repeats", "1", "--threads", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines() == [
        "mechlab: error: the nnsight backend needs nnsight; install the extra: "
        "pip install 'mechlab[nnsight]'"
    ]


def test_importing_mechlab_and_the_patching_package_loads_no_nnsight():
    code = ("import sys, mechlab.patching, mechlab.bench.hooks; "
            "assert 'nnsight' not in sys.modules, 'nnsight loaded'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)
