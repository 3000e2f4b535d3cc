"""The label- vs observation-based recall harness (mechlab.label_vs_observation): scores and verdicts by hand, planted label and observation copiers, the component sweep."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import mechlab
from mechlab.label_vs_observation import (
    VerdictRule,
    component_sweep,
    components_of,
    label_continuation,
    patch_token,
    recall_analysis,
    recall_score,
    verdict,
)
from mechlab.tasks import nih
from mechlab.tasks.lds import LDSConfig

torch.set_num_threads(1)


BUNDLED = Path(__file__).resolve().parents[1] / "examples" / "checkpoints" / "recall-cpu" / "last.pt"


TASK = {
    "d_state": 3, "n_pairs": 4, "n_ctx": 24, "max_systems": 3, "max_cuts": 8,
    "n_train_systems": 200, "n_test_systems": 50,
}  # fmt: skip


NIH = {"n_haystack": 2, "seg_len": 4}  # query label at p = 1 + 2 * 6 = 13; 19 positions


@pytest.fixture(scope="module")
def cfg() -> LDSConfig:
    return LDSConfig(**TASK)


class LabelMemory(nn.Module):
    """Outputs ``W[label]`` of the latest open label read: follows the label only."""

    def __init__(self, n_pairs: int, d_state: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.W = nn.Parameter(torch.randn(n_pairs, d_state, generator=g))
        self.n_pairs = n_pairs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        opens = x[..., 0 : 2 * self.n_pairs : 2]  # [batch, pos, n_pairs]: sqrt(2) one-hot on open labels
        state = torch.zeros_like(opens[:, 0])
        out = []
        for t in range(x.shape[1]):
            is_open = opens[:, t].abs().sum(-1, keepdim=True) > 0
            state = torch.where(is_open, opens[:, t], state)
            out.append(state @ self.W)
        return torch.stack(out, 1)  # [batch, pos, d_state]


class ObsCopy(nn.Module):
    """Outputs ``a * y_t``, the observation just read: follows the observations only."""

    def __init__(self, d_state: int, a: float = 0.9):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))
        self.d_state = d_state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a * x[..., -self.d_state :]


class Sum(nn.Module):
    def __init__(self, *parts: nn.Module):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(p(x) for p in self.parts)


def _hand_effects(cfg, W: torch.Tensor | None, a: float, seed: int, n: int):
    """E_label, E_obs, E_obs_all per offset 1..4, from the traces' metadata alone."""
    t = nih(cfg, n, probe="misdirect_incorrect", seed=seed, offsets=(1, 2, 3, 4), **NIH)
    r = nih(cfg, n, probe="misdirect_restart", seed=seed, offsets=(1, 2, 3, 4), **NIH)
    rows = torch.arange(n)
    zero = torch.zeros(4, dtype=torch.float64)
    e_label = zero.clone()
    if W is not None:
        lq, lo = t.slot_labels[rows, t.query], t.slot_labels[rows, t.other]
        e_label += 2 * (W[lo] - W[lq]).double().pow(2).sum(-1).mean()  # the same at every offset
    p = t.query_position
    # token p + k is the k-th continuation observation; truth[:, i] is token i + 1's state
    dy = (r.corrupted_truth - t.truth).double().pow(2).sum(-1)  # [n, pos]
    e_obs, e_obs_all = zero.clone(), zero.clone()
    e_obs[1] = a**2 * dy[:, p].mean()  # 2-after reads token p + 1 itself; later offsets do not
    for j in (2, 3, 4):
        e_obs_all[j - 1] = a**2 * dy[:, p + j - 2].mean()  # j-after reads token p + j - 1
    return e_label, e_obs, e_obs_all


def test_score_and_verdict_by_hand():
    assert recall_score(3.0, 1.0) == 0.75
    assert recall_score(0.0, 2.0) == 0.0
    assert math.isnan(recall_score(0.0, 0.0))
    assert verdict(1.0, 0.0, 1.0) == "label"
    assert verdict(0.2, 0.9, 1.0) == "observation"
    assert verdict(0.5, 0.5, 1.0) == "mixed"
    assert verdict(0.04, 0.001, 1.0) == "neither"  # below 5% of the target's size
    assert verdict(0.04, 0.001, 0.5) == "label"  # ... but not of a smaller target
    assert verdict(2.0, 1.0, 1.0) == "label"  # score 2/3 exactly: label
    assert verdict(1.0, 2.0, 1.0) == "observation"  # score 1/3 exactly: observation
    rule = VerdictRule(min_effect=0.5, label_at=0.9, observation_at=0.1)
    assert verdict(0.8, 0.2, 1.0, rule) == "mixed"
    assert verdict(0.3, 0.1, 1.0, rule) == "neither"


@pytest.mark.parametrize(
    "kwargs",
    [{"min_effect": 0}, {"min_effect": -1.0}, {"label_at": 0.3, "observation_at": 0.5},
     {"label_at": 1.5}, {"observation_at": -0.1}],
)  # fmt: skip
def test_bad_rules_are_refused(kwargs):
    with pytest.raises(ValueError, match="must be|need"):
        VerdictRule(**kwargs)
    with pytest.raises(ValueError, match="non-negative"):
        recall_score(-1.0, 1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_label_copier_follows_the_label_at_every_offset(cfg, seed):
    net = LabelMemory(cfg.n_pairs, cfg.d_state, seed=seed)
    r = recall_analysis(cfg, mechlab.hooked(net), n_traces=48, seed=seed, progress=False, **NIH)
    e_label, _, _ = _hand_effects(cfg, net.W.detach(), 0.0, seed, 48)
    assert r.offsets == (1, 2, 3, 4)
    torch.testing.assert_close(torch.tensor(r.e_label, dtype=torch.float64), e_label, rtol=1e-5, atol=1e-6)
    assert r.e_obs == [0.0] * 4 and r.e_obs_all == [0.0] * 4
    assert r.score == [1.0] * 4 and r.verdict == ["label"] * 4 and r.verdict_all == ["label"] * 4
    assert r.components.empty  # a hooked module has no blocks.{l} components


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_observation_copier_follows_the_observations(cfg, seed):
    r = recall_analysis(cfg, mechlab.hooked(ObsCopy(cfg.d_state, 0.9)), n_traces=48, seed=seed,
                        progress=False, **NIH)  # fmt: skip
    _, e_obs, e_obs_all = _hand_effects(cfg, None, 0.9, seed, 48)
    torch.testing.assert_close(torch.tensor(r.e_obs, dtype=torch.float64), e_obs, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(torch.tensor(r.e_obs_all, dtype=torch.float64), e_obs_all, rtol=1e-5, atol=1e-7)
    assert r.e_label == [0.0] * 4
    # 1-after: nothing read yet; 2-after reads the patched token; 3-after+ read later ones only
    assert r.verdict == ["neither", "observation", "neither", "neither"]
    assert r.verdict_all == ["neither", "observation", "observation", "observation"]
    assert math.isnan(r.score[0]) and r.score[1] == 0.0
    assert r.to_dict()["per_offset"]["1"]["score"] is None


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_model_score_matches_hand_computation(cfg, seed):
    label = LabelMemory(cfg.n_pairs, cfg.d_state, seed=seed)
    with torch.no_grad():
        label.W.mul_(0.45)  # comparable to the observation term at 2-after
    r = recall_analysis(cfg, mechlab.hooked(Sum(label, ObsCopy(cfg.d_state, 1.0))), n_traces=64, seed=seed,
                        components=False, progress=False, **NIH)  # fmt: skip
    e_label, e_obs, _ = _hand_effects(cfg, label.W.detach(), 1.0, seed, 64)
    # the two parts add, and each patch moves one part only: the effects are those of the parts
    expected = (e_label[1] / (e_label[1] + e_obs[1])).item()
    assert r.score[1] == pytest.approx(expected, rel=1e-5)
    assert r.verdict[1] == verdict(float(e_label[1]), float(e_obs[1]), r.scale[1])
    assert r.verdict[0] == "label" and r.score[2] == 1.0  # 3-after: only the label term moves


def test_label_continuation_is_the_query_systems_truth(cfg):
    t = nih(cfg, 32, probe="misdirect_incorrect", seed=3, offsets=(1, 2, 3, 4), **NIH)
    cont = label_continuation(t, t.query)  # the query's own continuation = the clean targets
    torch.testing.assert_close(cont.float(), t.truth[:, t.positions], rtol=1e-5, atol=1e-6)
    other = label_continuation(t, t.other)
    assert (other - cont).pow(2).sum(-1).min() > 1e-6  # a different system's states


@pytest.fixture(scope="module")
def tiny(cfg):
    torch.manual_seed(0)
    return build(cfg, {"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2})


def build(cfg, model):
    return mechlab.build_model({**model, "io": "continuous", "d_in": cfg.d_in, "d_out": cfg.d_out, "n_ctx": cfg.n_ctx})


def test_label_patch_equals_the_misdirected_run(cfg, tiny):
    r = recall_analysis(cfg, tiny, n_traces=32, seed=1, components=False, progress=False, **NIH)
    t = nih(cfg, 32, probe="misdirect_incorrect", seed=1, offsets=r.offsets, **NIH)
    with torch.no_grad():
        clean, wrong = tiny(t.clean)[:, t.positions], tiny(t.corrupted)[:, t.positions]
    e = (wrong - clean).double().pow(2).sum(-1).mean(0)
    torch.testing.assert_close(torch.tensor(r.e_label, dtype=torch.float64), e, rtol=1e-4, atol=1e-7)
    assert r.e_obs[0] == 0.0 and r.e_obs_all[0] == 0.0  # causality: 1-after reads no observation


def test_component_sweep_invariants(cfg):
    torch.manual_seed(1)
    one_head = build(cfg, {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 1})
    t = nih(cfg, 24, probe="misdirect_incorrect", seed=0, offsets=(1, 2, 3), **NIH)
    assert [c[0] for c in components_of(one_head)] == ["a0", "a0.h0", "m0"]
    for direction in ("noise", "denoise"):
        df = component_sweep(one_head, t.clean, t.corrupted, t.query_position, t.positions, t.offsets, direction)
        a0, h0 = df[df.component == "a0"], df[df.component == "a0.h0"]
        # one head: its result is the whole attention output (b_O is the same in both runs)
        torch.testing.assert_close(torch.tensor(a0.fraction.values), torch.tensor(h0.fraction.values))
        assert len(df) == 3 * 3 and set(df.offset) == {1, 2, 3}
    # patching at p + 1 cannot move the prediction at p
    later = patch_token(t.clean, t.corrupted, t.query_position + 1)
    df = component_sweep(one_head, t.clean, later, t.query_position + 1, t.positions, t.offsets)
    assert (df[df.offset == 1]["shift"] == 0).all() and df[df.offset == 1].fraction.isna().all()
    with pytest.raises(ValueError, match="unknown direction"):
        component_sweep(one_head, t.clean, t.corrupted, 1, t.positions, t.offsets, "sideways")


@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_component_sweep_agrees_with_activation_patch(direction):
    """Cross-check against the independent sweep of mechlab.patching, one offset at a time."""
    from mechlab.patching import activation_patch

    ckpt = mechlab.load_checkpoint(BUNDLED)
    model = ckpt.model.eval()
    t = nih(ckpt, 12, probe="misdirect_incorrect", seed=4, offsets=(1, 2))
    p = t.query_position
    df = component_sweep(model, t.clean, t.corrupted, p, t.positions, t.offsets, direction)
    with torch.no_grad():
        base = model(t.clean).double()
    hooks = ["blocks.0.attn.hook_result", "blocks.1.hook_mlp_out"]
    names = [f"a0.h{h}" for h in range(model.cfg.n_heads)] + ["m1"]
    for j, pos in zip(t.offsets, t.positions.tolist(), strict=True):
        res = activation_patch(
            model, t.clean, t.corrupted, lambda out, pos=pos: (out[:, pos] - base[:, pos]).pow(2).sum(-1).mean(),
            hooks=hooks, positions=[p], heads=True, direction=direction, progress=False,
        )  # fmt: skip
        ours = df[df.offset == j].set_index("component").loc[names, "shift"]
        torch.testing.assert_close(torch.tensor(ours.values), res.values[:, 0].double(), rtol=1e-4, atol=1e-6)
    assert df[(df.offset == 1) & (df.component == "a0")].fraction.item() > 0.5  # the label enters at a0


def test_offsets_beyond_seg_len_are_refused(cfg, tiny):
    with pytest.raises(ValueError, match=r"offset 5 is beyond seg_len=4"):
        recall_analysis(cfg, tiny, offsets=(1, 5), progress=False, **NIH)
    with pytest.raises(ValueError, match="positive integers"):
        recall_analysis(cfg, tiny, offsets=(0,), progress=False, **NIH)
    with pytest.raises(ValueError, match="give the model"):
        recall_analysis(cfg, progress=False, **NIH)
