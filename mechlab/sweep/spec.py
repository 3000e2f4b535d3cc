"""What a sweep runs: models x formats x m x L x length distributions, each with an N*
search over a grid of learning rates and seeds (:class:`SweepSpec`), and the searches it
expands into (:class:`SearchKey`).

For every model, format, m, L and joint length distribution in ``lengths`` there is one
search at L. With ``kappa`` on, every joint distribution (``uniform``,
``short_to_long``) also gets the searches on each length n = 2..L alone
(``lengths="fixed"``, ``L=n``), shared between the L values that contain n.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pydantic import StrictBool, StrictFloat, StrictInt, StrictStr

from mechlab.limits import check_elements
from mechlab.schema import json_type, load_yaml, validate
from mechlab.sweep.search import SearchConfig

GROUPS = ("zm", "s5")
FORMATS = ("outcome", "cot", "acot")
LENGTHS = ("fixed", "uniform", "short_to_long")
JOINT = ("uniform", "short_to_long")
S5_ORDER = 120  # elements of S_5: one token per permutation


def group_size(group: str, m: int) -> int:
    """How many elements a token can be: m for Z_m, 120 for S_5."""
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}; choose from {', '.join(GROUPS)}")
    return S5_ORDER if group == "s5" else m


def unique_sequences(group: str, m: int, L: int, lengths: str) -> int:
    """Distinct input sequences a task has: k^L for fixed length L, sum of k^n over n = 2..L
    for the joint distributions (k = the group's size).

    Args:
        group: ``zm`` or ``s5``.
        m: Modulus of Z_m (ignored for S_5).
        L: The (longest) length.
        lengths: ``fixed``, ``uniform`` or ``short_to_long``.

    Returns:
        The count.
    """
    k = group_size(group, m)
    if lengths not in LENGTHS:
        raise ValueError(f"unknown length distribution {lengths!r}; choose from {', '.join(LENGTHS)}")
    return k**L if lengths == "fixed" else sum(k**n for n in range(2, L + 1))


def available_train(group: str, m: int, L: int, lengths: str, n_val: int) -> int:
    """Unique training sequences left once validation has its share: what exists less
    the validation sets (:func:`mechlab.tasks.state_tracking.validation_sizes`: ``n_val``
    split over the lengths, each at most 20% of that length).

    Args:
        group: ``zm`` or ``s5``.
        m: Modulus of Z_m.
        L: The (longest) length.
        lengths: ``fixed``, ``uniform`` or ``short_to_long``.
        n_val: Validation sequences asked for.

    Returns:
        The largest N a search at this task can use.
    """
    # lazy: mechlab.sweep loads without torch (~90 ms); this import loads torch (~1.4 s)
    from mechlab.tasks.state_tracking import StateTrackingConfig, validation_sizes

    cfg = StateTrackingConfig(group=group, m=m, L=L, lengths=lengths, n_val=n_val)
    val = validation_sizes(cfg)
    return sum(cfg.n_states**n - val[n] for n in cfg.train_lengths)


def validation_count(group: str, m: int, L: int, lengths: str, n_val: int) -> int:
    """Validation sequences a task has (``n_val`` split over the lengths, each at most 20%
    of that length's sequences)."""
    # lazy: mechlab.sweep loads without torch (~90 ms); this import loads torch (~1.4 s)
    from mechlab.tasks.state_tracking import StateTrackingConfig, validation_sizes

    return sum(validation_sizes(StateTrackingConfig(group=group, m=m, L=L, lengths=lengths, n_val=n_val)).values())


@dataclass(frozen=True)
class SearchKey:
    """One N* search: a model, a format and a task (group, m, L, length distribution)."""

    model: str
    format: str
    lengths: str
    group: str
    m: int
    L: int

    @property
    def label(self) -> str:
        """Short text for tables and progress."""
        task = "S5" if self.group == "s5" else f"Z{self.m}"
        return f"{self.model} {self.format} {task} {self.lengths} L={self.L}"


def _model_entry(entry: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(label, model dict) for a model name or a dict (``name`` + fields)."""
    # lazy: mechlab.sweep loads without torch (~90 ms); the model registry loads torch and transformers (~3 s)
    from mechlab.models import FAMILIES, presets

    if isinstance(entry, str):
        known = presets()
        if entry in known:
            return entry, {"arch": known[entry][0], "preset": entry}
        if entry in FAMILIES:
            return entry, {"arch": entry}
        raise ValueError(f"unknown model {entry!r}; choose a preset ({', '.join(known)}), "
                         f"a family ({', '.join(FAMILIES)}) or give a dict with arch")  # fmt: skip
    if not isinstance(entry, dict):
        raise ValueError(f"a model is a name or a dict of fields, got {entry!r}")
    fields_ = dict(entry)
    name = fields_.pop("name", None)
    # lazy: mechlab.sweep loads without torch (~90 ms); the model registry loads torch and transformers (~3 s)
    from mechlab.models import make_config

    make_config({k: v for k, v in fields_.items()})  # unknown arch/preset/field -> ValueError
    label = name or fields_.get("preset") or fields_.get("arch")
    return str(label), fields_


def _without_seed(task: dict[str, Any]) -> dict[str, Any]:
    """A trial's task dict as :class:`~mechlab.tasks.state_tracking.StateTrackingConfig` fields."""
    return {k: v for k, v in task.items() if k != "seed"}


@dataclass(frozen=True)
class SweepSpec:
    """A sweep's grid and settings, validated on construction.

    Args:
        models: Model names (presets or families) or dicts of fields (``name`` labels
            one; the other keys go to the trial's ``model``).
        formats: Task formats: ``outcome``, ``cot``, ``acot``.
        lengths: Length distributions searched at each L: ``fixed`` (n = L),
            ``uniform`` (2..L), ``short_to_long``.
        group: ``zm`` (sum in Z_m) or ``s5`` (composition in S_5).
        ms: Moduli of Z_m (each >= 2; one value is used for S_5).
        Ls: Longest lengths (each >= 2).
        kappa: Also search each length n = 2..L alone, for kappa.
        lrs: Learning rates of the grid.
        seeds: Seeds of the grid.
        steps: Optimiser steps per trial (fixed whatever N).
        batch_size: Batch size per trial.
        eval_every: Steps between validations.
        n_val: Validation samples (at most 20% of each length).
        data_seed: The task's seed: the validation, training and OOD sets (the same for
            every configuration and every N, so a grid point trains as one ensemble).
        search: The N* search's knobs (epsilon, multiplier, bounds, max steps).
        ood: Also train each (model, format, task) at the largest N available and
            report its OOD accuracy.
        ood_n: That N (default: ``min(n_max, unique samples)``).
        device: Device of each trial.
    """

    # The annotations are the schema a YAML file is checked against (see from_dict); one
    # value stands for a list of one.
    models: tuple[StrictStr | dict[str, Any], ...] | StrictStr | dict[str, Any] = ("lstm_256",)
    formats: tuple[StrictStr, ...] | StrictStr = ("acot",)
    lengths: tuple[StrictStr, ...] | StrictStr = ("uniform",)
    group: StrictStr = "zm"
    ms: tuple[StrictInt, ...] | StrictInt = (2,)
    Ls: tuple[StrictInt, ...] | StrictInt = (5,)
    kappa: StrictBool = True
    lrs: tuple[StrictFloat, ...] | StrictFloat = (1e-3, 1e-4, 1e-5)
    seeds: tuple[StrictInt, ...] | StrictInt = (10, 20, 30, 40, 50)
    steps: StrictInt = 250_000
    batch_size: StrictInt = 64
    eval_every: StrictInt = 500
    n_val: StrictInt = 2000
    data_seed: StrictInt = 0
    search: SearchConfig = field(default_factory=SearchConfig)
    ood: StrictBool = True
    ood_n: StrictInt | None = None
    device: StrictStr = "cpu"

    def __post_init__(self) -> None:
        for name in ("models", "formats", "lengths", "ms", "Ls", "lrs", "seeds"):
            value = getattr(self, name)
            if isinstance(value, (str, int, float, dict)):
                value = (value,)
            object.__setattr__(self, name, tuple(value))
            if not getattr(self, name):
                raise ValueError(f"{name} is empty; give at least one value")
        if isinstance(self.search, dict):
            object.__setattr__(self, "search", SearchConfig(**self.search))
        if self.group not in GROUPS:
            raise ValueError(f"unknown group {self.group!r}; choose from {', '.join(GROUPS)}")
        for f in self.formats:
            if f not in FORMATS:
                raise ValueError(f"unknown format {f!r}; choose from {', '.join(FORMATS)}")
        for d in self.lengths:
            if d not in LENGTHS:
                raise ValueError(f"unknown length distribution {d!r}; choose from {', '.join(LENGTHS)}")
        for m in self.ms:
            if int(m) != m or m < 2:
                raise ValueError(f"m must be an integer >= 2, got {m}")
        for L in self.Ls:
            if int(L) != L or L < 2:
                raise ValueError(f"L must be an integer >= 2, got {L}")
        # lazy: mechlab.sweep loads without torch (~90 ms); this import loads torch (~1.4 s)
        from mechlab.devices import parse_device
        from mechlab.tasks.state_tracking import check_length, check_model_vocabulary

        for L in self.Ls:  # before any count of sequences (which grows as L**2.6)
            check_length(int(L))
        if self.group == "zm":
            for m in self.ms:  # before any model
                check_model_vocabulary(int(m))
        parse_device(self.device)  # the name; run_and_write asks whether this machine has it
        for lr in self.lrs:
            if not (lr > 0 and math.isfinite(lr)):
                raise ValueError(f"learning rates must be positive, got {lr}")
        for s in self.seeds:
            if int(s) != s:
                raise ValueError(f"seeds must be integers, got {s}")
        if int(self.data_seed) != self.data_seed:
            raise ValueError(f"data_seed must be an integer, got {self.data_seed}")
        for name in ("steps", "batch_size", "eval_every", "n_val"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        labels = [label for label, _ in self.model_table()]
        if len(set(labels)) != len(labels):
            raise ValueError(f"two models share a name in {labels}; give each dict a distinct 'name'")
        for key in self.search_keys():  # every N the search may try must exist
            if validation_count(key.group, key.m, key.L, key.lengths, self.n_val) == 0:
                raise ValueError(f"no validation sequences for {key.label}: 20% of the sequences of each "
                                 f"length is less than one; use a longer L or a larger m")  # fmt: skip
            cap = self.cap(key)
            if cap < self.search.n_min:
                raise ValueError(
                    f"N_min {self.search.n_min} is larger than the {cap} unique training samples "
                    f"that exist for {key.label}"
                )
        # lazy: mechlab.sweep loads without torch (~90 ms); these load torch and transformers (~3 s)
        from mechlab.models.registry import check_size, make_config
        from mechlab.tasks import state_tracking as st

        # Every trial's validation and OOD sets, as make_data sizes them (the training set
        # of a large N is sized by its trial: most searches never reach it).
        for key in self.search_keys():
            task = st.StateTrackingConfig(**_without_seed(self.task(key)))
            st.check_data_size(task, self.search.n_min, lower="n_val")

        for key in self.main_keys():  # a trial's model, batch and evaluation must fit
            task = st.StateTrackingConfig(**_without_seed(self.task(key)))
            check_elements(f"a batch of {key.label} (its logits)",
                           {"batch_size": self.batch_size, "positions": task.n_ctx, "vocabulary": task.n_states},
                           lower="batch_size")  # fmt: skip
            st.check_eval_chunk(task)
            # the model as TrialSpec.model_config gives it
            model = {**self.model_dict(key.model), "io": "tokens", "d_vocab": task.d_vocab,
                     "d_vocab_out": task.d_vocab_out, "n_ctx": task.n_ctx}  # fmt: skip
            try:
                check_size(make_config(model))
            except ValueError as err:
                raise ValueError(f"{key.label}: {err}") from None
        if self.ood_n is not None:
            if self.ood_n < 1:
                raise ValueError(f"ood_n must be >= 1, got {self.ood_n}")
            for key in self.main_keys():
                if self.ood_n > self.cap(key, limit=False):
                    raise ValueError(f"ood_n {self.ood_n} is larger than the "
                                     f"{self.cap(key, limit=False)} unique training samples that "
                                     f"exist for {key.label}")  # fmt: skip

    def model_table(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, model dict) for every model."""
        return [_model_entry(m) for m in self.models]

    def model_dict(self, label: str) -> dict[str, Any]:
        """The model dict of the model named ``label``."""
        return dict(dict(self.model_table())[label])

    def main_keys(self) -> list[SearchKey]:
        """The searches at each L (one per model, format, m, L and distribution in ``lengths``)."""
        ms = self.ms if self.group == "zm" else self.ms[:1]
        return [SearchKey(label, f, d, self.group, int(m), int(L))
                for label, _ in self.model_table() for f in self.formats for m in ms
                for L in self.Ls for d in self.lengths]  # fmt: skip

    def kappa_keys(self, key: SearchKey) -> list[SearchKey]:
        """The per-length searches kappa of a joint ``key`` needs (n = 2..L, fixed)."""
        return [SearchKey(key.model, key.format, "fixed", key.group, key.m, n) for n in range(2, key.L + 1)]

    def search_keys(self) -> list[SearchKey]:
        """Every search the sweep runs, each once (main searches first)."""
        keys = self.main_keys()
        if self.kappa:
            keys += [k for key in self.main_keys() if key.lengths in JOINT for k in self.kappa_keys(key)]
        return list(dict.fromkeys(keys))

    def cap(self, key: SearchKey, limit: bool = True) -> int:
        """The largest N of ``key``: unique training samples, also capped by ``n_max``
        unless ``limit`` is False."""
        n = available_train(key.group, key.m, key.L, key.lengths, self.n_val)
        return min(n, self.search.n_max) if limit else n

    def ood_n_for(self, key: SearchKey) -> int:
        """The N at which ``key``'s model is trained for OOD."""
        return self.ood_n if self.ood_n is not None else self.cap(key)

    def task(self, key: SearchKey) -> dict[str, Any]:
        """The trial's task dict for ``key``."""
        return {"group": key.group, "m": key.m, "L": key.L, "format": key.format,
                "lengths": key.lengths, "n_val": self.n_val, "seed": self.data_seed}  # fmt: skip

    def trial_specs(self, key: SearchKey, n_train: int) -> list[dict[str, Any]]:
        """The grid at one N: one trial spec (``TrialSpec`` fields) per (lr, seed)."""
        model = self.model_dict(key.model)
        return [{"model": model, "task": self.task(key), "n_train": int(n_train), "lr": float(lr),
                 "seed": int(seed), "steps": self.steps, "batch_size": self.batch_size,
                 "epsilon": self.search.epsilon, "eval_every": self.eval_every, "device": self.device}
                for lr in self.lrs for seed in self.seeds]  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """A JSON/YAML-ready dict that :meth:`from_dict` reads back."""
        out = asdict(self)
        for name in ("models", "formats", "lengths", "ms", "Ls", "lrs", "seeds"):
            out[name] = list(out[name])
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "sweep settings") -> SweepSpec:
        """Build from a dict (a YAML file's content); unknown keys are refused.

        Search knobs may sit under ``search:`` or at the top level (``epsilon``,
        ``multiplier``, ``n_min``, ``n_max``, ``max_steps``, ``resolution``, ``start``).
        """
        if not isinstance(data, dict):
            raise ValueError(f"{source} must be a mapping of settings, got {json_type(data)}")
        data = dict(data)
        search_names = {f.name for f in fields(SearchConfig)}
        search = data.pop("search", None) or {}
        if not isinstance(search, dict):
            raise ValueError(f"{source}: search must be a mapping of search settings, got {json_type(search)}")
        search = dict(search)
        for name in list(data):
            if name in search_names:
                search[name] = data.pop(name)
        known = {f.name for f in fields(cls)} - {"search"}
        unknown = sorted(map(str, set(data) - known))
        if unknown:
            raise ValueError(f"{source}: unknown sweep setting(s) {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(known | search_names))}")  # fmt: skip
        unknown = sorted(map(str, set(search) - search_names))
        if unknown:
            raise ValueError(f"{source}: unknown search setting(s) {', '.join(unknown)}")
        return validate(cls, {**data, "search": search}, source, "fix the setting")

    @classmethod
    def from_yaml(cls, path: str | Path) -> SweepSpec:
        """Read a sweep config (YAML) from ``path``; see :meth:`from_dict`."""
        data = read_settings(path)
        return cls.from_dict(data, f"sweep config {str(path)!r}")


def read_settings(path: str | Path) -> dict[str, Any]:
    """The settings of a sweep config file, read safely (:func:`mechlab.schema.load_yaml`:
    size, depth, tags and aliases checked) but not yet validated (:meth:`SweepSpec.from_dict`
    does that once command-line values are added).

    Raises:
        ValueError: One line, for a missing or oversized file, invalid or hostile YAML, or a
            document that is not a mapping.
    """
    data = load_yaml(path, "sweep config") or {}
    if not isinstance(data, dict):
        raise ValueError(f"sweep config {str(path)!r} must hold a mapping of settings, got {json_type(data)}")
    return data
