"""Pruning a model on prompt pairs (``mechlab prune --model FOLDER --pairs pairs.jsonl``).

The model is a Hugging Face ``save_pretrained`` folder (imported once with
:func:`mechlab.from_pretrained`) or a mechlab token checkpoint; the pairs a JSONL file of
text (tokenized with ``tokenizer``, by default the model folder's own) or token ids
(:mod:`mechlab.tasks.prompts`). Everything is checked before the first pruning step: the
settings, the pairs and the tokenizer (read before the weights), the model (its size from
``config.json`` before any weight), and the pairs against the model (vocabulary, context).
Each seed splits the pairs into pruning and held-out ones (its own shuffle), prunes with
the engine's loss (KL to the full model at the explained position), scores the circuit
on the held-out pairs and, for the logit-difference metric, adds the logit differences
(:func:`mechlab.tasks.prompts.logit_diff_metrics`) to its metrics. Circuits are written as
``<pairs-stem>_seed<k>.json`` and ``.html``.

:func:`write_ioi_pairs` writes IOI-style pairs for a tokenizer (``mechlab pairs ioi``).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechlab.circuit_methods import DEFAULT_METHOD, is_edge_pruning, method_tag
from mechlab.limits import MAX_PROMPT_PAIRS, check_at_most
from mechlab.models.importers import check_folder, from_pretrained, import_dtype, weight_files
from mechlab.pipelines import outputs, stops
from mechlab.pipelines.checkpoints import check_finite_parameters, open_checkpoint
from mechlab.pipelines.methods import check_budget, check_finite, check_method, run_method
from mechlab.pipelines.request import check_stability
from mechlab.pipelines.resume import keeper, resume_each
from mechlab.prune.circuit import Circuit, Stability, seed_stability
from mechlab.prune.config import RUN_ARGUMENTS, resolved_settings
from mechlab.prune.engine import check_prune_args, prune
from mechlab.prune.evaluate import target_outputs
from mechlab.prune.stability import bootstrap_stability
from mechlab.tasks import ioi
from mechlab.tasks.prompts import (
    METRICS,
    TARGET,
    PromptPairs,
    load_tokenizer,
    logit_diff_metrics,
    pairs_from_records,
    read_jsonl,
)
from mechlab.traces import PruneData

FAITHFULNESS_WARNING = "circuit for"  # the engine's warning, kept in metadata["warnings"]


def open_model(source: str | Path, device: str | None = None, dtype: str | None = None) -> tuple[Any, str]:
    """The model a prompt command runs on, opened once, and what it is.

    Args:
        source: A ``save_pretrained`` folder (imported with :func:`mechlab.from_pretrained`)
            or a mechlab checkpoint file.
        device: Where the model goes (default: the CPU).
        dtype: A folder's import dtype (default: the checkpoint's own); not for a checkpoint.

    Returns:
        ``(model, kind)``: the model in eval mode and ``"hf-folder"`` or ``"checkpoint"``.

    Raises:
        ValueError: A path that is neither; an unsupported architecture, a folder without
            weights, a model above the size limit, NaN or infinite weights (one line each).
    """
    path = Path(source)
    if path.is_dir():
        model = from_pretrained(path, dtype=dtype)
        check_finite_parameters(model, f"model folder {str(path)!r}")  # before any work on it
        return (model.to(device) if device else model).eval(), "hf-folder"
    if path.is_file():
        if dtype is not None:
            raise ValueError(f"dtype applies to a save_pretrained folder, not to the checkpoint {str(path)!r}")
        return open_checkpoint(path, device).model.eval(), "checkpoint"
    raise ValueError(f"model {str(path)!r} not found; give a save_pretrained folder or a mechlab checkpoint")


def prompt_pairs(
    pairs: str | Path,
    model_source: str | Path | None = None,
    tokenizer: str | Path | None = None,
    metric: str = "logit-diff",
    position: int = -1,
) -> PromptPairs:
    """The pairs of a file, tokenized with ``tokenizer`` (default: the model folder's own
    tokenizer when the pairs are text; token-id pairs need none)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    records = read_jsonl(pairs)
    is_text = any(isinstance(r, dict) and isinstance(r.get("clean"), str) for r in records)
    tok = None
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
    elif is_text:
        if model_source is None or not Path(model_source).is_dir():
            raise ValueError(
                f"{str(pairs)!r} holds text; give --tokenizer FOLDER (a mechlab checkpoint has no "
                "tokenizer), or token ids"
            )

        check_folder(
            model_source
        )  # its own messages, before transformers reads config.json for the tokenizer
        tok = load_tokenizer(model_source)
    return pairs_from_records(records, tok, metric, position, source=str(pairs))


@dataclass
class PromptRun:
    """What :func:`prune_prompts` found and wrote.

    Attributes:
        out: The folder written into.
        circuits: One circuit per seed, in order.
        files: Circuit stem -> ``(json, html)`` paths.
        stability: Seed-to-seed agreement (two or more seeds), or None.
        reused: Stems whose circuit was read back: found before with the same settings.
        replaced: Stems whose file of other settings was recomputed (``force``).
    """

    out: Path
    circuits: list[Circuit] = field(default_factory=list)
    files: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    stability: Stability | None = None
    reused: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)


def default_prompt_out(model_source: str | Path, pairs: str | Path) -> Path:
    """``mechlab-out/<model>-<pairs stem>/circuits``: the default folder of a prompt prune
    (the model folder's name, or a checkpoint's run name)."""
    model = Path(model_source)
    name = outputs.run_name(model) if model.is_file() else (model.absolute().name or "model")
    return Path(outputs.DEFAULT_ROOT) / f"{name}-{Path(pairs).stem}" / "circuits"


def _search_record(settings: dict[str, Any]) -> dict[str, Any]:
    """The pruning settings a prompt circuit records, resolved through
    :class:`~mechlab.prune.config.PruneConfig` and :func:`prune`'s run defaults (sparsity
    is recorded on its own)."""
    run = outputs.with_defaults(prune, {k: v for k, v in settings.items() if k in RUN_ARGUMENTS})
    return {**{k: v for k, v in run.items() if k != "config"}, **resolved_settings(settings, sparsity=False)}


def source_digest(path: str | Path | None) -> str | None:
    """The SHA-256 of what a model or tokenizer source holds: a file's bytes, or a folder's
    files (names and bytes): its top-level files but hidden ones, and every weight file the
    import reads (:func:`mechlab.models.importers.weight_files`: a shard a weight index names
    in a subfolder or a hidden file too, by its path in the folder); None for None.

    Raises:
        ImportProblem: A weight index that is not valid, or names a file outside the folder
            (a ``ValueError``, one line).
    """
    if path is None:
        return None
    path = Path(path)
    if path.is_file():
        return outputs.file_sha256(path)

    top = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    names = [item.name for item in top]
    named = {f.relative_to(path).as_posix() for f in weight_files(path)} - set(names)
    digest = hashlib.sha256()
    # (a folder whose index names only top-level files keeps the digest it had)
    for name in [*names, *sorted(named)]:
        digest.update(f"{name}\0{outputs.file_sha256(path / name)}\0".encode())
    return digest.hexdigest()


def prune_prompts(
    model_source: str | Path,
    pairs: str | Path,
    seeds: Sequence[int] = (0,),
    out: str | Path | None = None,
    *,
    tokenizer: str | Path | None = None,
    metric: str = "logit-diff",
    position: int = -1,
    test_fraction: float = 0.5,
    sparsity: float = 0.95,
    device: str | None = None,
    on_circuit: Callable[[str, Circuit, Path], None] | None = None,
    method: str = DEFAULT_METHOD,
    n_edges: int | None = None,
    ig_steps: int | None = None,
    acdc_max_edges: int | None = None,
    force: bool = False,
    dtype: str | None = None,
    stability: int = 0,
    **prune_kwargs: Any,
) -> PromptRun:
    """Prune a model on prompt pairs, one circuit per seed (module docstring).

    The output folder is claimed under the output policy
    (:class:`~mechlab.pipelines.outputs.OutputFolder`) before the model is opened; a circuit
    file that records the same settings (the model's and the pairs' SHA-256, the tokenizer,
    metric, position, split, seed and every pruning setting) is read back instead of pruned
    again, so an interrupted run resumes; a file of other settings is refused before any
    work (recomputed with ``force``). A signal (Ctrl-C, SIGTERM) raises
    :class:`~mechlab.pipelines.stops.Interrupted` naming the circuits kept.

    Args:
        model_source: A ``save_pretrained`` folder or a mechlab checkpoint (opened once).
        pairs: The JSONL pair file.
        seeds: Pruning seeds; seed ``k`` also shuffles the pairs' split (``data_seed``).
        out: Folder of the circuits (default: :func:`default_prompt_out`).
        tokenizer: Tokenizer folder for text pairs (default: the model folder).
        metric: ``logit-diff`` (reported beside the engine's metrics) or ``kl``.
        position: Explained position of pairs that give none (default -1: the last token).
        test_fraction: Share of the pairs held out to score each circuit.
        sparsity: Edge sparsity in (0, 1).
        device: Where to run (default: the CPU).
        on_circuit: Called with ``(stem, circuit, out)`` after each circuit is written (or
            read back).
        method: ``prune`` (edge pruning, the default) or an attribution method
            (:mod:`mechlab.pipelines.methods`); its circuits are ``<pairs-stem>_<method>_seed<k>``.
        n_edges: Keep at most this many countable edges instead of ``sparsity``.
        ig_steps: Integration points of ``eap-ig`` and ``eap-ig-inputs`` (default 10).
        acdc_max_edges: ACDC's limit on countable edges (default 400).
        force: Recompute and replace circuit files of other settings, and write into a
            folder git tracks.
        dtype: A model folder's import dtype (``"bfloat16"``, ...; default: the checkpoint's
            own), checked before anything is written; recorded in the circuits' settings.
        stability: Bootstrap replicates of each circuit's stability over resampled training
            pairs (:func:`~mechlab.prune.stability.bootstrap_stability`: the same method and
            settings on each resample of the seed's training pairs, resampled with the seed;
            the held-out pairs kept), recorded as ``metadata["stability"]`` and in the
            circuit's settings; 0 (the default): not measured.
        **prune_kwargs: :func:`mechlab.prune.prune`'s settings (``steps``, ``ablation``,
            ``loss``, ...).

    Returns:
        The :class:`PromptRun`.

    Raises:
        ValueError: Any bad setting, pair, tokenizer, model or output folder (one line),
            before any work.
    """
    check_prune_args(sparsity, **prune_kwargs)
    check_stability(stability)
    by_method = not is_edge_pruning(method) or n_edges is not None
    check_method(method, prune_kwargs, ig_steps=ig_steps, n_edges=n_edges, acdc_max_edges=acdc_max_edges)
    if dtype is not None:
        import_dtype(dtype)  # an unknown dtype, or one this machine cannot run: before any output
    if not seeds:
        raise ValueError("give at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds must not repeat")
    for s in seeds:  # a seed seeds torch's generators, which take 64 bits
        if isinstance(s, bool) or not isinstance(s, int) or not -(2**63) <= s < 2**63:
            raise ValueError(f"seed {s!r} is not an integer in -2**63..2**63-1; give a smaller --seed")
    inputs = [Path(model_source), Path(pairs), *([Path(tokenizer)] if tokenizer is not None else [])]
    run = PromptRun(Path(out) if out is not None else default_prompt_out(model_source, pairs))
    folder = outputs.OutputFolder(run.out, "prune --pairs", force=force, inputs=inputs)
    found = prompt_pairs(pairs, model_source, tokenizer, metric, position)
    found.split(test_fraction, 0)  # checks test_fraction
    base = {"analysis": "prune-pairs", "model_sha256": source_digest(model_source),
            "pairs_sha256": outputs.file_sha256(pairs), "tokenizer_sha256": source_digest(tokenizer),
            "metric": metric, "position": position, "test_fraction": test_fraction, "sparsity": sparsity}  # fmt: skip
    if dtype is not None:  # (recorded when asked for, so circuits of the default still read back)
        base["dtype"] = dtype
    stem_base = Path(pairs).stem
    tag = method_tag(method)
    chosen = {"method": method, "n_edges": n_edges, "ig_steps": ig_steps, "acdc_max_edges": acdc_max_edges}
    extra = {k: v for k, v in chosen.items() if v is not None} if by_method else {}
    if stability:  # (recorded when measured, so circuits made without it still read back)
        extra["stability_boots"] = stability
    planned = {f"{stem_base}{tag}_seed{s}": {**base, **_search_record({**prune_kwargs, "seed": s}),
                                             **extra}
               for s in seeds}  # fmt: skip
    tally = stops.Tally(run.out, len(planned))  # Ctrl-C or SIGTERM: the circuits written stay
    with stops.resumable(tally), folder:
        status = folder.plan({f"{stem}.json": record for stem, record in planned.items()})
        model, kind = open_model(model_source, device, dtype)
        found.check_model(model)
        if by_method:
            check_budget(model, found.prune_data(test_fraction, seed=seeds[0]), TARGET, method, sparsity,
                         n_edges=n_edges, ablation=prune_kwargs.get("ablation", "interchange"),
                         acdc_max_edges=acdc_max_edges)  # fmt: skip
        seed_of = dict(zip(planned, seeds, strict=True))

        def find(data: PruneData, s: int, replicate: bool = False) -> Circuit:
            shown = {"progress": False} if replicate and "progress" in prune_kwargs else {}
            kwargs = {**prune_kwargs, **shown}
            if by_method:
                return run_method(model, data, TARGET, method, sparsity, n_edges=n_edges, ig_steps=ig_steps,
                                  acdc_max_edges=acdc_max_edges, seed=s, **kwargs)  # fmt: skip
            return check_finite(prune(model, data, TARGET, sparsity, seed=s, **kwargs))

        def compute(stem: str) -> Circuit:
            s = seed_of[stem]
            data = found.prune_data(test_fraction, seed=s)
            with warnings.catch_warnings():  # the metadata keeps them (callers print them)
                warnings.filterwarnings("ignore", message=FAITHFULNESS_WARNING, category=UserWarning)
                circuit = find(data, s)
                if stability:  # the same method and settings on resampled training pairs
                    measured = bootstrap_stability(lambda d: find(d, s, replicate=True), data, stability,
                                                   seed=s, reference=circuit)  # fmt: skip
                    circuit.metadata["stability"] = measured.to_dict()
            meta = circuit.metadata
            meta.setdefault("method", DEFAULT_METHOD)
            meta.update(model=str(model_source), model_kind=kind, pairs=str(pairs), metric=metric)
            if metric == "logit-diff":
                _, test = found.split(test_fraction, seed=s)
                meta["metrics"].update(logit_diff_metrics(target_outputs(model, data, circuit), test))
            return circuit

        def write(stem: str, circuit: Circuit, json_name: str) -> None:
            circuit.metadata.update(outputs.settings_record(planned[stem]))
            folder.write_circuit(circuit, json_name)

        for done in resume_each(
            folder, status, {stem: stem for stem in planned}, read=lambda _, file: Circuit.from_json(file),
            compute=compute, write=write, kept=keeper(tally.kept, reused=run.reused, replaced=run.replaced),
            draw=lambda _, circuit, file: folder.write_circuit_figure(circuit, file),
        ):  # fmt: skip
            run.circuits.append(done.value)
            run.files[done.key] = (done.json_path, done.html_path)
            if on_circuit is not None:
                on_circuit(done.key, done.value, run.out)
    if len(seeds) >= 2:
        run.stability = seed_stability({"prompts": run.circuits})
    return run


def write_ioi_pairs(
    tokenizer: str | Path,
    out: str | Path,
    n: int = 200,
    seed: int = 0,
    force: bool = False,
    **options: Any,
) -> tuple[Path, PromptPairs]:
    """Write ``n`` IOI-style pairs (:func:`mechlab.tasks.ioi.ioi_records`) for a tokenizer
    folder as a pair file, after checking that they read back (equal lengths, single-token
    answers); the file is checked under the output policy first
    (:func:`~mechlab.pipelines.outputs.check_output_file`: an existing or git-tracked file is
    kept unless ``force``; a checkpoint or the tokenizer never written).

    Returns:
        ``(path, pairs)``: the file and the pairs as the prune command will read them.
    """
    check_at_most("--n", n, MAX_PROMPT_PAIRS, "the most pairs a pair file may hold", minimum=1)
    path = outputs.check_output_file(out, force=force, inputs=[tokenizer])
    tok = load_tokenizer(tokenizer)
    records = ioi.ioi_records(tok, n=n, seed=seed, **options)
    pairs = pairs_from_records(records, tok, source=str(path))
    outputs.write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    return path, pairs
