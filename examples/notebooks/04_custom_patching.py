# %% [markdown]
# # A custom patching experiment in a few lines
#
# Head 4 of layer 2 carries the query label to the 1-after prediction. Does it carry it
# to the 2-after prediction too? Patch only that head's output at the prediction's own
# position, from the clean run into the misdirected one, and compare the two offsets
# (1 = the clean prediction restored, 0 = still misdirected).

# %%
from pathlib import Path

import torch

import mechlab

torch.set_num_threads(2)
mechlab.viz.notebook_renderers()  # figures stay visible in the saved notebook (PNG: kaleido)
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "examples" / "checkpoints").is_dir())
ckpt = mechlab.load_checkpoint(ROOT / "examples" / "checkpoints" / "recall-cpu" / "last.pt")
model = ckpt.model.eval()
t = mechlab.nih(ckpt, n_traces=128, probe="misdirect_incorrect", seed=1)

for k in (1, 2):
    p = t.target_index(k)
    result = mechlab.activation_patch(
        model, t.clean, t.corrupted,
        metric=lambda out, p=p: -(out[:, p] - t.truth[:, p]).pow(2).sum(-1).mean(),
        hooks="blocks.2.attn.hook_result", positions=[p], heads=[4], progress=False,
    )
    print(f"{k}-after: clean {-result.clean_metric:.3f}, misdirected {-result.corrupted_metric:.3f}, "
          f"restored fraction {result.normalized.item():.2f}")
