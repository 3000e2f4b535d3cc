"""Edge attribution (mechlab.prune.attribution) against exact effects and its own identities.

* a model *linear in the masks* (every component writes a constant, the read-out reads
  each into its own output dim, no normalisation; zero ablation): with the linear
  ``projection`` metric EAP, EAP-IG and the exact effect are the same number for every
  edge, and with the (quadratic) ``loss`` metric EAP-IG still equals the exact effect;
* completeness: EAP-IG's scores sum to the total effect ``m(0) - m(1)`` up to the
  midpoint rule's error, which shrinks with the steps (every family, tokens and
  continuous, windowed recurrent graphs);
* EAP-IG over the inputs moves only the read-in, so its embedding edges' scores sum to
  the total effect under interchange ablation;
* the fixed-difference gradient at the clean run is the plain mask gradient;
* EAP on a model exported to a TransformerBridge equals TransformerLens' own edge-level
  ``attribution_patch`` (tests/prune/test_attribution_tl.py).
"""

from __future__ import annotations

import pytest
import torch

from mechlab.models.registry import build_model
from mechlab.models.transformer import Transformer, TransformerConfig
from mechlab.prune.attribution import (
    _gradient,
    attribute,
    build_objective,
    fixed_difference_gradient,
    metric_value,
    score_edges,
)
from mechlab.prune.forward import frozen_eval
from mechlab.prune.graph import pruning_graph
from mechlab.prune.objective import writer_kind_mask
from mechlab.traces import PruneData, Traces

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

WINDOWS = (("haystack", 0, 3), ("label", 3, 4), ("continuation", 4, 6))


def linear_transformer() -> Transformer:
    """A transformer whose output is affine in the edge masks under zero ablation.

    No normalisation; every head writes a constant (``W_V = 0``, ``b_V`` non-zero), every
    MLP too (``W_in = 0``), so no edge into a head or an MLP matters; the read-out reads
    the embedding, each head and each MLP through its own output dim, so their effects
    on the output are orthogonal.
    """
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=16, n_layers=2, n_heads=2, d_head=2, d_mlp=4, d_in=3, d_out=7,
                            n_ctx=6, normalization="none")  # fmt: skip
    model = Transformer(cfg).double().eval()
    with torch.no_grad():
        read_out = model.read_out.proj.weight  # [d_out, d_model]
        read_out.zero_()
        model.read_in.proj.weight.zero_()
        model.read_in.proj.bias.zero_()
        model.W_pos.zero_()  # the position table writes nothing
        model.read_in.proj.weight[:3, :3] = torch.eye(3)  # the input into dims 0-2
        read_out[0, 0] = 1.0
        dim = 1
        for layer, block in enumerate(model.blocks):
            block.attn.W_V.zero_()
            block.mlp.W_in.zero_()
            for h in range(2):
                block.attn.b_V[h] = torch.tensor([1.0, 0.5]) * (h + 1)
                block.attn.W_O[h].zero_()
                block.attn.W_O[h, 0, 4 + 4 * layer + h] = 1.0 + layer  # its own residual dim
                read_out[dim, 4 + 4 * layer + h] = 1.0
                dim += 1
            block.mlp.W_out.zero_()
            block.mlp.b_in.fill_(1.0)
            block.mlp.W_out[:, 6 + 4 * layer] = 0.5
            block.mlp.b_out.zero_()
            read_out[dim, 6 + 4 * layer] = 1.0
            dim += 1
            block.attn.b_O.zero_()
    return model


def random_traces(model, batch: int = 6, n_pos: int = 6, seed: int = 0, windows=None) -> Traces:
    g = torch.Generator().manual_seed(seed)
    if model.cfg.io == "tokens":
        x = torch.randint(model.cfg.d_vocab, (batch, n_pos), generator=g)
        c = torch.randint(model.cfg.d_vocab, (batch, n_pos), generator=g)
    else:
        dtype = next(model.parameters()).dtype
        x = torch.randn(batch, n_pos, model.cfg.d_in, generator=g, dtype=dtype)
        c = torch.randn(batch, n_pos, model.cfg.d_in, generator=g, dtype=dtype)
    return Traces(x, c, windows=windows)


def small_model(arch: str, io: str = "continuous", seed: int = 0):
    torch.manual_seed(seed)
    cfg = {"arch": arch, "d_model": 12, "n_layers": 2, "n_ctx": 8}
    cfg.update({"d_in": 3, "d_out": 2} if io == "continuous" else {"io": "tokens", "d_vocab": 5})
    cfg.update({"transformer": {"n_heads": 2}, "dense_ssm": {"d_state": 4},
                "mamba": {"d_state": 4}}.get(arch, {}))  # fmt: skip
    return build_model(cfg).double().eval()


def test_the_linear_model_is_linear_in_the_masks():
    model = linear_transformer()
    traces = random_traces(model)
    with frozen_eval(model):
        obj = build_objective(model, traces, "all", "zero", "projection")
        n = obj.graph.n_edges
        z1, z2 = torch.rand(n, dtype=torch.float64), torch.rand(n, dtype=torch.float64)
        mid = metric_value(obj, (z1 + z2) / 2)
        assert mid == pytest.approx((metric_value(obj, z1) + metric_value(obj, z2)) / 2, rel=1e-9)
        n_matter = int(
            (attribute(model, traces, "all", "exact", ablation="zero").scores.abs() > 1e-9).sum()
        )
    assert n_matter == 1 + 2 * (2 + 1)  # embed, four heads, two MLPs into out


@pytest.mark.parametrize("metric", ["projection", "loss"])
def test_attribution_equals_the_exact_effect_on_a_model_linear_in_the_masks(metric):
    model = linear_transformer()
    traces = random_traces(model)
    exact = attribute(model, traces, "all", "exact", ablation="zero", metric=metric).scores
    methods = [("eap-ig", {"steps": 1}), ("eap-ig", {"steps": 4})]
    if metric == "projection":
        methods.append(("eap", {"at": "clean"}))
    assert exact.abs().max() > 0.1
    for method, kw in methods:
        scores = attribute(
            model, traces, "all", method, ablation="zero", metric=metric, **kw
        ).scores
        torch.testing.assert_close(scores, exact, atol=1e-9, rtol=1e-7, msg=f"{method} {kw}")


CASES = [
    ("transformer", "continuous", None),
    ("transformer", "tokens", None),
    ("lstm", "continuous", None),
    ("mamba", "tokens", None),
    ("dense_ssm", "continuous", WINDOWS),
    ("lstm", "tokens", WINDOWS),
]


@pytest.mark.parametrize("arch, io, windows", CASES)
@pytest.mark.parametrize("ablation", ["interchange", "mean"])
def test_eap_ig_is_complete_and_its_error_shrinks_with_steps(arch, io, windows, ablation):
    model = small_model(arch, io)
    traces = random_traces(model, windows=windows)
    errors = []
    for steps in (2, 8):
        result = attribute(model, traces, "all", "eap-ig", steps=steps, ablation=ablation)
        assert result.graph == pruning_graph(model, windows)
        assert result.total_effect > 0
        errors.append(abs(float(result.scores.sum()) - result.total_effect))
    assert errors[1] < 0.02 * result.total_effect
    assert errors[1] < errors[0] or errors[0] < 1e-9 * result.total_effect


@pytest.mark.parametrize("arch, io, windows", CASES[:4] + CASES[5:])
def test_eap_ig_over_the_inputs_is_complete_on_the_embedding_edges(arch, io, windows):
    model = small_model(arch, io)
    traces = random_traces(model, windows=windows)
    result = attribute(model, traces, "all", "eap-ig-inputs", steps=24)
    embed = writer_kind_mask(result.graph, "embed")
    assert float(result.scores[embed].sum()) == pytest.approx(result.total_effect, rel=2e-3)


@pytest.mark.parametrize("arch, io, windows", [CASES[0], CASES[3], CASES[4]])
def test_fixed_difference_gradient_at_the_clean_run_is_the_mask_gradient(arch, io, windows):
    model = small_model(arch, io)
    traces = random_traces(model, windows=windows)
    with frozen_eval(model):
        obj = build_objective(model, traces, "all", "interchange", "projection")
        plain = _gradient(obj, torch.ones(obj.graph.n_edges), 4)
        torch.testing.assert_close(
            fixed_difference_gradient(obj, 1.0, 4), plain, atol=1e-10, rtol=1e-8
        )


def test_scores_of_edges_that_cannot_matter_are_zero_and_data_is_accepted_either_way():
    model = small_model("transformer")
    traces = random_traces(model)
    data = PruneData(traces, random_traces(model, seed=1))
    a = attribute(model, data, "all", "eap")
    b = attribute(model, traces, "all", "eap")
    torch.testing.assert_close(a.scores, b.scores)
    pos = torch.tensor([w == "pos" for w, _ in a.graph.edges])
    assert bool((a.scores[pos] == 0).all()) and not bool(a.countable[pos].any())
    top = a.top(3)
    assert len(top) == 3 and abs(top[0][1]) >= abs(top[1][1]) >= abs(top[2][1])
    assert a.summary()["scores"][0][:2] == list(a.graph.edges[0])


BAD = [
    ({"method": "gradient"}, "unknown attribution method 'gradient'"),
    ({"method": "eap", "at": "clean"}, "zero gradient for metric 'loss'"),
    ({"method": "eap", "ablation": "mean"}, "needs interchange ablation"),
    ({"method": "eap", "at": "middle"}, "unknown EAP point"),
    ({"method": "eap-ig-inputs", "ablation": "zero"}, "needs interchange"),
    ({"method": "eap-ig", "steps": 0}, "steps .* must be an integer >= 1"),
    ({"method": "eap-ig", "steps": 10**12}, r"steps \(integration points\) 1e\+12 is more than"),
    ({"method": "eap-ig", "metric": "kl"}, "unknown metric 'kl'"),
    ({"method": "exact", "ablation": "resample"}, "unknown ablation 'resample'"),
    ({"method": "exact", "batch_size": 0}, "batch_size must be an integer >= 1"),
]


@pytest.mark.parametrize("kwargs, message", BAD)
def test_bad_settings_are_refused_in_one_line_before_any_work(kwargs, message, monkeypatch):
    model = small_model("transformer")
    traces = random_traces(model)

    def no_work(*args, **kwargs):
        raise AssertionError("work was done before the settings were checked")

    monkeypatch.setattr("mechlab.prune.attribution.build_objective", no_work)
    kwargs = dict(kwargs)
    with pytest.raises(ValueError, match=message) as err:
        attribute(model, traces, "all", kwargs.pop("method"), **kwargs)
    assert "\n" not in str(err.value)


def test_nan_scores_are_refused():
    model = small_model("transformer")
    with torch.no_grad():
        model.read_out.proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"edge score\(s\) are NaN or infinite"):
        attribute(model, random_traces(model), "all", "eap-ig", steps=1)


def test_eap_shows_a_bar_of_its_one_pass(capsys):
    model = small_model("transformer")
    traces = random_traces(model)
    with frozen_eval(model):
        obj = build_objective(model, traces, "all", "interchange", "loss", pruning_graph(model))
        quiet = score_edges(obj, "eap")
        assert capsys.readouterr().err == ""  # no bar unless asked
        shown = score_edges(obj, "eap", progress=True, desc="selection pool: eap")
    torch.testing.assert_close(shown, quiet)  # the bar changes nothing
    assert "selection pool: eap: 100%|██████████| 1/1" in capsys.readouterr().err
