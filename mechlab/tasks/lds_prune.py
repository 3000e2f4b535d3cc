"""Pruning data of an interleaved-systems (recall) checkpoint: NiH traces and their corruptions.

The pruning engine (:mod:`mechlab.prune`) knows no task: this module builds its
:class:`~mechlab.traces.PruneData` from an :class:`~mechlab.tasks.lds.LDSConfig`, beside
the task, as :mod:`mechlab.tasks.state_tracking_prune` does for state tracking.

The traces are needle-in-a-haystack traces drawn by :func:`mechlab.tasks.nih.nih` (the
one builder of the NiH pair; :meth:`~mechlab.tasks.nih.NiH.traces` turns it into what
an engine reads). The default corruption is the ``misdirect_incorrect`` construction:
the corrupted trace is the same trace (same generator state, same systems, states and
query) except that the query segment's open and close labels are those of another
haystack system. An interchange ablation therefore replaces a writer's output by what it
would be had the label pointed to the wrong system, and the pruned circuit is what
carries the *label-dependent* part of the prediction. Other corruptions: the other probes
of :data:`mechlab.tasks.lds_evals.PROBES`, and ``"shuffle"`` (another trace of the
batch). By default (``protocol="study"``) the NiH is the study's: the oldest haystack
system is queried and the misdirection shows the next one's label; ``protocol="uniform"``
draws both uniformly.

Windows (for a recurrent model's windowed graph): :func:`~mechlab.tasks.nih.nih_windows`,
``haystack`` ``[0, p)``, ``label`` ``[p, p + 1)``, ``continuation`` ``[p + 1, n_pos)``.
"""

from __future__ import annotations

from typing import Any

from mechlab.tasks.lds import LDSConfig
from mechlab.tasks.lds_evals import PROBES, nih_protocol
from mechlab.tasks.lds_systems import SystemLibrary, make_libraries
from mechlab.tasks.nih import default_haystack, nih, nih_windows
from mechlab.tasks.registry import DEFAULT_CORRUPTION
from mechlab.traces import PruneData, Target, Traces, check_target

CORRUPTIONS = (*PROBES, "shuffle")
TEST_SEED_OFFSET = 7919  # the held-out traces' seed is seed + this

__all__ = ["CORRUPTIONS", "DEFAULT_CORRUPTION", "TEST_SEED_OFFSET", "check_task_targets", "nih_prune_data",
           "nih_windows", "task_prune_data"]


def _traces(
    cfg: LDSConfig,
    library: SystemLibrary,
    n_traces: int,
    n_haystack: int,
    seg_len: int,
    seed: int,
    corruption: str,
    protocol: str,
) -> Traces:
    shuffle = corruption == "shuffle"
    pair = nih(
        cfg, n_traces, probe=None if shuffle else corruption, n_haystack=n_haystack,
        seg_len=seg_len, offsets=(1,), seed=seed, protocol=protocol, library=library,
    )  # fmt: skip
    return pair.traces(pair.clean.roll(1, dims=0) if shuffle else None)  # shuffle: another trace


def nih_prune_data(
    cfg: LDSConfig,
    n_train: int = 256,
    n_test: int = 512,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    corruption: str = DEFAULT_CORRUPTION,
    seed: int = 0,
    protocol: str = "study",
) -> PruneData:
    """Needle-in-a-haystack traces for pruning a model of the interleaved-systems task.

    Both sets are drawn from the task's *test* library (systems never trained on), with
    fresh initial states per trace; the training traces from ``Generator(seed)``, the
    held-out ones from ``Generator(seed + 7919)``.

    Args:
        cfg: The task config the model was trained on.
        n_train: Training traces.
        n_test: Held-out traces.
        n_haystack: Haystack systems (default: see :func:`~mechlab.tasks.nih.default_haystack`).
        seg_len: Observations per segment.
        corruption: ``misdirect_incorrect`` (default), another probe of
            :data:`~mechlab.tasks.lds_evals.PROBES`, or ``shuffle``.
        seed: Seed of the traces.
        protocol: NiH construction: ``"study"`` (default: oldest system queried,
            misdirection to the next) or ``"uniform"`` (both drawn uniformly).

    Returns:
        The :class:`~mechlab.traces.PruneData`.
    """
    nih_protocol(protocol)  # validate before any work
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; choose one of {CORRUPTIONS}")
    for name, value in (("n_train", n_train), ("n_test", n_test)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    default_n, default_s = default_haystack(cfg)
    n_haystack = default_n if n_haystack is None else n_haystack
    seg_len = default_s if seg_len is None else seg_len
    library = make_libraries(cfg)[1]
    kw = {"n_haystack": n_haystack, "seg_len": seg_len, "corruption": corruption, "protocol": protocol}
    train = _traces(cfg, library, n_train, seed=seed, **kw)
    test = _traces(cfg, library, n_test, seed=seed + TEST_SEED_OFFSET, **kw)
    info = {
        "task": "lds-nih", "n_haystack": n_haystack, "seg_len": seg_len, "corruption": corruption,
        "n_train": n_train, "n_test": n_test, "data_seed": seed, "n_pos": train.n_pos,
        "query_position": train.query_position,
    }  # fmt: skip
    info["nih_protocol"] = protocol
    info["windows"] = [list(w) for w in train.windows]
    return PruneData(train=train, test=test, info=info)


def task_prune_data(
    cfg: LDSConfig,
    target: Target,
    *,
    n_train: int,
    n_test: int,
    corruption: str = DEFAULT_CORRUPTION,
    seed: int = 0,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    nih: str = "study",
    **_: Any,
) -> tuple[PruneData, Target]:
    """The lds task's entry of :mod:`mechlab.tasks.registry`: NiH pruning traces
    (:func:`nih_prune_data`) and ``target``, checked on them."""
    data = nih_prune_data(cfg, n_train=n_train, n_test=n_test, n_haystack=n_haystack, seg_len=seg_len,
                          corruption=corruption, seed=seed, protocol=nih)  # fmt: skip
    check_target(target, data.train)
    return data, target


def check_task_targets(
    cfg: LDSConfig,
    targets: list[Target],
    *,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    nih: str = "study",
    **_: Any,
) -> None:
    """Every target checked on one NiH trace of the task (the default corruption)."""
    data = nih_prune_data(cfg, n_train=1, n_test=1, n_haystack=n_haystack, seg_len=seg_len, protocol=nih)
    for target in targets:
        check_target(target, data.train)
