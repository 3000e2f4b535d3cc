"""The bundled trainer: configs, presets, the training loop."""

from mechlab.train.config import PRESETS, TrainConfig, available_presets, resolve_config
from mechlab.train.dispatch import run_trials
from mechlab.train.prefetch import Prefetcher
from mechlab.train.task import LDSTask, StateTrackingTask, make_task, masked_mse
from mechlab.train.trainer import Trainer, TrainingStopped, TrainResult, log_spaced_steps, train
from mechlab.train.trials import TrialSpec, run_trial

__all__ = [
    "PRESETS",
    "LDSTask",
    "Prefetcher",
    "StateTrackingTask",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingStopped",
    "TrialSpec",
    "available_presets",
    "log_spaced_steps",
    "make_task",
    "masked_mse",
    "resolve_config",
    "run_trial",
    "run_trials",
    "train",
]
