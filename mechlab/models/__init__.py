"""The model families and the registry that builds them."""

from mechlab.models.base import MechModel, ModelConfig
from mechlab.models.registry import FAMILIES, build_model, make_config, presets

__all__ = ["FAMILIES", "MechModel", "ModelConfig", "build_model", "make_config", "presets"]
