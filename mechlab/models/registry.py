"""Build any mechlab model from a config object, a dict or a name; every family's contract.

Each architecture lives in its own module, which defines a config dataclass
(a :class:`~mechlab.models.base.ModelConfig` with ``arch`` set) and the model
class; a module may also define ``PRESETS``, named dicts of config fields.

A family's registry entry (:class:`Family`, in :data:`FAMILIES`) is its whole contract:
where its classes live, and what the layers above need of it: the edge graph pruning
builds for it (:attr:`Family.graph`), the attribute of each block that holds its mixer
(:attr:`Family.mixer`), and whether training batches its trials as one ensemble
(:attr:`Family.ensemble`). Pruning and training read these here; a new family is one
:func:`register_family` call (``docs/architecture.md``, "How to add a model family").
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

from mechlab import limits
from mechlab.models.base import MechModel, ModelConfig

GRAPH_KINDS = ("transformer", "recurrent")
"""The edge graphs pruning builds (:mod:`mechlab.prune.graph`): a transformer's heads and
MLPs, or a residual stack of recurrent mixers (position windows and carried states)."""


class Family(NamedTuple):
    """One model family of the registry: where it lives and what pruning and training need of it.

    The first three fields are where the classes live (an entry may be given as just those
    three: a family that builds and trains one trial at a time, but is not pruned).

    Attributes:
        module: The module that defines the family (``"mechlab.models.lstm"``).
        config: The name of its config class there (a ``ModelConfig`` with ``arch`` set).
        model: The name of its model class there.
        graph: The edge graph pruning builds (one of :data:`GRAPH_KINDS`), or None: the
            family is not pruned (``edge pruning supports ...``).
        mixer: For a ``recurrent`` graph, the attribute of each block that holds its mixer
            (called as ``mixer(x, state, return_state=True)`` for position windows); the
            block's ``norm`` comes before it and the model's ``hook_embed``,
            ``blocks.{l}.hook_mixer_out``, ``read_in``, ``ln_final`` and ``read_out``
            are read around it (:mod:`mechlab.prune.forward`).
        ensemble: Trials of one shape are trained as one batched ensemble
            (:mod:`mechlab.train.dispatch`): for families where that beats training the
            members one after another (``mechlab bench ensemble``).
    """

    module: str
    config: str
    model: str
    graph: str | None = None
    mixer: str | None = None
    ensemble: bool = False

    @property
    def recurrent(self) -> bool:
        """Pruned as a residual stack of recurrent mixers (position windows apply)."""
        return self.graph == "recurrent"

    @property
    def prunable(self) -> bool:
        """Edge pruning (and every circuit method) builds a graph for it."""
        return self.graph is not None


# arch name -> its entry (a plain (module, config class, model class) tuple reads as a
# Family that is not pruned)
FAMILIES: dict[str, Family] = {}


def _check_family(name: str, family: Family) -> Family:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a family's name is a non-empty string, got {name!r}")
    if family.graph is not None and family.graph not in GRAPH_KINDS:
        raise ValueError(
            f"family {name!r}: unknown graph {family.graph!r}; choose one of {GRAPH_KINDS} or None"
        )
    if family.recurrent and not family.mixer:
        raise ValueError(
            f"family {name!r}: a recurrent graph needs mixer=, the attribute of each block that holds its mixer"
        )
    if not family.recurrent and family.mixer is not None:
        raise ValueError(
            f"family {name!r}: mixer= is for recurrent graphs, this one's graph is {family.graph!r}"
        )
    return family


def register_family(
    name: str, family: Family | tuple[str, ...], *, replace: bool = False
) -> Family:
    """Add a model family to the registry; returns its entry.

    Args:
        name: The architecture name its config's ``arch`` holds.
        family: Its :class:`Family` (or a ``(module, config, model)`` tuple: not pruned).
        replace: Replace an entry of the same name (else that is a ValueError).

    Raises:
        ValueError: The name is registered already, or the contract is inconsistent (an
            unknown graph kind, a recurrent graph without a mixer).
    """
    if name in FAMILIES and not replace:
        raise ValueError(f"family {name!r} is registered already")
    entry = _check_family(name, Family(*family))
    FAMILIES[name] = entry
    return entry


def unregister_family(name: str) -> None:
    """Remove a family from the registry (a test's toy family); unknown names are ignored."""
    FAMILIES.pop(name, None)


def get_family(arch: str) -> Family:
    """The entry of a family; one-line ValueError for an architecture not registered."""
    if arch not in FAMILIES:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {sorted(FAMILIES)}")
    return Family(*FAMILIES[arch])


def graph_kind(arch: str | None) -> str | None:
    """The edge graph pruning builds for ``arch`` (:attr:`Family.graph`); None for an
    architecture that is not registered or not pruned."""
    entry = FAMILIES.get(arch) if isinstance(arch, str) else None
    return None if entry is None else Family(*entry).graph


def prunable_families() -> tuple[str, ...]:
    """The families pruning builds a graph for, in the order registered."""
    return tuple(name for name in FAMILIES if graph_kind(name) is not None)


def recurrent_families() -> tuple[str, ...]:
    """The families pruned as residual stacks of recurrent mixers, in the order registered."""
    return tuple(name for name in FAMILIES if graph_kind(name) == "recurrent")


def ensemble_families() -> tuple[str, ...]:
    """The families whose trials train as one batched ensemble, in the order registered."""
    return tuple(name for name, entry in FAMILIES.items() if Family(*entry).ensemble)


register_family("transformer", Family("mechlab.models.transformer", "TransformerConfig", "Transformer",
                                      graph="transformer", ensemble=True))  # fmt: skip
register_family("lstm", Family("mechlab.models.lstm", "LSTMConfig", "LSTM", graph="recurrent", mixer="lstm",
                               ensemble=True))  # fmt: skip
register_family("dense_ssm", Family("mechlab.models.dense_ssm", "DenseSSMConfig", "DenseSSM", graph="recurrent",
                                    mixer="ssm", ensemble=True))  # fmt: skip
# Mamba's chunked scan writes into preallocated buffers (out=), which vmap cannot batch.
register_family(
    "mamba",
    Family("mechlab.models.mamba", "MambaConfig", "Mamba", graph="recurrent", mixer="mixer"),
)


def _family(arch: str) -> tuple[type[ModelConfig], type[MechModel], dict[str, dict]]:
    module_name, config_name, model_name = get_family(arch)[:3]
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


# Models larger than the size limit (parameters and buffers) are refused before anything
# is allocated, unless the limit is raised (``max_elements=`` or the environment variable
# ``MECHLAB_MAX_ELEMENTS``). The limit lives in :mod:`mechlab.limits`; these names stay
# here for the code that imports them from the registry.
MAX_ELEMENTS = limits.MAX_ELEMENTS
MAX_ELEMENTS_ENV = limits.MAX_ELEMENTS_ENV
max_elements = limits.max_elements


def estimate_elements(cfg: ModelConfig) -> int:
    """Parameter and buffer elements the model of ``cfg`` will allocate, from its sizes alone.

    Exact for the four families and the transformer's options (within a few elements;
    the attention's causal mask is made per forward pass, not stored); computed with
    Python integers, so an absurd config gives an absurd number rather than an
    allocation.

    Args:
        cfg: A model config.

    Returns:
        The estimated number of elements.
    """
    d, n_layers = int(cfg.d_model), int(cfg.n_layers)
    if cfg.io == "tokens":
        io = int(cfg.d_vocab) * d + (d + 1) * int(cfg.d_vocab_out or cfg.d_vocab)
    else:
        io = (int(cfg.d_in) + 1) * d + (d + 1) * int(cfg.d_out)
    arch = cfg.arch
    if arch == "transformer":
        H, G, dh = int(cfg.n_heads), int(cfg.n_key_value_heads or cfg.n_heads), int(cfg.d_head)
        d_mlp = int(cfg.d_mlp)
        norm = {"LN": 2 * d, "RMS": d, "LNPre": 2 * d}.get(cfg.normalization, 0)
        pre = norm if getattr(cfg, "pre_norms", True) else 0  # OLMo 2: ln1, ln2 are the identity
        per_layer = (2 * H + 2 * G) * d * dh + pre  # W_Q, W_O, W_K, W_V, ln1
        qk = (H + G) * dh if getattr(cfg, "qk_norm_over", "head") == "all" else 2 * dh
        per_layer += qk * bool(getattr(cfg, "qk_norm", False))  # q_norm, k_norm
        post = norm * bool(getattr(cfg, "post_norms", False))
        per_layer += post * (1 if cfg.attn_only else 2)  # ln1_post, ln2_post
        per_layer += (H + 2 * G) * dh * bool(cfg.qkv_bias) + d * bool(cfg.attn_out_bias)
        if not cfg.attn_only:
            n_in = 2 if cfg.gated_mlp else 1
            per_layer += (n_in + 1) * d * d_mlp + pre  # W_in (W_gate), W_out, ln2
            per_layer += (n_in * d_mlp + d) * bool(cfg.mlp_bias)
        if cfg.positional == "rotary":
            per_layer += int(cfg.rotary_dim) // 2  # inv_freq
        extra = int(cfg.n_ctx) * d if cfg.positional == "learned" else 0  # positions
        extra += norm - 2 * d  # ln_final (counted as a LayerNorm below)
        if cfg.io == "tokens" and cfg.tie_embeddings:
            io -= int(cfg.d_vocab) * d  # the read-out's weight is the embedding
    elif arch == "lstm":
        h = int(getattr(cfg, "d_hidden", d) or d)
        per_layer = 4 * h * (d + h) + 8 * h + 2 * d + (h * d if h != d else 0)
        extra = 0
    elif arch == "dense_ssm":
        n = int(cfg.d_state)
        per_layer = n * n * d + n + n * d + 2 * d
        extra = 0
    elif arch == "mamba":
        e, n = int(cfg.d_inner), int(cfg.d_state)
        r = int(cfg.resolved_dt_rank)
        per_layer = (
            e * n + 2 * e * d + e * (int(cfg.d_conv) + 3) + (r + 2 * n) * e + e * r + d * e + d
        )
        extra = 0
    else:  # a family added later: bound by the sizes it shares with the others
        per_layer, extra = 16 * d * d, int(cfg.n_ctx) * d
    return io + n_layers * per_layer + extra + 2 * d


def check_size(cfg: ModelConfig, limit: int | None = None) -> int:
    """Refuse a config whose model would exceed the size limit, before any allocation.

    Args:
        cfg: A model config.
        limit: Most elements allowed (default: :func:`max_elements`).

    Returns:
        The estimated number of elements.

    Raises:
        ValueError: The estimate is above the limit (the message gives both, and how
            to raise the limit).
    """
    limit = max_elements() if limit is None else int(limit)
    n = estimate_elements(cfg)
    if n > limit:
        gib = n * 4 / 2**30
        raise ValueError(
            f"the {cfg.arch} config (d_model={cfg.d_model}, n_layers={cfg.n_layers}, "
            f"n_ctx={cfg.n_ctx}) would allocate about {n:.3g} elements ({gib:,.1f} GiB in float32), "
            f"more than the limit {limit:.3g}; if you mean it, raise the limit with "
            f"{MAX_ELEMENTS_ENV}={max(n, limit + 1)} (or max_elements=)"
        )
    return n


def build_model(
    config: ModelConfig | dict[str, Any] | str,
    *,
    max_elements: int | None = None,
    **overrides: Any,
) -> MechModel:
    """Build a freshly initialised model.

    The config's size is checked before anything is allocated (:func:`check_size`):
    a model above ``max_elements`` parameter and buffer elements (default
    :data:`MAX_ELEMENTS` = 2**31, or ``MECHLAB_MAX_ELEMENTS``) is refused.

    Args:
        config: See :func:`make_config`.
        max_elements: Size limit for this call (overrides the default and the
            environment variable).
        **overrides: Config fields to replace.

    Returns:
        The model, a ``HookedRootModule``, in train mode on the CPU.

    Raises:
        ValueError: An invalid config, or one above the size limit.
    """
    cfg = make_config(config, **overrides)
    check_size(cfg, max_elements)
    return _family(cfg.arch)[1](cfg)
