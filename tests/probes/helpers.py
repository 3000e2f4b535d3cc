"""What the probe tests share: a small recall task, its NiH traces and a tiny transformer."""

import torch

import mechlab
from mechlab.tasks import LDSConfig

CFG = LDSConfig(
    d_state=3, n_pairs=6, n_ctx=48, zipf_a=0.0, min_systems=2, max_systems=4,
    n_train_systems=50, n_test_systems=300,
)  # fmt: skip
N, S = 3, 4  # haystack systems, observations per segment: (S + 2)(N + 1) = 24 positions


def traces(n: int = 200, seed: int = 0):
    return mechlab.nih(CFG, n_traces=n, n_haystack=N, seg_len=S, probe=None, seed=seed,
                       protocol="uniform")  # the queried slot varies: query_system has classes


def tiny_transformer(seed: int = 0):
    torch.manual_seed(seed)
    return mechlab.build_model(
        "transformer", d_model=16, n_layers=2, n_heads=2, d_in=CFG.d_in, d_out=CFG.d_state,
        n_ctx=CFG.n_ctx,
    )  # fmt: skip
