"""Imports sit at the top of modules, so that readers and tools see where data comes from;
an import kept inside a function says why (``# lazy: <reason>``: the CLI's start-up, an
optional dependency, a measured import cost). ``mechlab --help`` stays under a second."""

from __future__ import annotations

import ast
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ELSEWHERE: dict[str, str] = {}
HELP_LIMIT_S = 1.0


def _annotated(lines: list[str], node: ast.stmt) -> bool:
    """``# lazy:`` on the import's own lines or on the comment / import lines right above it
    (one comment covers a group of imports)."""
    if any("# lazy:" in line for line in lines[node.lineno - 1 : node.end_lineno]):
        return True
    i = node.lineno - 2
    while i >= 0:
        text = lines[i].strip()
        if "# lazy:" in text:
            return True
        if not (text.startswith(("import ", "from ", "#", ")")) or text.endswith(",")):
            return False
        i -= 1
    return False


def function_local_imports(path: Path) -> list[tuple[int, bool]]:
    """``(line, annotated)`` of every import inside a function of ``path``."""
    text = path.read_text()
    lines = text.splitlines()
    found: list[tuple[int, bool]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child.lineno, _annotated(lines, child)))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    walk(ast.parse(text), False)
    return found


def test_function_local_imports_say_why_they_are_lazy():
    unexplained = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "mechlab").rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in ELSEWHERE
        for line, annotated in function_local_imports(path)
        if not annotated
    ]
    assert not unexplained, (
        "imports inside functions without a '# lazy: <reason>' comment (move them to the "
        f"module's top, or say why they must wait): {unexplained}"
    )


def test_the_counter_sees_nested_and_annotated_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import os\n\n\ndef f():\n    import json\n\n    def g():\n        # lazy: optional\n"
        "        import ray\n        import nnsight\n\n    return json\n\n\n"
        "class C:\n    def h(self):\n        x = 1\n        from math import pi  # lazy: cheap\n"
        "        return pi\n"
    )
    assert function_local_imports(source) == [(5, False), (9, True), (10, True), (18, True)]


def test_the_excluded_files_exist():
    """The exclusions name real files (drop one once its refactoring is merged)."""
    assert all((ROOT / path).is_file() for path in ELSEWHERE)


def test_the_cli_starts_in_under_a_second():
    """``mechlab --help``'s import of the CLI, in a fresh process, median of 3."""
    code = (
        "import time; t = time.perf_counter(); import mechlab.cli; print(time.perf_counter() - t)"
    )
    times = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
            ).stdout
        )
        for _ in range(3)
    ]
    assert statistics.median(times) < HELP_LIMIT_S, times
