"""Draw mechlab's package graph (docs/architecture.md) from the code's imports.

    python -m mechlab._archdoc docs/architecture.md

rewrites the Mermaid picture between the ``<!-- package graph -->`` markers of the page:
one box per package (or top-level module), grouped by layer in :data:`LAYERS`' order
(top to bottom), one arrow per package that imports another (the imports that run:
those made only for type checkers are left out), but for the arrows into the ground layer,
which every layer may use. The imports are read by grimp, the
library under import-linter; ``tests/test_architecture.py`` keeps the picture current and
:data:`LAYERS` equal to the contract that ``lint-imports`` checks (pyproject.toml).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LAYERS: list[list[str]] = [
    ["cli"],
    ["pipelines", "bench"],
    ["viz", "sweep", "train"],
    ["prune", "patching", "probes", "evals", "label_vs_observation", "checkpoint"],
    ["tasks"],
    ["models", "traces"],
    ["io", "devices", "progress", "limits", "schema", "_deprecated", "circuit_methods"],
]
"""The layers, top first: a package may import the layers below its own, never one above;
packages of one layer do not import each other."""

LAYER_NAMES = ["command line", "joining layer, measurements", "figures, sweeps, training",
               "analyses and the checkpoint file", "tasks: data and traces", "models, trace types",
               "ground"]  # fmt: skip

START, END = "<!-- package graph: start -->", "<!-- package graph: end -->"


def package_edges() -> set[tuple[str, str]]:
    """``(importer, imported)`` packages (names under ``mechlab.``) of every import between two."""
    # lazy: grimp comes with import-linter (the test extra), not with mechlab
    import grimp

    graph = grimp.build_graph("mechlab", exclude_type_checking_imports=True)
    known = {p for layer in LAYERS for p in layer}

    def package(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in known else None

    edges = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = package(module), package(imported)
            if a and b and a != b:
                edges.add((a, b))
    return edges


def render() -> str:
    """The Mermaid block (markers included)."""
    lines = [START, "```mermaid", "flowchart TB"]
    for i, (layer, name) in enumerate(zip(LAYERS, LAYER_NAMES, strict=True)):
        lines.append(f'  subgraph L{i}["{name}"]')
        lines += [f'    {p.strip("_")}["{p}"]' for p in layer]
        lines.append("  end")
    ground = set(LAYERS[-1])
    for a, b in sorted(e for e in package_edges() if e[1] not in ground):
        lines.append(f"  {a.strip('_')} --> {b.strip('_')}")
    lines += ["```", END]
    return "\n".join(lines)


def update(page: str | Path) -> bool:
    """Rewrite the picture in ``page``; returns whether it changed."""
    path = Path(page)
    text = path.read_text(encoding="utf-8")
    new = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: render(), text, flags=re.S)
    if new == text:
        return False
    path.write_text(new, encoding="utf-8")
    return True


if __name__ == "__main__":
    print("updated" if update(sys.argv[1] if len(sys.argv) > 1 else "docs/architecture.md") else "current")
