"""Peak CPU memory of one call, from the allocation timeline of ``torch.profiler``.

Imports torch only, so the Edge Pruning runner (:mod:`mechlab.bench.reference_runner`, which
must not import mechlab) loads this file by its path and measures the reference's step the
same way :func:`mechlab.bench.prune.peak_memory` measures mechlab's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.profiler import ProfilerActivity, profile


def profiled_peak(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated on the CPU while ``fn()`` runs, above what was allocated before:
    the profiler's ``CREATE`` / ``DESTROY`` events replayed in order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:  # fmt: skip
        fn()
    current = peak = 0
    for _, action, _, size in prof._memory_profile().timeline:
        name = getattr(action, "name", str(action))
        if name == "CREATE":
            current += size
        elif name == "DESTROY":
            current -= size
        peak = max(peak, current)
    return peak
