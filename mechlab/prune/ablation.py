"""Writer outputs and ablations: what the masked forward pass mixes in.

:func:`writer_outputs` reads every writer's output ``X_w`` from the model's own hooks, in
the graph's writer order; :func:`make_ablation` gives the ablated outputs ``X~_w`` a masked
pass mixes in where an edge is closed (``interchange``: on the corrupted traces; ``mean``:
averaged over reference inputs; ``zero``), and for a windowed recurrent graph the ablated
states too (:class:`WindowedAblation`); :func:`select_traces` takes some traces of either.
The arithmetic that mixes them is :mod:`mechlab.prune.forward`'s.

Memory. The interchange ablation holds ``n_writers x traces x positions x d_model`` floats
for the whole run (4.1 GB for GPT-2 small's 158 writers over 256 traces of 33 tokens), the
largest tensor a search keeps; :func:`writer_outputs` checks its size against the size
limit (:func:`mechlab.limits.check_elements`) and, on the CPU, against the memory free
(:func:`mechlab.limits.check_memory`) before the first forward, and fills it chunk by chunk
(no second copy to concatenate).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn

from mechlab.limits import check_elements, check_memory
from mechlab.models.registry import get_family, graph_kind
from mechlab.prune.graph import EdgeGraph, Windows, build_graph, check_windows
from mechlab.traces import Traces

ABLATIONS = ("interchange", "mean", "zero")


# ---------------------------------------------------------------------------------------
# Writer outputs and ablations
# ---------------------------------------------------------------------------------------


def _writer_hooks(model: nn.Module) -> list[str]:
    cfg = model.cfg
    if graph_kind(cfg.arch) == "transformer":
        names = ["hook_embed"] + (["hook_pos_embed"] if cfg.positional == "learned" else [])
        for layer in range(cfg.n_layers):
            if getattr(cfg, "post_norms", False):  # read by writer_outputs, no writer
                names.append(f"blocks.{layer}.ln1_post.hook_scale")
            names.append(f"blocks.{layer}.attn.hook_result")
            if not cfg.attn_only:
                names.append(f"blocks.{layer}.hook_mlp_out")
        return names
    return ["hook_embed"] + [f"blocks.{layer}.hook_mixer_out" for layer in range(cfg.n_layers)]


@torch.no_grad()
def writer_outputs(
    model: nn.Module, x: Tensor, batch_size: int = 256
) -> Float[Tensor, "writer batch pos d_model"]:
    """Every writer's output on input ``x``, read from the model's own hooks.

    Args:
        model: A mechlab model.
        x: ``[batch, pos, d_in]`` floats or ``[batch, pos]`` token ids.
        batch_size: Traces per forward pass.

    Returns:
        ``[n_writers, batch, pos, d_model]`` in the graph's writer order (for a
        transformer: embed, pos (with a learned position table), then per layer its
        heads' ``hook_result`` and its MLP (unless attention-only); with ``post_norms``
        each head's share of the normed attention output, ``ln1_post.w * result_h / s``
        (:mod:`mechlab.prune.forward`'s docstring), and the normed MLP output).
    """
    names = _writer_hooks(model)
    n_traces, param = x.shape[0], next(model.parameters())
    n_writers = sum(model.cfg.n_heads if name.endswith("hook_result") else 0 if name.endswith("hook_scale") else 1
                    for name in names)  # fmt: skip
    n = check_elements("the writers' outputs", {"writers": n_writers, "traces": n_traces, "positions": x.shape[1],
                                                "d_model": model.cfg.d_model}, lower="traces")  # fmt: skip
    if param.device.type == "cpu":  # a GPU says it is out of memory; a CPU's kernel kills the process
        check_memory("the writers' outputs on these traces", n * param.element_size(),
                     lower="the number of traces or their length")  # fmt: skip
    out = None  # [n_writers, n_traces, pos, d], filled chunk by chunk (no second copy to concatenate)
    for start in range(0, n_traces, batch_size):
        _, cache = model.run_with_cache(x[start : start + batch_size], names_filter=names)
        parts = []
        for name in names:
            act = cache[name]
            if name.endswith("ln1_post.hook_scale"):
                continue
            if name.endswith("hook_result"):  # [batch, pos, head, d_model] -> [head, batch, pos, d]
                post = name.replace("attn.hook_result", "ln1_post")
                if post + ".hook_scale" in cache:
                    w = model.get_submodule(post).w
                    act = act / cache[post + ".hook_scale"].unsqueeze(2) * w.to(act.dtype)
                parts.extend(act.permute(2, 0, 1, 3).unbind(0))
            else:
                parts.append(act)
        if start == 0 and n_traces <= batch_size:
            return torch.stack(parts)
        if out is None:
            out = parts[0].new_empty(len(parts), n_traces, *parts[0].shape[1:])
        out[:, start : start + batch_size] = torch.stack(parts)
    return out


def mixer_of(model: nn.Module, layer: int) -> nn.Module:
    return getattr(model.blocks[layer], get_family(model.cfg.arch).mixer)


@torch.no_grad()
def window_states(
    model: nn.Module, x: Tensor, windows: Windows, batch_size: int = 256
) -> list[Float[Tensor, "boundary batch *state"]]:
    """Each layer's recurrent state at the start of every window but the first.

    The model is run window by window (each mixer from the state it ended the
    previous window with), which computes its normal forward pass.

    Args:
        model: A recurrent mechlab model (LSTM, dense SSM, Mamba).
        x: ``[batch, pos, d_in]`` floats or ``[batch, pos]`` token ids.
        windows: ``(name, start, end)`` ranges covering ``0 .. pos``.
        batch_size: Traces per forward pass.

    Returns:
        Per layer, ``[n_windows - 1, batch, *state]``: entry ``k`` is the state after
        position ``windows[k + 1].start - 1``, the one carried into window ``k + 1``.
    """
    windows = check_windows(windows, x.shape[1])
    per_layer: list[list[Tensor]] = [[] for _ in model.blocks]
    for start in range(0, x.shape[0], batch_size):
        resid = model.read_in(x[start : start + batch_size])  # [batch, pos, d]
        for layer, block in enumerate(model.blocks):
            mixer_in = block.norm(resid)
            outs, states, state = [], [], None
            for _, a, b in windows:
                out, state = mixer_of(model, layer)(mixer_in[:, a:b], state, return_state=True)
                outs.append(out)
                states.append(state)
            resid = resid + torch.cat(outs, dim=1)
            per_layer[layer].append(torch.stack(states[:-1]))  # [K - 1, batch, *state]
    return [torch.cat(chunks, dim=1) for chunks in per_layer]


@dataclass
class WindowedAblation:
    """The ablated values of a windowed recurrent graph: writer outputs and states.

    Attributes:
        writers: ``[1 + n_layers, batch | 1, pos, d_model]`` ablated outputs of the read-in
            and of every layer at every position (the plain graph's writers; the
            windowed writer ``l{l}@w`` is row ``1 + l`` at ``w``'s positions).
        states: Per layer, ``[n_windows - 1, batch | 1, *state]``: the ablated state
            carried into each window after the first (:func:`window_states`).
    """

    writers: Tensor
    states: list[Tensor]

    @property
    def per_trace(self) -> bool:
        """Whether it holds one value per trace (interchange) rather than one for all."""
        return self.writers.shape[1] != 1

    @property
    def device(self) -> torch.device:
        return self.writers.device

    @property
    def dtype(self) -> torch.dtype:
        return self.writers.dtype

    def select(self, index: Tensor) -> WindowedAblation:
        """The traces at ``index`` (unchanged when not per trace)."""
        if not self.per_trace:
            return self
        return WindowedAblation(self.writers[:, index], [s[:, index] for s in self.states])


Ablation = Tensor | WindowedAblation
"""Ablated values: ``[n_writers, batch | 1, pos, d_model]`` writer outputs, or a
:class:`WindowedAblation` for a windowed recurrent graph."""


def select_traces(ablated: Ablation, index: Tensor) -> Ablation:
    """The ablated values of the traces at ``index`` (all of them when not per trace).

    Args:
        ablated: From :func:`make_ablation`.
        index: 1-D index of traces.
    """
    if isinstance(ablated, WindowedAblation):
        return ablated.select(index)
    return ablated[:, index] if ablated.shape[1] != 1 else ablated


@torch.no_grad()
def make_ablation(
    model: nn.Module,
    kind: str,
    traces: Traces,
    reference: Tensor | None = None,
    batch_size: int = 256,
    graph: EdgeGraph | None = None,
) -> Ablation:
    """The ablated writer outputs ``X~`` (and, for a windowed graph, the ablated states).

    Args:
        model: The model.
        kind: ``"interchange"`` (writer outputs on ``traces.corrupted``), ``"mean"``
            (writer outputs averaged over the ``reference`` inputs, per position) or
            ``"zero"``.
        traces: The traces being run (for interchange, and the shapes).
        reference: Inputs whose mean writer outputs ``"mean"`` uses; default
            ``traces.inputs``.
        batch_size: Traces per forward pass.
        graph: The graph the ablation is for; a windowed recurrent graph gets a
            :class:`WindowedAblation` (its states on the corrupted input, their mean
            over ``reference``, or zeros). None: the plain graph.

    Returns:
        ``[n_writers, batch, pos, d_model]`` (interchange) or ``[n_writers, 1, pos, d_model]``,
        or a :class:`WindowedAblation` with those shapes.
    """
    if kind not in ABLATIONS:
        raise ValueError(f"unknown ablation {kind!r}; choose one of {ABLATIONS}")
    windows = graph.windows if graph is not None else ()
    if kind == "interchange":
        if traces.corrupted is None:
            raise ValueError("interchange ablation needs corrupted traces (Traces.corrupted)")
        writers = writer_outputs(model, traces.corrupted, batch_size)
        if not windows:
            return writers
        return WindowedAblation(writers, window_states(model, traces.corrupted, windows, batch_size))
    if kind == "mean":
        ref = traces.inputs if reference is None else reference
        if ref.shape[1] != traces.n_pos:
            raise ValueError(
                f"mean-ablation reference has {ref.shape[1]} positions, traces have {traces.n_pos}"
            )
        writers = writer_outputs(model, ref, batch_size).mean(dim=1, keepdim=True)
        if not windows:
            return writers
        states = window_states(model, ref, windows, batch_size)
        return WindowedAblation(writers, [s.mean(dim=1, keepdim=True) for s in states])
    n_writers = build_graph(model).n_writers
    param = next(model.parameters())
    writers = param.new_zeros(n_writers, 1, traces.n_pos, model.cfg.d_model)
    if not windows:
        return writers
    shapes = window_states(model, traces.inputs[:1], windows)  # for the states' shapes
    return WindowedAblation(writers, [torch.zeros_like(s) for s in shapes])
