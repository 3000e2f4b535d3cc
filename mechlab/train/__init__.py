"""The bundled trainer: configs, presets, the training loop."""

from mechlab.train.config import PRESETS, TrainConfig, available_presets, resolve_config
from mechlab.train.task import LDSTask, make_task, masked_mse
from mechlab.train.trainer import Trainer, TrainingStopped, TrainResult, log_spaced_steps, train

__all__ = [
    "PRESETS",
    "LDSTask",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingStopped",
    "available_presets",
    "log_spaced_steps",
    "make_task",
    "masked_mse",
    "resolve_config",
    "train",
]
