"""The search core (mechlab.prune.search): the budget threshold, the budget kept at every
step, a result independent of the loss's scale, the batch sampler, the task loss."""

from __future__ import annotations

import math

import pytest
import torch

from mechlab.prune import masks as hc
from mechlab.prune.engine import prune
from mechlab.prune.graph import build_graph, countable_edges
from mechlab.prune.planted import PLANTED_FAMILY, planted_model
from mechlab.prune.search import BatchSampler, budget_shift, lr_factor, task_loss, warm_logits

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_budget_shift_meets_the_count_exactly():
    g = torch.Generator().manual_seed(0)
    la = torch.randn(3, 50, generator=g) * 3
    counted = torch.rand(3, 50, generator=g) > 0.2
    want = torch.tensor([1.0, 7.5, 12.0])  # reachable: below the summed weights
    weight = torch.rand(3, 50, generator=g)
    for w in (None, weight):
        tau = budget_shift(la, counted, want, w)
        p = hc.prob_nonzero(la.double() - tau.double()[:, None]) * counted
        if w is not None:
            p = p * w
        torch.testing.assert_close(p.sum(1), want.double(), atol=1e-6, rtol=0)
    # asking every counted edge open: the threshold sits far below every logit
    tau = budget_shift(la, counted, counted.sum(1).float())
    assert bool((la.masked_fill(~counted, math.inf).amin(1) - tau > 20).all())


@pytest.fixture(scope="module")
def planted():
    return planted_model(PLANTED_FAMILY["t2x4-qk-1:3"])


def test_the_budget_is_met_at_every_step_and_at_the_end(planted):
    model, data = planted.model, planted.data(0)
    n = int(countable_edges(build_graph(model), "interchange").sum())
    sparsity = 1 - len(planted.edges) / n
    circuit = prune(model, data, "all", sparsity, steps=60, progress=False, select="rank")
    for record in circuit.metadata["history"]:  # expected sparsity = the scheduled target
        assert record["sparsity"] == pytest.approx(record["target"], abs=1e-5)
    assert circuit.metadata["final_expected_sparsity"] == pytest.approx(sparsity, abs=1e-5)


def test_the_result_does_not_depend_on_the_scale_of_the_loss(planted):
    """Adam is invariant to the scale of the gradient (but for its eps, 1e-8, a floor under
    which gradients count as noise) and the budget needs no multiplier: raw or normalised
    loss, times 1, 1000 or 1e-3, give the same circuit."""
    model, data = planted.model, planted.data(1)
    n = int(countable_edges(build_graph(model), "interchange").sum())
    kw = {"steps": 80, "seed": 1, "progress": False}
    base = prune(model, data, "all", 1 - 6 / n, **kw)
    for other in ({"loss_scale": 1000.0}, {"normalize_loss": False}, {"normalize_loss": False, "loss_scale": 1e-3}):
        again = prune(model, data, "all", 1 - 6 / n, **kw, **other)
        assert set(again.edges) == set(base.edges) == set(planted.edges), other


def test_batch_sampler_draws_every_trace_once_per_pass():
    gen = torch.Generator().manual_seed(0)
    sampler = BatchSampler(10, 3, gen)
    first = torch.cat([sampler() for _ in range(3)])
    assert len(set(first.tolist())) == 9  # three batches of one permutation, no repeats
    assert torch.equal(BatchSampler(4, 8, gen)(), torch.arange(4))  # all traces when fewer


def test_task_loss_and_lr_factor():
    pred, ref = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.zeros(2, 2)
    assert float(task_loss(pred, ref, "continuous")) == pytest.approx(2.5)  # sum over dims, mean
    logits = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    ids = torch.tensor([0, 0])
    assert float(task_loss(logits, ids, "tokens")) == pytest.approx(-(math.log(0.5) + math.log(0.9)) / 2)
    assert lr_factor(0, 100, 10) == pytest.approx(0.1) and lr_factor(99, 100, 10) == pytest.approx(1 / 90)


def test_warm_logits_follow_the_ranking_not_the_scale():
    scores = torch.tensor([0.5, -3.0, 0.0, 2.0, float("nan"), 1.0])
    countable = torch.tensor([True, True, True, True, True, False])
    out = warm_logits(scores, countable, spread=2.0)
    # |score| order among the countable: 1 (3.0), 3 (2.0), 0 (0.5), then 2 and 4 (0, NaN) in graph order
    assert out.tolist() == pytest.approx([0.0, 2.0, -1.0, 1.0, -2.0, 0.0])
    assert torch.equal(warm_logits(scores * 1e-6, countable, 2.0), out)  # scale-free
    assert warm_logits(scores, torch.zeros(6, dtype=torch.bool)).abs().sum() == 0


def test_a_warm_start_starts_from_the_ranking(planted):
    """With no room to move (one step, a tiny learning rate), a warm-started search hands
    back the attribution's order, and the selection weighs the attribution's own circuit."""
    model, data = planted.model, planted.data(0)
    n = int(countable_edges(build_graph(model), "interchange").sum())
    kw = {"steps": 1, "lr": 1e-6, "progress": False, "warm_start": "exact"}
    circuit = prune(model, data, "all", 1 - 6 / n, **kw)
    top = sorted(circuit.log_alpha, key=lambda e: -circuit.log_alpha[e])[:6]
    assert set(top) == set(planted.edges)  # exact scores single out the planted edges
    assert set(circuit.edges) == set(planted.edges)
    assert circuit.metadata["warm_start"] == circuit.metadata["warm_start_method"] == "exact"
    cold = prune(model, data, "all", 1 - 6 / n, **{**kw, "warm_start": "none", "refine_pool": "none"})
    assert set(cold.edges) != set(planted.edges)  # without it one step finds nothing


def test_auto_warm_start_is_exact_on_small_graphs_and_eap_ig_on_large():
    from mechlab.prune.config import EXACT_WARM_MAX, PruneConfig
    from mechlab.prune.engine import warm_method

    auto = PruneConfig(warm_start="auto")
    assert warm_method(auto, EXACT_WARM_MAX) == "exact"
    assert warm_method(auto, EXACT_WARM_MAX + 1) == "eap-ig"
    assert warm_method(PruneConfig(warm_start="eap-ig"), 10) == "eap-ig"
    assert warm_method(PruneConfig(warm_start="none"), 10) is None
    assert warm_method(PruneConfig(warm_start="eap"), 10) == "eap"


def test_the_selection_pool_is_exact_on_small_graphs_eap_on_large_and_never_the_warm_starts():
    from mechlab.prune.config import EXACT_WARM_MAX, PruneConfig
    from mechlab.prune.engine import pool_method

    default = PruneConfig()  # EAP-IG warm start, refine_pool "auto"
    assert pool_method(default, EXACT_WARM_MAX) == "exact"
    assert pool_method(default, EXACT_WARM_MAX + 1) == "eap"
    assert pool_method(PruneConfig(refine_pool="eap-ig"), 10) is None  # the warm start's own
    assert pool_method(PruneConfig(refine_pool="eap-ig", warm_start="auto"), 10) == "eap-ig"
    assert pool_method(PruneConfig(refine_pool="auto", warm_start="exact"), 10) is None
    assert pool_method(PruneConfig(refine_pool="none"), 10) is None


def test_the_pool_ranking_is_scored_on_the_first_pool_traces(monkeypatch, planted):
    """The default's exact ranking for the selection is scored on the first ``pool_traces``
    training traces (64), the warm start on all of them."""
    from mechlab.prune import setup as prepare
    from mechlab.prune.config import PruneConfig

    seen = []
    real = prepare.attribution_scores

    def spy(model, traces, target, graph, config, method, *args):
        seen.append((method, len(traces)))
        return real(model, traces, target, graph, config, method, *args)

    monkeypatch.setattr(prepare, "attribution_scores", spy)
    data = planted.data(0)
    n = len(data.train)
    assert n > 3
    prepare.prepare_search(planted.model, data, ["all"], PruneConfig(sparsity=0.8, pool_traces=3))
    assert seen == [(None, n), ("exact", 3)]  # None: the warm start's method (EAP-IG)
    seen.clear()
    prepare.prepare_search(planted.model, data, ["all"], PruneConfig(sparsity=0.8, pool_traces=None))
    assert seen == [(None, n), ("exact", n)]


def test_a_default_search_never_imports_torch_dynamo():
    """The first torch Optimizer of a process imports torch._dynamo (a second or more on
    one core); the default search's shared-scale Adam is no Optimizer and needs none."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from mechlab.prune.engine import prune\n"
        "from mechlab.prune.planted import PLANTED_FAMILY, planted_model\n"
        "case = planted_model(PLANTED_FAMILY['t2x4-qk-1:3'])\n"
        "prune(case.model, case.data(), 'all', 0.9, steps=3, batch_size=8)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
