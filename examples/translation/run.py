"""The translation test on a tiny language model trained here: regenerates examples/translation/.

Trains a small transformer (mechlab's trainer, task ``bilingual``: the synthetic bilingual
corpus of :mod:`mechlab.tasks.bilingual`) with a checkpoint every ``EVERY`` steps, writes
its tokenizer and word list beside the checkpoints, then runs the whole pipeline on them:
start vs continue across the checkpoints (``across/``: per-step JSON, ``across.json``,
``across.html``, copied to ``examples/figures/translation-across.html`` where plotly.js is
committed) and the circuits of the start and continue positions on the final
checkpoint with their overlap against the null models, on symbolic and on semantic labels
(``circuits/symbolic/``, ``circuits/semantic/``).

    python examples/translation/run.py            # what exists is kept (resumed); in this
                                                  # repository git tracks the outputs, so it
                                                  # refuses to write there: use a flag below
    python examples/translation/run.py --force    # retrain and recompute everything (and
                                                  # write where git tracks the outputs)
    python examples/translation/run.py --recompute  # keep the model, recompute its results
                                                    # (after a change to the pipeline)

One torch thread throughout (the timing in docs/reproduction.md is for one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
# relative to ROOT, where the script runs: no machine's path in the outputs
HERE = Path("examples") / "translation"
MODEL = HERE / "tiny"
TASK = {"n_words": 40, "episode_share": 0.9, "symbolic_share": 0.7, "max_segments": 3}
NET = {"arch": "transformer", "d_model": 32, "n_layers": 2, "n_heads": 4}
STEPS, EVERY = 8000, 1000
TRAIN = {"steps": STEPS, "batch_size": 32, "lr": 3e-3, "warmup_steps": 100, "loss_reduction": "mean",
         "eval_every": 1000, "eval_traces": 64, "n_checkpoints": 10, "checkpoint_every": EVERY,
         "save_every": STEPS, "log_every": 100, "seed": 0}  # fmt: skip
THRESHOLD = 0.8  # two target languages: 0.5 is what a model that knows the dictionary but not the language gets
ACROSS = {"n_prompts": 128, "k": 4, "n_query": 3, "threshold": THRESHOLD, "n_boot": 1000, "seed": 0}
CIRCUITS = {"n_pairs": 64, "k": 4, "n_query": 3, "seeds": (0, 1, 2), "methods": ("prune", "eap-ig"),
            "sparsity": 0.9, "n_boot": 1000, "n_null": 200, "seed": 0, "progress": False}  # fmt: skip


def train(force: bool) -> float | None:
    """Train the model into ``tiny/`` (kept when it exists, unless ``force``); its seconds."""
    from mechlab.tasks import bilingual
    from mechlab.train.config import TrainConfig
    from mechlab.train.trainer import train as run

    if (MODEL / "checkpoints").is_dir() and not force:
        print(f"kept {MODEL} (pass --force to retrain)")
        return None
    if MODEL.exists():
        shutil.rmtree(MODEL)
    cfg = TrainConfig(task="bilingual", task_cfg=TASK, model=NET, **TRAIN)
    start = time.perf_counter()
    result = run(cfg, MODEL, progress=False)
    seconds = time.perf_counter() - start
    (
        MODEL / "last.pt"
    ).unlink()  # a copy of the last step's weights, with the optimiser: only for --resume
    vocab = bilingual.vocabulary(bilingual.BilingualConfig.from_dict(TASK))
    bilingual.tokenizer(vocab).save_pretrained(MODEL / "checkpoints")
    bilingual.write_word_list(vocab, MODEL / "words.tsv")
    (MODEL / "train.json").write_text(json.dumps({"seconds_one_thread": round(seconds, 1), "steps": result.step,
                                                  "final_eval": result.final_eval}, indent=1) + "\n")  # fmt: skip
    print(f"trained {result.step} steps in {seconds:.0f} s: {result.final_eval}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="Retrain and recompute what exists.")
    parser.add_argument("--recompute", action="store_true", help="Keep the trained model; recompute its results.")
    args = parser.parse_args(argv)
    redo = args.force or args.recompute
    torch.set_num_threads(1)
    os.chdir(ROOT)
    from mechlab.pipelines import translation_across_training, translation_circuits

    if train(args.force) is not None:  # new weights: the results of the old ones go
        for old in (HERE / "across", HERE / "circuits"):
            shutil.rmtree(old, ignore_errors=True)
    words = MODEL / "words.tsv"
    summary = translation_across_training(MODEL / "checkpoints", HERE / "across", words=words, force=redo,
                                          **ACROSS,
                                          on_checkpoint=lambda s, how: print(f"step {s}: {how}"))  # fmt: skip
    print(summary["verdict"])
    figure = (
        Path("examples") / "figures" / "translation-across.html"
    )  # beside the committed plotly.min.js
    page = (HERE / "across" / "across.html").read_text(encoding="utf-8")
    if figure.is_file() and figure.read_text(encoding="utf-8") != page and not redo:
        raise SystemExit(f"{figure} holds another figure; pass --force to replace it")
    figure.write_text(page, encoding="utf-8")
    final = MODEL / "checkpoints" / f"step_{STEPS:07d}.pt"
    for kind in ("symbolic", "semantic"):
        report = translation_circuits(final, HERE / "circuits" / kind, words=words, kind=kind, force=redo,
                                      **CIRCUITS, on_circuit=lambda stem: print(f"circuit {stem}"))  # fmt: skip
        for method, entry in report["overlap"].items():
            pair = entry["across"]["start vs continue"]
            print(f"{kind} {method}: Jaccard {pair['jaccard_observed']:.3f}, uniform null "
                  f"{pair['null_uniform']['mc_mean']:.3f}, degree null {pair['null_degree']['mc_mean']:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
