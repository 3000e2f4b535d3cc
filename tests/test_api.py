"""The package's top-level API: every exported name is the object its module defines, the
analysis packages load lazily, and what was removed stays removed."""

import importlib
import inspect
import subprocess
import sys
import types

import pytest

import mechlab


@pytest.mark.parametrize("name", mechlab.__all__)
def test_every_exported_name_is_the_object_its_module_defines(name):
    value = getattr(mechlab, name)
    if name == "__version__":
        from importlib.metadata import version

        assert value == version("mechlab")
        return
    module = importlib.import_module(mechlab._LAZY_NAMES[name])
    assert value is getattr(module, name)  # the same object, not a copy or a wrapper
    assert name in getattr(module, "__all__", [name])  # and its module exports it
    if inspect.isclass(value) or inspect.isfunction(value):
        assert value.__name__ == name and inspect.getdoc(value), name  # documented


def test_every_subpackage_name_is_its_module():
    for name in mechlab._LAZY_MODULES:
        module = getattr(mechlab, name)
        assert isinstance(module, types.ModuleType) and module.__name__ == f"mechlab.{name}"


def test_all_lists_exactly_the_lazy_names_and_the_version():
    assert sorted(mechlab.__all__) == sorted({*mechlab._LAZY_NAMES, "__version__"})
    assert set(dir(mechlab)) >= set(mechlab.__all__) | set(mechlab._LAZY_MODULES)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mechlab.nope  # noqa: B018


@pytest.mark.parametrize("module, name", [("mechlab.tasks.lds", "KIND_NAMES"), ("mechlab.sweep.search", "STATUSES"),
                                          ("mechlab.prune.graph", "NIH_WINDOWS")])  # fmt: skip
def test_unused_constants_are_gone(module, name):
    assert not hasattr(importlib.import_module(module), name)


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


def test_circuit_files_load_from_the_top_level_and_from_pipelines():
    """load_circuits sits beside load_checkpoint, where one looks first, and in
    mechlab.pipelines, where the commands take it from: one function."""
    import mechlab.pipelines
    from mechlab.pipelines.circuits import load_circuits

    assert mechlab.load_circuits is mechlab.pipelines.load_circuits is load_circuits
    assert "load_circuits" in mechlab.__all__ and "load_circuits" in mechlab.pipelines.__all__
    circuits = mechlab.load_circuits(["circuits/recall-cpu/1-after_seed0.json", "circuits/recall-cpu/2-after_seed0.json"])
    assert [c.metadata["target"] for c in circuits] == ["1-after", "2-after"]
