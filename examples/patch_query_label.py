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

import mechlab

CKPT = Path(__file__).resolve().parent / "checkpoints" / "recall-cpu" / "last.pt"


def main() -> None:
    ckpt = mechlab.load_checkpoint(CKPT)
    model = ckpt.model.eval()
    # 3 haystack systems of 6 observations (the run's eval setting); offsets 1 and 2
    t = mechlab.nih(ckpt, n_traces=500, probe="misdirect_incorrect", offsets=(1, 2), seed=0)
    q = t.query_position  # the query label's token index = output position of 1-after
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(t.clean)
        print(f"clean        1-after median error {t.errors(model(t.clean))[:, 0].median():.3f}")
        print(f"misdirected  1-after median error {t.errors(model(t.corrupted))[:, 0].median():.3f}")
        names = [f"blocks.{i}.{part}" for i in range(model.cfg.n_layers) for part in ("hook_attn_out", "hook_mlp_out")]
        for name in names:

            def patch(resid, hook, name=name):
                resid[:, q] = clean_cache[name][:, q]  # the clean output at the query label only
                return resid

            pred = model.run_with_hooks(t.corrupted, fwd_hooks=[(name, patch)])
            print(f"patch {name:24s} -> 1-after median error {t.errors(pred)[:, 0].median():.3f}")


if __name__ == "__main__":
    main()
