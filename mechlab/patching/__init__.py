"""Activation, path and attribution patching on mechlab models, with two backends.

``activation_patch`` sweeps hooks x positions (x heads); ``path_patch`` sends one
sender's change to receivers along direct paths only; ``attribution_patch`` is the
one-backward gradient estimate of the activation sweep. Each returns a
:class:`PatchResult`. ``backend="hooks"`` uses TransformerLens hooks,
``backend="nnsight"`` an ``nnsight.NNsight`` trace; both give the same numbers.
"""

from mechlab.patching.activation import activation_patch
from mechlab.patching.attribution_patching import attribution_patch
from mechlab.patching.backends import Patch
from mechlab.patching.path import path_patch
from mechlab.patching.result import PatchResult

__all__ = ["Patch", "PatchResult", "activation_patch", "attribution_patch", "path_patch"]
