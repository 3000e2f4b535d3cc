"""Bootstrap stability of a circuit: does it keep its edges when the traces change?

A circuit found on one sample of traces should not hinge on which traces were drawn. The
bar set in the literature: a circuit's edges should stay, its mean bootstrap Jaccard over
resampled traces at least :data:`STABILITY_BAR` (0.8).

:func:`bootstrap_stability` measures it for any circuit finder ``find(data) -> Circuit``:

* the reference circuit is ``find(data)`` on the traces as given (or the one passed);
* each of ``n_boot`` replicates draws the *training* traces with replacement, as many as
  there are, from a generator seeded with ``seed`` (every per-trace field, inputs,
  corrupted inputs, truth, observed positions, drawn with the same index:
  :meth:`~mechlab.traces.Traces.subset`); the held-out traces stay as they are, so every
  replicate's circuit is scored on the same traces;
* it reports the mean edge Jaccard (:func:`~mechlab.prune.circuit.jaccard`) of each
  replicate's circuit with the reference, their spread (min, 5th and 95th percentiles),
  the mean pairwise Jaccard among the replicates, and each edge's frequency across the
  replicates.

:func:`method_stability` is the same for a method of
:func:`~mechlab.prune.methods.find_circuit`. This is stability over the *data*; over
pruning seeds it is :func:`~mechlab.prune.circuit.seed_stability` and
:func:`~mechlab.prune.stats.bootstrap_overlap` (resampling circuits, not traces).
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from mechlab.prune.circuit import Circuit, jaccard
from mechlab.prune.methods import find_circuit
from mechlab.traces import PruneData, Target

Edge = tuple[str, str]

STABILITY_BAR = 0.8
"""The published bar: a circuit's mean bootstrap Jaccard over resampled traces is at least this."""

RESAMPLED = "training traces, with replacement, as many as given; held-out traces unchanged"


@dataclass(frozen=True)
class BootstrapStability:
    """How well a circuit keeps its edges over resampled training traces.

    Attributes:
        mean_jaccard: Mean edge Jaccard of each replicate's circuit with the reference
            (the circuit on the traces as given).
        pairwise_jaccard: Mean edge Jaccard over every pair of replicates.
        jaccards: Each replicate's Jaccard with the reference, in replicate order.
        min_jaccard: The smallest of ``jaccards``.
        p5, p95: Their 5th and 95th percentiles (linear interpolation).
        edge_frequency: Edge -> fraction of the replicates that keep it (every edge of
            the reference or of a replicate; most frequent first).
        n_boot: Replicates.
        seed: Seed of the resampling.
        n_edges_reference: Edges of the reference circuit.
        seconds: Time the replicates took (the reference not included when passed).
        bar: :data:`STABILITY_BAR`.
    """

    mean_jaccard: float
    pairwise_jaccard: float
    jaccards: tuple[float, ...]
    min_jaccard: float
    p5: float
    p95: float
    edge_frequency: dict[Edge, float] = field(hash=False)
    n_boot: int
    seed: int
    n_edges_reference: int
    seconds: float = 0.0
    bar: float = STABILITY_BAR

    @property
    def meets_bar(self) -> bool:
        """``mean_jaccard >= bar``."""
        return self.mean_jaccard >= self.bar

    def summary(self) -> str:
        """The result in words (:func:`stability_text`)."""
        return stability_text(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """Plain values (what a circuit's ``metadata["stability"]`` holds); edge
        frequencies as rows ``[writer, reader, fraction]``."""
        out = {
            "mean_jaccard": self.mean_jaccard,
            "pairwise_jaccard": self.pairwise_jaccard,
            "jaccards": list(self.jaccards),
            "min_jaccard": self.min_jaccard,
            "p5": self.p5,
            "p95": self.p95,
            "n_boot": self.n_boot,
            "seed": self.seed,
            "n_edges_reference": self.n_edges_reference,
            "seconds": self.seconds,
            "bar": self.bar,
            "meets_bar": self.meets_bar,
            "resampled": RESAMPLED,
            "edge_frequency": [[w, r, f] for (w, r), f in self.edge_frequency.items()],
        }
        out["summary"] = stability_text(out)
        return out


def stability_text(values: Mapping[str, Any], short: bool = False) -> str:
    """A stability record (:meth:`BootstrapStability.to_dict`) in words, one line (``short``:
    the mean Jaccard, the resamples and the bar only)."""
    mean, bar, n = (
        values.get("mean_jaccard"),
        values.get("bar", STABILITY_BAR),
        values.get("n_boot"),
    )
    if not isinstance(mean, (int, float)) or isinstance(mean, bool):
        return "bootstrap stability: not recorded"
    meets = "met" if values.get("meets_bar", mean >= bar) else "not met"
    head = f"bootstrap stability: mean edge Jaccard {mean:.2f} with the circuit over {n} resamples of the training traces"
    if short:
        return f"{head} (bar {bar:g}: {meets})"
    spread = ""
    if all(isinstance(values.get(k), (int, float)) for k in ("p5", "p95", "min_jaccard")):
        spread = f", 5-95% {values['p5']:.2f}-{values['p95']:.2f}, min {values['min_jaccard']:.2f}"
    pairwise = values.get("pairwise_jaccard")
    among = (
        f"; replicates agree among themselves at {pairwise:.2f}"
        if isinstance(pairwise, (int, float))
        else ""
    )
    return f"{head}{spread}{among}; bar {bar:g}: {meets}"


def _check_n_boot(n_boot: Any) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 2:
        raise ValueError(f"n_boot must be an integer >= 2 (bootstrap replicates), got {n_boot!r}")


def bootstrap_indices(n: int, n_boot: int, seed: int = 0) -> list[torch.Tensor]:
    """``n_boot`` index tensors of ``n`` draws with replacement from ``range(n)`` (seeded;
    the same for the same ``n``, ``n_boot`` and ``seed``, whatever else draws numbers)."""
    gen = torch.Generator().manual_seed(int(seed))
    return [torch.randint(n, (n,), generator=gen) for _ in range(n_boot)]


def bootstrap_samples(data: PruneData, n_boot: int, seed: int = 0) -> list[PruneData]:
    """The replicates' data: training traces resampled with replacement
    (:func:`bootstrap_indices`, every per-trace field with the same index), held-out traces
    and ``info`` as given (``info["bootstrap"]``: the seed and the replicate)."""
    _check_n_boot(n_boot)
    if not isinstance(data, PruneData):
        raise ValueError(f"data must be PruneData, got {type(data).__name__}")
    if len(data.train) < 1:
        raise ValueError("bootstrap stability needs at least one training trace")
    return [
        PruneData(
            data.train.subset(index),
            data.test,
            {**data.info, "bootstrap": {"seed": int(seed), "replicate": b}},
        )  # fmt: skip
        for b, index in enumerate(bootstrap_indices(len(data.train), n_boot, seed))
    ]


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def bootstrap_stability(
    find: Callable[[PruneData], Circuit],
    data: PruneData,
    n_boot: int = 10,
    seed: int = 0,
    *,
    reference: Circuit | None = None,
    quiet: bool = True,
) -> BootstrapStability:
    """Edge Jaccard of ``find``'s circuits on resampled training traces with its circuit on
    ``data`` (module docstring).

    Args:
        find: The circuit finder, ``find(data) -> Circuit`` (deterministic apart from the
            data, or seeded inside: it is called once per replicate).
        data: Training traces (resampled) and held-out traces (kept).
        n_boot: Replicates (at least 2).
        seed: Seed of the resampling.
        reference: The circuit on ``data`` when already found (else ``find(data)``).
        quiet: Silence the replicates' warnings (a replicate's low faithfulness).

    Returns:
        The :class:`BootstrapStability`.

    Raises:
        ValueError: ``n_boot`` not an integer >= 2, ``data`` not PruneData (before any work).
    """
    samples = bootstrap_samples(data, n_boot, seed)
    if reference is None:
        reference = find(data)
    started = time.perf_counter()
    replicates: list[set[Edge]] = []
    for sample in samples:
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore")
            replicates.append(set(find(sample).edges))
    seconds = time.perf_counter() - started
    ref = set(reference.edges)
    jaccards = [jaccard(ref, edges) for edges in replicates]
    pairwise = [jaccard(a, b) for a, b in itertools.combinations(replicates, 2)]
    counts: dict[Edge, int] = dict.fromkeys(sorted(ref), 0)
    for edges in replicates:
        for e in sorted(edges):
            counts[e] = counts.get(e, 0) + 1
    frequency = {e: c / n_boot for e, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))}
    return BootstrapStability(
        mean_jaccard=float(np.mean(jaccards)), pairwise_jaccard=float(np.mean(pairwise)),
        jaccards=tuple(float(j) for j in jaccards), min_jaccard=float(min(jaccards)),
        p5=_percentile(jaccards, 5), p95=_percentile(jaccards, 95), edge_frequency=frequency,
        n_boot=n_boot, seed=int(seed), n_edges_reference=len(ref), seconds=seconds,
    )  # fmt: skip


def method_stability(
    model: nn.Module,
    data: PruneData,
    target: Target,
    method: str,
    n_boot: int = 10,
    seed: int = 0,
    *,
    reference: Circuit | None = None,
    **kwargs: Any,
) -> BootstrapStability:
    """:func:`bootstrap_stability` of :func:`~mechlab.prune.methods.find_circuit` with
    ``method`` (``kwargs``: its settings, e.g. ``n_edges=25`` or ``sparsity=0.95``).

    Example::

        from mechlab.pipelines import checkpoint_prune_data
        from mechlab.prune import method_stability
        ckpt, data = checkpoint_prune_data("examples/checkpoints/recall-cpu/last.pt")
        s = method_stability(ckpt.model, data, "1-after", "eap", n_boot=5, n_edges=25)
        print(s.mean_jaccard, s.meets_bar)
    """
    _check_n_boot(n_boot)
    kwargs.setdefault("progress", False)

    def find(d: PruneData) -> Circuit:
        return find_circuit(model, d, target, method, **kwargs)

    return bootstrap_stability(find, data, n_boot, seed, reference=reference)
