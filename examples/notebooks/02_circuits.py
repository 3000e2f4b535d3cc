# %% [markdown]
# # Circuits: 1-after vs 2-after
#
# Edge pruning learns a mask over the edges between components (heads, MLPs, embeddings,
# read-out) so that a small circuit reproduces the model's prediction at one target
# position while everything else is ablated. The committed circuits in
# `circuits/recall-cpu/` were found with `mechlab prune` (5 seeds per target); here we
# load two of them, compare them, and prune a quick one ourselves.

# %%
from pathlib import Path

import torch

import mechlab
from mechlab.prune import Circuit, overlap
from mechlab.viz import overlap_figure

torch.set_num_threads(2)
mechlab.viz.notebook_renderers()  # figures stay visible in the saved notebook (PNG: kaleido)
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "examples" / "checkpoints").is_dir())
CKPT = ROOT / "examples" / "checkpoints" / "recall-cpu" / "last.pt"
CIRCUITS = ROOT / "circuits" / "recall-cpu"

one = Circuit.from_json(CIRCUITS / "1-after_seed0.json")
two = Circuit.from_json(CIRCUITS / "2-after_seed0.json")
for c in (one, two):
    m = c.metadata["metrics"]
    print(f"{c.metadata['target']}: {c.n_edges} edges, faithfulness {m['faithfulness']:.3f}, "
          f"complement {m['complement_faithfulness']:.3f}")

# %%
mechlab.viz.circuit_figure(one)

# %%
mechlab.viz.circuit_figure(two)

# %% [markdown]
# How much do the two targets' circuits share? (`mechlab overlap` adds bootstrap intervals,
# null models and cross-evaluation.)

# %%
o = overlap(one, two)
print(f"shared edges {o.n_shared_edges}, Jaccard {o.jaccard:.3f}, overlap coefficient {o.overlap_coefficient:.3f}")
print(sorted(o.shared_edges)[:10])

# %% [markdown]
# Both circuits on one layout: shared edges in purple, each target's own in its colour.

# %%
overlap_figure([one, two], ["1-after", "2-after"])

# %% [markdown]
# Every committed circuit in one explorer: choose the target and the seed, compare with a
# second circuit (edges shared / only A / only B), filter by score (the mask) or stability
# (the fraction of the target's seeds that keep an edge), hover or click a node or an edge
# for its scores under both its names, the graph's (`a0.h4`) and the hook's
# (`blocks.0.attn.hook_result[4]`). It works offline, here and as a file
# (`explorer.write("circuits.html")`, or `mechlab view circuits/recall-cpu/*.json --out circuits.html`).

# %%
explorer = mechlab.viz.circuit_explorer([Circuit.from_json(p) for p in sorted(CIRCUITS.glob("*-after_seed*.json"))])
explorer

# %% [markdown]
# One name per component: `mechlab.hook_name` and `mechlab.graph_name` map the graph's names
# to the hooks that patching, probes and caches address, and back.

# %%
print({n: mechlab.hook_name(n) for n in ("a0.h4", "a2.h4.q", "m1", "m1.in", "out")})
print(mechlab.graph_name("blocks.2.attn.hook_result[4]"))

# %% [markdown]
# A quick circuit of our own (fewer steps and traces than the defaults, to stay fast).

# %%
quick = mechlab.prune_checkpoint(CKPT, "1-after", n_train=64, n_test=128, steps=100, seed=0, progress=False)
m = quick.metadata["metrics"]
print(f"{quick.n_edges} edges, faithfulness {m['faithfulness']:.3f}; "
      f"Jaccard with the committed 1-after circuit {overlap(quick, one).jaccard:.3f}")
