"""mechlab.bench.prune: the pruning step and memory benchmark."""

import pytest
import torch

from mechlab.bench.prune import bench_prune
from mechlab.models import build_model


def test_bench_prune_memory_below_naive_stacking():
    torch.manual_seed(0)
    model = build_model("transformer", d_model=8, n_layers=4, n_heads=2, d_in=5, d_out=3, n_ctx=16)
    result = bench_prune(model, batch=4, n_pos=8, repeats=1)
    assert result.memory_ours > 0 and result.memory_naive > 0
    assert result.memory_ratio < 1.0
    assert result.step_seconds > 0 and result.plain_seconds > 0


def test_peak_memory_keeps_the_profilers_native_lines_off_the_terminal():
    import subprocess
    import sys

    code = ("import torch; from mechlab.bench.prune import peak_memory; "
            "print(peak_memory(lambda: torch.ones(1000) * 2))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) >= 4000  # the 1000-float result was allocated
    assert "USDT" not in out.stderr and "profiler_start" not in out.stderr


def test_bench_prune_times_the_straightforward_path_and_can_skip_memory():
    torch.manual_seed(0)
    model = build_model("transformer", d_model=8, n_layers=2, n_heads=2, d_in=5, d_out=3, n_ctx=16)
    result = bench_prune(model, batch=2, n_pos=6, repeats=1, memory=False, straightforward=True)
    assert result.memory_ours is None and result.memory_naive is None
    assert result.straightforward_seconds > 0 and result.step_seconds > 0


def test_bench_prune_memory_recompute_keeps_less():
    torch.manual_seed(0)
    model = build_model("transformer", d_model=16, n_layers=4, n_heads=4, d_in=5, d_out=3, n_ctx=16)
    result = bench_prune(model, batch=4, n_pos=16, repeats=1)
    assert 0 < result.memory_recompute < result.memory_ours < result.memory_naive


def fake_reference(root, source: str):
    folder = root / "src" / "modeling"
    folder.mkdir(parents=True)
    (folder / "modeling_fpt2.py").write_text(source)
    return root


def test_reference_errors_are_one_line_value_errors(tmp_path):
    from mechlab.bench.reference import bench_reference

    with pytest.raises(ValueError, match="no src/modeling/modeling_fpt2.py under"):
        bench_reference(tmp_path / "nothing", "tiny", batch=1, n_pos=4, repeats=1)
    missing = fake_reference(tmp_path / "a", "import mechlab_no_such_package_xyz\n")
    with pytest.raises(ValueError, match="needs the package 'mechlab_no_such_package_xyz'"):
        bench_reference(missing, "tiny", batch=1, n_pos=4, repeats=1)


@pytest.mark.slow
def test_reference_that_does_not_import_or_crashes_is_a_one_line_value_error(tmp_path):
    from mechlab.bench.reference import bench_reference

    old = fake_reference(tmp_path / "b", "from torch import no_such_name_in_torch_xyz\n")
    with pytest.raises(ValueError, match="does not import here"):
        bench_reference(old, "tiny", batch=1, n_pos=4, repeats=1)
    broken = fake_reference(tmp_path / "c", "class FPT2LMHeadModel:\n"
                            "    def __init__(self, *args, **kwargs):\n"
                            "        raise RuntimeError('boom in the reference')\n")  # fmt: skip
    with pytest.raises(ValueError, match="the reference process ended: RuntimeError: boom"):
        bench_reference(broken, "tiny", batch=1, n_pos=4, repeats=1)


def test_cli_reference_without_a_checkout_says_so_in_one_line(tmp_path, capsys):
    from mechlab.cli import main

    assert main(["bench", "prune", "--presets", "tiny", "--reference", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "modeling_fpt2.py" in err


def test_reference_log_alphas_put_every_edge_in_its_table():
    from mechlab.bench.reference import OPEN, reference_log_alphas
    from mechlab.prune.graph import build_graph

    model = build_model("transformer", d_model=8, n_layers=2, n_heads=2, d_in=5, d_out=3, n_ctx=16)
    graph = build_graph(model)
    values = -1.0 - torch.arange(graph.n_edges, dtype=torch.float32)  # unlike any default
    tables = reference_log_alphas(graph, values, n_heads=2)
    w, e = graph.writer_index, graph.edge_index
    assert tables["transformer.h.1.k_read_log_alphas"][w["a0.h1"], 0] == values[e[("a0.h1", "a1.h0.k")]]
    assert tables["transformer.h.0.mlp_read_log_alphas"][w["a0.h0"]] == values[e[("a0.h0", "m0.in")]]
    assert tables["transformer.final_read_log_alphas"][w["m1"]] == values[e[("m1", "out")]]
    assert float(tables["transformer.h.1.attn_write_log_alphas"].min()) == OPEN
    assert len(tables) == 3 + 6 * graph.n_layers
    # every edge's value lands in exactly one table entry
    found = torch.cat([t.flatten() for t in tables.values()])
    assert all(int((found == v).sum()) == 1 for v in values.tolist())


def test_bench_prune_measures_a_mamba_against_its_plain_step():
    from mechlab.bench.prune import scale_model

    with pytest.raises(ValueError, match="unknown preset"):
        scale_model("nope", 8)
    torch.manual_seed(0)
    model = build_model("mamba", d_model=8, n_layers=2, d_state=2, io="tokens", d_vocab=11, n_ctx=8)
    result = bench_prune(model, batch=2, n_pos=6, repeats=1)
    assert result.config["n_edges"] == 6 and result.memory_naive is None and result.memory_ratio is None
    assert result.memory_ours > 0 and result.memory_plain > 0 and result.step_seconds > 0
    with pytest.raises(ValueError, match="only that path"):
        bench_prune(model, batch=2, n_pos=6, repeats=1, memory=False, straightforward=True)
