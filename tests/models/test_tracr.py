"""A compiled Tracr program loaded into mechlab's transformer computes what Tracr computes."""

import numpy as np
import pytest
import torch

pytest.importorskip("tracr", reason="Tracr is not installed: pip install -e '.[tracr]'")
pytest.importorskip("haiku", reason="dm-haiku is not installed: pip install -e '.[tracr]'")

from mechlab.models.tracr import (  # noqa: E402
    TRACR_PROGRAMS,
    compile_program,
    load_tracr,
    sample_sequences,
)
from mechlab.models.transformer import Transformer, TransformerConfig  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=sorted(TRACR_PROGRAMS))
def program(request):
    assembled = compile_program(request.param)
    model, info = load_tracr(assembled)
    return request.param, assembled, model, info


def test_outputs_match_tracr(program):
    name, assembled, model, info = program
    gen = torch.Generator().manual_seed(0)
    for length in (1, 3, info.max_seq_len):
        for seq in sample_sequences(name, 4, length, gen):
            out = assembled.apply([info.bos, *seq])
            with torch.no_grad():
                mine = model(info.encode([seq]))  # [1, 1 + length, d_output]
            assert info.decode(mine)[0] == pytest.approx(out.decoded[1:], abs=1e-5)
            ref = np.asarray(out.unembedded)[0]  # Tracr: argmax ids, or the values
            if info.numerical:
                np.testing.assert_allclose(mine[0, :, 0].numpy(), ref, atol=1e-5)
            else:
                np.testing.assert_array_equal(mine[0, 1:].argmax(-1).numpy(), ref[1:])


def test_hist_counts_by_hand():
    model, info = load_tracr(compile_program("hist"))
    with torch.no_grad():
        out = model(info.encode([["a", "b", "a", "c", "a"], ["c", "c", "b", "b", "b"]]))
    assert info.decode(out) == [[3, 1, 3, 1, 3], [2, 2, 3, 3, 3]]


def test_config_is_tracr_layout(program):
    _, assembled, model, info = program
    cfg = model.cfg
    assert (cfg.normalization, cfg.act_fn, cfg.causal) == ("none", "relu", False)
    assert cfg.n_layers == assembled.model_config.num_layers
    assert cfg.d_model == len(info.residual_labels)
    assert cfg.io == ("continuous" if info.numerical else "tokens")


def test_residual_stream_matches_tracr():
    assembled = compile_program("reverse")
    model, info = load_tracr(assembled)
    seq = ["c", "a", "b", "b"]
    out = assembled.apply([info.bos, *seq])
    _, cache = model.run_with_cache(info.encode([seq]))
    for layer in range(model.cfg.n_layers):
        tracr_mid = np.asarray(out.residuals[2 * layer])[0]
        tracr_post = np.asarray(out.residuals[2 * layer + 1])[0]
        np.testing.assert_allclose(cache[f"blocks.{layer}.hook_resid_mid"][0], tracr_mid, atol=1e-4)
        np.testing.assert_allclose(cache[f"blocks.{layer}.hook_resid_post"][0], tracr_post, atol=1e-4)


def test_bad_inputs():
    _, info = load_tracr(compile_program("hist"))
    with pytest.raises(ValueError, match="not in the vocabulary"):
        info.encode([["a", "z"]])
    with pytest.raises(ValueError, match="one length"):
        info.encode([["a"], ["a", "b"]])
    with pytest.raises(ValueError, match="length must be in"):
        info.encode([["a"] * (info.max_seq_len + 1)])
    with pytest.raises(ValueError, match="AssembledTransformerModel"):
        load_tracr(object())
    with pytest.raises(ValueError, match="unknown Tracr program"):
        compile_program("nope")
    with pytest.raises(ValueError, match="length must be in"):
        sample_sequences("sort_unique", 2, 6)


def test_sort_unique_samples_have_distinct_tokens():
    for seq in sample_sequences("sort_unique", 20, 5, torch.Generator().manual_seed(1)):
        assert len(set(seq)) == 5


# The new config options, without Tracr -----------------------------------------------


def test_new_options_validate_and_defaults_unchanged():
    cfg = TransformerConfig(d_model=8, n_layers=1, n_heads=2)
    assert (cfg.normalization, cfg.causal) == ("LN", True)
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("normalization", "causal")}
    assert TransformerConfig.from_dict(old).to_dict() == cfg.to_dict()  # old dicts load
    with pytest.raises(ValueError, match="normalization must be one of"):
        TransformerConfig(d_model=8, n_heads=2, normalization="rms")
    with pytest.raises(ValueError, match="act_fn must be one of"):
        TransformerConfig(d_model=8, n_heads=2, act_fn="tanh")
    with pytest.raises(ValueError, match="causal must be True or False"):
        TransformerConfig(d_model=8, n_heads=2, causal=1)


def test_non_causal_attends_to_the_future_and_no_norm_is_identity():
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=8, n_layers=1, n_heads=2, io="tokens", d_vocab=5, n_ctx=6,
                            act_fn="relu", normalization="none", causal=False)  # fmt: skip
    model = Transformer(cfg)
    x = torch.randint(5, (2, 6))
    _, cache = model.run_with_cache(x)
    pattern = cache["blocks.0.attn.hook_pattern"]  # [batch, head, q, k]
    assert (pattern.triu(1) > 0).any()  # future keys get weight
    resid = cache["blocks.0.hook_resid_post"]
    torch.testing.assert_close(cache["ln_final.hook_normalized"], resid)
    mlp_pre = cache["blocks.0.mlp.hook_pre"]
    torch.testing.assert_close(cache["blocks.0.mlp.hook_post"], mlp_pre.clamp(min=0))
    causal = Transformer(TransformerConfig.from_dict({**cfg.to_dict(), "causal": True}))
    causal.load_state_dict(model.state_dict())
    _, c2 = causal.run_with_cache(x)
    assert (c2["blocks.0.attn.hook_pattern"].triu(1) == 0).all()
