"""Plotly figures: inline in Jupyter (``fig.show()``), offline HTML via :func:`write_html`."""

from mechlab.viz.circuits import circuit_figure, circuits_across_checkpoints_figure, overlap_figure
from mechlab.viz.curves import faithfulness_curves_figure
from mechlab.viz.explorer import CircuitExplorer, circuit_explorer
from mechlab.viz.figures import figure_for_suite, notebook_renderers, write_html
from mechlab.viz.label_vs_observation import recall_dynamics_figure, recall_figure

__all__ = [
    "CircuitExplorer",
    "circuit_explorer",
    "circuit_figure",
    "circuits_across_checkpoints_figure",
    "faithfulness_curves_figure",
    "figure_for_suite",
    "notebook_renderers",
    "overlap_figure",
    "recall_dynamics_figure",
    "recall_figure",
    "write_html",
]
