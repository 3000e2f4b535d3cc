"""Keep freed memory in the process instead of handing it back to the kernel.

glibc serves allocations above 32 MB (attention maps of a batch of long traces)
with fresh ``mmap`` pages and returns them on ``free``; the next call faults
every page in again. A forward that keeps all its activations (``run_with_cache``)
pays that again each call, which can dominate its cost on the CPU. Telling glibc
never to use ``mmap`` and never to trim the heap makes freed memory reusable. The
same effect, for any program: ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large>``.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse; returns False where glibc is absent."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(M_MMAP_MAX, 0) == 1
    ok &= mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
    ok &= mallopt(M_TOP_PAD, 256 * 2**20) == 1
    return bool(ok)
