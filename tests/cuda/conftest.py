"""The accelerator the tests in tests/cuda compare with the CPU.

Every test here is marked ``cuda`` and compares what a model, hook, patch, pruning or
training step computes on the accelerator with the same computation on the CPU, to a
stated tolerance. Without CUDA they skip, saying why. ``MECHLAB_TEST_ACCELERATOR=cpu``
runs them with the CPU standing in for the accelerator: the comparisons are then trivial,
but every test body runs, which is how the suite is checked on a machine without a GPU
before device time is spent on it (``scripts/gpu_check.sh`` runs them on a GPU).
"""

from __future__ import annotations

import os

import pytest
import torch

ENV = "MECHLAB_TEST_ACCELERATOR"


def _accelerator() -> tuple[torch.device | None, str]:
    name = os.environ.get(ENV, "cuda").strip() or "cuda"
    if name == "cpu":
        return torch.device("cpu"), ""
    if not name.startswith("cuda"):
        return None, f"{ENV}={name!r}: only cuda, cuda:N or cpu (a dry run) are supported"
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        return None, (
            f"no CUDA device visible to torch {torch.__version__} ({build}); these tests compare "
            f"GPU with CPU results: run them on a GPU with `pytest -m cuda`, or as a dry run "
            f"with {ENV}=cpu"
        )
    return torch.device(name), ""


def pytest_collection_modifyitems(config, items):
    device, reason = _accelerator()
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.cuda)
            if device is None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def accel() -> torch.device:
    """The accelerator (``cuda`` unless ``MECHLAB_TEST_ACCELERATOR`` says otherwise),
    with TF32 off so that float32 products match the CPU's to float32 rounding."""
    device, reason = _accelerator()
    if device is None:
        pytest.skip(reason)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return device


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    """The CPU side of each comparison runs on one thread (the machine is shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
