"""Circuit stability on a model you bring: a Hugging Face GPT-2 trained here, its prompt pairs.

The published stability bar (a circuit's edges kept at a mean bootstrap Jaccard of 0.8 or
more over resampled data) is measured on mechlab's own checkpoints by ``mechlab bench
methods``. This script measures it where a researcher meets it: a model made by another
library, imported from its ``save_pretrained`` folder, pruned on prompt pairs.

1. **The model** (``tiny-gpt2/``, kept once trained): a 2-layer Hugging Face
   ``GPT2LMHeadModel`` (d 32, 4 heads, 36 k parameters) trained with a plain PyTorch loop
   (no mechlab code in the model or the loop) on the synthetic bilingual corpus of
   :mod:`mechlab.tasks.bilingual`, saved with its word-level tokenizer.
2. **The pairs**: the label-swapped prompt pairs of the translation test
   (:mod:`mechlab.tasks.translation_pairs`), 64 per target, for the two positions where the
   model has the behaviour (its accuracy on the clean prompts is printed and recorded):
   continuing a translation under a symbolic label, and starting one under a semantic label.
3. **The circuits and their stability**: for each method (the default search, EAP, EAP-IG,
   exact single-edge ablation) and pruning seed, ``mechlab prune --model tiny-gpt2 --pairs
   pairs/<target>.jsonl --method M --sparsity S --seed k --stability 10``, at sparsity 0.9 and
   0.95
   (:func:`mechlab.pipelines.prune_prompts`): each circuit's mean Jaccard with the same
   method's circuits on 10 resamples of its 32 training pairs, and its held-out
   faithfulness. ``stability.json`` holds the table; docs/pruning.md quotes it.

    python examples/imported/run.py              # what exists is read back (resumed); git
                                                 # tracks the outputs here: use a flag below
    python examples/imported/run.py --recompute  # keep the model, recompute the circuits
    python examples/imported/run.py --force      # retrain and recompute everything

One torch thread throughout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
HERE = Path("examples") / "imported"  # relative to ROOT: no machine's path in the outputs
MODEL = HERE / "tiny-gpt2"
CORPUS = {"n_words": 40, "episode_share": 0.9, "symbolic_share": 0.7, "max_segments": 3}
NET = {"n_embd": 32, "n_layer": 2, "n_head": 4}
STEPS, BATCH, LR, WARMUP, SEED = 4000, 32, 3e-3, 100, 0
TARGETS = {"continue": "symbolic", "start": "semantic"}  # target -> the labels its pairs use
METHODS = ("prune", "eap", "eap-ig", "exact")
SEEDS = (0, 1, 2)
N_PAIRS, SPARSITIES, BOOTS = 64, (0.9, 0.95), 10


def train(force: bool) -> float | None:
    """Train the Hugging Face model into ``tiny-gpt2/`` (kept when it exists, unless
    ``force``); the seconds it took."""
    import transformers as T

    from mechlab.tasks import bilingual

    if (MODEL / "config.json").is_file() and not force:
        print(f"kept {MODEL} (pass --force to retrain)")
        return None
    cfg = bilingual.BilingualConfig.from_dict(CORPUS)
    vocab = bilingual.vocabulary(cfg)
    torch.manual_seed(SEED)
    config = T.GPT2Config(vocab_size=len(vocab.tokens), n_positions=cfg.n_ctx, resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, **NET)  # fmt: skip
    model = T.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / WARMUP))
    gen = torch.Generator().manual_seed(SEED)
    start = time.perf_counter()
    for step in range(STEPS):
        inputs, targets, _ = bilingual.batch(cfg, vocab, BATCH, gen)
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 500 == 0 or step == STEPS - 1:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    seconds = time.perf_counter() - start
    if MODEL.exists():
        shutil.rmtree(MODEL)
    model.save_pretrained(MODEL)
    bilingual.tokenizer(vocab).save_pretrained(MODEL)
    bilingual.write_word_list(vocab, MODEL / "words.tsv")
    (MODEL / "train.json").write_text(json.dumps({"library": f"transformers {T.__version__}", "steps": STEPS,
                                                  "batch": BATCH, "lr": LR, "seconds_one_thread": round(seconds, 1),
                                                  "final_loss": round(loss.item(), 4)}, indent=1) + "\n")  # fmt: skip
    print(f"trained {STEPS} steps in {seconds:.0f} s")
    return seconds


def write_pairs(force: bool) -> dict[str, Path]:
    """The label-swapped pairs of each target, as the translation test writes them."""
    from mechlab.pipelines import outputs
    from mechlab.tasks.prompts import load_tokenizer
    from mechlab.tasks.translation import load_words, usable_words
    from mechlab.tasks.translation_pairs import pair_records

    tok = load_tokenizer(MODEL)
    words, _ = usable_words(load_words(MODEL / "words.tsv"), tok)
    files = {}
    for target, kind in TARGETS.items():
        path = HERE / "pairs" / f"{target}.jsonl"
        records = pair_records(words, tok, target, kind=kind, n=N_PAIRS, seed=0)
        text = "".join(json.dumps(r) + "\n" for r in records)
        if not path.is_file() or force:
            outputs.write_text(path, text)
        elif path.read_text() != text:
            raise SystemExit(f"{path} holds other pairs; pass --force to replace them")
        files[target] = path
    return files


def clean_accuracy(pairs: Path) -> float:
    """Share of the clean prompts on which the model ranks the answer above the wrong token."""
    from mechlab.models.importers import from_pretrained
    from mechlab.tasks.prompts import load_pairs

    found = load_pairs(pairs, MODEL)
    model = from_pretrained(MODEL).eval()
    with torch.no_grad():
        logits = model(found.clean)[torch.arange(len(found)), found.position]
    return float((found.logit_difference(logits) > 0).float().mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="Retrain and recompute what exists.")
    parser.add_argument("--recompute", action="store_true", help="Keep the model; recompute the circuits.")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.chdir(ROOT)
    from mechlab.pipelines import prune_prompts

    if train(args.force) is not None:
        shutil.rmtree(HERE / "circuits", ignore_errors=True)
    redo = args.force or args.recompute
    rows, behaviour = [], {}
    for target, pairs in write_pairs(args.force).items():
        behaviour[target] = clean_accuracy(pairs)
        print(f"{target} ({TARGETS[target]} labels): clean accuracy {behaviour[target]:.3f}")
        for sparsity, method in itertools.product(SPARSITIES, METHODS):
            started = time.perf_counter()
            out = HERE / "circuits" / target / f"sparsity-{sparsity}"
            run = prune_prompts(MODEL, pairs, SEEDS, out, method=method, sparsity=sparsity, stability=BOOTS,
                                force=redo, **({"progress": False} if method == "prune" else {}))  # fmt: skip
            for circuit in run.circuits:
                meta = circuit.metadata
                rows.append({"target": target, "sparsity": sparsity, "method": method, "seed": meta["seed"],
                             "edges": circuit.n_edges, "edges_countable": meta.get("n_edges_countable"),
                             "faithfulness": meta["metrics"]["faithfulness"],
                             "logit_diff_recovered": meta["metrics"].get("logit_diff_recovered"),
                             "stability": meta["stability"]["mean_jaccard"],
                             "stability_p5": meta["stability"]["p5"]})  # fmt: skip
            mine = [r for r in rows if (r["target"], r["sparsity"], r["method"]) == (target, sparsity, method)]
            print(f"  {sparsity} {method}: {mine[0]['edges']} edges, stability {statistics.mean(r['stability'] for r in mine):.3f}, faithfulness "
                  f"{statistics.mean(r['faithfulness'] for r in mine):.3f} ({time.perf_counter() - started:.0f} s)")  # fmt: skip
    summary = {}
    for t, s, m in itertools.product(TARGETS, SPARSITIES, METHODS):
        mine = [r for r in rows if (r["target"], r["sparsity"], r["method"]) == (t, s, m)]
        summary[f"{t} {s} {m}"] = {key: statistics.mean(r[key] for r in mine)
                                   for key in ("edges", "faithfulness", "stability", "stability_p5")}  # fmt: skip
    table = {"model": str(MODEL), "pairs_per_target": N_PAIRS, "sparsities": list(SPARSITIES),
             "bootstrap_replicates": BOOTS, "seeds": list(SEEDS), "clean_accuracy": behaviour, "bar": 0.8,
             "summary": summary, "circuits": rows}  # fmt: skip
    from mechlab.pipelines import outputs

    outputs.write_text(HERE / "stability.json", json.dumps(table, indent=1) + "\n")
    print(f"wrote {HERE / 'stability.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
