"""scripts/gpu_check.sh and scripts/gpu_wheels.sh parse, and the CUDA tests skip cleanly here.

The GPU check itself runs on a GPU machine (docs/benchmarks.md, "The GPU check"); its dry
run on a CPU (``DEVICE=cpu QUICK=1``) takes minutes and is not part of the suite.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_wheels.sh"])
def test_the_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the CUDA tests run instead of skipping")
def test_without_cuda_every_cuda_test_skips_saying_why():
    env = {k: v for k, v in os.environ.items() if k != "MECHLAB_TEST_ACCELERATOR"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "-rs",
         "tests/cuda/test_models.py::test_forward_matches_the_cpu"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    assert " passed" not in done.stdout and "5 skipped" in done.stdout
    assert "no CUDA device visible to torch" in done.stdout and "MECHLAB_TEST_ACCELERATOR=cpu" in done.stdout
