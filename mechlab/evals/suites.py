"""Evaluations of a model trained on interleaved linear systems.

Suites (``mechlab eval --suite ...``):

* ``uninterleaved``: one system, one long segment; the model's squared error per
  observation next to the least-squares (pseudoinverse) predictor's.
* ``nih``: needle in a haystack; errors at offsets 1, 2, 3, 7, 8 after the query label.
* ``ood``: the four out-of-distribution probes of the recall mechanism, each scored like
  ``nih`` (see :func:`mechlab.tasks.lds_evals.needle_in_haystack`).
* ``dynamics``: every checkpoint of a run through ``nih``: error vs examples seen (a run
  of checkpoints: :func:`mechlab.pipelines.eval_dynamics` opens them).

Errors are squared errors summed over the state dims (the zero predictor scores 1);
a summary gives the median over traces and the quartiles. With ``trials=K`` the NiH and
OOD suites aggregate as the study does (:func:`summarize_per_example`): ``n_traces``
examples (draws of test systems, labels and query), each with ``K`` initial-state trials;
the median over each example's trials, then the median and quartiles across examples.

This module computes on a model and a task config; it opens no checkpoint
(:func:`mechlab.pipelines.run_suite` does, and defaults the haystack to the run's
evaluation setting). The haystack defaults of every function here are
:func:`mechlab.tasks.nih.default_haystack`'s, the one source of them (the study's 7
systems of 10 observations, shrunk to fit ``n_ctx`` and ``n_pairs``).

``protocol`` picks the NiH construction (:data:`mechlab.tasks.lds_evals.NIH_PROTOCOLS`):
``"study"`` (the default: oldest system queried, misdirection to the next, as in the
study's code) or ``"uniform"`` (query and misdirection drawn uniformly).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mechlab.models.base import predict_in_chunks
from mechlab.progress import tqdm
from mechlab.tasks.lds import LDSConfig, SystemLibrary
from mechlab.tasks.lds_evals import (
    PROBES,
    EvalTraces,
    least_squares_predict,
    needle_in_haystack,
    nih_protocol,
    uninterleaved,
)
from mechlab.tasks.nih import default_haystack

SUITES = ("uninterleaved", "nih", "ood", "dynamics")


def _haystack(cfg: LDSConfig, n_haystack: int | None, seg_len: int | None) -> tuple[int, int]:
    """``(n_haystack, seg_len)``: the given ones, else :func:`default_haystack`'s."""
    default_n, default_s = default_haystack(cfg)
    return (default_n if n_haystack is None else n_haystack, default_s if seg_len is None else seg_len)


def _predict(model: torch.nn.Module, traces: EvalTraces, batch_size: int = 256) -> Tensor:
    """The model's output on the traces' inputs, in chunks, on the model's device (CPU result)."""
    was_training = model.training
    model.eval()
    try:
        return predict_in_chunks(model, traces.batch.inputs.float(), batch_size).float().cpu()
    finally:
        model.train(was_training)


def summarize(errors: Tensor) -> dict[str, float]:
    """Median and quartiles of per-trace errors (``[n_traces]``)."""
    q = torch.quantile(errors.double(), torch.tensor([0.25, 0.5, 0.75], dtype=torch.double))
    return {"median": float(q[1]), "q1": float(q[0]), "q3": float(q[2]), "mean": float(errors.double().mean())}


def summarize_per_example(errors: Tensor, trials: int) -> dict[str, float]:
    """The study's aggregation: median over each example's trials, then across examples.

    Args:
        errors: ``[n_examples * trials]`` per-trace errors, each example's trials
            consecutive (as :func:`~mechlab.tasks.lds_evals.needle_in_haystack` with
            ``trials`` lays them out).
        trials: Initial-state trials per example.

    Returns:
        ``median``, ``q1``, ``q3`` and ``mean`` of the per-example medians, plus
        ``n_examples`` and ``trials``.
    """
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1 or errors.numel() % trials:
        raise ValueError(f"trials must be a positive integer dividing the {errors.numel()} errors, got {trials!r}")
    # torch.median takes the lower middle value; the study's median (numpy) averages the two.
    per_example = errors.double().reshape(-1, trials).quantile(0.5, dim=1)  # [n_examples]
    return {**summarize(per_example), "n_examples": per_example.numel(), "trials": trials}


def _summarize(errors: Tensor, trials: int | None) -> dict[str, float]:
    return summarize(errors) if trials is None else summarize_per_example(errors, trials)


def nih_errors(
    model: torch.nn.Module,
    cfg: LDSConfig,
    library: SystemLibrary,
    n_traces: int = 1000,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    generator: torch.Generator | None = None,
    probe: str | None = None,
    protocol: str = "study",
    trials: int = 1,
) -> dict[int, Tensor]:
    """Needle-in-a-haystack errors per offset after the query label.

    Args:
        model: A continuous-mode model of the task's ``d_in``/``d_out``.
        cfg: Task config.
        library: Systems to draw from (the test library).
        n_traces: Traces.
        n_haystack: Haystack systems (1..n_pairs-1); default
            :func:`~mechlab.tasks.nih.default_haystack`'s.
        seg_len: Observations per haystack segment; default as ``n_haystack``.
        generator: Source of randomness (fixed seed for comparable numbers).
        probe: One of the out-of-distribution probes, or None.
        protocol: NiH construction, ``"uniform"`` or ``"study"``.
        trials: Initial-state trials per example (``n_traces`` is then ``n_examples *
            trials``, each example's trials consecutive).

    Returns:
        Offset (1, 2, 3, 7, 8; those that fit ``seg_len``) -> ``[n_traces]`` squared errors.
    """
    n_haystack, seg_len = _haystack(cfg, n_haystack, seg_len)
    offsets = tuple(j for j in (1, 2, 3, 7, 8) if j <= seg_len)
    traces = needle_in_haystack(
        cfg, library, n_traces, n_haystack=n_haystack, seg_len=seg_len, generator=generator,
        probe=probe, offsets=offsets, trials=trials, **nih_protocol(protocol),
    )
    n_tokens = traces.batch.tokens.shape[1]
    if n_tokens - 1 > getattr(getattr(model, "cfg", None), "n_ctx", n_tokens):
        raise ValueError(
            f"a haystack of {n_haystack} segments of {seg_len} needs {n_tokens - 1} positions, "
            f"more than the model's n_ctx={model.cfg.n_ctx}; use a smaller --haystack"
        )
    errs = traces.errors(_predict(model, traces))  # [n_traces, n_offsets]
    return {j: errs[:, i] for i, j in enumerate(traces.offsets)}


def uninterleaved_errors(
    model: torch.nn.Module,
    cfg: LDSConfig,
    library: SystemLibrary,
    n_traces: int = 200,
    n_obs: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Model and least-squares errors on single uninterleaved segments.

    Returns:
        ``(model_errors, lstsq_errors)``, each ``[n_traces, n_obs]``: the squared error of
        the prediction of observation ``j`` (1-based column ``j - 1``) from the ``j - 1``
        before it.
    """
    traces = uninterleaved(cfg, library, n_traces, n_obs=n_obs, generator=generator)
    model_err = traces.errors(_predict(model, traces))
    obs = traces.targets  # [n_traces, n_obs, d]
    lstsq_err = (least_squares_predict(obs) - obs).pow(2).sum(-1)
    return model_err, lstsq_err


def evaluate_model(
    model: torch.nn.Module,
    cfg: LDSConfig,
    library: SystemLibrary,
    suite: str,
    n_traces: int = 1000,
    n_haystack: int | None = None,
    seg_len: int | None = None,
    seed: int = 0,
    protocol: str = "study",
    trials: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run one suite (not ``dynamics``) on a model; returns a JSON-ready dict.

    Args:
        model: The model.
        cfg: Task config.
        library: Systems (the test library).
        suite: ``nih``, ``ood`` or ``uninterleaved``.
        n_traces: Traces; with ``trials``, examples (each of ``trials`` traces).
        n_haystack: Haystack systems (default :func:`~mechlab.tasks.nih.default_haystack`'s).
        seg_len: Observations per segment (default as ``n_haystack``).
        seed: Seed of the traces.
        protocol: NiH construction (``nih``/``ood``): ``"uniform"`` or ``"study"``.
        trials: None (median and quartiles over traces) or initial-state trials per
            example (``nih``/``ood``: :func:`summarize_per_example`).
        progress: Show a bar over ``ood``'s runs (the clean traces, then each probe's).
    """
    g = torch.Generator().manual_seed(seed)
    nih_protocol(protocol)  # validate before any work
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
        raise ValueError(f"trials must be a positive integer or None, got {trials!r}")
    n_total = n_traces * (trials or 1)
    n_haystack, seg_len = _haystack(cfg, n_haystack, seg_len)
    head = {"n_haystack": n_haystack, "seg_len": seg_len, "n_traces": n_traces}
    head["protocol"] = protocol
    if trials is not None:
        head["trials"] = trials
    if suite == "nih":
        errs = nih_errors(model, cfg, library, n_total, n_haystack, seg_len, g, protocol=protocol,
                          trials=trials or 1)
        return {**head, "offsets": {str(j): _summarize(e, trials) for j, e in errs.items()}}
    if suite == "ood":
        out: dict[str, Any] = {**head, "probes": {}}
        desc = f"ood: clean and {len(PROBES)} probes, {n_total} traces"
        for probe in tqdm((None, *PROBES), disable=not progress, desc=desc, unit="run"):
            # The same generator seed for every probe: the traces differ only by the probe.
            errs = nih_errors(model, cfg, library, n_total, n_haystack, seg_len,
                              torch.Generator().manual_seed(seed), probe=probe, protocol=protocol,
                              trials=trials or 1)
            out["probes"][probe or "clean"] = {str(j): _summarize(e, trials) for j, e in errs.items()}
        return out
    if suite == "uninterleaved":
        if trials is not None:
            raise ValueError("trials (per-example aggregation) applies to the nih and ood suites, not 'uninterleaved'")
        model_err, ls_err = uninterleaved_errors(model, cfg, library, min(n_traces, 500), generator=g)
        return {
            "n_traces": model_err.shape[0],
            "model_median": model_err.median(0).values.tolist(),
            "lstsq_median": ls_err.median(0).values.tolist(),
            "model_q1": model_err.quantile(0.25, dim=0).tolist(),
            "model_q3": model_err.quantile(0.75, dim=0).tolist(),
        }
    raise ValueError(f"unknown suite {suite!r}; choose one of {list(SUITES)}")
