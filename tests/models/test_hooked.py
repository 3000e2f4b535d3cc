"""Tests of mechlab.models.hooked: any torch module gets the TransformerLens hook API."""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from nnsight import NNsight
from torch import nn

from mechlab.models.hooked import HookedModule, hooked
from mechlab.models.registry import FAMILIES, build_model

# Net calls `act` twice on purpose (the hook point sees both calls); the warning that says so
# to a user is expected here.
pytestmark = pytest.mark.filterwarnings("ignore:submodule 'act' ran more than once")


class Zeros(nn.Module):
    """Stands in for a submodule whose output is edited to zero."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        out = self.module(*args)
        if isinstance(out, tuple):
            return (torch.zeros_like(out[0]), *out[1:])
        return torch.zeros_like(out)


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Stats(nn.Module):
    """Returns a dict: not a tensor, so it has no hook output."""

    def forward(self, x):
        return {"mean": x.mean()}


class Net(nn.Module):
    """Nested blocks in a ModuleList, an LSTM (tuple output), a dict output, a reused module."""

    def __init__(self, d_in: int = 3, d: int = 4, d_out: int = 2):
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.layers = nn.ModuleList([Block(d), Block(d)])
        self.lstm = nn.LSTM(d, d, batch_first=True)
        self.stats = Stats()
        self.act = nn.Tanh()  # called twice
        self.head = nn.Linear(d, d_out)

    def forward(self, x):
        h = self.act(self.embed(x))
        for layer in self.layers:
            h = layer(h)
        h, _ = self.lstm(h)
        self.last_mean = self.stats(h)["mean"].detach()
        return self.head(self.act(h))


# hook name -> shape for x of shape [2, 5, 3]
NET_HOOKS = {
    "embed.hook_out": (2, 5, 4),
    "act.hook_out": (2, 5, 4),  # the last of its two calls
    **{
        f"layers.{i}.{name}.hook_out": shape
        for i in range(2)
        for name, shape in [
            ("norm", (2, 5, 4)),
            ("mlp.0", (2, 5, 8)),
            ("mlp.1", (2, 5, 8)),
            ("mlp.2", (2, 5, 4)),
            ("mlp", (2, 5, 4)),
        ]
    },
    "layers.0.hook_out": (2, 5, 4),
    "layers.1.hook_out": (2, 5, 4),
    "lstm.hook_out": (2, 5, 4),
    "head.hook_out": (2, 5, 2),
    "hook_out": (2, 5, 2),
}


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def x_net() -> torch.Tensor:
    return torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(1))


def capture_by_hand(module: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every submodule's (first tensor) output, by plain torch forward hooks."""
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for path, sub in module.named_modules():
        if path:

            def grab(_m, _a, out, path=path):
                out = out[0] if isinstance(out, tuple) else out
                if isinstance(out, torch.Tensor):
                    seen[f"{path}.hook_out"] = out.detach().clone()

            handles.append(sub.register_forward_hook(grab))
    out = module(x)
    seen["hook_out"] = out.detach().clone()
    for h in handles:
        h.remove()
    return seen


def test_sequential_mlp_cache_matches_plain_forward_hooks():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(4, 6)
    model = hooked(mlp)
    assert isinstance(model, HookedModule)
    assert sorted(model.hook_dict) == ["0.hook_out", "1.hook_out", "2.hook_out", "hook_out"]
    out, cache = model.run_with_cache(x)
    assert torch.equal(out, mlp(x))
    assert {k: tuple(v.shape) for k, v in cache.items()} == {
        "0.hook_out": (4, 16),
        "1.hook_out": (4, 16),
        "2.hook_out": (4, 3),
        "hook_out": (4, 3),
    }
    expected = capture_by_hand(mlp, x)
    assert set(expected) == set(cache.keys())
    for name, value in expected.items():
        assert torch.equal(cache[name], value), name
    assert torch.equal(cache["1.hook_out"], torch.relu(mlp[0](x)))


def test_nested_module_cache_names_and_shapes():
    net = make_net()
    model = hooked(net)
    x = x_net()
    out, cache = model.run_with_cache(x)
    assert torch.equal(out, net(x))
    assert {k: tuple(v.shape) for k, v in cache.items()} == NET_HOOKS
    expected = capture_by_hand(net, x)
    for name in NET_HOOKS:
        assert torch.equal(cache[name], expected[name]), name
    # Containers are never called and a dict output has nothing to hook.
    assert "layers.hook_out" not in model.hook_dict
    assert "stats.hook_out" in model.hook_dict and "stats.hook_out" not in cache
    assert model.module_paths["layers.1.mlp.hook_out"] == "layers.1.mlp"
    assert model.mod_dict["layers.1.mlp"] is net.layers[1].mlp
    assert model.mod_dict["layers.1.mlp.hook_out"] is model.hook_dict["layers.1.mlp.hook_out"]
    # TransformerLens name filters work on these names.
    _, mlp_only = model.run_with_cache(x, names_filter=lambda n: n.endswith("mlp.hook_out"))
    assert sorted(mlp_only.keys()) == ["layers.0.mlp.hook_out", "layers.1.mlp.hook_out"]


def test_example_input_keeps_only_hook_points_that_fire():
    net = make_net().train()
    model = hooked(net, example=x_net())
    # The probe saw `act` called twice: one hook point per call (issue 10).
    expected = {**NET_HOOKS, "act.hook_out_1": (2, 5, 4)}
    assert set(model.hook_dict) == set(expected)
    assert all(m.training for m in net.modules())  # the probe restored train mode
    assert model.hook_shapes(x_net()) == expected


def zero(tensor, hook):
    return torch.zeros_like(tensor)


@pytest.mark.parametrize("path", ["1", "0"])
def test_zeroing_hook_equals_editing_the_sequential(path):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(4, 6)
    model = hooked(mlp)
    patched = model.run_with_hooks(x, fwd_hooks=[(f"{path}.hook_out", zero)])
    edited = copy.deepcopy(mlp)
    edited[int(path)] = Zeros(edited[int(path)])
    assert torch.equal(patched, edited(x))
    assert not torch.equal(patched, mlp(x))
    assert torch.equal(model(x), mlp(x))  # the hook was temporary


@pytest.mark.parametrize("path", ["layers.0.mlp", "layers.1.mlp.1", "lstm", "embed"])
def test_zeroing_hook_equals_editing_the_nested_module(path):
    net = make_net()
    x = x_net()
    model = hooked(net)
    with model.hooks(fwd_hooks=[(f"{path}.hook_out", zero)]):
        patched, cache = model.run_with_cache(x)
    assert torch.count_nonzero(cache[f"{path}.hook_out"]) == 0
    edited = copy.deepcopy(net)
    parent, _, name = path.rpartition(".")
    owner = edited.get_submodule(parent) if parent else edited
    setattr(owner, name, Zeros(getattr(owner, name)))
    assert torch.equal(patched, edited(x))
    assert not torch.equal(patched, net(x))


def test_gradients_flow_like_the_plain_module():
    net = make_net()
    x = x_net()
    net(x).square().sum().backward()
    plain = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    model = hooked(net)
    model(x).square().sum().backward()
    for a, p in zip(plain, net.parameters(), strict=True):
        assert torch.equal(a, p.grad)


def test_wrapped_module_is_left_untouched():
    net = make_net()
    x = x_net()
    keys = list(net.state_dict())
    before = net(x)
    model = hooked(net)
    assert list(model.state_dict()) == [f"wrapped.{k}" for k in keys]
    assert list(net.state_dict()) == keys
    assert not any(hasattr(m, "name") for m in net.modules())
    # Hooks on the wrapper do not reach calls of the original module.
    with model.hooks(fwd_hooks=[("layers.0.mlp.hook_out", zero)]):
        assert torch.equal(net(x), before)
        assert not torch.equal(model(x), before)
    assert sum(len(m._forward_hooks) for m in net.modules()) > 0
    assert model.unwrap() is net
    assert sum(len(m._forward_hooks) for m in net.modules()) == 0
    with pytest.raises(RuntimeError, match="removed"):
        model(x)
    # Leaving a with-block or dropping the wrapper removes the hooks too.
    with hooked(net) as inner:
        assert torch.equal(inner(x), before)
    assert sum(len(m._forward_hooks) for m in net.modules()) == 0
    dropped = hooked(net)
    del dropped
    gc.collect()
    assert sum(len(m._forward_hooks) for m in net.modules()) == 0
    assert torch.equal(net(x), before)


def test_clashing_names_are_refused():
    with pytest.raises(ValueError, match="named 'hook_out'"):
        hooked(_clash())
    with pytest.raises(ValueError, match="'wrapped'"):
        hooked(nn.ModuleDict({"wrapped": nn.ReLU()}))
    with pytest.raises(TypeError, match="nn.Module"):
        hooked(lambda x: x)


def _clash() -> nn.Module:
    outer = nn.Sequential(nn.Linear(2, 2))
    outer[0].add_module("hook_out", nn.ReLU())
    return outer


def test_wrapping_a_hooked_root_module_keeps_its_own_hook_names():
    pytest.importorskip(FAMILIES["transformer"][0])
    torch.manual_seed(0)
    net = build_model("transformer", d_model=16, n_layers=1, n_ctx=8, d_in=3, d_out=2)
    names = list(net.hook_dict)
    x = torch.randn(2, 5, 3)
    model = hooked(net)
    assert list(net.hook_dict) == names and net.hook_out.name == "hook_out"
    assert not any(name.startswith("wrapped") for name in model.hook_dict)
    assert "blocks.0.hook_out" in model.hook_dict  # a block's output
    assert "blocks.0.hook_resid_post.hook_out" not in model.hook_dict  # not a hook of a hook
    out, cache = model.run_with_cache(x)
    _, own = net.run_with_cache(x)
    assert torch.equal(out, own["hook_out"])
    assert torch.equal(cache["blocks.0.hook_out"], own["blocks.0.hook_resid_post"])


def test_nnsight_trace_saves_and_patches():
    net = make_net()
    x = x_net()
    model = hooked(net)
    _, cache = model.run_with_cache(x)
    patched = model.run_with_hooks(x, fwd_hooks=[("layers.1.mlp.0.hook_out", zero)])

    traced = NNsight(model)
    with traced.trace(x):
        raw = traced.wrapped.layers[0].mlp.output.save()
        point = traced.get("layers.0.mlp.hook_out").output.save()
        lstm = traced.lstm.hook_out.output.save()
        out = traced.output.save()
    assert torch.equal(raw, cache["layers.0.mlp.hook_out"])
    assert torch.equal(point, cache["layers.0.mlp.hook_out"])
    assert torch.equal(lstm, cache["lstm.hook_out"])
    assert torch.equal(out, cache["hook_out"])

    with traced.trace(x):
        traced.layers[1].mlp[0].hook_out.output[:] = 0
        out = traced.output.save()
    assert torch.equal(out, patched)
    assert torch.equal(model(x), cache["hook_out"])


def test_deepcopy_gives_an_independent_wrapper():
    net = make_net()
    x = x_net()
    model = hooked(net, example=x)
    twin = copy.deepcopy(model)
    assert twin.wrapped is not net and set(twin.hook_dict) == set(model.hook_dict)
    patched = twin.run_with_hooks(x, fwd_hooks=[("lstm.hook_out", zero)])
    assert torch.equal(patched, model.run_with_hooks(x, fwd_hooks=[("lstm.hook_out", zero)]))
    assert not torch.equal(patched, model(x))
    twin.remove()  # takes the twin's hooks off the copy only
    assert torch.equal(model.run_with_hooks(x, fwd_hooks=[("lstm.hook_out", zero)]), patched)
    assert sum(len(m._forward_hooks) for m in twin.wrapped.modules()) == 0
