"""mechlab.prune.setup: what a search needs, built once (here: the warm start's scores)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mechlab.models.transformer import Transformer
from mechlab.prune import setup as prepare
from tests.prune.test_engine import random_data, small_model


def test_the_exact_warm_start_is_the_batched_replay_of_attribute(monkeypatch):
    """The default warm start ("auto": exact single-edge ablation on small graphs) scores
    with the batched replay of ``attribute(..., "exact")`` (not one masked forward per
    edge) and gives the same scores, bit for bit."""
    import mechlab.prune.exact as exact
    from mechlab.prune.attribution import attribute
    from mechlab.prune.config import PruneConfig

    def no_loop(*args, **kwargs):
        raise AssertionError("the warm start took the loop of masked forwards")

    model = small_model("transformer")
    data = random_data(model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ~0.1 s; seconds on two contended threads
    try:
        expected = attribute(model, data, "all", "exact").scores.float().cpu()
        monkeypatch.setattr(exact, "exact_loop_scores", no_loop)
        setup = prepare.prepare_search(model, data, ["all"], PruneConfig(sparsity=0.8, warm_start="exact"), None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(setup.warm[0], expected)
    assert int((expected != 0).sum()) > 0


def test_the_search_runs_on_traces_cut_after_the_last_target():
    """A causal model's search skips the positions after its last target: its traces,
    target masks and references are the first positions of the whole ones, the fully
    ablated loss is the one of the whole traces, and a model that is not causal (or a
    windowed graph) keeps every position."""
    from mechlab.prune.config import PruneConfig
    from mechlab.prune.graph import pruning_graph
    from mechlab.traces import target_mask

    def early(traces):  # positions 1 and 3 of 8 (3 in some traces only)
        mask = torch.zeros(traces.inputs.shape[:2], dtype=torch.bool)
        mask[:, 1] = True
        mask[::2, 3] = True
        return mask

    model = small_model("transformer")
    data = random_data(model)
    n_pos = data.train.n_pos
    assert n_pos > 4
    config = PruneConfig(sparsity=0.8, warm_start="none", refine_pool="none")
    setup = prepare.prepare_search(model, data, [early], config)
    assert setup.train.n_pos == 4 and torch.equal(setup.train.inputs, data.train.inputs[:, :4])
    assert torch.equal(setup.positions[0], target_mask(early, data.train)[:, :4])
    with torch.no_grad():
        torch.testing.assert_close(setup.reference, model(data.train.inputs)[:, :4])
    whole = prepare.ablated_loss(model, setup.graph, data.train, target_mask(early, data.train),
                                 model(data.train.inputs).detach(), prepare.make_ablation(
                                     model, "interchange", data.train, graph=setup.graph))  # fmt: skip
    assert setup.ablated_losses[0] == pytest.approx(whole, rel=1e-5)

    ahead = Transformer(dataclasses.replace(model.cfg, causal=False))  # a model that sees ahead
    kept, positions = prepare.cut_after_targets(ahead, pruning_graph(ahead), data.train, [early])
    assert kept is data.train and positions[0].shape == (len(data.train), n_pos)
