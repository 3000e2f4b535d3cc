# %% [markdown]
# # Label- or observation-based recall?
#
# After the query label, is each prediction made from the label (which system it names)
# or from the observations that follow it? `mechlab.recall_analysis` patches the label
# token and the first observation separately and scores each offset: `label`,
# `observation`, `mixed` or `neither`.

# %%
from pathlib import Path

import pandas as pd
import torch

import mechlab
from mechlab.viz import recall_figure

torch.set_num_threads(2)
mechlab.viz.notebook_renderers()  # figures stay visible in the saved notebook (PNG: kaleido)
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "examples" / "checkpoints").is_dir())
ckpt = mechlab.load_checkpoint(ROOT / "examples" / "checkpoints" / "recall-cpu" / "last.pt")

report = mechlab.recall_analysis(ckpt, n_traces=128, components=False, progress=False)
per_offset = pd.DataFrame(report.to_dict()["per_offset"]).T
per_offset[["e_label", "e_obs", "score", "verdict", "follows_label"]]

# %% [markdown]
# The 1-after prediction follows the label; from 2-after on the prediction follows the
# observations: the finding of the recall study, on this CPU-sized model.

# %%
assert report.verdict[0] == "label" and report.verdict[1] == "observation"
recall_figure({"result": report.to_dict(), "step": ckpt.step})
