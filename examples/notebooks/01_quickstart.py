# %% [markdown]
# # Quickstart: load the bundled checkpoint, cache every activation, patch one
#
# The bundled checkpoint is a 3-layer transformer trained on interleaved linear dynamical
# systems with symbolic open/close labels (`recall-cpu`). At the query label it must
# recall which system the label names and predict that system's next state (the
# "1-after" prediction).

# %%
from pathlib import Path

import torch

import mechlab

torch.set_num_threads(2)
mechlab.viz.notebook_renderers()  # figures stay visible in the saved notebook (PNG: kaleido)
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "examples" / "checkpoints").is_dir())
CKPT = ROOT / "examples" / "checkpoints" / "recall-cpu" / "last.pt"

ckpt = mechlab.load_checkpoint(CKPT)
model = ckpt.model.eval()
print(ckpt.config)

# %% [markdown]
# Needle-in-a-haystack traces on the checkpoint's own task (the study's construction: the
# oldest haystack system is queried), with a *misdirected* twin whose query label names
# the next system instead.

# %%
t = mechlab.nih(ckpt, n_traces=64, probe="misdirect_incorrect", seed=0)
q = t.target_index(1)  # output position of the 1-after prediction (the label itself)
with torch.no_grad():
    clean_out, cache = model.run_with_cache(t.clean)
    bad_out = model(t.corrupted)
print("1-after error, clean:", t.errors(clean_out)[:, 0].median().item())
print("1-after error, misdirected:", t.errors(bad_out)[:, 0].median().item())

# %% [markdown]
# The cache holds every hook, named the TransformerLens way, with named axes.

# %%
for name in list(cache)[:8]:
    print(f"{name:40s} {tuple(cache[name].shape)}  {model.hook_axes(name)}")

# %% [markdown]
# Patch one clean activation at a time into the misdirected run: which cells restore the
# 1-after prediction?

# %%
def metric(out):  # minus the 1-after squared error, averaged over traces
    return -(out[:, q] - t.truth[:, q]).pow(2).sum(-1).mean()


result = mechlab.activation_patch(model, t.clean, t.corrupted, metric, positions=[q], progress=False)
for cell, pos, effect in result.top(6):
    print(f"{cell:32s} position {pos}: {effect:.3f}")
result.plot()
