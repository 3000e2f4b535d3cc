"""The package's top-level API: every exported name resolves, the analysis packages load lazily."""

import subprocess
import sys

import pytest

import mechlab


@pytest.mark.parametrize("name", mechlab.__all__)
def test_every_exported_name_resolves(name):
    assert getattr(mechlab, name) is not None


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mechlab.nope  # noqa: B018


def test_import_does_not_load_the_analysis_packages():
    code = (
        "import sys, mechlab; "
        "print(sorted(m for m in ('sklearn', 'nnsight', 'mechlab.patching', 'mechlab.probes', "
        "'torch', 'transformer_lens') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert mechlab.patching.activation_patch is mechlab.activation_patch


def test_the_cli_help_loads_neither_torch_nor_transformer_lens():
    code = (
        "import sys; from mechlab.cli import main; main(['prune', '--help']); "
        "print([m for m in ('torch', 'transformer_lens') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
