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
