# %% [markdown]
# # Starting vs continuing a translation, across training
#
# The recall study's natural-language test: in-context word translation named by a label.
# Does *starting* a translation from a symbolic label (`X:`, whose meaning only the prompt's
# examples give) emerge later in training than *continuing* one, while with a semantic label
# (`Veltish:`) the two emerge together? Here on the tiny language model of
# `examples/translation/` (trained by `python examples/translation/run.py` on a synthetic
# bilingual corpus, checkpoints every 500 steps); the same calls take a folder of OLMo,
# OLMo 2 or Pythia revisions.

# %%
import json
import tempfile
from pathlib import Path

import torch

import mechlab
from mechlab.evals.translation import start_vs_continue
from mechlab.tasks.prompts import load_tokenizer
from mechlab.tasks.translation import episodes, load_words, usable_words
from mechlab.viz.translation import translation_figure

torch.set_num_threads(2)
mechlab.viz.notebook_renderers()  # figures stay visible in the saved notebook (PNG: kaleido)
ROOT = next(
    p for p in (Path.cwd(), *Path.cwd().parents) if (p / "examples" / "translation").is_dir()
)
HERE = ROOT / "examples" / "translation"
CHECKPOINTS = HERE / "tiny" / "checkpoints"
tok = load_tokenizer(CHECKPOINTS)
words, dropped = usable_words(load_words(HERE / "tiny" / "words.tsv"), tok)
print(f"{len(words.entries)} dictionary entries ({words.languages}), {len(dropped)} dropped")

# %% [markdown]
# One prompt of each label kind: an example segment per language, then the query segment
# under one of the labels. Its first answer is the *start*, the later ones *continue*.

# %%
prompts = {
    kind: episodes(words, tok, n=32, kind=kind, k=4, n_query=3, seed=1)
    for kind in ("symbolic", "semantic")
}
for kind, eps in prompts.items():
    print(f"{kind}: {eps[0].text!r}")

# %% [markdown]
# The final checkpoint: top-1 accuracy of the answer's token at the start and at the
# continuation, with 95% bootstrap intervals over the 32 prompts.

# %%
final = sorted(CHECKPOINTS.glob("step_*.pt"))[-1]
model = mechlab.load_checkpoint(final).model
report = start_vs_continue(model, prompts, n_boot=200)
for kind, metrics in report.items():
    for pos in ("start", "continue"):
        a = metrics[f"{pos}_acc"]
        print(
            f"{final.stem} {kind:9s} {pos:8s} accuracy {a['mean']:.2f} [{a['low']:.2f}, {a['high']:.2f}]"
        )

# %% [markdown]
# Across training: every fourth checkpoint scored here into a temporary folder (the
# committed run, `examples/translation/across/`, scores all of them with 128 prompts).
# A curve emerges at the first step whose accuracy reaches the threshold; the verdict
# compares the emergence intervals.

# %%
few = sorted(CHECKPOINTS.glob("step_*.pt"))[::4]
with tempfile.TemporaryDirectory() as out:
    summary = mechlab.pipelines.translation_across_training(
        few, Path(out) / "across", words=words, n_prompts=16, threshold=0.8, n_boot=100
    )
print(summary["verdict"])

# %%
committed = json.loads((HERE / "across" / "across.json").read_text())
print(committed["verdict"])
translation_figure(committed)

# %% [markdown]
# The circuits of the two positions (label-swapped prompt pairs, `mechlab translation
# circuits`), committed in `examples/translation/circuits/`: how much the start's and the
# continuation's circuits share, against random circuits of the same sizes, and how much
# the label swap moves each position's logit difference at all.

# %%
for kind in ("symbolic", "semantic"):
    overlap = json.loads((HERE / "circuits" / kind / "overlap.json").read_text())
    for method, entry in overlap["overlap"].items():
        pair = entry["across"]["start vs continue"]
        diffs = {
            t: [round(m["logit_diff_full"], 2) for m in entry["metrics"][t]]
            for t in ("start", "continue")
        }
        print(
            f"{kind} {method}: Jaccard {pair['jaccard_observed']:.3f} (uniform null "
            f"{pair['null_uniform']['mc_mean']:.3f}); full model's logit differences {diffs}"
        )
