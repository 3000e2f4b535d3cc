"""One name per component: the pruning graph's names and the hook names they stand for.

The library speaks in hook names (``blocks.0.attn.hook_result[4]``, what patching,
probes and caches address), the pruning graph and its figures in graph names
(``a0.h4``). They are the same component under two names; this module maps one to the
other, for every family:

=====================  ======================================  ==============================
graph name             hook name                               what it is
=====================  ======================================  ==============================
``embed``              ``hook_embed``                          the read-in's output
``pos``                ``hook_pos_embed``                      the position table's output
``a{l}.h{h}``          ``blocks.{l}.attn.hook_result[{h}]``    head h's output (a writer)
``a{l}.h{h}.q``        ``blocks.{l}.attn.hook_q[{h}]``         head h's query, made from
                                                               what the head reads (k, v
                                                               alike)
``a{l}.g{g}.k``        ``blocks.{l}.attn.hook_k[{g}]``         key/value group g's key
``m{l}``               ``blocks.{l}.hook_mlp_out``             MLP l's output (a writer)
``m{l}.in``            ``blocks.{l}.hook_resid_mid``           the stream MLP l reads
                                                               (parallel residual:
                                                               ``hook_resid_pre``)
``l{l}``               ``blocks.{l}.hook_mixer_out``           a recurrent layer's output
``l{l}.in``            ``blocks.{l}.hook_resid_pre``           the stream it reads
``l{l}.state@w``       ``blocks.{l}.lstm.hook_c`` (dense SSM:  the state carried into
                       ``ssm.hook_h``, Mamba                   window w
                       ``mixer.hook_ssm_state``)
``out``                ``hook_out``                            the read-out (its input:
                                                               ``blocks.{L-1}.hook_resid_post``)
=====================  ======================================  ==============================

A window suffix (``l0@label``) names the positions of that window: ``l0@label`` is
``blocks.0.hook_mixer_out`` at the label's positions (``hook_name`` writes it
``blocks.0.hook_mixer_out @ label``). :func:`hook_name` and :func:`graph_name` are
inverse on every node of a graph (tested on each family), so the explorer, ``mechlab
info`` and ``docs/hooks.md`` show both names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_STATE_HOOK = {"lstm": "lstm.hook_c", "dense_ssm": "ssm.hook_h", "mamba": "mixer.hook_ssm_state"}
_INDEXED = re.compile(r"(?P<base>.+)\[(?P<index>\d+)\]")


def _split_window(name: str, sep: str) -> tuple[str, str]:
    base, _, window = name.partition(sep)
    return base.strip(), window.strip()


def hook_name(node: str, graph: Mapping[str, Any] | None = None) -> str:
    """The hook name of a pruning-graph node (writer, reader or component).

    Args:
        node: A graph name: ``a0.h4``, ``a0.h4.q``, ``m1.in``, ``l0.state@label``, ...
        graph: The graph's summary (a circuit's ``metadata["graph"]``): its ``arch``
            names the state hook of a recurrent family, ``n_layers`` the read-out's input
            and ``parallel_attn_mlp`` what an MLP reads. Default: a GPT-2 style transformer.

    Returns:
        The hook name, with ``[i]`` for a head (or key/value group) and `` @ window`` for
        a windowed node.

    Raises:
        ValueError: Not a graph name.
    """
    graph = graph or {}
    base, window = _split_window(node, "@")
    suffix = f" @ {window}" if window else ""
    if base in ("embed", "pos", "out"):
        return {"embed": "hook_embed", "pos": "hook_pos_embed", "out": "hook_out"}[base] + suffix
    if m := re.fullmatch(r"a(\d+)\.([hg])(\d+)(?:\.([qkv]))?", base):
        layer, kind, index, port = int(m[1]), m[2], int(m[3]), m[4]
        if port is None:
            if kind == "g":  # a group is a reader's component only: its key
                return f"blocks.{layer}.attn.hook_k[{index}]{suffix}"
            return f"blocks.{layer}.attn.hook_result[{index}]{suffix}"
        return f"blocks.{layer}.attn.hook_{port}[{index}]{suffix}"
    if m := re.fullmatch(r"m(\d+)(\.in)?", base):
        layer = int(m[1])
        if m[2] is None:
            return f"blocks.{layer}.hook_mlp_out{suffix}"
        stream = "hook_resid_pre" if graph.get("parallel_attn_mlp") else "hook_resid_mid"
        return f"blocks.{layer}.{stream}{suffix}"
    if m := re.fullmatch(r"l(\d+)(\.in|\.state)?", base):
        layer = int(m[1])
        if m[2] is None:
            return f"blocks.{layer}.hook_mixer_out{suffix}"
        if m[2] == ".in":
            return f"blocks.{layer}.hook_resid_pre{suffix}"
        arch = str(graph.get("arch", "lstm"))
        return f"blocks.{layer}.{_STATE_HOOK.get(arch, _STATE_HOOK['lstm'])}{suffix}"
    raise ValueError(f"not a pruning-graph name: {node!r} (e.g. embed, a0.h4, a0.h4.q, m1.in, l0@label)")


def graph_name(hook: str, graph: Mapping[str, Any] | None = None) -> str | None:
    """The pruning-graph name of a hook, where the graph has one (inverse of :func:`hook_name`).

    Args:
        hook: A hook name, with ``[i]`` for a head (``blocks.0.attn.hook_result[4]``) and
            optionally `` @ window``.
        graph: The graph's summary (as for :func:`hook_name`; ``n_key_value_heads``
            tells a group's key from a head's).

    Returns:
        The graph name (``a0.h4``), or None for a hook that is no node of the graph
        (``blocks.0.attn.hook_pattern``, a hook of a head without its index, ...).
    """
    graph = graph or {}
    base, window = _split_window(hook, "@")
    suffix = f"@{window}" if window else ""
    simple = {"hook_embed": "embed", "hook_pos_embed": "pos", "hook_out": "out"}
    if base in simple:
        return simple[base] + suffix
    index = None
    if m := _INDEXED.fullmatch(base):
        base, index = m["base"], int(m["index"])
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", base)
    if m is None:
        return None
    layer, rest = int(m[1]), m[2]
    grouped = graph.get("n_key_value_heads") not in (None, graph.get("n_heads"))
    if rest.startswith("attn.hook_") and index is not None:
        port = rest[len("attn.hook_") :]
        if port == "result":
            return f"a{layer}.h{index}{suffix}"
        if port == "q" or (port in ("k", "v") and not grouped):
            return f"a{layer}.h{index}.{port}{suffix}"
        if port in ("k", "v"):
            return f"a{layer}.g{index}.{port}{suffix}"
        return None
    if index is not None:
        return None
    recurrent = str(graph.get("arch", "transformer")) != "transformer"
    if rest == "hook_mlp_out":
        return f"m{layer}{suffix}"
    if rest == "hook_mixer_out":
        return f"l{layer}{suffix}"
    if rest == "hook_resid_mid" and not graph.get("parallel_attn_mlp"):
        return f"m{layer}.in{suffix}"
    if rest == "hook_resid_pre":
        if recurrent:
            return f"l{layer}.in{suffix}"
        return f"m{layer}.in{suffix}" if graph.get("parallel_attn_mlp") else None
    if rest in _STATE_HOOK.values():
        return f"l{layer}.state{suffix}"
    return None


def hook_graph_names(graph: Mapping[str, Any], hooks: list[str]) -> dict[str, str]:
    """For ``mechlab info``: each hook that stands for graph nodes, with their names.

    Args:
        graph: A graph summary (:meth:`~mechlab.prune.graph.EdgeGraph.summary`).
        hooks: The model's hook names (without indices).

    Returns:
        Hook name -> the graph names it holds (``blocks.0.attn.hook_result`` ->
        ``a0.h0 .. a0.h5 (by head)``); hooks that are no node are left out.
    """
    n_heads = int(graph.get("n_heads", 0) or 0)
    n_groups = int(graph.get("n_key_value_heads", n_heads) or n_heads)
    out: dict[str, str] = {}
    for hook in hooks:
        sizes = {"result": n_heads, "q": n_heads, "k": n_groups, "v": n_groups}
        port = hook.rsplit(".hook_", 1)[-1] if ".attn.hook_" in hook else None
        if port in sizes and sizes[port]:
            first = graph_name(f"{hook}[0]", graph)
            last = graph_name(f"{hook}[{sizes[port] - 1}]", graph)
            if first is not None:
                out[hook] = first if first == last else f"{first} .. {last} (by head)"
            continue
        name = graph_name(hook, graph)
        if name is None:
            continue
        if graph.get("windows"):
            out[hook] = f"{name}@<window>"
        elif name.endswith(".state"):  # a state reader exists in windowed graphs only
            out[hook] = f"{name}@<window> (windowed graphs)"
        else:
            out[hook] = name
    return out


__all__ = ["graph_name", "hook_graph_names", "hook_name"]
