"""Writer outputs and ablations (mechlab.prune.ablation): the outputs read in chunks are the
outputs read at once, in the graph's writer order; an ablation too large for the size limit
or for the memory free is refused in one line before the first forward pass."""

from __future__ import annotations

import pytest
import torch

import mechlab.limits
from mechlab.cli import main
from mechlab.models import build_model
from mechlab.prune.ablation import make_ablation, writer_outputs
from mechlab.prune.graph import build_graph
from mechlab.traces import Traces

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model({"arch": "transformer", "d_model": 18, "n_layers": 2, "n_heads": 3, "d_mlp": 32,
                        "io": "tokens", "d_vocab": 11, "n_ctx": 8}).eval()  # fmt: skip


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 11, (n, 8), generator=torch.Generator().manual_seed(seed))


def test_writer_outputs_in_chunks_are_the_outputs_at_once_in_writer_order(model):
    x = tokens(10)
    whole = writer_outputs(model, x)
    assert whole.shape == (build_graph(model).n_writers, 10, 8, 18)
    for batch_size in (1, 3, 9):
        assert torch.equal(writer_outputs(model, x, batch_size=batch_size), whole)
    _, cache = model.run_with_cache(x)  # independent: the hooks read by hand
    assert torch.equal(whole[0], cache["hook_embed"]) and torch.equal(whole[1], cache["hook_pos_embed"])
    for h in range(3):
        assert torch.equal(whole[2 + h], cache["blocks.0.attn.hook_result"][:, :, h])
    assert torch.equal(whole[5], cache["blocks.0.hook_mlp_out"])
    assert torch.equal(whole[-1], cache["blocks.1.hook_mlp_out"])


def test_an_ablation_larger_than_the_memory_free_is_refused_before_any_forward(model, monkeypatch):
    def no_forward(*args, **kwargs):
        raise AssertionError("a forward pass ran before the size was checked")

    monkeypatch.setattr(mechlab.limits, "available_memory", lambda: 10_000)
    monkeypatch.setattr(model, "run_with_cache", no_forward)
    traces = Traces(tokens(64), corrupted=tokens(64, 1))
    needed = build_graph(model).n_writers * 64 * 8 * 18 * 4
    with pytest.raises(ValueError) as err:
        make_ablation(model, "interchange", traces)
    message = str(err.value)
    assert "\n" not in message
    assert f"would need {needed / 1e3:,.0f} kB, more than the 10 kB this machine has free" in message
    assert "lower the number of traces or their length" in message


def test_an_ablation_over_the_size_limit_is_refused_naming_its_factors(model, monkeypatch):
    monkeypatch.setenv("MECHLAB_MAX_ELEMENTS", "1000")
    with pytest.raises(ValueError, match=r"the writers' outputs would hold writers 10 x traces 64 x positions 8 x "
                                         r"d_model 18 = 9.22e\+04 elements .*; lower traces"):  # fmt: skip
        writer_outputs(model, tokens(64))


def test_what_fits_is_not_refused(model, monkeypatch):
    needed = build_graph(model).n_writers * 4 * 8 * 18 * 4
    monkeypatch.setattr(mechlab.limits, "available_memory", lambda: needed)
    assert writer_outputs(model, tokens(4)).shape[1] == 4


def test_mechlab_prune_refuses_in_one_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(mechlab.limits, "available_memory", lambda: 1000)
    out = tmp_path / "out"
    code = main(["prune", "--ckpt", "examples/checkpoints/recall-cpu/last.pt", "--target", "1-after",
                 "--out", str(out), "--steps", "5", "--no-progress"])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "this machine has free" in err and "Traceback" not in err
    assert not out.exists()
