"""Plotly figures: inline in Jupyter (``fig.show()``), offline HTML via :func:`write_html`."""

from mechlab.viz.figures import figure_for_suite, write_html

__all__ = ["figure_for_suite", "write_html"]
