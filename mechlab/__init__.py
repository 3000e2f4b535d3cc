"""mechlab: train small sequence models, look inside them, find their circuits.

The public API, re-exported by name.
"""

from mechlab.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from mechlab.models import FAMILIES, MechModel, ModelConfig, build_model, make_config, presets
from mechlab.models.hooked import HookedModule, hooked
from mechlab.tasks.nih import NiH, nih

__version__ = "0.1.0"

__all__ = [
    "FAMILIES",
    "Checkpoint",
    "CheckpointError",
    "HookedModule",
    "MechModel",
    "ModelConfig",
    "NiH",
    "__version__",
    "build_model",
    "hooked",
    "load_checkpoint",
    "make_config",
    "nih",
    "presets",
    "save_checkpoint",
]
