"""Fixtures of the probe tests."""

import pytest
import torch
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    """Small sklearn fits are much faster without BLAS threads on the shared 2 cores; one
    torch thread for the module's tests, restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield
    torch.set_num_threads(threads)
