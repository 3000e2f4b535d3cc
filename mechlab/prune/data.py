"""Deprecated: the trace types moved to :mod:`mechlab.traces` (below tasks and engines)
and the recall task's NiH pruning traces to :mod:`mechlab.tasks.lds_prune` (beside the
task). The old names resolve, with a ``DeprecationWarning``, until mechlab 0.2.0."""

from mechlab._deprecated import moved_names

__getattr__ = moved_names(__name__)
