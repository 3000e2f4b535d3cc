"""Position-aware graphs of recurrent models: windows, state edges, their masked forward.

The windowed graph (:func:`mechlab.prune.graph.windowed_recurrent_graph`) splits the
sequence into position windows; a layer's input edges act within a window and its
*state edge* carries its recurrent state from one window into the next. Checked here:

* the mixers' ``initial_state`` / ``return_state`` path: a sequence run in pieces, each
  from the state the previous piece ended with, is the sequence run whole (LSTM fused
  and unrolled, dense SSM, Mamba; float64);
* the masked forward's invariants for all three families (float64): all masks 1 is the
  model's output, all masks 0 its output on the ablation input, closing only a state
  edge equals the model's own forward with that layer's state at the window boundary
  patched (through its step hooks) to the corrupted run's, and every mask gets a
  gradient;
* NiH traces carry their windows; windowed circuits are evaluated on the windowed graph;
* a planted 1-layer dense SSM whose output at the target comes only through the state
  edge (corruption in the haystack) or only through the label window's input
  (corruption at the label), checked by exhaustive single-edge ablation and recovered
  exactly by :func:`prune` at its defaults for several seeds.
"""

from __future__ import annotations

import pytest
import torch

from mechlab.models.dense_ssm import DenseSSM, DenseSSMConfig
from mechlab.models.registry import build_model
from mechlab.prune.circuit import Circuit
from mechlab.prune.engine import prune
from mechlab.prune.evaluate import evaluate_circuit
from mechlab.prune.forward import (
    WindowedAblation,
    make_ablation,
    masked_forward,
    select_traces,
    window_states,
)
from mechlab.prune.graph import build_graph, countable_edges, pruning_graph
from mechlab.prune.stats import graph_edges
from mechlab.tasks.lds import LDSConfig
from mechlab.tasks.lds_prune import nih_prune_data
from mechlab.traces import PruneData, Traces, target_positions
from mechlab.viz import circuit_figure
from tests.prune.test_planted import LN_EPS, LN_WEIGHT, unit_vectors, write

ARCHS = ("lstm", "dense_ssm", "mamba")
MIXER = {"lstm": "lstm", "dense_ssm": "ssm", "mamba": "mixer"}
WINDOWS = (("haystack", 0, 6), ("label", 6, 7), ("continuation", 7, 10))
N_POS = 10


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def small_model(arch: str, n_layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    extra = {"dense_ssm": {"d_state": 6}, "mamba": {"d_state": 4}}.get(arch, {})
    cfg = {"arch": arch, "d_model": 12, "n_layers": n_layers, "d_in": 3, "d_out": 2, "n_ctx": 16}
    return build_model({**cfg, **extra}).double().eval()


def random_traces(batch: int = 5, seed: int = 0) -> Traces:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, N_POS, 3, generator=g, dtype=torch.float64)
    corrupted = torch.randn(batch, N_POS, 3, generator=g, dtype=torch.float64)
    return Traces(x, corrupted, windows=WINDOWS)


# ---------------------------------------------------------------------------------------
# The mixers' state path
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", [*ARCHS, "lstm-unrolled"])
def test_mixer_run_in_pieces_from_carried_state_equals_the_whole_run(arch):
    model = small_model(arch.split("-")[0])
    mixer = getattr(model.blocks[0], MIXER[model.cfg.arch])
    if arch == "lstm-unrolled":
        mixer.fused = False
    x = torch.randn(3, 9, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = mixer(x)
        pieces, state = [], None
        for a, b in ((0, 4), (4, 5), (5, 9)):  # a piece shorter than Mamba's conv window too
            out, state = mixer(x[:, a:b], state, return_state=True)
            pieces.append(out)
    assert (torch.cat(pieces, dim=1) - whole).abs().max() < 1e-12
    # the final state is the one the next position would start from: not a no-op
    assert state.abs().max() > 1e-3


def test_lstm_state_is_torch_lstms_h_and_c():
    model = small_model("lstm")
    mixer = model.blocks[0].lstm
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        _, state = mixer(x, return_state=True)
        _, (h_n, c_n) = mixer.rnn(x)
    assert torch.equal(state[:, 0], h_n[0]) and torch.equal(state[:, 1], c_n[0])


# ---------------------------------------------------------------------------------------
# The masked forward
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_all_open_is_the_model_and_all_closed_is_the_corrupted_run(arch):
    model, traces = small_model(arch), random_traces()
    graph = pruning_graph(model, traces.windows)
    ablated = make_ablation(model, "interchange", traces, graph=graph)
    assert isinstance(ablated, WindowedAblation)
    with torch.no_grad():
        ones = masked_forward(model, graph, traces.inputs, ablated, torch.ones(graph.n_edges))
        zeros = masked_forward(model, graph, traces.inputs, ablated, torch.zeros(graph.n_edges))
        assert (ones - model(traces.inputs)).abs().max() < 1e-12
        assert (zeros - model(traces.corrupted)).abs().max() < 1e-12
        # node masks of 0 ablate every out-edge, the state edges included
        nodes = torch.zeros(graph.n_writers, dtype=torch.float64)
        by_nodes = masked_forward(
            model, graph, traces.inputs, ablated, torch.ones(graph.n_edges), nodes
        )
        assert (by_nodes - model(traces.corrupted)).abs().max() < 1e-12


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["mean", "zero"])
def test_all_closed_under_mean_and_zero_ablation_matches_the_plain_graph(arch, kind):
    """With every edge closed each read-out sees only ablated writers, whatever the states."""
    model, traces = small_model(arch), random_traces()
    reference = random_traces(batch=7, seed=3).inputs
    windowed = pruning_graph(model, traces.windows)
    plain = build_graph(model)
    with torch.no_grad():
        abl_w = make_ablation(model, kind, traces, reference=reference, graph=windowed)
        abl_p = make_ablation(model, kind, traces, reference=reference)
        out_w = masked_forward(model, windowed, traces.inputs, abl_w, torch.zeros(windowed.n_edges))
        out_p = masked_forward(model, plain, traces.inputs, abl_p, torch.zeros(plain.n_edges))
    assert (out_w - out_p).abs().max() < 1e-12
    if kind == "zero":
        assert all(bool((s == 0).all()) for s in abl_w.states)
    else:  # the mean over the reference of the states at each boundary
        states = window_states(model, reference, WINDOWS)
        for ours, theirs in zip(abl_w.states, states, strict=True):
            assert (ours[:, 0] - theirs.mean(1)).abs().max() < 1e-12


def _state_patch_hooks(model, layer: int, boundary: int, corrupted_cache) -> list:
    """Hooks that set ``layer``'s state after position ``boundary - 1`` to the corrupted run's."""
    arch = model.cfg.arch
    prefix = f"blocks.{layer}.{MIXER[arch]}"
    if arch == "lstm":
        names = [f"{prefix}.hook_h", f"{prefix}.hook_c"]
        positions = [boundary - 1]
    elif arch == "dense_ssm":
        names, positions = [f"{prefix}.hook_h"], [boundary - 1]
    else:  # Mamba: the SSM state, and the conv's inputs it still sees after the boundary
        names = [f"{prefix}.hook_ssm_state", f"{prefix}.hook_conv_in"]
        positions = list(range(boundary - (model.cfg.d_conv - 1), boundary))

    def hook_for(name):
        def patch(act, hook):
            chosen = positions if name.endswith(("hook_conv_in",)) else [boundary - 1]
            act[:, chosen] = corrupted_cache[name][:, chosen]
            return act

        return patch

    return [(name, hook_for(name)) for name in names]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("window", ["label", "continuation"])
def test_closing_a_state_edge_runs_the_next_window_from_the_corrupted_state(arch, layer, window):
    """Independent computation from the model's own forward and hooks, in two passes.

    Pass 1 patches layer ``layer``'s state after position ``b - 1`` (``b`` the window's
    start) to the corrupted run's, through its step hooks; that also changes the
    layer's outputs before ``b`` (an LSTM's ``h`` is its output), which the state edge
    does not, so pass 2 runs the model with the layer's output taken from the clean
    run before ``b`` and from pass 1 from ``b`` on.
    """
    model, traces = small_model(arch), random_traces()
    graph = pruning_graph(model, traces.windows)
    b = dict((n, a) for n, a, _ in WINDOWS)[window]
    z = torch.ones(graph.n_edges, dtype=torch.float64)
    z[graph.edge_offset[f"l{layer}.state@{window}"]] = 0.0
    ablated = make_ablation(model, "interchange", traces, graph=graph)
    mixer_out = f"blocks.{layer}.hook_mixer_out"
    with torch.no_grad():
        ours = masked_forward(model, graph, traces.inputs, ablated, z)
        _, corrupted = model.run_with_cache(traces.corrupted)
        clean_out, clean = model.run_with_cache(traces.inputs)
        saved = {}

        def save(act, hook):
            saved["out"] = act.clone()

        model.run_with_hooks(
            traces.inputs, fwd_hooks=[*_state_patch_hooks(model, layer, b, corrupted), (mixer_out, save)]
        )
        spliced = torch.cat([clean[mixer_out][:, :b], saved["out"][:, b:]], dim=1)
        theirs = model.run_with_hooks(traces.inputs, fwd_hooks=[(mixer_out, lambda act, hook: spliced)])
    assert (ours - theirs).abs().max() < 1e-12
    assert (ours[:, :b] - clean_out[:, :b]).abs().max() < 1e-12
    assert (ours[:, b:] - clean_out[:, b:]).abs().max() > 1e-4  # the edge did something


@pytest.mark.parametrize("arch", ARCHS)
def test_every_mask_gets_a_gradient(arch):
    model, traces = small_model(arch), random_traces()
    graph = pruning_graph(model, traces.windows)
    ablated = make_ablation(model, "interchange", traces, graph=graph)
    z = torch.full((graph.n_edges,), 0.5, dtype=torch.float64, requires_grad=True)
    nodes = torch.full((graph.n_writers,), 0.5, dtype=torch.float64, requires_grad=True)
    for p in model.parameters():
        p.requires_grad_(False)
    masked_forward(model, graph, traces.inputs, ablated, z, nodes).pow(2).sum().backward()
    assert bool((z.grad.abs() > 0).all()), [e for e, g in zip(graph.edges, z.grad, strict=True) if g == 0]
    assert bool((nodes.grad.abs() > 0).all())


def test_select_traces_takes_writers_and_states_of_the_same_traces():
    model, traces = small_model("lstm"), random_traces()
    graph = pruning_graph(model, traces.windows)
    ablated = make_ablation(model, "interchange", traces, graph=graph)
    index = torch.tensor([3, 1])
    picked = select_traces(ablated, index)
    assert torch.equal(picked.writers, ablated.writers[:, index])
    assert all(torch.equal(a, b[:, index]) for a, b in zip(picked.states, ablated.states, strict=True))
    mean = make_ablation(model, "mean", traces, graph=graph)
    assert select_traces(mean, index) is mean  # one value for every trace


def test_bad_ablation_for_the_graph_is_refused():
    model, traces = small_model("dense_ssm"), random_traces()
    windowed, plain = pruning_graph(model, traces.windows), build_graph(model)
    with pytest.raises(ValueError, match="WindowedAblation"):
        masked_forward(model, windowed, traces.inputs, make_ablation(model, "interchange", traces),
                       torch.ones(windowed.n_edges))  # fmt: skip
    with pytest.raises(ValueError, match="no windows"):
        masked_forward(model, plain, traces.inputs,
                       make_ablation(model, "interchange", traces, graph=windowed),
                       torch.ones(plain.n_edges))  # fmt: skip


# ---------------------------------------------------------------------------------------
# Data and plumbing
# ---------------------------------------------------------------------------------------


def test_nih_traces_carry_their_windows():
    cfg = LDSConfig(d_state=3, n_pairs=8, n_ctx=64, min_systems=2, max_systems=4,
                    n_train_systems=50, n_test_systems=20)  # fmt: skip
    data = nih_prune_data(cfg, n_train=4, n_test=4, n_haystack=3, seg_len=6)
    p, T = data.train.query_position, data.train.n_pos
    assert data.train.windows == (("haystack", 0, p), ("label", p, p + 1), ("continuation", p + 1, T))
    assert data.test.windows == data.train.windows
    assert data.train.subset(torch.tensor([0, 2])).windows == data.train.windows
    assert data.info["windows"] == [list(w) for w in data.train.windows]
    # the corruption changes the query label only: nothing before it differs
    assert torch.equal(data.train.inputs[:, :p], data.train.corrupted[:, :p])
    assert not torch.equal(data.train.inputs[:, p], data.train.corrupted[:, p])


@pytest.mark.parametrize(
    "windows, match",
    [
        ((("a", 0, 4), ("b", 5, N_POS)), "consecutive"),
        ((("a", 0, 4), ("b", 4, 4), ("c", 4, N_POS)), "consecutive"),
        ((("a", 0, 4), ("a", 4, N_POS)), "distinct"),
        ((("a", 0, 4), ("b", 4, N_POS - 1)), "cover"),
        ((("a@x", 0, N_POS),), "without"),
        ((), "empty"),
    ],
)
def test_bad_windows_are_refused_in_one_line(windows, match):
    with pytest.raises(ValueError, match=match) as err:
        Traces(torch.zeros(2, N_POS, 3), windows=windows)
    assert "\n" not in str(err.value)


def test_pruning_graph_choice():
    lstm, traces = small_model("lstm"), random_traces()
    assert pruning_graph(lstm, traces.windows).windows == WINDOWS
    assert pruning_graph(lstm, None).n_edges == build_graph(lstm).n_edges
    assert not pruning_graph(lstm, traces.windows, position_aware=False).windows
    with pytest.raises(ValueError, match="needs traces with windows"):
        pruning_graph(lstm, None, position_aware=True)
    transformer = build_model({"arch": "transformer", "d_model": 8, "n_layers": 1, "n_heads": 2,
                               "d_in": 3, "d_out": 2, "n_ctx": 16})  # fmt: skip
    assert not pruning_graph(transformer, traces.windows).windows  # unchanged for transformers
    with pytest.raises(ValueError, match="recurrent"):
        pruning_graph(transformer, traces.windows, position_aware=True)


# ---------------------------------------------------------------------------------------
# Planted: the target's output only through the state edge, or only through the label
# ---------------------------------------------------------------------------------------

PLANTED_WINDOWS = (("haystack", 0, 4), ("label", 4, 5), ("continuation", 5, 7))
LABEL = 4  # the label window's one position


def planted_rotation_ssm():
    """A 1-layer dense SSM that rotates a unit state by each input's angle.

    Read-in: the input (a unit vector) into slot 0; the layer reads slot 0 and writes
    its state into slot 1; the read-out reads slot 1 and half of slot 0. So the output
    at ``t`` is the state rotated by the angles of inputs ``0..t``, plus half the input.
    """
    cfg = DenseSSMConfig(d_model=12, n_layers=1, d_state=2, d_in=2, d_out=2, n_ctx=8)
    model = DenseSSM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (model.ln_final, model.blocks[0].norm):
            norm.eps = LN_EPS
            norm.weight.fill_(LN_WEIGHT)
        write(model.read_in.proj.weight.T, 0, (0, 1))
        ssm = model.blocks[0].ssm
        ssm.W_A[0, 0, 0], ssm.W_A[0, 1, 1], ssm.W_A[1, 0, 1], ssm.W_A[1, 1, 0] = 1, -1, 1, 1
        ssm.h_init[0] = 1.0
        write(ssm.W_out.weight.T, 1, (0, 1))
        read_out = model.read_out.proj.weight
        read_out[0, 4], read_out[1, 5], read_out[0, 0], read_out[1, 1] = 1.0, 1.0, 0.5, 0.5
    return model.eval()


def planted_case(corrupt: str, seed: int, n: int) -> Traces:
    """Unit-vector traces whose corruption is confined to the haystack or to the label."""
    x = unit_vectors(n, 7, 10 * seed)
    other = unit_vectors(n, 7, 10 * seed + 1)
    corrupted = x.clone()
    where = slice(0, LABEL) if corrupt == "haystack" else slice(LABEL, LABEL + 1)
    corrupted[:, where] = other[:, where]
    return Traces(x, corrupted, query_position=LABEL, seg_len=2, windows=PLANTED_WINDOWS)


PLANTED_CASES = {
    # the haystack differs: the target's output changes only through the carried state
    "state": ("haystack", "1-after", {
        ("embed@haystack", "l0.in@haystack"), ("l0@haystack", "l0.state@label"),
        ("l0@label", "out@label"),
    }),
    # the label differs: only through the label window's input (into the layer, and direct)
    "label": ("label", "1-after", {
        ("embed@label", "l0.in@label"), ("l0@label", "out@label"), ("embed@label", "out@label"),
    }),
    # the label differs, the target is one later: the label is carried by the state edge
    "label-carried": ("label", "2-after", {
        ("embed@label", "l0.in@label"), ("l0@label", "l0.state@continuation"),
        ("l0@continuation", "out@continuation"),
    }),
}  # fmt: skip


def planted_data(case: str, seed: int) -> PruneData:
    corrupt = PLANTED_CASES[case][0]
    return PruneData(planted_case(corrupt, seed, 16), planted_case(corrupt, seed + 100, 32))


@pytest.mark.parametrize("case", list(PLANTED_CASES))
def test_planted_edges_matter_at_the_target_and_every_other_edge_is_inert(case):
    model = planted_rotation_ssm()
    _, target, planted = PLANTED_CASES[case]
    traces = planted_data(case, 0).test
    graph = pruning_graph(model, traces.windows)
    assert graph.n_edges == 11
    ablated = make_ablation(model, "interchange", traces, graph=graph)
    at = target_positions(target, traces)
    effects = {}
    with torch.no_grad():
        full = model(traces.inputs)[:, at]
        for i, edge in enumerate(graph.edges):
            z = torch.ones(graph.n_edges)
            z[i] = 0.0
            out = masked_forward(model, graph, traces.inputs, ablated, z)[:, at]
            effects[edge] = float((out - full).pow(2).mean())
    assert min(effects[e] for e in planted) > 1e-3
    assert max(v for e, v in effects.items() if e not in planted) < 1e-12


@pytest.mark.parametrize("case", list(PLANTED_CASES))
def test_default_search_recovers_the_planted_windowed_circuit_exactly(case):
    model = planted_rotation_ssm()
    _, target, planted = PLANTED_CASES[case]
    graph = pruning_graph(model, PLANTED_WINDOWS)
    scored = [LABEL] if target == "1-after" else [LABEL + 1]
    n_countable = int(countable_edges(graph, "interchange", scored).sum())
    assert n_countable == (5 if target == "1-after" else 7)  # edges reaching the target's read-out
    sparsity = 1 - len(planted) / n_countable
    for seed in range(3):  # optimiser and data seeds both vary
        circuit = prune(model, planted_data(case, seed), target, sparsity, seed=seed, progress=False)
        assert set(circuit.edges) == planted, f"seed {seed}"
        meta = circuit.metadata
        assert meta["metrics"]["faithfulness"] > 0.999
        assert meta["metrics"]["complement_faithfulness"] < 0.01
        assert meta["n_edges_countable"] == n_countable
        assert meta["n_edges_excluded_unreachable"] == graph.n_edges - n_countable
        assert meta["graph"]["windows"] == [list(w) for w in PLANTED_WINDOWS]
        # evaluated again on the same windows: the same metrics
        again = evaluate_circuit(model, planted_data(case, seed), circuit)
        assert again["faithfulness"] == pytest.approx(meta["metrics"]["faithfulness"])


def test_plain_graph_on_request_and_its_three_edges():
    model = planted_rotation_ssm()
    data = planted_data("label", 0)
    circuit = prune(model, data, "1-after", 0.5, steps=20, progress=False, position_aware=False)
    assert "windows" not in circuit.metadata["graph"]
    assert circuit.metadata["graph"]["n_edges"] == 3
    assert set(circuit.edges) <= {("embed", "l0.in"), ("embed", "out"), ("l0", "out")}


def test_windowed_circuit_nodes_in_forward_order_and_its_plot():
    graph = pruning_graph(planted_rotation_ssm(), PLANTED_WINDOWS)
    edges = dict.fromkeys(PLANTED_CASES["label-carried"][2], 1.0)
    circuit = Circuit.from_edges(edges, metadata={"graph": graph.summary()})
    assert circuit.nodes == ["embed@label", "l0@label", "l0@continuation", "out@continuation"]
    fig = circuit_figure(circuit)
    assert list(fig.layout.yaxis.ticktext) == ["haystack", "label", "continuation"]
    state_lines = [t for t in fig.data if t.name == "→ state"]
    assert len(state_lines) == 1
    xs = [x for x in state_lines[0].x if x is not None]  # a curve from l0@label to l0@continuation
    ys = [y for y in state_lines[0].y if y is not None]
    rows = dict(zip(fig.layout.yaxis.ticktext, fig.layout.yaxis.tickvals, strict=True))
    assert (xs[0], ys[0]) == (1.0, rows["label"]) and (xs[-1], ys[-1]) == (1.0, rows["continuation"])
    assert max(xs) > 1.0  # it bows to the right of the layer's column, past the in-window edges


def test_overlap_statistics_rebuild_the_windowed_graph():
    graph = pruning_graph(planted_rotation_ssm(), PLANTED_WINDOWS)
    circuit = Circuit.from_edges(
        dict.fromkeys(PLANTED_CASES["state"][2], 1.0), metadata={"graph": graph.summary()}
    )
    assert graph_edges(circuit) == graph.edges
