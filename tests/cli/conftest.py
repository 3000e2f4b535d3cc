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
