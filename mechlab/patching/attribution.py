"""Deprecated: attribution patching is :mod:`mechlab.patching.attribution_patching` (edge
attribution is :mod:`mechlab.prune.attribution`). The old names resolve, with a
``DeprecationWarning``, until mechlab 0.2.0."""

from mechlab._deprecated import moved_names

__getattr__ = moved_names(__name__)
