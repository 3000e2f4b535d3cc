"""The random-number-generator states a checkpoint saved with ``rng=True`` carries."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from mechlab.checkpoint.errors import CheckpointError, _brief


def capture_rng() -> dict[str, Any]:
    """The current torch (CPU and CUDA), numpy and Python RNG states, as plain values."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    bit_generator, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state["numpy"] = {
        "bit_generator": str(bit_generator),
        "keys": [int(k) for k in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }
    version, internal, gauss_next = random.getstate()
    state["python"] = {"version": version, "state": list(internal), "gauss_next": gauss_next}
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the RNGs to a state from :func:`capture_rng` (or ``Checkpoint.rng_state``).

    CUDA states are restored for the devices present; the rest are ignored.
    """
    try:
        if "torch" in state:
            torch.set_rng_state(state["torch"].cpu())
        cuda_states = state.get("cuda") or []
        if cuda_states and torch.cuda.is_available():
            for index, cuda_state in enumerate(cuda_states[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(cuda_state.cpu(), index)
        if "numpy" in state:
            s = state["numpy"]
            keys = np.asarray(s["keys"], dtype=np.uint32)
            np.random.set_state(
                (s["bit_generator"], keys, s["pos"], s["has_gauss"], s["cached_gaussian"])
            )
        if "python" in state:
            s = state["python"]
            random.setstate((s["version"], tuple(s["state"]), s["gauss_next"]))
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as err:
        raise CheckpointError(
            f"malformed RNG state ({_brief(err)}); pass the rng_state of a checkpoint saved "
            "with rng=True"
        ) from err

