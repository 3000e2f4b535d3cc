"""Fixtures of the command-line tests: a model folder you bring and its IOI pairs, built once."""

from __future__ import annotations

import pytest
import torch

from mechlab.cli import main
from mechlab.tasks.prompts import load_tokenizer
from tests.tasks.tokenizers import byte_bpe


@pytest.fixture(scope="session")
def gpt2_folder(tmp_path_factory):
    """A random 2-layer GPT-2 saved with a byte-level BPE tokenizer in one folder."""
    import transformers as T
    folder = tmp_path_factory.mktemp("gpt2")
    byte_bpe(folder, vocab_size=1000)
    vocab = len(load_tokenizer(folder))
    torch.manual_seed(0)
    config = T.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=48,
                          bos_token_id=0, eos_token_id=0)  # fmt: skip
    T.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def ioi_file(gpt2_folder, tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "ioi.jsonl"
    assert main(["pairs", "ioi", "--tokenizer", str(gpt2_folder), "--out", str(path), "--n", "12"]) == 0
    return path


def write_repeat_pairs(path, n: int):
    """``n`` token-id pairs of the induction task (its default config) whose answer is the
    repeat's next token (position -2 predicts the last one), written as JSONL at ``path``."""
    import json

    from mechlab.tasks.induction import InductionConfig, sample_sequences

    cfg = InductionConfig()
    gen = torch.Generator().manual_seed(0)
    clean, corrupted = sample_sequences(cfg, n, gen), sample_sequences(cfg, n, gen)
    lines = []
    for x, y in zip(clean.tokens.tolist(), corrupted.tokens.tolist(), strict=True):
        wrong = next(t for t in range(1, cfg.d_vocab) if t not in x)
        lines.append(json.dumps({"clean": x, "corrupted": y, "answer": x[-1], "wrong": wrong, "position": -2}))
    path.write_text("\n".join(lines) + "\n")
    return path
