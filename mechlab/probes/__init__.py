"""Linear probes on a model's activations: what is linearly decodable where.

* :func:`collect_activations`: a model's activations at some hooks and positions, over a
  dataset, batch by batch.
* :class:`ClassifierProbe`, :class:`RegressorProbe`: scikit-learn estimators
  (standardisation + logistic / ridge regression) that accept torch tensors.
* :func:`recall_targets`: what to probe for on needle-in-a-haystack traces
  (``query_system``, ``open_label``, ``state``, ``next_state``) and the system of each
  sample, to split by system; :func:`control_task`: Hewitt-Liang control targets.
* :func:`probe_sweep`: scores over hooks x positions beside a random-model and a
  control-task baseline, as a :class:`ProbeSweep` (``to_dataframe()``, ``plot()``).
"""

from mechlab._deprecated import moved_names
from mechlab.probes.activations import collect_activations
from mechlab.probes.estimators import ClassifierProbe, RegressorProbe
from mechlab.probes.sweep import ProbeSweep, default_hooks, probe_sweep, random_twin
from mechlab.probes.targets import (
    TARGETS,
    control_task,
    probe_positions,
    recall_targets,
)

__all__ = [
    "TARGETS",
    "ClassifierProbe",
    "ProbeSweep",
    "RegressorProbe",
    "collect_activations",
    "control_task",
    "default_hooks",
    "probe_sweep",
    "random_twin",
    "recall_targets",
    "probe_positions",
]

__getattr__ = moved_names(__name__)  # target_positions: probe_positions
