"""probe_sweep: where a carried label is decodable, its table, plot and controls; random_twin; the bundled checkpoint."""

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from torch import nn

import mechlab
from mechlab.probes import (
    RegressorProbe,
    probe_sweep,
    random_twin,
    recall_targets,
)
from tests.probes.helpers import CFG, N, S, tiny_transformer, traces

BUNDLED = (
    Path(__file__).resolve().parents[2] / "examples" / "checkpoints" / "recall-cpu" / "last.pt"
)


class CarryLabel(nn.Module):
    """Writes a fixed random code of the currently open label (plus noise) at every position:
    a hand-built linear feature that survives the observation tokens, which show no label."""

    def __init__(self, n_pairs: int, d: int, seed: int):
        super().__init__()
        self.n_pairs = n_pairs
        self.register_buffer(
            "codes", torch.randn(n_pairs, d, generator=torch.Generator().manual_seed(seed))
        )

    def forward(self, x):
        opens = x[..., 0 : 2 * self.n_pairs : 2]  # [batch, pos, n_pairs]
        pos = torch.arange(x.shape[1]).expand(x.shape[0], -1)
        last_open = torch.where(opens.amax(-1) > 1, pos, 0).cummax(dim=1).values  # [batch, pos]
        label = opens.argmax(-1).gather(1, last_open)
        return self.codes[label] + 0.5 * torch.randn(*label.shape, self.codes.shape[1])


class Planted(nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(CFG.d_in, 16)  # the token alone
        self.carry = CarryLabel(CFG.n_pairs, 16, seed)

    def forward(self, x):
        return self.embed(x) + self.carry(x)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sweep_finds_the_carried_label_only_in_the_hook_that_carries_it(seed):
    t = traces(240, seed)
    model = mechlab.hooked(Planted(seed))
    obs = [1 + h * (S + 2) + 2 for h in range(N)]  # the second observation of each haystack segment
    sweep = probe_sweep(
        model, t, "open_label", hooks=["carry.hook_out", "embed.hook_out"], positions=obs,
        random_model=False, cv=4, seed=seed, progress=False,
    )  # fmt: skip
    carried, token = sweep.scores
    assert (carried > 0.95).all()
    assert (token < sweep.chance + 0.12).all()  # observation tokens show no label
    # the control task (random label per system, split by system) cannot be learned
    assert (sweep.control_scores < 0.45).all()
    np.testing.assert_allclose(sweep.selectivity, sweep.scores - sweep.control_scores)


def test_sweep_table_plot_and_controls_on_a_tiny_model():
    t = traces(60)
    model = tiny_transformer()
    sweep = probe_sweep(model, t, "next_state", positions=[t.query_position, t.query_position + 1],
                        cv=3, progress=False)  # fmt: skip
    assert sweep.hooks == [
        "blocks.0.hook_resid_pre",
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_post",
    ]
    df = sweep.to_dataframe()
    assert len(df) == 3 * 2 and {
        "score",
        "random_model_score",
        "control_score",
        "selectivity",
    } <= set(df)
    np.testing.assert_allclose(df.selectivity, df.score - df.control_score)
    fig = sweep.plot("selectivity")
    assert isinstance(fig, go.Figure) and np.asarray(fig.data[0].z).shape == (3, 2)
    with pytest.raises(ValueError, match="unknown value"):
        sweep.plot("accuracy")
    with pytest.raises(ValueError, match="give a probe of that kind"):
        probe_sweep(model, t, "query_system", probe=RegressorProbe(), progress=False)
    with pytest.raises(ValueError, match="cv must be at least 2"):
        probe_sweep(model, t, "query_system", cv=1, progress=False)
    with pytest.raises(ValueError, match="no residual-stream hooks; pass hooks="):
        probe_sweep(mechlab.hooked(Planted(0)), t, "query_system", progress=False)
    with pytest.raises(ValueError, match="random_model=False"):
        probe_sweep(
            mechlab.hooked(Planted(0)), t, "query_system", hooks=["embed.hook_out"], progress=False
        )


def test_random_twin_is_seeded_and_leaves_the_global_rng_alone():
    model = tiny_transformer(5)
    state = torch.get_rng_state()
    a, b = random_twin(model, seed=1), random_twin(model, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    params = zip(a.parameters(), model.parameters(), strict=True)
    assert any(not torch.equal(pa, pm) for pa, pm in params)
    assert not a.training


def test_bundled_checkpoint_encodes_the_query_system_and_a_random_model_does_not():
    ckpt = mechlab.load_checkpoint(BUNDLED)
    with pytest.raises(ValueError, match="every trace queries haystack slot 0"):
        recall_targets(mechlab.nih(ckpt, n_traces=8, probe=None), "query_system")  # study NiH
    t = mechlab.nih(ckpt, n_traces=512, probe=None, seed=0, protocol="uniform")
    hook, p = f"blocks.{ckpt.config.n_layers - 1}.hook_resid_post", t.query_position
    sweep = probe_sweep(ckpt.model, t, "query_system", hooks=[hook], positions=[p], progress=False)
    row = sweep.to_dataframe().iloc[0]
    assert row.score > 0.95  # measured 1.000 (3 haystack slots)
    assert row.random_model_score < row.chance + 0.1  # measured 0.340, chance 0.359
    assert row.control_score < row.chance + 0.1  # measured 0.326
