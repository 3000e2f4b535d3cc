"""Deprecated: the report's page is :mod:`mechlab.viz.report_page`, its wording
:mod:`mechlab.viz.report_text`. The old names resolve, with a ``DeprecationWarning``,
until mechlab 0.2.0."""

from mechlab._deprecated import moved_names

__getattr__ = moved_names(__name__)
