"""Tasks as the trainer sees them: batches, the loss, and a quick evaluation.

A task turns its own data (e.g. :mod:`mechlab.tasks.lds`) into what one
training step needs and knows which model fields it fixes (input and output
sizes, context length). Adding a task means adding one class here.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from mechlab.models.base import predict_in_chunks
from mechlab.tasks import induction
from mechlab.tasks.lds import LDSConfig, make_libraries, sample_batch
from mechlab.tasks.state_tracking import (
    StateTrackingConfig,
    make_data,
    masked_cross_entropy,
    set_accuracy,
    set_loss,
)


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
    """Squared error averaged over the positions where ``mask`` is True.

    Args:
        pred: ``[batch, pos, d]`` predictions.
        targets: ``[batch, pos, d]`` targets.
        mask: ``[batch, pos]`` True where the target counts.
        reduction: Over the ``d`` dims: ``"mean"`` or ``"sum"`` (the study's, ``d`` times
            larger).
        n_scored: The number of scored positions to divide by (default ``mask.sum()``);
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
    n_scored = mask.sum() if n_scored is None else n_scored
    return (sq * mask).sum() / n_scored.clamp(min=1)


class LDSTask:
    """In-context recall on interleaved linear systems (study B)."""

    def __init__(self, overrides: dict[str, Any]):
        self.cfg = LDSConfig.from_dict(overrides)
        self.train_lib, self.test_lib = make_libraries(self.cfg)

    def model_fields(self) -> dict[str, Any]:
        return {"io": "continuous", "d_in": self.cfg.d_in, "d_out": self.cfg.d_out, "n_ctx": self.cfg.n_ctx}

    def config_dict(self) -> dict[str, Any]:
        return self.cfg.to_dict()

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        b = sample_batch(self.cfg, self.train_lib, batch_size, generator)
        return b.inputs, b.targets, b.mask

    def loss(
        self, pred: Tensor, targets: Tensor, mask: Tensor, reduction: str = "mean",
        n_scored: Tensor | None = None,
    ) -> Tensor:
        return masked_mse(pred, targets, mask, reduction, n_scored)

    def evaluate(self, model: torch.nn.Module, cfg: Any, generator: torch.Generator) -> dict[str, float]:
        from mechlab.evals.suites import nih_errors

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
        if getattr(model.cfg, "arch", None) == "transformer" and model.cfg.n_layers >= 2:
            from mechlab.evals.induction import head_scores
            from mechlab.tasks.induction import Sequences

            few = Sequences(self.val.tokens[: int(cfg.eval_traces)], self.val.first_len[: int(cfg.eval_traces)])
            scores = head_scores(model, self.cfg, sequences=few)
            out["previous_token_score"] = scores.top("previous_token", 0)[1]
            out["induction_score"] = scores.top("induction", model.cfg.n_layers - 1)[1]
        return out


TASK_CLASSES = {"lds": LDSTask, "state_tracking": StateTrackingTask, "induction": InductionTask}


def make_task(name: str, overrides: dict[str, Any]) -> Task:
    """Build the task ``name`` with config ``overrides``.

    Raises:
        ValueError: Unknown task or config field.
    """
    if name not in TASK_CLASSES:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASK_CLASSES)}")
    return TASK_CLASSES[name](overrides)
