"""A custom patching experiment on the bundled checkpoint, with the plain hook API.

Is the 1-after prediction made from the query label? Build needle-in-a-haystack
traces and their misdirected twins (query label swapped for another haystack
system's). Every token before the query label is the same in both, so the whole
difference enters at the query position; patching the clean output of one
component there (each layer's attention, each MLP) into the misdirected run shows
which components carry the recalled state to the 1-after prediction.

    python examples/patch_query_label.py
"""

from pathlib import Path

import torch

from mechlab.checkpoint import load_checkpoint
from mechlab.evals.recall import task_config_of
from mechlab.tasks.lds import make_libraries
from mechlab.tasks.lds_evals import needle_in_haystack

CKPT = Path(__file__).resolve().parent / "checkpoints" / "recall-cpu" / "last.pt"


def main() -> None:
    ckpt = load_checkpoint(CKPT)
    model, cfg = ckpt.model.eval(), task_config_of(ckpt.metadata, CKPT)
    test_lib = make_libraries(cfg)[1]
    kwargs = {"n_haystack": 3, "seg_len": 6, "offsets": (1, 2)}
    clean = needle_in_haystack(cfg, test_lib, 500, generator=torch.Generator().manual_seed(0), **kwargs)
    wrong = needle_in_haystack(cfg, test_lib, 500, generator=torch.Generator().manual_seed(0),
                               probe="misdirect_incorrect", **kwargs)
    q = clean.query_position  # the query label's token index = target index of 1-after
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean.batch.inputs)
        print(f"clean        1-after median error {clean.errors(model(clean.batch.inputs))[:, 0].median():.3f}")
        print(f"misdirected  1-after median error {wrong.errors(model(wrong.batch.inputs))[:, 0].median():.3f}")
        names = [f"blocks.{i}.{part}" for i in range(model.cfg.n_layers) for part in ("hook_attn_out", "hook_mlp_out")]
        for name in names:

            def patch(resid, hook, name=name):
                resid[:, q] = clean_cache[name][:, q]  # the clean output at the query label only
                return resid

            pred = model.run_with_hooks(wrong.batch.inputs, fwd_hooks=[(name, patch)])
            print(f"patch {name:24s} -> 1-after median error {wrong.errors(pred)[:, 0].median():.3f}")


if __name__ == "__main__":
    main()
