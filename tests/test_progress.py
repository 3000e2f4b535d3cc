"""mechlab.progress picks the terminal bar outside Jupyter, without warnings."""

import subprocess
import sys


def test_outside_jupyter_the_terminal_bar_without_a_warning():
    code = ("import warnings; warnings.simplefilter('error'); "
            "from mechlab.progress import tqdm; from tqdm.std import tqdm as std; print(tqdm is std)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True" and "IProgress" not in out.stderr


def test_the_notebook_bar_only_inside_a_kernel_with_widgets(monkeypatch):
    import IPython

    from mechlab import progress

    class ZMQInteractiveShell:  # the class name a Jupyter kernel's shell has
        pass

    monkeypatch.setattr(IPython, "get_ipython", lambda: ZMQInteractiveShell())
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        assert progress._notebook_tqdm() is None  # no widgets: the terminal bar, quietly
    else:
        from tqdm.notebook import tqdm as notebook_tqdm

        assert progress._notebook_tqdm() is notebook_tqdm
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert progress._notebook_tqdm() is None
