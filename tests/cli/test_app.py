"""mechlab.cli.app's shared helpers: the loading line before torch loads."""

from __future__ import annotations

import importlib

app = importlib.import_module("mechlab.cli.app")  # the package's own ``app`` is the Typer app


def test_the_loading_line_only_at_a_terminal_with_progress(monkeypatch, capsys):
    monkeypatch.setattr(app, "interactive", lambda: True)
    app.say_loading(True, "torch and the model")
    assert capsys.readouterr().err == "loading torch and the model\n"
    app.say_loading(False)  # --no-progress
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(app, "interactive", lambda: False)  # a log or a pipe: refused input stays one line
    app.say_loading(True)
    assert capsys.readouterr().err == ""
