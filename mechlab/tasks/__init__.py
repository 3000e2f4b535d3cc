"""Data for mechlab's studies: the interleaved linear-systems recall task (``lds``) and
its evaluation traces (``lds_evals``)."""

from mechlab.tasks.lds import (
    CLOSE,
    OBS,
    OPEN,
    START,
    LDSBatch,
    LDSConfig,
    SystemLibrary,
    make_libraries,
    sample_batch,
)
from mechlab.tasks.lds_evals import (
    NIH_OFFSETS,
    PROBES,
    EvalTraces,
    least_squares_predict,
    needle_in_haystack,
    uninterleaved,
)

__all__ = [
    "CLOSE",
    "NIH_OFFSETS",
    "OBS",
    "OPEN",
    "PROBES",
    "START",
    "EvalTraces",
    "LDSBatch",
    "LDSConfig",
    "SystemLibrary",
    "least_squares_predict",
    "make_libraries",
    "needle_in_haystack",
    "sample_batch",
    "uninterleaved",
]
