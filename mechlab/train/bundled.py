"""CPU-sized training presets whose checkpoints ship in ``examples/checkpoints``.

The study's presets need ~1e7 examples (days on two CPU cores); ``recall-cpu``
keeps the task's structure (interleaved orthogonal systems, open/close labels,
needle in a haystack) at a size that trains in under an hour on two CPU cores.
How it was chosen (``examples/recall_sweep.py``) is in ``docs/reproduction.md``:
a 3-dimensional state, 2 to 4 systems per trace (uniform), 8 label pairs and a
64-token context made label-based recall learnable within ~6e5 examples.
It keeps the loss it was trained with, averaged over the state dims
(``loss_reduction: mean``), so that ``mechlab train --preset recall-cpu`` reproduces the
bundled checkpoint bit for bit.
"""

from __future__ import annotations

from typing import Any

BUNDLED_PRESETS: dict[str, dict[str, Any]] = {
    # Induction (docs/induction.md): a 2-layer attention-only transformer on 33 tokens,
    # random ones (of 63) and a repeat of 4-16 of them; the induction circuit forms within a
    # few thousand steps.
    "induction-cpu": {
        "task": "induction",
        "task_cfg": {"d_vocab": 64, "n_ctx": 33, "min_repeat": 4, "max_repeat": 16},
        "model": {"arch": "transformer", "d_model": 64, "n_layers": 2, "n_heads": 4,
                  "attn_only": True},
        "batch_size": 64, "lr": 1e-3, "weight_decay": 0.0, "steps": 3000, "warmup_steps": 100,
        "eval_every": 250, "eval_traces": 256, "n_checkpoints": 0, "save_every": 500,
    },
    "recall-cpu": {
        "task_cfg": {
            "d_state": 3, "n_pairs": 8, "n_ctx": 64, "zipf_a": 0.0, "min_systems": 2, "max_systems": 4,
            "cut_rate": 2.0, "max_cuts": 32, "n_train_systems": 40000, "n_test_systems": 1000,
        },
        "model": {"arch": "transformer", "d_model": 72, "n_layers": 3, "n_heads": 6},
        "batch_size": 64, "lr": 1e-3, "steps": 20000, "loss_reduction": "mean",
        "eval_every": 1000, "eval_traces": 500,
        "eval_haystack": 3, "eval_seg_len": 6, "n_checkpoints": 12, "save_every": 500,
    },
}
