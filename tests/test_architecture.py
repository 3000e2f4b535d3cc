"""The house of docs/architecture.md: no import circles, no oversized modules."""

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 660
"""Small modules with one job: about 600 lines is the aim, this the limit."""
LONG_MODULES: dict[str, str] = {}
"""Modules still over the limit (path -> why, and what splitting it waits for); none now."""


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


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def long_modules(package: Path, excepted: dict[str, str]) -> dict[str, int]:
    """``{path: lines}`` of the modules under ``package`` over MAX_MODULE_LINES lines, paths
    relative to ``package``'s parent, the ``excepted`` ones left out."""
    found = {
        path.relative_to(package.parent).as_posix(): _lines(path)
        for path in sorted(package.rglob("*.py"))
    }
    return {p: n for p, n in found.items() if n > MAX_MODULE_LINES and p not in excepted}


def test_no_module_is_over_the_line_limit():
    """Every module of mechlab/ fits MAX_MODULE_LINES lines, but for LONG_MODULES; split an
    oversized one by job (as models/importers.py and models/transformer.py were)."""
    long = long_modules(ROOT / "mechlab", LONG_MODULES)
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"


def test_the_listed_long_modules_are_still_long():
    """An exception is dropped once its module is split."""
    fitted = [
        p for p in LONG_MODULES if not (ROOT / p).is_file() or _lines(ROOT / p) <= MAX_MODULE_LINES
    ]
    assert not fitted, f"drop these from LONG_MODULES: {fitted}"


def test_the_check_finds_a_long_module_but_not_an_excepted_one(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "fits.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (package / "sub" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "excepted.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 5))
    assert long_modules(package, {"pkg/excepted.py": "why"}) == {
        "pkg/sub/long.py": MAX_MODULE_LINES + 1
    }
