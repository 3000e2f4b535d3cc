"""The model families, the registry that builds them, and the importer of Hugging Face models."""

from mechlab.models.base import MechModel, ModelConfig
from mechlab.models.importers import SUPPORTED, ImportProblem, from_pretrained
from mechlab.models.registry import FAMILIES, build_model, make_config, presets

__all__ = [
    "FAMILIES",
    "SUPPORTED",
    "ImportProblem",
    "MechModel",
    "ModelConfig",
    "build_model",
    "from_pretrained",
    "make_config",
    "presets",
]
