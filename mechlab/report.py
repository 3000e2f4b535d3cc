"""Deprecated: the report is a pipeline, :mod:`mechlab.pipelines.report`. The old names
resolve, with a ``DeprecationWarning``, until mechlab 0.2.0."""

from mechlab._deprecated import moved_names

__getattr__ = moved_names(__name__)
