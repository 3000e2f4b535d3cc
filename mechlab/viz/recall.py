"""Deprecated: the recall harness's figures are :mod:`mechlab.viz.label_vs_observation`.
The old names resolve, with a ``DeprecationWarning``, until mechlab 0.2.0."""

from mechlab._deprecated import moved_names

__getattr__ = moved_names(__name__)
