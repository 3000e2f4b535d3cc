"""Deprecated: the report's wording is :mod:`mechlab.viz.report_text`, whether the model
does the task :mod:`mechlab.evals.does_task`. The old names resolve, with a
``DeprecationWarning``, until mechlab 0.2.0."""

from mechlab._deprecated import moved_names

__getattr__ = moved_names(__name__)
