"""docs/cli-reference.md is the CLI's own help, complete and current (typer generates it)."""

import subprocess
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "cli-reference.md"


def test_the_cli_reference_is_current(tmp_path):
    fresh = tmp_path / "cli-reference.md"
    subprocess.run([sys.executable, "-m", "typer", "mechlab.cli", "utils", "docs", "--name", "mechlab",
                    "--output", str(fresh)], check=True, capture_output=True)  # fmt: skip
    assert fresh.read_text() == REFERENCE.read_text(), (
        "docs/cli-reference.md is out of date: python -m typer mechlab.cli utils docs "
        "--name mechlab --output docs/cli-reference.md"
    )
    for command in ("report", "prune", "view", "overlap", "curve", "recall", "eval", "train", "info"):
        assert f"## `mechlab {command}`" in fresh.read_text()
