"""Progress bars: tqdm's notebook widget inside Jupyter when ipywidgets is installed, else
the terminal bar. (``tqdm.auto`` warns "IProgress not found" in a notebook without
ipywidgets; this falls back quietly.)"""

from __future__ import annotations

from typing import Any

from tqdm.std import tqdm as terminal_tqdm


def _notebook_tqdm() -> Any | None:
    try:
        # lazy: optional: only inside Jupyter; any failure below means the terminal bar
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
            return None
        # lazy: optional: only inside Jupyter; any failure below means the terminal bar
        import ipywidgets  # noqa: F401 -- the widget bar needs it
        from tqdm.notebook import tqdm as notebook_tqdm

        return notebook_tqdm
    except Exception:  # no IPython, no ipywidgets, or an old version of either
        return None


def _pick() -> Any:
    return _notebook_tqdm() or terminal_tqdm


tqdm = _pick()

__all__ = ["tqdm"]
