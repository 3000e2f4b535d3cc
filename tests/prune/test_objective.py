"""The objective every circuit method scores against (mechlab.prune.objective): the chunk of
traces a gradient pass takes shrinks to what the free memory holds, and the gradient is the
same sum in smaller parts."""

from __future__ import annotations

import pytest
import torch

import mechlab.limits
from mechlab.models.registry import build_model
from mechlab.prune.attribution import _gradient, build_objective
from mechlab.prune.forward import frozen_eval
from mechlab.prune.graph import pruning_graph
from mechlab.prune.objective import GRADIENT_VECTORS_PER_READER, MEMORY_SHARE
from mechlab.traces import Traces

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def objective():
    torch.manual_seed(0)
    model = build_model({"arch": "transformer", "d_model": 16, "n_layers": 2, "n_heads": 2, "d_mlp": 32,
                         "io": "continuous", "d_in": 5, "d_out": 3, "n_ctx": 6})  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    traces = Traces(torch.randn(24, 6, 5, generator=gen), corrupted=torch.randn(24, 6, 5, generator=gen))
    graph = pruning_graph(model, traces.windows, None)
    with frozen_eval(model):
        yield build_objective(model, traces, "all", "interchange", "loss", graph, batch_size=128)


def per_trace(obj) -> int:
    return GRADIENT_VECTORS_PER_READER * obj.graph.n_readers * obj.traces.n_pos * obj.model.cfg.d_model * 4


def test_the_chunk_is_what_the_free_memory_holds(objective, monkeypatch):
    need = per_trace(objective)
    for free, chunk in ((None, 128), (10**15, 128), (int(5 * need / MEMORY_SHARE) + 1, 5), (10, 1)):
        monkeypatch.setattr(mechlab.limits, "available_memory", lambda free=free: free)
        assert objective.gradient_chunk(128) == chunk
        assert objective.gradient_chunk(3) == min(3, chunk)


def test_the_gradient_in_small_chunks_is_the_gradient_in_one(objective, monkeypatch):
    z = torch.rand(objective.graph.n_edges, generator=torch.Generator().manual_seed(2))
    whole = _gradient(objective, z, 128)
    sizes = []
    chunks = objective.chunks

    def recorded(batch_size):
        sizes.append(batch_size)
        return chunks(batch_size)

    monkeypatch.setattr(objective, "chunks", recorded)
    monkeypatch.setattr(mechlab.limits, "available_memory", lambda: int(5 * per_trace(objective) / MEMORY_SHARE) + 1)
    chunked = _gradient(objective, z, 128)
    assert sizes == [5]  # 24 traces in 5 chunks, where 128 would take them at once
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-8)
    assert whole.abs().max() > 1e-3
