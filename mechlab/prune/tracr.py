"""Ground-truth circuits of compiled programs, and how well edge pruning recovers them.

A Tracr model (:func:`mechlab.models.tracr.load_tracr`) writes and reads named residual
directions through basis-aligned weights, so its circuit can be read off the weights.

* **Weight circuit** (:func:`weight_edges`): writer ``w`` -> reader ``r`` is an edge when
  the reader's input matrix reads what the writer can write, ``max |W_read^T W_write| >
  tol``. Write matrices ``[d_model, k]``: the token embedding (``embed``), ``W_pos^T``
  (``pos``), ``W_O[h]^T`` (head ``h``), ``W_out^T`` (MLP); read matrices: ``W_Q[h]``,
  ``W_K[h]``, ``W_V[h]``, ``W_in``, the unembedding ``W_U`` (``out``).
* **Ablation ground truth** (:func:`ablation_edges`): the edges of the weight circuit
  whose ablation alone (every other edge clean, :func:`masked_forward`) changes the
  output at the target positions. Under interchange ablation with corrupted inputs of
  the same length this drops the edges that carry only the ``one`` direction, the BOS
  token, positions, or what is computed from them alone (``length`` and ``opp_idx`` in
  ``reverse``), and key/query edges of heads whose pattern does not depend on the
  tokens: they are the same in the clean and the corrupted run, so no ablation of them
  changes the output and no search can find them. (Edges that matter only together,
  redundantly, would be missed; the tests check that the ablation ground truth alone
  reproduces the full model's output.)

:func:`tracr_prune_data` draws inputs the program accepts with an independent corrupted
input of the same length per trace; the targets are every position but BOS.
:func:`edge_recovery` scores a circuit's edges against a ground truth.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from mechlab.models.tracr import TracrInfo, sample_sequences
from mechlab.models.transformer import Transformer
from mechlab.prune.forward import make_ablation, masked_forward
from mechlab.prune.graph import EdgeGraph, build_graph
from mechlab.traces import PruneData, Traces

Edge = tuple[str, str]


def _write_matrices(model: Transformer, graph: EdgeGraph) -> list[Tensor]:
    """Per writer, in graph order, the ``[d_model, k]`` matrix whose columns span its output."""
    if model.cfg.io == "tokens":
        embed = model.read_in.embed.weight.T  # [d_model, d_vocab]
    else:
        embed = torch.cat([model.read_in.proj.weight, model.read_in.proj.bias[:, None]], 1)
    mats = {"embed": embed, "pos": model.W_pos.T}
    for layer, block in enumerate(model.blocks):
        for h in range(model.cfg.n_heads):
            mats[f"a{layer}.h{h}"] = block.attn.W_O[h].T  # [d_model, d_head]
        mats[f"m{layer}"] = torch.cat([block.mlp.W_out.T, block.mlp.b_out[:, None]], 1)
    return [mats[w.name] for w in graph.writers]


def _read_matrix(model: Transformer, reader: str) -> Tensor:
    """The ``[d_model, k]`` input matrix of a reader."""
    if reader == "out":
        return model.W_U  # [d_model, d_output]
    component, kind = reader.rsplit(".", 1)
    block = model.blocks[int(component[1:].split(".")[0])]
    if kind == "in":
        return block.mlp.W_in  # [d_model, d_mlp]
    head = int(component.split(".h")[1])
    return {"q": block.attn.W_Q, "k": block.attn.W_K, "v": block.attn.W_V}[kind][head]


def _check_model(model: Any) -> None:
    cfg = getattr(model, "cfg", None)
    if not isinstance(model, Transformer) or cfg.normalization != "none":
        raise ValueError(
            "ground truth from weights needs a transformer without normalisation "
            "(normalization='none', e.g. from load_tracr)"
        )


@torch.no_grad()
def weight_edges(model: Transformer, tol: float = 1e-6) -> list[Edge]:
    """Edges whose reader reads the subspace their writer writes: ``max |W_read^T W_write| > tol``.

    Args:
        model: A transformer without normalisation (a loaded Tracr model).
        tol: Entries of ``W_read^T W_write`` at or below this count as zero.

    Returns:
        The edges in graph order.
    """
    _check_model(model)
    graph = build_graph(model)
    writes = _write_matrices(model, graph)
    edges = []
    for reader in graph.readers:
        read = _read_matrix(model, reader.name)
        for writer, write in zip(graph.writers[: reader.n_upstream], writes, strict=False):
            if (read.T @ write).abs().max() > tol:
                edges.append((writer.name, reader.name))
    return edges


@torch.no_grad()
def ablation_edges(
    model: Transformer,
    traces: Traces,
    ablation: str = "interchange",
    tol: float = 1e-4,
    positions: Tensor | None = None,
) -> list[Edge]:
    """The weight circuit's edges whose ablation, alone, changes the model's output.

    Args:
        model: A transformer without normalisation (a loaded Tracr model).
        traces: Inputs (and ``corrupted`` inputs for interchange).
        ablation: ``"interchange"``, ``"mean"`` or ``"zero"``.
        tol: An output that moves by at most this (max abs over traces and positions)
            counts as unchanged.
        positions: ``[batch, pos]`` bool positions compared (default ``traces.observed``,
            else all).

    Returns:
        The edges ``e`` of :func:`weight_edges` for which the masked forward with every
        edge clean but ``e`` differs from the full output, in graph order.
    """
    graph = build_graph(model)
    if positions is None:
        positions = traces.observed
    if positions is None:
        positions = torch.ones(traces.inputs.shape[:2], dtype=torch.bool)
    ablated = make_ablation(model, ablation, traces)  # [writer, batch | 1, pos, d]
    full = model(traces.inputs)[positions]  # [n, d_output]
    kept = []
    for edge in weight_edges(model):
        mask = torch.ones(graph.n_edges, dtype=ablated.dtype)
        mask[graph.edge_index[edge]] = 0.0
        out = masked_forward(model, graph, traces.inputs, ablated, mask)[positions]
        if (out - full).abs().max() > tol:
            kept.append(edge)
    return kept


def tracr_prune_data(
    name: str, info: TracrInfo, n_train: int = 64, n_test: int = 128, seed: int = 0
) -> PruneData:
    """Traces of a program of :data:`~mechlab.models.tracr.TRACR_PROGRAMS` for pruning.

    Every trace is a random input of ``max_seq_len`` tokens after BOS; its corrupted
    input is an independent draw of the same length; ``observed`` marks every position
    but BOS (so target ``"all"`` is every position the program's output is defined at).

    Args:
        name: The program.
        info: Its :class:`~mechlab.models.tracr.TracrInfo`.
        n_train: Training traces.
        n_test: Held-out traces.
        seed: Seed of the draws (held-out traces from ``seed + 7919``).

    Returns:
        The :class:`~mechlab.traces.PruneData`.
    """
    for label, value in (("n_train", n_train), ("n_test", n_test)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")

    def traces(n: int, gen: torch.Generator) -> Traces:
        inputs = info.encode(sample_sequences(name, n, generator=gen))
        corrupted = info.encode(sample_sequences(name, n, generator=gen))
        observed = torch.ones(inputs.shape[:2], dtype=torch.bool)
        observed[:, 0] = False  # BOS: the program's output is undefined there
        return Traces(inputs=inputs, corrupted=corrupted, observed=observed)

    train = traces(n_train, torch.Generator().manual_seed(seed))
    test = traces(n_test, torch.Generator().manual_seed(seed + 7919))
    info_dict = {"task": f"tracr-{name}", "n_train": n_train, "n_test": n_test,
                 "data_seed": seed, "n_pos": train.n_pos}  # fmt: skip
    return PruneData(train=train, test=test, info=info_dict)


def edge_recovery(found: Iterable[Edge], truth: Iterable[Edge]) -> dict[str, float]:
    """Precision and recall of a circuit's edges against a ground truth.

    Args:
        found: The circuit's edges ``(writer, reader)``.
        truth: The ground-truth edges.

    Returns:
        ``precision`` (|found & truth| / |found|, 1.0 when nothing was found), ``recall``
        (|found & truth| / |truth|, 1.0 for an empty truth), ``n_found``, ``n_truth``,
        ``n_common`` and ``exact`` (1.0 when the sets are equal).
    """
    found, truth = set(found), set(truth)
    common = len(found & truth)
    return {
        "precision": common / len(found) if found else 1.0,
        "recall": common / len(truth) if truth else 1.0,
        "n_found": float(len(found)),
        "n_truth": float(len(truth)),
        "n_common": float(common),
        "exact": float(found == truth),
    }
