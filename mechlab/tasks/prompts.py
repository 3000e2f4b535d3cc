"""Token tasks from prompts: clean/corrupted prompt pairs, answer tokens, the position to explain.

A *pair* is a clean prompt and a corrupted one of the same token length (the corrupted
one differs where the behaviour should change, e.g. another name), the position whose
prediction is explained (default: each prompt's last token, which predicts the next one)
and, for the logit-difference metric, two answer tokens: the one the clean prompt should
make likely (``answer``) and the one it should not (``wrong``; for IOI, the indirect
object and the subject).

Pair files are JSONL, one pair per line, either text (tokenized with a local tokenizer
folder, never the network) or token ids::

    {"clean": "When Mary and John went to the store, John gave a drink to",
     "corrupted": "When Anne and Paul went to the store, Mark gave a drink to",
     "answer": " Mary", "wrong": " John"}
    {"clean": [464, 5335, 290], "corrupted": [464, 3700, 290], "answer": 1757, "wrong": 5335}

``position`` (optional, per line) is the explained position, an index into the prompt's
tokens (negative: from its end). Text is encoded with the tokenizer's own special tokens
(a Llama tokenizer prepends BOS, GPT-2's adds nothing); answers without, and each must be
one token. Pairs of different lengths are right-padded into one batch (the pad never
reaches an earlier position of a causal model).

Refused before any work, with one line each: a missing file, a line that is not a JSON
object with ``clean`` and ``corrupted``, mixed text and ids, text without a tokenizer, a
tokenizer folder without a tokenizer, a clean and corrupted prompt of unequal token
length, an answer that is not a single token, a logit-difference metric without answers,
a position outside the prompt, fewer than two pairs (one to prune on, one to score); and,
before any line is parsed (:func:`read_jsonl`), a file above
:data:`~mechlab.limits.MAX_PAIR_FILE_BYTES` or :data:`~mechlab.limits.MAX_PROMPT_PAIRS`
pairs, pairs whose padded batch could exceed the size limit (pairs x bytes of the longest
line), a line nested deeper than :data:`mechlab.schema.MAX_DEPTH`.

Metrics (:data:`METRICS`): ``logit-diff`` reports the logit difference
``logit[answer] - logit[wrong]`` at the explained position; ``kl`` only the divergence
the engines report. Either way the circuit is *searched* with the engines' loss, the
KL divergence of the circuit's next-token distribution from the full model's at the
explained position (``loss="model"``; ``loss="truth"``, the cross-entropy of ``answer``,
also works): the logit difference is one number per prompt and can be matched by a
circuit that gets the rest of the distribution wrong, so it is reported, not optimised.
:func:`logit_diff_metrics` turns the outputs of a circuit
(:func:`mechlab.prune.evaluate.target_outputs`) into the logit differences of the full
model, the circuit, the fully ablated model and the complement, and the fraction of the
full model's logit difference the circuit recovers.

The engines take :meth:`PromptPairs.prune_data` (target ``"all"``: the traces' only
observed position is the explained one).
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mechlab.io import atomic_write_text
from mechlab.limits import MAX_PAIR_FILE_BYTES, MAX_PROMPT_PAIRS, check_elements
from mechlab.schema import MAX_DEPTH, json_depth
from mechlab.traces import PruneData, Traces

METRICS = ("logit-diff", "kl")
TARGET = "all"  # the explained position (the traces' only observed one)
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model",
    "vocab.txt",
)  # fmt: skip


def load_tokenizer(folder: str | Path) -> Any:
    """A Hugging Face tokenizer from a local folder (``save_pretrained``), never the network.

    Raises:
        ValueError: Not a folder, a folder without tokenizer files, or one that does not load.
    """
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"tokenizer folder {str(path)!r} is not a folder")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"{str(path)!r} has no tokenizer ({', '.join(TOKENIZER_FILES[:4])}, ...); save one "
            "there with tokenizer.save_pretrained(folder), or give token ids instead of text"
        )
    for name in (*TOKENIZER_FILES, "config.json", "special_tokens_map.json", "added_tokens.json"):
        item = path / name  # transformers reads each to its end: a link to /dev/zero never ends
        if os.path.lexists(item) and not item.is_file():
            raise ValueError(
                f"{str(item)!r} is not a regular file (a folder, or a link to a device or to nothing); "
                "replace it with the file itself"
            )
    # lazy: transformers adds ~0.4 s to this module's import; paid only when a tokenizer is loaded
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - any failure is one line to the user
        reason = " ".join(str(err).split())[:160]
        raise ValueError(f"cannot load the tokenizer in {str(path)!r}: {reason}") from None


@dataclass
class PromptPairs:
    """Clean/corrupted prompt pairs as token ids, with the positions to explain.

    Attributes:
        clean: ``[n, T]`` token ids, right-padded with ``pad_id``.
        corrupted: ``[n, T]`` the corrupted prompts (the same length per pair).
        lengths: ``[n]`` tokens of each pair's prompts.
        position: ``[n]`` the explained position of each pair (``0 <= position < length``).
        answer: ``[n]`` the token the clean prompt should predict there, or None.
        wrong: ``[n]`` the token it should not (logit difference ``answer - wrong``), or None.
        metric: ``logit-diff`` or ``kl``.
        pad_id: The token the prompts are padded with.
        source: Where the pairs came from (a file), for the record.
    """

    clean: Tensor
    corrupted: Tensor
    lengths: Tensor
    position: Tensor
    answer: Tensor | None = None
    wrong: Tensor | None = None
    metric: str = "logit-diff"
    pad_id: int = 0
    source: str | None = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}")
        if self.clean.shape != self.corrupted.shape or self.clean.ndim != 2:
            raise ValueError(
                f"clean {list(self.clean.shape)} and corrupted {list(self.corrupted.shape)} prompts "
                "must be [n, T] token ids of one shape"
            )
        n = self.clean.shape[0]
        for name in ("lengths", "position", "answer", "wrong"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (n,):
                raise ValueError(f"PromptPairs.{name} must have shape [{n}], got {list(value.shape)}")
        if self.metric == "logit-diff" and (self.answer is None or self.wrong is None):
            raise ValueError(
                "the logit-diff metric needs an answer and a wrong token for every pair "
                "('answer' and 'wrong'); give them or use the kl metric"
            )

    def __len__(self) -> int:
        return self.clean.shape[0]

    @property
    def n_pos(self) -> int:
        return self.clean.shape[1]

    @property
    def padded(self) -> bool:
        """Whether some prompts are shorter than the batch (right-padded)."""
        return bool((self.lengths < self.n_pos).any())

    def subset(self, index: Tensor) -> PromptPairs:
        """The pairs at ``index`` (a 1-D index tensor)."""

        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[index]

        return PromptPairs(
            self.clean[index], self.corrupted[index], self.lengths[index], self.position[index],
            pick(self.answer), pick(self.wrong), self.metric, self.pad_id, self.source,
        )  # fmt: skip

    def traces(self) -> Traces:
        """The pairs as :class:`~mechlab.traces.Traces`: ``observed`` is True at the
        explained position only (so the target ``"all"`` scores it), ``truth`` holds the
        answer there (``-100`` elsewhere), or None without answers."""
        n, T = self.clean.shape
        rows = torch.arange(n)
        observed = torch.zeros(n, T, dtype=torch.bool)
        observed[rows, self.position] = True
        truth = None
        if self.answer is not None:
            truth = torch.full((n, T), -100, dtype=torch.long)
            truth[rows, self.position] = self.answer
        return Traces(inputs=self.clean, corrupted=self.corrupted, truth=truth, observed=observed)

    def prune_data(self, test_fraction: float = 0.5, seed: int = 0) -> PruneData:
        """Split into pruning (training) and held-out pairs, shuffled by ``seed``.

        Args:
            test_fraction: Share of the pairs held out (at least one each way).
            seed: Seed of the shuffle.

        Returns:
            The :class:`~mechlab.traces.PruneData` (target ``"all"``); ``info`` records
            the split, metric and source.
        """
        train, test = self.split(test_fraction, seed)
        info = {
            "task": "prompts", "metric": self.metric, "source": self.source, "n_train": len(train),
            "n_test": len(test), "data_seed": seed, "test_fraction": test_fraction,
            "n_pos": self.n_pos,
        }  # fmt: skip
        return PruneData(train=train.traces(), test=test.traces(), info=info)

    def split(self, test_fraction: float = 0.5, seed: int = 0) -> tuple[PromptPairs, PromptPairs]:
        """``(train, test)`` pairs as :meth:`prune_data` splits them."""
        ok = isinstance(test_fraction, (int, float)) and not isinstance(test_fraction, bool)
        if not (ok and 0 < test_fraction < 1):
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        n = len(self)
        n_test = min(n - 1, max(1, round(n * test_fraction)))
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        return self.subset(order[n_test:]), self.subset(order[:n_test])

    def check_model(self, model: Any) -> None:
        """Raise a one-line ValueError unless ``model`` can run these prompts: a token model
        whose vocabulary holds every token and whose context holds the longest prompt (and,
        for prompts of different lengths, a causal one)."""
        cfg = getattr(model, "cfg", None)
        if getattr(cfg, "io", None) != "tokens":
            raise ValueError("prompt pairs need a token model (io='tokens'); this model reads vectors")
        largest = int(max(self.clean.max(), self.corrupted.max()))
        if self.answer is not None:
            largest = max(largest, int(self.answer.max()), int(self.wrong.max()))
        vocab = int(cfg.d_vocab)
        if largest >= vocab:
            raise ValueError(
                f"token id {largest} is outside the model's vocabulary of {vocab}; the pairs were "
                "tokenized for another model"
            )
        d_out = int(getattr(cfg, "d_vocab_out", vocab) or vocab)
        if self.answer is not None and max(int(self.answer.max()), int(self.wrong.max())) >= d_out:
            raise ValueError(f"an answer token is outside the model's {d_out} output tokens")
        n_ctx = getattr(cfg, "n_ctx", None)
        if n_ctx is not None and self.n_pos > int(n_ctx):
            raise ValueError(
                f"the longest prompt has {self.n_pos} tokens, more than the model's context of "
                f"{n_ctx}; shorten the prompts"
            )
        if self.padded and not getattr(cfg, "causal", True):
            raise ValueError(
                "prompts of different lengths are right-padded, which changes a non-causal "
                "model's outputs; give prompts of one length"
            )

    def logit_difference(self, logits: Tensor) -> Tensor:
        """``[n]`` ``logit[answer] - logit[wrong]`` of ``[n, vocab]`` logits at the explained positions."""
        if self.answer is None or self.wrong is None:
            raise ValueError("the pairs have no answer and wrong tokens; the logit difference needs both")
        rows = torch.arange(len(self))
        logits = logits.float()
        return logits[rows, self.answer] - logits[rows, self.wrong]


def logit_diff_metrics(outputs: dict[str, Tensor], pairs: PromptPairs) -> dict[str, float]:
    """Logit differences of a circuit and the model on held-out pairs.

    Args:
        outputs: ``full``, ``circuit``, ``ablated`` and ``complement`` logits at the
            explained positions, ``[n, vocab]`` each, one row per pair of ``pairs``
            (:func:`mechlab.prune.evaluate.target_outputs` on the held-out traces).
        pairs: The held-out pairs (``PromptPairs.split(...)[1]``).

    Returns:
        ``logit_diff_<variant>`` (mean over pairs) for each variant, and
        ``logit_diff_recovered`` = ``(LD_circuit - LD_ablated) / (LD_full - LD_ablated)``
        (1: the circuit's logit difference is the model's; 0: no better than ablating every
        edge) with ``logit_diff_complement_recovered`` likewise; NaN when the full and ablated
        logit differences are equal.
    """
    missing = {"full", "circuit", "ablated", "complement"} - set(outputs)
    if missing:
        raise ValueError(f"outputs lack {sorted(missing)}; pass target_outputs(...)")
    means = {}
    for name in ("full", "circuit", "ablated", "complement"):
        if outputs[name].shape[0] != len(pairs):
            raise ValueError(
                f"{outputs[name].shape[0]} rows of {name!r} outputs for {len(pairs)} pairs; "
                "pass the held-out pairs the outputs were computed on"
            )
        means[name] = float(pairs.logit_difference(outputs[name]).double().mean())
    gap = means["full"] - means["ablated"]
    out = {f"logit_diff_{name}": value for name, value in means.items()}
    nan = float("nan")
    out["logit_diff_recovered"] = (means["circuit"] - means["ablated"]) / gap if gap else nan
    out["logit_diff_complement_recovered"] = (
        (means["complement"] - means["ablated"]) / gap if gap else nan
    )
    return out


# ---------------------------------------------------------------------------------------
# Reading pairs
# ---------------------------------------------------------------------------------------


_MAX_TOKEN_ID = 2**63 - 1  # token ids are int64 tensors (the model's vocabulary is checked later)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    return [int(i) for i in ids]


def _answer_id(value: Any, tokenizer: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: {key!r} must be a token string or id, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{where}: {key!r} token id {value} is negative")
        if value > _MAX_TOKEN_ID:
            raise ValueError(f"{where}: {key!r} token id {value} is larger than any vocabulary")
        return value
    if isinstance(value, list) and _is_ids(value):
        if len(value) != 1:
            raise ValueError(
                f"{where}: {key!r} is {len(value)} tokens {value}; answers must be single tokens"
            )
        return _answer_id(value[0], tokenizer, where, key)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key!r} must be a token string or id, got {type(value).__name__}")
    if tokenizer is None:
        raise ValueError(f"{where}: {key!r} is text ({value!r}); give a tokenizer folder, or token ids")
    ids = _encode(tokenizer, value, special=False)
    if len(ids) != 1:
        raise ValueError(
            f"{where}: {key!r} {value!r} is {len(ids)} tokens {ids} under this tokenizer; answers "
            "must be single tokens (mind the leading space: ' Mary', not 'Mary')"
        )
    return ids[0]


def pairs_from_records(
    records: Iterable[dict[str, Any]],
    tokenizer: Any = None,
    metric: str = "logit-diff",
    position: int = -1,
    pad_id: int | None = None,
    source: str | None = None,
) -> PromptPairs:
    """Pairs from dicts (the lines of a pair file; see the module docstring).

    Args:
        records: Dicts with ``clean``, ``corrupted`` (text or token-id lists), optionally
            ``answer``, ``wrong`` (text or ids) and ``position``.
        tokenizer: A Hugging Face tokenizer, a folder holding one, or None (token ids only).
        metric: ``logit-diff`` (needs ``answer`` and ``wrong``) or ``kl``.
        position: The explained position of pairs that give none (default -1, the last token).
        pad_id: The padding token (default: the tokenizer's pad, else its EOS, else 0).
        source: Recorded as the pairs' source, and named in errors.

    Returns:
        The :class:`PromptPairs`.

    Raises:
        ValueError: One line naming the record (``line N``) and what is wrong with it.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if isinstance(position, bool) or not isinstance(position, int):
        raise ValueError(f"position must be an integer (negative: from the prompt's end), got {position!r}")
    if isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(tokenizer)
    prefix = f"{source}: " if source else ""
    clean, corrupted, positions, answers, wrongs = [], [], [], [], []
    kind = None
    for number, record in enumerate(records, start=1):
        where = f"{prefix}line {number}"
        if number > MAX_PROMPT_PAIRS:
            raise ValueError(_too_many(source or "the records"))
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object with 'clean' and 'corrupted', got {type(record).__name__}")
        unknown = sorted(set(record) - {"clean", "corrupted", "answer", "wrong", "position"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known: clean, corrupted, answer, wrong, position")
        for key in ("clean", "corrupted"):
            if key not in record:
                raise ValueError(f"{where}: no {key!r} prompt")
        pair = []
        for key in ("clean", "corrupted"):
            value = record[key]
            this = "text" if isinstance(value, str) else "ids" if _is_ids(value) else None
            if this is None:
                raise ValueError(f"{where}: {key!r} must be text or a list of token ids, got {value!r:.60}")
            if kind is not None and this != kind:
                raise ValueError(f"{where}: {key!r} is {this} but earlier prompts are {kind}; use one kind per file")
            kind = this
            if this == "text":
                if tokenizer is None:
                    raise ValueError(f"{where}: {key!r} is text; give a tokenizer folder, or token ids")
                ids = _encode(tokenizer, value, special=True)
            else:
                ids = list(value)
                if any(i < 0 for i in ids):
                    raise ValueError(f"{where}: {key!r} holds a negative token id")
                if any(i > _MAX_TOKEN_ID for i in ids):
                    raise ValueError(
                        f"{where}: {key!r} holds the token id {max(ids)}, larger than any vocabulary"
                    )
            if not ids:
                raise ValueError(f"{where}: the {key!r} prompt has no tokens")
            pair.append(ids)
        if len(pair[0]) != len(pair[1]):
            raise ValueError(
                f"{where}: the clean prompt has {len(pair[0])} tokens and the corrupted {len(pair[1])}; "
                "the prompts of a pair must have equal token lengths"
            )
        length = len(pair[0])
        p = record.get("position", position)
        if isinstance(p, bool) or not isinstance(p, int):
            raise ValueError(f"{where}: position must be an integer, got {p!r}")
        if not -length <= p < length:
            raise ValueError(f"{where}: position {p} is outside the prompt's {length} tokens")
        positions.append(p % length)
        has = [key in record for key in ("answer", "wrong")]
        if metric == "logit-diff" and not all(has):
            raise ValueError(
                f"{where}: the logit-diff metric needs 'answer' and 'wrong' tokens; give both, or "
                "use the kl metric"
            )
        answers.append(_answer_id(record["answer"], tokenizer, where, "answer") if has[0] else None)
        wrongs.append(_answer_id(record["wrong"], tokenizer, where, "wrong") if has[1] else None)
        clean.append(pair[0])
        corrupted.append(pair[1])
    if len(clean) < 2:
        raise ValueError(
            f"{prefix}{len(clean)} pair(s); at least two are needed (pairs to prune on and "
            "held-out pairs to score the circuit on)"
        )
    if pad_id is None:
        pad_id = 0
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(tokenizer, name, None) if tokenizer is not None else None
            if isinstance(value, int):
                pad_id = value
                break
    T = max(len(ids) for ids in clean)
    check_elements(f"{prefix}the padded pairs", {"pairs": len(clean), "tokens of the longest prompt": T},
                   lower="the longest prompt")  # fmt: skip

    def batch(rows: Sequence[list[int]]) -> Tensor:
        out = torch.full((len(rows), T), pad_id, dtype=torch.long)
        for i, ids in enumerate(rows):
            out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out

    def ids_or_none(values: list[int | None]) -> Tensor | None:
        return None if any(v is None for v in values) else torch.tensor(values, dtype=torch.long)

    return PromptPairs(
        clean=batch(clean), corrupted=batch(corrupted),
        lengths=torch.tensor([len(ids) for ids in clean]), position=torch.tensor(positions),
        answer=ids_or_none(answers), wrong=ids_or_none(wrongs), metric=metric, pad_id=pad_id,
        source=source,
    )  # fmt: skip


_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines splits
_NON_BLANK_LINE = re.compile(f"[^{_LINE_BREAKS}]*\\S[^{_LINE_BREAKS}]*")


def _too_many(what: str) -> str:
    return (
        f"{what} holds more than mechlab's limit of {MAX_PROMPT_PAIRS:,} pairs (each is held as "
        f"Python objects before any tensor); split them into sets of at most {MAX_PROMPT_PAIRS:,}"
    )


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL pair file (blank lines skipped), read within limits.

    Before any line is parsed: the file's size (:data:`~mechlab.limits.MAX_PAIR_FILE_BYTES`),
    its number of pairs (:data:`~mechlab.limits.MAX_PROMPT_PAIRS`) and the padded size of
    its pairs, bounded by pairs x bytes of the longest line (a prompt has at most one token
    per byte: a byte-level tokenizer's worst case, and each token id takes two bytes or
    more), against the size limit (:func:`~mechlab.limits.check_elements`): one 14 MB line
    among thousands is refused before it is tokenized or padded. Each line's nesting depth
    is measured before ``json.loads`` (:func:`mechlab.schema.json_depth`), so a line nested
    100,000 deep is one line of error, not a ``RecursionError``.

    Raises:
        ValueError: One line naming the file (and line) when it cannot be read, is too
            large, or a line is not JSON or nests too deeply.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"pair file {str(path)!r} not found")
    size = path.stat().st_size
    if size > MAX_PAIR_FILE_BYTES:
        raise ValueError(
            f"pair file {str(path)!r} is {size:,} bytes, more than mechlab's limit of "
            f"{MAX_PAIR_FILE_BYTES:,}; split it into smaller files"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the pair file {str(path)!r}: {err}") from None
    breaks = sum(text.count(mark) for mark in _LINE_BREAKS)
    if breaks >= MAX_PROMPT_PAIRS:  # then count the non-blank lines, holding none of them
        n = sum(1 for _ in itertools.islice(_NON_BLANK_LINE.finditer(text), MAX_PROMPT_PAIRS + 1))
        if n > MAX_PROMPT_PAIRS:
            raise ValueError(_too_many(f"pair file {str(path)!r}"))
    numbered = enumerate(text.splitlines(), start=1)
    lines = [(number, line) for number, line in numbered if line.strip()]
    if lines:
        number, longest = max(lines, key=lambda item: len(item[1]))
        check_elements(
            f"the padded pairs of {str(path)!r} (line {number} is the longest)",
            {"pairs": len(lines), "bytes of the longest line": len(longest.encode("utf-8"))},
            lower="the longest line (or split the file)",
        )  # fmt: skip
    records = []
    for number, line in lines:
        if json_depth(line) > MAX_DEPTH:  # json.loads would recurse past the interpreter's limit
            raise ValueError(
                f"{path}: line {number} nests more than {MAX_DEPTH} levels deep; a pair is one "
                "JSON object of prompts and tokens"
            )
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not JSON ({err.msg})") from None
    return records


def load_pairs(
    path: str | Path,
    tokenizer: Any = None,
    metric: str = "logit-diff",
    position: int = -1,
    pad_id: int | None = None,
) -> PromptPairs:
    """Read a JSONL pair file (module docstring), tokenizing text with ``tokenizer``.

    Args:
        path: The file.
        tokenizer: A tokenizer folder (or tokenizer object); needed for text, unused for ids.
        metric: ``logit-diff`` or ``kl``.
        position: The explained position of lines that give none (default -1: the last token).
        pad_id: The padding token (default: the tokenizer's pad or EOS, else 0).

    Returns:
        The :class:`PromptPairs`; every line is checked before it returns.
    """
    if metric not in METRICS:  # before reading anything
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(tokenizer)
    records = read_jsonl(path)
    return pairs_from_records(records, tokenizer, metric, position, pad_id, source=str(path))


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Write records as JSONL, atomically (the file appears whole or not at all)."""
    atomic_write_text(Path(path), "".join(json.dumps(r) + "\n" for r in records))
