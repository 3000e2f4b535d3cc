"""Build any mechlab model from a config object, a dict or a name.

Each architecture lives in its own module, which defines a config dataclass
(a :class:`~mechlab.models.base.ModelConfig` with ``arch`` set) and the model
class; a module may also define ``PRESETS``, named dicts of config fields.
"""

from __future__ import annotations

import importlib
from typing import Any

from mechlab.models.base import MechModel, ModelConfig

# arch name -> (module, config class, model class)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "transformer": ("mechlab.models.transformer", "TransformerConfig", "Transformer"),
    "lstm": ("mechlab.models.lstm", "LSTMConfig", "LSTM"),
    "dense_ssm": ("mechlab.models.dense_ssm", "DenseSSMConfig", "DenseSSM"),
    "mamba": ("mechlab.models.mamba", "MambaConfig", "Mamba"),
}


def _family(arch: str) -> tuple[type[ModelConfig], type[MechModel], dict[str, dict]]:
    if arch not in FAMILIES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {sorted(FAMILIES)}")
    module_name, config_name, model_name = FAMILIES[arch]
    module = importlib.import_module(module_name)
    return getattr(module, config_name), getattr(module, model_name), getattr(module, "PRESETS", {})


def presets() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every named preset: preset name -> (arch, config fields)."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for arch in FAMILIES:
        for name, fields in _family(arch)[2].items():
            out[name] = (arch, dict(fields))
    return out


def make_config(config: ModelConfig | dict[str, Any] | str, **overrides: Any) -> ModelConfig:
    """Turn a config object, dict, architecture name or preset name into a config.

    Args:
        config: A ``ModelConfig``; a dict with an ``"arch"`` key (and, optionally,
            ``"preset"``) plus any fields; an architecture name such as ``"mamba"``;
            or a preset name such as ``"tiny"``. Missing fields take their defaults.
        **overrides: Fields that replace those of ``config``.

    Returns:
        The validated config dataclass of the architecture.

    Raises:
        ValueError: Unknown architecture, preset or field, or an invalid value.
    """
    if isinstance(config, ModelConfig):
        if not overrides:
            return config
        config = config.to_dict()
    if isinstance(config, str):
        if config in FAMILIES:
            config = {"arch": config}
        else:
            known = presets()
            if config not in known:
                raise ValueError(
                    f"unknown architecture or preset {config!r}; architectures: "
                    f"{sorted(FAMILIES)}, presets: {sorted(known)}"
                )
            arch, fields = known[config]
            config = {"arch": arch, **fields}
    if not isinstance(config, dict):
        raise TypeError(f"config must be a ModelConfig, dict or str, not {type(config).__name__}")
    fields = {**config, **overrides}
    preset = fields.pop("preset", None)
    arch = fields.pop("arch", None)
    if preset is not None:
        known = presets()
        if preset not in known:
            raise ValueError(f"unknown preset {preset!r}; presets: {sorted(known)}")
        preset_arch, preset_fields = known[preset]
        if arch is not None and arch != preset_arch:
            raise ValueError(f"preset {preset!r} is a {preset_arch}, not a {arch}")
        arch = preset_arch
        fields = {**preset_fields, **fields}
    if arch is None:
        raise ValueError("config dict needs an 'arch' key, e.g. {'arch': 'lstm'}")
    config_cls = _family(arch)[0]
    return config_cls.from_dict(fields)


def build_model(config: ModelConfig | dict[str, Any] | str, **overrides: Any) -> MechModel:
    """Build a freshly initialised model.

    Args:
        config: See :func:`make_config`.
        **overrides: Config fields to replace.

    Returns:
        The model, a ``HookedRootModule``, in train mode on the CPU.
    """
    cfg = make_config(config, **overrides)
    return _family(cfg.arch)[1](cfg)
