"""docs/api.md lists every public name as the code has it."""

from pathlib import Path

from mechlab._apidoc import PACKAGES, render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_the_api_reference_is_current():
    assert PAGE.read_text() == render(), "run: python -m mechlab._apidoc > docs/api.md"


def test_every_public_name_is_on_the_page():
    import importlib

    text = PAGE.read_text()
    for package in PACKAGES:
        for name in importlib.import_module(package).__all__:
            assert f" {name}(" in text or f"`{name}`" in text or f" {name}`" in text, (package, name)
