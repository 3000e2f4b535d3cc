"""Tasks as the trainer sees them: batches, the loss, and a quick evaluation.

A task turns its own data (e.g. :mod:`mechlab.tasks.lds`) into what one
training step needs and knows which model fields it fixes (input and output
sizes, context length). A task's class here is its entry's trainer in the task registry
(:mod:`mechlab.tasks.registry`, docs/architecture.md "How to add a task").
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from mechlab.evals.induction import head_scores
from mechlab.evals.suites import nih_errors
from mechlab.evals.translation import start_vs_continue
from mechlab.models.base import predict_in_chunks
from mechlab.models.registry import graph_kind
from mechlab.tasks import bilingual, induction
from mechlab.tasks.induction import Sequences
from mechlab.tasks.lds import OBS, OPEN, LDSConfig, make_libraries, sample_batch
from mechlab.tasks.registry import attach_trainer, get_task, task_names
from mechlab.tasks.state_tracking import (
    StateTrackingConfig,
    check_model_vocabulary,
    make_data,
    masked_cross_entropy,
    set_accuracy,
    set_loss,
)
from mechlab.tasks.translation import episodes


class Task(Protocol):
    """What the trainer needs from a task."""

    def model_fields(self) -> dict[str, Any]: ...

    def config_dict(self) -> dict[str, Any]: ...

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]: ...

    def loss(
        self, pred: Tensor, targets: Tensor, mask: Tensor, reduction: str = "mean",
        n_scored: Tensor | None = None,
    ) -> Tensor: ...

    def evaluate(self, model: torch.nn.Module, cfg: Any, generator: torch.Generator) -> dict[str, float]: ...


def masked_mse(
    pred: Tensor,
    targets: Tensor,
    mask: Tensor,
    reduction: str = "mean",
    n_scored: Tensor | None = None,
) -> Tensor:
    """Squared error averaged over the positions where ``mask`` is True (or weighted by it).

    Args:
        pred: ``[batch, pos, d]`` predictions.
        targets: ``[batch, pos, d]`` targets.
        mask: ``[batch, pos]`` True where the target counts, or a float weight per position
            (0 where it does not count; see :func:`target_weight_mask`): each squared error
            is multiplied by its weight and the sum is still divided by the count of
            scored (non-zero) positions.
        reduction: Over the ``d`` dims: ``"mean"`` or ``"sum"`` (the study's, ``d`` times
            larger).
        n_scored: The number of scored positions to divide by (default: the count of
            non-zero ``mask`` entries);
            a micro-batch of an accumulated step passes the whole batch's count, so that
            the micro-batch losses add up to the batch's.

    Returns:
        A scalar: ``sum(mask * ||pred - target||^2) / (n_scored * d)`` (``mean``) or
        ``sum(mask * ||pred - target||^2) / n_scored`` (``sum``).
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"unknown reduction {reduction!r}; choose 'mean' or 'sum'")
    diff = (pred - targets).pow(2)
    sq = diff.mean(-1) if reduction == "mean" else diff.sum(-1)  # [batch, pos]
    n_scored = torch.count_nonzero(mask) if n_scored is None else n_scored
    return (sq * mask).sum() / n_scored.clamp(min=1)


def after_offsets(kind: Tensor) -> Tensor:
    """Each target's place in its segment: ``k`` for the ``k``-th observation after the
    segment's open label (``1``: the one right after it), 0 where the target is not an
    observation.

    Args:
        kind: ``[batch, pos]`` token kinds of the traces (``LDSBatch.kind``).

    Returns:
        ``[batch, pos - 1]`` long, aligned with the targets (target ``i`` is token ``i + 1``).
    """
    pos = torch.arange(kind.shape[1], device=kind.device).expand_as(kind)
    last_open = torch.where(kind == OPEN, pos, torch.full_like(pos, -1)).cummax(dim=1).values
    offset = torch.where((kind == OBS) & (last_open >= 0), pos - last_open, torch.zeros_like(pos))
    return offset[:, 1:]


def target_weight_mask(
    kind: Tensor, mask: Tensor, weights: dict[int, float], norm: str = "none"
) -> Tensor:
    """The loss weight of every target: ``weights[k]`` at a segment's ``k``-th
    observation, 1 at the other observations, 0 where nothing is scored.

    Args:
        kind: ``[batch, pos]`` token kinds.
        mask: ``[batch, pos - 1]`` True where the target is an observation.
        weights: Weight by offset ``k`` (``{1: 4.0}``: the 1-after targets count 4 times).
        norm: ``"none"``, or ``"trace"``: each trace's weights rescaled to sum to its
            count of scored positions.

    Returns:
        ``[batch, pos - 1]`` float32 weights (exactly ``mask`` as 0/1 when every weight is 1).
    """
    offsets = after_offsets(kind)
    w = mask.to(torch.float32)
    for k, value in weights.items():
        w = torch.where(mask & (offsets == k), torch.full_like(w, value), w)
    if norm == "trace":
        count = mask.sum(1, keepdim=True).to(torch.float32)
        w = w * (count / w.sum(1, keepdim=True).clamp(min=1e-12))
    return w


class LDSTask:
    """In-context recall on interleaved linear systems (study B).

    Args:
        overrides: :class:`LDSConfig` fields.
        target_weights: Loss weight by a target's place in its segment (``{1: 4.0}``:
            the observation right after an open label counts 4 times; see
            :func:`target_weight_mask`); the batch's mask then carries the weights.
        target_weight_norm: ``"none"`` or ``"trace"`` (see :func:`target_weight_mask`).

    Raises:
        ValueError: A bad config field, or a weighted offset that no training target
            can have (a segment holds at most ``n_ctx - 3`` observations).
    """

    def __init__(
        self, overrides: dict[str, Any], target_weights: dict[int, float] | None = None,
        target_weight_norm: str = "none",
    ):
        self.cfg = LDSConfig.from_dict(overrides)
        self.target_weights = dict(target_weights or {})
        self.target_weight_norm = target_weight_norm
        longest = self.cfg.n_ctx - 3  # one segment over the whole body: open, n_ctx - 3 observations, close
        for k in self.target_weights:
            if not 1 <= k <= longest:
                raise ValueError(
                    f"no training target is {k}-after: a segment holds at most {longest} observations "
                    f"at n_ctx={self.cfg.n_ctx}; weigh a target k-after with 1 <= k <= {longest}"
                )
        self.train_lib, self.test_lib = make_libraries(self.cfg)

    def model_fields(self) -> dict[str, Any]:
        return {"io": "continuous", "d_in": self.cfg.d_in, "d_out": self.cfg.d_out, "n_ctx": self.cfg.n_ctx}

    def config_dict(self) -> dict[str, Any]:
        return self.cfg.to_dict()

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs, targets and the mask (or, with target weights, the weight of every target)."""
        b = sample_batch(self.cfg, self.train_lib, batch_size, generator)
        if not self.target_weights:
            return b.inputs, b.targets, b.mask
        return b.inputs, b.targets, target_weight_mask(b.kind, b.mask, self.target_weights, self.target_weight_norm)

    def loss(
        self, pred: Tensor, targets: Tensor, mask: Tensor, reduction: str = "mean",
        n_scored: Tensor | None = None,
    ) -> Tensor:
        return masked_mse(pred, targets, mask, reduction, n_scored)

    def evaluate(self, model: torch.nn.Module, cfg: Any, generator: torch.Generator) -> dict[str, float]:
        errs = nih_errors(
            model, self.cfg, self.test_lib, n_traces=cfg.eval_traces, n_haystack=cfg.eval_haystack,
            seg_len=cfg.eval_seg_len, generator=generator,
        )
        out = {f"nih_{k}_after": float(v.median()) for k, v in errs.items()}
        b = sample_batch(self.cfg, self.test_lib, cfg.eval_traces, generator)
        device = next(model.parameters()).device
        pred = model(b.inputs.to(device)).cpu()
        reduction = getattr(cfg, "loss_reduction", "mean")  # the run's own loss, on test systems
        out["test_loss"] = float(masked_mse(pred, b.targets, b.mask, reduction))
        return out


class TokenTask:
    """What the token tasks share: the loss is the cross-entropy per scored token."""

    def loss(
        self, pred: Tensor, targets: Tensor, mask: Tensor, reduction: str = "mean",
        n_scored: Tensor | None = None,
    ) -> Tensor:
        """Cross-entropy per scored token (``reduction`` is for the continuous task; unused)."""
        return masked_cross_entropy(pred, targets, mask, n_scored)


class StateTrackingTask(TokenTask):
    """State tracking on Z_m or S_5 (the induction-bias study): token cross-entropy on the
    scored positions of the task's format (:mod:`mechlab.tasks.state_tracking`)."""

    def __init__(self, overrides: dict[str, Any]):
        self.cfg = StateTrackingConfig.from_dict(overrides)
        if self.cfg.group == "zm":
            check_model_vocabulary(self.cfg.m)  # a model is trained on it: before any data
        self.data = make_data(self.cfg)

    def model_fields(self) -> dict[str, Any]:
        return {"io": "tokens", "d_vocab": self.cfg.d_vocab, "d_vocab_out": self.cfg.d_vocab_out,
                "n_ctx": self.cfg.n_ctx}  # fmt: skip

    def config_dict(self) -> dict[str, Any]:
        return self.cfg.to_dict()

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        return self.data.batch(batch_size, generator)

    def evaluate(self, model: torch.nn.Module, cfg: Any, generator: torch.Generator) -> dict[str, float]:
        """Validation loss (teacher forcing) and accuracy on the whole validation set, and
        accuracy on the first ``cfg.eval_traces`` sequences of the OOD set."""
        device = next(model.parameters()).device
        val = self.data.val.to(device)
        ood = self.data.ood.subset(slice(0, int(cfg.eval_traces))).to(device)
        out = {"val_loss": set_loss(model, self.cfg, val)}
        out.update({f"val_{k}": v for k, v in set_accuracy(model, self.cfg, val).items() if "norm" not in k})
        out.update({f"ood_{k}": v for k, v in set_accuracy(model, self.cfg, ood).items()})
        return out


class InductionTask(TokenTask):
    """Induction on repeated random tokens (:mod:`mechlab.tasks.induction`): token
    cross-entropy on the predictable positions of the repeat."""

    def __init__(self, overrides: dict[str, Any]):
        self.cfg = induction.InductionConfig.from_dict(overrides)
        self.val = induction.validation_set(self.cfg)

    def model_fields(self) -> dict[str, Any]:
        V = self.cfg.d_vocab
        return {"io": "tokens", "d_vocab": V, "d_vocab_out": V, "n_ctx": self.cfg.n_ctx}

    def config_dict(self) -> dict[str, Any]:
        return self.cfg.to_dict()

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        return induction.batch(self.cfg, batch_size, generator)

    def evaluate(self, model: torch.nn.Module, cfg: Any, generator: torch.Generator) -> dict[str, float]:
        """Loss and accuracy on the fixed validation set; for a transformer, the best
        previous-token score in layer 0 and induction score in the last layer
        (:mod:`mechlab.evals.induction`, on ``cfg.eval_traces`` validation sequences)."""
        device = next(model.parameters()).device
        inputs, targets, mask = (t.to(device) for t in (self.val.tokens, self.val.targets, self.val.scored))
        logits = predict_in_chunks(model, inputs)
        out = {
            "val_loss": float(masked_cross_entropy(logits, targets, mask)),
            "val_accuracy": float((logits.argmax(-1) == targets)[mask].float().mean()),
        }
        if graph_kind(getattr(model.cfg, "arch", None)) == "transformer" and model.cfg.n_layers >= 2:
            few = Sequences(self.val.tokens[: int(cfg.eval_traces)], self.val.first_len[: int(cfg.eval_traces)])
            scores = head_scores(model, self.cfg, sequences=few)
            out["previous_token_score"] = scores.top("previous_token", 0)[1]
            out["induction_score"] = scores.top("induction", model.cfg.n_layers - 1)[1]
        return out


class BilingualTask(TokenTask):
    """A token language model on the synthetic bilingual corpus (:mod:`mechlab.tasks.bilingual`):
    token cross-entropy on every next token."""

    def __init__(self, overrides: dict[str, Any]):
        self.cfg = bilingual.BilingualConfig.from_dict(overrides)
        self.vocab = bilingual.vocabulary(self.cfg)
        self.val = bilingual.validation_set(self.cfg, self.vocab)

    def model_fields(self) -> dict[str, Any]:
        V = len(self.vocab.tokens)
        return {"io": "tokens", "d_vocab": V, "d_vocab_out": V, "n_ctx": self.cfg.n_ctx}

    def config_dict(self) -> dict[str, Any]:
        return self.cfg.to_dict()

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        return bilingual.batch(self.cfg, self.vocab, batch_size, generator)

    def evaluate(self, model: torch.nn.Module, cfg: Any, generator: torch.Generator) -> dict[str, float]:
        """Loss and next-token accuracy on the fixed validation set; start and continue
        accuracy (:func:`mechlab.evals.translation.start_vs_continue`) on
        ``cfg.eval_traces`` translation prompts per label kind."""
        device = next(model.parameters()).device
        val = self.val.to(device)
        logits = predict_in_chunks(model, val[:, :-1])
        mask = torch.ones_like(val[:, 1:], dtype=torch.bool)
        out = {"val_loss": float(masked_cross_entropy(logits, val[:, 1:], mask)),
               "val_accuracy": float((logits.argmax(-1) == val[:, 1:]).float().mean())}  # fmt: skip
        tok = bilingual.tokenizer(self.vocab)
        n = int(cfg.eval_traces)
        prompts = {kind: episodes(self.vocab.words, tok, n=n, kind=kind, k=min(4, self.cfg.max_k),
                                  n_query=min(3, self.cfg.max_query), seed=i)
                   for i, kind in enumerate(("symbolic", "semantic"))}  # fmt: skip
        report = start_vs_continue(model, prompts, n_boot=1)
        for kind, metrics in report.items():
            for pos in ("start", "continue"):
                out[f"{kind}_{pos}_acc"] = metrics[f"{pos}_acc"]["mean"]
        return out


for _name, _cls in (("lds", LDSTask), ("state_tracking", StateTrackingTask), ("induction", InductionTask),
                   ("bilingual", BilingualTask)):  # fmt: skip
    attach_trainer(_name, _cls)  # the task registry (mechlab.tasks.registry) holds every task's trainer
del _name, _cls

TASK_CLASSES = {name: get_task(name).trainer for name in task_names()}
"""The built-in tasks' trainer classes (a task registered later is found through the registry)."""


def make_task(name: str, overrides: dict[str, Any], **options: Any) -> Task:
    """Build the task ``name`` with config ``overrides``.

    Args:
        name: ``lds``, ``state_tracking`` or ``induction``.
        overrides: The task config's fields.
        **options: Loss options of the task (``lds``: ``target_weights``,
            ``target_weight_norm``; see :class:`LDSTask`).

    Raises:
        ValueError: Unknown task or config field.
    """
    trainable = sorted(n for n in task_names() if get_task(n).trainer is not None)
    if name not in trainable:
        raise ValueError(f"unknown task {name!r}; choose one of {trainable}")
    return get_task(name).trainer(overrides, **options)
