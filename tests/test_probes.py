"""mechlab.probes: activations, sklearn-shaped probes, recall targets, control tasks, sweeps."""

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from sklearn.base import clone
from sklearn.decomposition import PCA
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, GroupKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import check_estimator
from threadpoolctl import threadpool_limits
from torch import nn

import mechlab
from mechlab.probes import (
    TARGETS,
    ClassifierProbe,
    RegressorProbe,
    collect_activations,
    control_task,
    default_hooks,
    probe_sweep,
    random_twin,
    recall_targets,
    target_positions,
)
from mechlab.tasks import OBS, LDSConfig

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    """Small sklearn fits are much faster without BLAS threads on the shared 2 cores."""
    with threadpool_limits(limits=1):
        yield


BUNDLED = (
    Path(__file__).resolve().parents[1] / "examples" / "checkpoints" / "recall-cpu" / "last.pt"
)
CFG = LDSConfig(
    d_state=3, n_pairs=6, n_ctx=48, zipf_a=0.0, min_systems=2, max_systems=4,
    n_train_systems=50, n_test_systems=300,
)  # fmt: skip
N, S = 3, 4  # haystack systems, observations per segment: (S + 2)(N + 1) = 24 positions


def traces(n: int = 200, seed: int = 0):
    return mechlab.nih(CFG, n_traces=n, n_haystack=N, seg_len=S, probe=None, seed=seed,
                       protocol="uniform")  # the queried slot varies: query_system has classes


def tiny_transformer(seed: int = 0):
    torch.manual_seed(seed)
    return mechlab.build_model(
        "transformer", d_model=16, n_layers=2, n_heads=2, d_in=CFG.d_in, d_out=CFG.d_state,
        n_ctx=CFG.n_ctx,
    )  # fmt: skip


def planted(n: int, d: int, seed: int, strength: float) -> tuple[np.ndarray, ...]:
    """``(X, y, u)``: Gaussian activations moved by +-strength along a random unit vector u."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    y = rng.integers(0, 2, size=n)
    X = rng.normal(size=(n, d)) + strength * (2 * y[:, None] - 1) * u
    return X, y, u


# ---------------------------------------------------------------- probes on planted features


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_probe_finds_a_planted_direction_and_nothing_where_it_is_absent(seed):
    X, y, u = planted(400, 32, seed, strength=2.0)
    groups = np.arange(400) // 4
    cv = GroupKFold(n_splits=4)
    found = cross_val_score(ClassifierProbe(), X, y, groups=groups, cv=cv).mean()
    absent = cross_val_score(ClassifierProbe(), X - (X @ u)[:, None] * u, y, groups=groups, cv=cv)
    assert found > 0.95  # Bayes accuracy Phi(2) = 0.977
    assert absent.mean() < 0.62  # chance 0.5, 100 test samples per fold
    coef = ClassifierProbe().fit(X, y).coef_[0]
    # the probe's direction is the planted one (measured cosines 0.89-0.91; the other 31
    # dimensions pick up finite-sample noise)
    assert coef @ u / np.linalg.norm(coef) > 0.85


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


# ------------------------------------------------------------------- sklearn conventions


def test_probes_follow_sklearn_conventions():
    X, y, _ = planted(120, 6, 0, strength=1.5)
    for probe in (ClassifierProbe(C=0.5), RegressorProbe(alpha=2.0)):
        assert not hasattr(probe, "coef_") and not hasattr(probe, "n_features_in_")
        with pytest.raises(NotFittedError):
            probe.predict(X)
        twin = clone(probe)
        assert twin.get_params() == probe.get_params() and twin is not probe
        twin.set_params(standardize=False)
        assert twin.get_params()["standardize"] is False and probe.standardize is True
        probe.fit(X, y)
        assert probe.n_features_in_ == 6 and probe.coef_.shape[-1] == 6
        with pytest.raises(ValueError, match="features"):
            probe.predict(X[:, :5])
    assert list(ClassifierProbe().fit(X, y).classes_) == [0, 1]
    # inside a Pipeline, a grid search and a cross-validation
    pipe = make_pipeline(PCA(n_components=4), ClassifierProbe())
    assert cross_val_score(pipe, X, y, cv=3).mean() > 0.7
    grid = GridSearchCV(ClassifierProbe(), {"C": [0.01, 1.0]}, cv=3).fit(X, y)
    assert grid.best_params_["C"] in (0.01, 1.0)


def test_hyperparameters_are_stored_verbatim_and_checked_in_fit():
    X, y, _ = planted(40, 3, 0, strength=1.0)
    probe = ClassifierProbe(C=-1.0)  # no error at construction (sklearn convention)
    assert probe.C == -1.0
    with pytest.raises(ValueError, match="C must be a positive finite number"):
        probe.fit(X, y)
    with pytest.raises(ValueError, match="alpha must be"):
        RegressorProbe(alpha=0).fit(X, y.astype(float))
    with pytest.raises(ValueError, match="standardize must be True or False"):
        RegressorProbe(standardize="yes").fit(X, y.astype(float))
    with pytest.raises(ValueError, match="max_iter"):
        ClassifierProbe(max_iter=0).fit(X, y)
    with pytest.raises(ValueError, match="class"):
        ClassifierProbe().fit(X, np.zeros(40))  # one class


@pytest.mark.parametrize("standardize", [True, False])
def test_coefficients_live_in_the_input_space(standardize):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 5)) * [1, 10, 0.1, 3, 1] + [5, -2, 0, 1, 7]
    y3 = rng.integers(0, 3, 80)
    clf = ClassifierProbe(standardize=standardize).fit(X, y3)
    np.testing.assert_allclose(
        X @ clf.coef_.T + clf.intercept_, clf.decision_function(X), atol=1e-8
    )
    Y = X @ rng.normal(size=(5, 2)) + rng.normal(size=(80, 2))
    reg = RegressorProbe(standardize=standardize).fit(X, Y)
    np.testing.assert_allclose(X @ reg.coef_.T + reg.intercept_, reg.predict(X), atol=1e-8)
    # a torch tensor is accepted and gives the same fit as the numpy array
    reg_t = RegressorProbe(standardize=standardize).fit(torch.tensor(X), torch.tensor(Y))
    np.testing.assert_allclose(reg_t.coef_, reg.coef_)
    np.testing.assert_allclose(reg_t.predict(torch.tensor(X)), reg.predict(X))


def test_regressor_probe_recovers_a_planted_linear_map():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 8))
    W = rng.normal(size=(3, 8))
    Y = X @ W.T + 0.5 + 0.01 * rng.normal(size=(300, 3))
    reg = RegressorProbe(alpha=1e-3).fit(X, Y)
    np.testing.assert_allclose(reg.coef_, W, atol=0.01)
    np.testing.assert_allclose(reg.intercept_, 0.5, atol=0.01)
    assert reg.score(X, Y) > 0.999


@pytest.mark.parametrize("probe", [ClassifierProbe(), RegressorProbe()], ids=type)
def test_sklearn_check_estimator_passes(probe):
    """Every check of scikit-learn's check_estimator (55 for the classifier, 52 for the
    regressor; only check_array_api_input is skipped: array_api_compat is not installed)."""
    results = check_estimator(probe, on_fail=None, on_skip=None)
    failed = [r["check_name"] for r in results if r["status"] == "failed"]
    assert not failed
    assert sum(r["status"] == "passed" for r in results) >= 50


# ---------------------------------------------------------------------- activations


def test_collect_activations_matches_one_big_forward_and_restores_the_mode():
    model = tiny_transformer()
    model.train()
    x = traces(7).clean
    hooks = ["blocks.1.hook_resid_post", "blocks.0.attn.hook_pattern"]
    acts = collect_activations(model, x, hooks, positions=[3, -1], batch_size=3, progress=False)
    assert model.training
    model.eval()
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    torch.testing.assert_close(acts[hooks[0]], cache[hooks[0]][:, [3, x.shape[1] - 1]])
    torch.testing.assert_close(acts[hooks[1]], cache[hooks[1]][:, :, [3, x.shape[1] - 1]])
    assert not acts[hooks[0]].requires_grad
    full = collect_activations(model, x, hooks[0], progress=False)[hooks[0]]
    torch.testing.assert_close(full, cache[hooks[0]])


FAMILIES = {
    "lstm": ({"d_hidden": 6}, "blocks.1.lstm.hook_h"),
    "dense_ssm": ({"d_state": 4}, "blocks.1.ssm.hook_h"),
    "mamba": ({"d_state": 3, "expand": 2}, "blocks.1.mixer.hook_ssm_state"),
}


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_collect_activations_on_recurrent_families_matches_the_cache(arch):
    extra, step_hook = FAMILIES[arch]
    torch.manual_seed(0)
    model = mechlab.build_model(
        arch, d_model=8, n_layers=2, d_in=CFG.d_in, d_out=CFG.d_state, n_ctx=CFG.n_ctx, **extra
    )
    x = traces(5).clean
    hooks = [*default_hooks(model), step_hook]
    acts = collect_activations(model, x, hooks, positions=[0, 7, 20], batch_size=2, progress=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
    for hook in hooks:  # per-time-step states: the whole trajectory, cut to the positions
        torch.testing.assert_close(acts[hook], cache[hook][:, [0, 7, 20]])


def test_collect_activations_rejects_bad_input():
    model, x = tiny_transformer(), traces(4).clean
    with pytest.raises(ValueError, match="unknown hook 'blocks.0.hook_resid_pots'; did you mean"):
        collect_activations(model, x, "blocks.0.hook_resid_pots", progress=False)
    with pytest.raises(ValueError, match="out of range"):
        collect_activations(model, x, "hook_embed", positions=[x.shape[1]], progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        collect_activations(model, x, "hook_embed", batch_size=0, progress=False)
    with pytest.raises(ValueError, match="hooks is empty"):
        collect_activations(model, x, [], progress=False)


# ------------------------------------------------------------------------- targets


def test_recall_targets_by_hand():
    t = traces(16, seed=3)
    B = torch.arange(len(t))
    p = t.query_position
    y, groups = recall_targets(t, "query_system", [p, p + 2])
    assert (y == t.query[:, None]).all()
    assert (groups == t.systems[B, t.query][:, None]).all()
    # open_label: in haystack segment h, the label of slot h; in the query segment, the query's
    positions = target_positions(t, "open_label")
    y, groups = recall_targets(t, "open_label", positions)
    for j, i in enumerate(positions):
        h = (i - 1) // (S + 2)
        slot = t.query if h == N else torch.full_like(t.query, h)
        assert (y[:, j] == t.slot_labels[B, slot]).all() and (
            groups[:, j] == t.systems[B, slot]
        ).all()
    # state at i is the target of position i - 1; next_state at i is the target of i
    obs = target_positions(t, "state")
    assert obs == (t.clean_batch.kind[0, : t.n_pos] == OBS).nonzero().flatten().tolist()
    y, _ = recall_targets(t, "state", obs)
    torch.testing.assert_close(y, t.truth[:, [i - 1 for i in obs]])
    nxt = target_positions(t, "next_state")
    assert p in nxt and all(t.observed[:, i].all() for i in nxt)
    y, groups = recall_targets(t, "next_state", nxt)
    torch.testing.assert_close(y, t.truth[:, nxt])
    assert (groups[:, nxt.index(p)] == t.systems[B, t.query]).all()  # 1-after: the query system


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_group_splits_never_share_a_system(name):
    t = traces(120, seed=1)
    y, groups = recall_targets(t, name)
    X = np.zeros((len(t), 1))
    for train, test in GroupKFold(n_splits=5).split(X, groups=groups[:, 0].numpy()):
        assert not set(groups[train, 0].tolist()) & set(groups[test, 0].tolist())


def test_targets_reject_bad_input():
    t = traces(4)
    with pytest.raises(
        ValueError, match=r"unknown probe target 'query'; known targets: \['next_state'"
    ):
        recall_targets(t, "query")
    with pytest.raises(ValueError, match="defined only at observation tokens; not at positions"):
        recall_targets(t, "state", [0, 1])  # start and open tokens
    with pytest.raises(ValueError, match="not at positions"):
        recall_targets(t, "open_label", [S + 2])  # a close token
    with pytest.raises(ValueError, match="need mechlab.nih"):
        recall_targets(t.clean_batch, "state")


# ------------------------------------------------------------------------ control task


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_control_task_is_a_fixed_random_target_per_type(seed):
    g = torch.Generator().manual_seed(seed)
    types = torch.randint(0, 2000, (20000,), generator=g)
    y = torch.multinomial(torch.tensor([0.6, 0.3, 0.1]), 20000, replacement=True, generator=g)
    control = control_task(y, types, seed)
    for value in types.unique()[:50]:
        assert control[types == value].unique().numel() == 1  # one label per type
    freq = torch.bincount(control, minlength=3).float() / len(y)  # 2000 types: std ~0.011
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.05, rtol=0)
    assert not torch.equal(control_task(y, types, seed + 10), control)
    states = torch.randn(len(y), 3, generator=g)
    vectors = control_task(states, types, seed)
    for value in types.unique()[:20]:
        rows = vectors[types == value]
        assert (rows == rows[0]).all()
        assert (states == rows[0]).all(-1).any()  # a target that occurs in the data
    with pytest.raises(ValueError, match="types must be"):
        control_task(y, types[:10])


# ---------------------------------------------------------------------------- sweeps


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


# ------------------------------------------------------------------- bundled checkpoint


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
