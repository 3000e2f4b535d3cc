"""Tests of mechlab.models.stack: the recurrent families' shared residual stack."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mechlab.models import build_model
from mechlab.models.base import ResidualBlock
from mechlab.models.dense_ssm import DenseSSM, DenseSSMMixer
from mechlab.models.lstm import LSTM, LSTMMixer
from mechlab.models.mamba import Mamba, MambaMixer, RMSNorm
from mechlab.models.stack import ResidualStack

# family -> (config fields, model class, mixer name, mixer class, final norm class)
FAMILIES = {
    "lstm": ({"d_hidden": 24}, LSTM, "lstm", LSTMMixer, nn.LayerNorm),
    "dense_ssm": ({"d_state": 8}, DenseSSM, "ssm", DenseSSMMixer, nn.LayerNorm),
    "mamba": ({"d_state": 4}, Mamba, "mixer", MambaMixer, RMSNorm),
}
SIZES = {"d_model": 16, "n_layers": 3, "n_ctx": 20, "d_in": 5, "d_out": 3}


def make(arch: str, io: str = "continuous", seed: int = 0) -> ResidualStack:
    torch.manual_seed(seed)
    fields = {"arch": arch, **SIZES, **FAMILIES[arch][0]}
    if io == "tokens":
        fields.update(io="tokens", d_vocab=11)
    return build_model(fields)


def make_input(model: ResidualStack, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if model.cfg.io == "continuous":
        return torch.randn(2, 9, model.cfg.d_in, generator=g)
    return torch.randint(0, model.cfg.d_vocab, (2, 9), generator=g)


@pytest.mark.parametrize("arch", FAMILIES)
def test_every_recurrent_family_is_the_stack_with_its_block_and_norm(arch):
    _, cls, mixer_name, mixer_cls, norm_cls = FAMILIES[arch]
    model = make(arch)
    assert type(model) is cls and isinstance(model, ResidualStack)
    # the order modules are built in (a seeded init draws in it) and the state-dict prefixes
    assert [name for name, _ in model.named_children()] == [
        "read_in", "hook_embed", "blocks", "ln_final", "read_out", "hook_out",
    ]  # fmt: skip
    assert type(model.ln_final) is norm_cls
    assert len(model.blocks) == SIZES["n_layers"]
    for block, mixer in zip(model.blocks, model.mixers(), strict=True):
        assert isinstance(block, ResidualBlock) and block.mixer_name == mixer_name
        assert type(mixer) is mixer_cls and getattr(block, mixer_name) is mixer
    assert {key.split(".")[0] for key in model.state_dict()} == {
        "read_in",
        "blocks",
        "ln_final",
        "read_out",
    }


@pytest.mark.parametrize("io", ["continuous", "tokens"])
@pytest.mark.parametrize("arch", FAMILIES)
def test_forward_equals_the_stack_computed_from_its_parts(arch, io):
    """resid = read_in(x); resid += mixer(norm(resid)) per block; read_out(ln_final(resid)),
    bit for bit."""
    model = make(arch, io)
    x = make_input(model)
    with torch.no_grad():
        resid = model.read_in(x)
        for block, mixer in zip(model.blocks, model.mixers(), strict=True):
            resid = resid + mixer(block.norm(resid))
        expected = model.read_out.proj(model.ln_final(resid))
        assert torch.equal(model(x), expected)


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_cache_holds_the_stack_wired_as_the_math_says(arch):
    """Each hook of the stack holds what its neighbours make of each other, bit for bit
    (the cached run's mixers take their read-only paths, equal to the plain ones to
    about 1e-6, not bit for bit: see the mixers' docs)."""
    model = make(arch)
    x = make_input(model)
    with torch.no_grad():
        out, cache = model.run_with_cache(x)
        assert torch.allclose(out, model(x), atol=1e-5)
        assert torch.equal(cache["hook_embed"], model.read_in(x))
        resid = cache["hook_embed"]
        for i, block in enumerate(model.blocks):
            assert torch.equal(cache[f"blocks.{i}.hook_resid_pre"], resid)
            assert torch.equal(cache[f"blocks.{i}.hook_mixer_in"], block.norm(resid))
            resid = resid + cache[f"blocks.{i}.hook_mixer_out"]
            assert torch.equal(cache[f"blocks.{i}.hook_resid_post"], resid)
        assert torch.equal(cache["hook_out"], model.read_out.proj(model.ln_final(resid)))
        assert torch.equal(out, cache["hook_out"])


@pytest.mark.parametrize("arch", FAMILIES)
def test_too_long_input_is_refused(arch):
    model = make(arch)
    with pytest.raises(ValueError, match="exceeds n_ctx=20"):
        model(torch.zeros(1, 21, SIZES["d_in"]))


@pytest.mark.parametrize("arch", ["dense_ssm", "mamba"])
def test_scan_reads_and_sets_every_mixer(arch):
    model = make(arch)
    model.scan = "chunked"
    assert model.scan == "chunked" and [m.scan for m in model.mixers()] == ["chunked"] * 3
    model.mixers()[1].scan = "loop"
    assert model.scan == "mixed"
    with pytest.raises(ValueError, match="scan must be one of"):
        model.scan = "parallel"
    assert [m.scan for m in model.mixers()] == ["chunked", "loop", "chunked"]  # unchanged
    assert type(model).scan.__doc__.startswith("How the blocks run")


def test_lstm_fused_reads_and_sets_every_mixer():
    model = make("lstm")
    model.fused = False
    assert model.fused is False and not any(m.fused for m in model.mixers())
    model.mixers()[0].fused = True
    assert model.fused is False  # all of them, or not
    model.fused = True
    assert model.fused is True


def test_a_stack_without_a_block_says_what_is_missing():
    from mechlab.models.lstm import LSTMConfig

    class NoBlock(ResidualStack):
        pass

    with pytest.raises(NotImplementedError, match="NoBlock must define make_block"):
        NoBlock(LSTMConfig(d_model=8, n_layers=1))
