"""Deprecated: the NiH evaluation suites are :mod:`mechlab.evals.suites`; running a suite on
a checkpoint file is :func:`mechlab.pipelines.run_suite`. The old names resolve, with a
``DeprecationWarning``, until mechlab 0.2.0."""

from mechlab._deprecated import moved_names

__getattr__ = moved_names(__name__)
