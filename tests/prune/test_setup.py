"""mechlab.prune.setup: what a search needs, built once (here: the warm start's scores)."""

from __future__ import annotations

import torch

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
