"""The house of docs/architecture.md: no import circles."""

import grimp


def test_no_module_imports_itself_through_others():
    """No import circle among mechlab's modules (imports made only for type checkers aside:
    they never run). The layer order between packages is the import-linter contract in
    pyproject.toml (`lint-imports`); this checks inside the packages too."""
    graph = grimp.build_graph("mechlab", exclude_type_checking_imports=True)
    circles = sorted(
        (a, b)
        for a in graph.modules
        for b in graph.find_modules_directly_imported_by(a)
        if graph.find_shortest_chain(importer=b, imported=a)
    )
    assert circles == []


def test_the_pictured_layers_are_the_checked_ones_and_the_picture_is_current():
    """docs/architecture.md draws the graph of the code and the layers lint-imports checks."""
    from pathlib import Path

    import pytest

    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11 or newer")

    from mechlab._archdoc import LAYERS, render

    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in config["contracts"] if c["name"].startswith("Data flows one way"))
    assert [[f"mechlab.{p}" for p in layer] for layer in LAYERS] == [
        [p.strip() for p in layer.split("|")] for layer in layers
    ]
    assert render() in (root / "docs" / "architecture.md").read_text(), (
        "run: python -m mechlab._archdoc docs/architecture.md"
    )
