"""Tiny models and inputs shared by the patching tests."""

import torch

import mechlab

N_POS, D_IN, D_OUT = 6, 5, 3
CONFIGS = {
    "transformer": {"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2, "init_std": 0.3},
    "lstm": {"arch": "lstm", "d_model": 8, "n_layers": 2},
    "dense_ssm": {"arch": "dense_ssm", "d_model": 8, "n_layers": 2},
    "mamba": {"arch": "mamba", "d_model": 8, "n_layers": 2},
}
# One per-time-step hook of each recurrent family.
STEP_HOOKS = {
    "lstm": "blocks.0.lstm.hook_h",
    "dense_ssm": "blocks.0.ssm.hook_h",
    "mamba": "blocks.0.mixer.hook_ssm_state",
}


def make_model(arch: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = {**CONFIGS[arch], "d_in": D_IN, "d_out": D_OUT, "n_ctx": 12, **overrides}
    return mechlab.build_model(cfg).eval()


def make_pair(seed: int = 0, batch: int = 3, scale: float = 1.0):
    """Clean and corrupted inputs ``[batch, N_POS, D_IN]``; corrupted = clean + scale * noise."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randn(batch, N_POS, D_IN, generator=g)
    return clean, clean + scale * torch.randn(batch, N_POS, D_IN, generator=g)


def last_output(out):
    """A scalar metric: first output feature at the last position, batch mean."""
    return out[:, -1, 0].mean()
