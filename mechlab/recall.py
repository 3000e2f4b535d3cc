"""Deprecated: the label- vs observation-based recall harness is
:mod:`mechlab.label_vs_observation`; running it on a checkpoint or a run is
:func:`mechlab.pipelines.recall_checkpoint` / :func:`mechlab.pipelines.recall_dynamics`.
The old names resolve, with a ``DeprecationWarning``, until mechlab 0.2.0."""

from mechlab._deprecated import moved_names

__getattr__ = moved_names(__name__)
