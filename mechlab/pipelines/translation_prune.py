"""Circuits of starting vs continuing a translation, and their overlap against null models.

:func:`translation_circuits` writes label-swapped prompt pairs of the two targets
(:mod:`mechlab.tasks.translation_pairs`: the same prompts, the start or the continue
position explained) as pair files, searches each target's circuits with the prompt-pair
pipeline (:func:`mechlab.pipelines.prompts.prune_prompts`: edge pruning or an attribution
method, one circuit per seed, resumed per circuit), then compares the two targets' circuits
as 1-after and 2-after are compared (:func:`mechlab.prune.stats.overlap_report`: Jaccard
with bootstrap intervals over seeds, the uniform and degree-preserving null models, the
stable shared and unshared edges). Layout of ``OUT``::

    pairs/start.jsonl, pairs/continue.jsonl       the pairs (token ids)
    circuits/<target>[_<method>]_seed<k>.json/.html  the circuits
    overlap.json                                  per method, the overlap report

The model is a ``save_pretrained`` folder or a mechlab token checkpoint; the tokenizer its
folder's (a checkpoint file's folder) unless given. Everything is checked before the first
circuit: a word the tokenizer cannot encode or a label that is a word of the list is one
line and nothing is written.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mechlab.circuit_methods import (
    DEFAULT_METHOD,
    EDGE_PRUNING_OPTIONS,
    is_edge_pruning,
    method_tag,
)
from mechlab.pipelines import outputs
from mechlab.pipelines.prompts import prune_prompts
from mechlab.prune.circuit import Circuit
from mechlab.prune.stats import graph_edges, overlap_report
from mechlab.tasks.prompts import load_tokenizer, pairs_from_records
from mechlab.tasks.translation import SYMBOLS, WordList, load_words, usable_words
from mechlab.tasks.translation_pairs import TARGETS, pair_records


def _tokenizer(tokenizer: Any, model: Path) -> Any:
    if tokenizer is None:
        return load_tokenizer(model.parent if model.is_file() else model)
    return load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer


def translation_circuits(
    model: str | Path,
    out: str | Path,
    *,
    tokenizer: Any = None,
    words: str | Path | WordList | None = None,
    kind: str = "symbolic",
    symbols: Sequence[str] = SYMBOLS,
    n_pairs: int = 64,
    k: int = 4,
    n_query: int = 3,
    seed: int = 0,
    seeds: Sequence[int] = (0, 1, 2),
    methods: Sequence[str] = (DEFAULT_METHOD,),
    sparsity: float = 0.95,
    n_boot: int = 1000,
    n_null: int = 200,
    force: bool = False,
    on_circuit: Callable[[str], None] | None = None,
    **prune_kwargs: Any,
) -> dict[str, Any]:
    """Search the start and continue circuits and compare them (see the module's docstring).

    Args:
        model: A ``save_pretrained`` folder or a mechlab token checkpoint.
        out: The output folder (resumed per circuit).
        tokenizer: A tokenizer or its folder (default: the model's folder).
        words: A word list (TSV path or :class:`~mechlab.tasks.translation.WordList`;
            default: the bundled one).
        kind: ``symbolic`` or ``semantic`` labels.
        symbols: The pool of symbolic labels.
        n_pairs: Prompts drawn per target (half pruned on, half held out per seed).
        k: Example pairs per language.
        n_query: Query items per prompt.
        seed: Seed of the prompts.
        seeds: Search seeds (three or more give the overlap intervals).
        methods: ``prune`` and/or attribution methods (``eap``, ``eap-ig``, ...).
        sparsity: Edge sparsity of every circuit.
        n_boot: Bootstrap resamples of the overlap.
        n_null: Samples of each null model.
        force: Replace outputs of other settings (and write where git tracks files).
        on_circuit: Called with each circuit's name once it is written or read back.
        **prune_kwargs: Settings of the search (``steps``, ``ablation``, ...); edge pruning's
            own (``steps``, ``lr``, ...) go to ``prune`` only.

    Returns:
        ``overlap.json``'s content: ``settings`` (what was run), ``pairs`` (per target its
        file, relative to ``out``, and count), ``circuits`` (per method and target the
        files, relative to ``out``) and ``overlap``
        (per method :func:`~mechlab.prune.stats.overlap_report` of ``start`` vs
        ``continue``, with each target's held-out metrics per seed).

    Raises:
        ValueError: One line, before anything is written.
    """
    model = Path(model)
    if not model.exists():
        raise ValueError(
            f"model {str(model)!r} not found; give a save_pretrained folder or a mechlab checkpoint"
        )
    if not methods or len(set(methods)) != len(methods):
        raise ValueError(f"give one or more distinct methods, got {list(methods)}")
    tok = _tokenizer(tokenizer, model)
    listed = words if isinstance(words, WordList) else load_words(words)
    kept, _ = usable_words(listed, tok)
    pad = getattr(tok, "pad_token_id", None)
    records = {}
    for target in TARGETS:
        records[target] = pair_records(kept, tok, target, n=n_pairs, kind=kind, k=k, n_query=n_query, seed=seed,
                                       symbols=symbols)  # fmt: skip
        if len(records[target]) < 2:
            raise ValueError(f"only {len(records[target])} {target} pairs have labels of equal token length; "
                             "use symbolic labels or labels that tokenize alike")  # fmt: skip
        pairs_from_records(
            records[target], pad_id=pad
        )  # checks the records before anything is written
    settings = {"model_sha256": outputs.file_sha256(model) if model.is_file() else str(model.resolve()),
                "kind": kind, "symbols": list(symbols), "n_pairs": n_pairs, "k": k, "n_query": n_query, "seed": seed,
                "seeds": list(seeds), "methods": list(methods), "sparsity": sparsity, "n_boot": n_boot,
                "n_null": n_null, "prune": {key: value for key, value in sorted(prune_kwargs.items())}}  # fmt: skip
    out = Path(out)
    inputs = [model, *([Path(tokenizer)] if isinstance(tokenizer, (str, Path)) else [])]
    with outputs.OutputFolder(out, "translation circuits", force=force, inputs=inputs) as folder:
        status = folder.plan({"overlap.json": settings})
        files = {}
        for target in TARGETS:
            text = "".join(json.dumps(r) + "\n" for r in records[target])
            name = f"pairs/{target}.jsonl"
            path = folder.file(name)
            if path.is_file() and path.read_text(encoding="utf-8") != text and not force:
                raise ValueError(f"{str(path)!r} holds other pairs (other settings); pass --force to replace them, "
                                 "or choose another --out")  # fmt: skip
            files[target] = path
        for target in TARGETS:
            folder.write_text(
                f"pairs/{target}.jsonl", "".join(json.dumps(r) + "\n" for r in records[target])
            )
    circuits: dict[str, dict[str, list[str]]] = {}
    found: dict[str, list[Circuit]] = {}
    for method in methods:
        circuits[method], found[method] = {}, []
        options = prune_kwargs if is_edge_pruning(method) else \
            {key: value for key, value in prune_kwargs.items() if key not in EDGE_PRUNING_OPTIONS}  # fmt: skip
        for target in TARGETS:
            run = prune_prompts(model, files[target], seeds, out / "circuits", tokenizer=None, metric="logit-diff",
                                sparsity=sparsity, method=method, force=force,
                                on_circuit=(lambda stem, c, where: on_circuit(stem)) if on_circuit else None,
                                **options)  # fmt: skip
            circuits[method][target] = [
                f"circuits/{target}{method_tag(method)}_seed{s}.json" for s in seeds
            ]
            found[method] += [
                dataclasses.replace(c, metadata={**c.metadata, "target": target})
                for c in run.circuits
            ]
    report: dict[str, Any] = {"settings": settings, "pairs": {t: {"file": f"pairs/{t}.jsonl", "n": len(records[t])}
                                                             for t in TARGETS}, "circuits": circuits, "overlap": {}}  # fmt: skip
    for method, group in found.items():
        entry = overlap_report(
            group, graph_edges(group[0]), n_boot=n_boot, n_null=n_null, seed=seed
        )
        entry["metrics"] = {target: [c.metadata.get("metrics", {}) for c in group if c.metadata["target"] == target]
                            for target in TARGETS}  # fmt: skip
        entry["n_edges"] = {
            target: [c.n_edges for c in group if c.metadata["target"] == target]
            for target in TARGETS
        }
        report["overlap"][method] = entry
    record = {**report, **outputs.settings_record(settings)}
    with outputs.OutputFolder(out, "translation circuits", force=force, inputs=inputs) as folder:
        # the same settings, but circuits made anew (the search's defaults moved): the summary follows them
        if status["overlap.json"] != "same" or _stored(folder.file("overlap.json")) != json.loads(json.dumps(record)):
            folder.write_json("overlap.json", record)
    return report


def _stored(path: Path) -> Any:
    """The JSON at ``path``, or None when there is none (or it cannot be read)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
