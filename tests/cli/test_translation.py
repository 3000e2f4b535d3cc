"""``mechlab translation across`` and ``circuits``: a run that prints the verdict, and bad
input as one line, exit 2, nothing written."""

from __future__ import annotations

import shutil

import pytest

from mechlab.cli import main
from mechlab.tasks.translation import load_words
from tests.pipelines.test_translation import save_checkpoint
from tests.tasks.translation_helpers import word_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = ["--prompts", "4", "--k", "1", "--queries", "2", "--boot", "20"]


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("series")
    for seed, name in enumerate(["step20-tokens0B", "step300-tokens1B"]):
        save_checkpoint(root / name, seed=seed)
    return root


def one_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mechlab: error: ") and "Traceback" not in err[0], (
        err
    )
    return err[0]


def test_across_prints_the_curves_and_the_verdict(series, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(["translation", "across", "--checkpoints", str(series), "--out", str(out), *FAST]) == 0
    )
    printed = capsys.readouterr().out
    assert (
        "step 20: scored" in printed and "verdict: " in printed and (out / "across.html").is_file()
    )
    assert (
        main(["translation", "across", "--checkpoints", str(series), "--out", str(out), *FAST]) == 0
    )
    assert "step 20: reused" in capsys.readouterr().out


def _mixed(series, tmp_path):
    other = tmp_path / "arch"
    shutil.copytree(series, other)
    shutil.rmtree(other / "step300-tokens1B")
    save_checkpoint(other / "step300-tokens1B", n_layer=2)
    return ["--checkpoints", str(other)]


def _tokenizers(series, tmp_path):
    toks = tmp_path / "toks"
    shutil.copytree(series, toks)
    word_tokenizer(load_words(), extra=("zebra",)).save_pretrained(toks / "step300-tokens1B")
    return ["--checkpoints", str(toks)]


def _no_step(series, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(series, bad)
    (bad / "step300-tokens1B").rename(bad / "latest")
    return ["--checkpoints", str(bad)]


def _words(series, tmp_path):
    words = tmp_path / "w.tsv"
    words.write_text("english\tspanish\ndog\tperro\nzzyzx\tgato\n", encoding="utf-8")
    return ["--checkpoints", str(series), "--words", str(words)]


def _label(series, tmp_path):
    return ["--checkpoints", str(series), "--symbol", "X", "--symbol", "dog"]


@pytest.mark.parametrize("make, message", [
    (_mixed, "different architectures (n_layer: 1 vs 2)"), (_tokenizers, "have different tokenizers"),
    (_no_step, "'latest' names no step"), (_words, "cannot encode the word 'zzyzx'"),
    (_label, "label 'dog' is a word of the word list"),
], ids=["architectures", "tokenizers", "no-step", "word-list", "label"])  # fmt: skip
def test_across_refusals_exit_2_and_write_nothing(make, message, series, tmp_path, capsys):
    args = make(series, tmp_path)
    capsys.readouterr()  # what making the bad input printed
    out = tmp_path / "out"
    assert main(["translation", "across", *args, "--out", str(out), *FAST]) == 2
    assert message in one_line(capsys)
    assert not out.exists()


def test_circuits_refusals_exit_2_and_write_nothing(series, tmp_path, capsys):
    out = tmp_path / "out"
    model = str(series / "step20-tokens0B")
    assert (
        main(["translation", "circuits", "--model", model, "--out", str(out), "--symbol", "dog"])
        == 2
    )
    assert "label 'dog' is a word of the word list" in one_line(capsys)
    assert (
        main(["translation", "circuits", "--model", model, "--out", str(out), "--kind", "plain"])
        == 2
    )
    assert "kind must be one of ('symbolic', 'semantic'), got 'plain'" in one_line(capsys)
    assert main(["translation", "across", "--out", str(out)]) == 2
    assert "give --checkpoints" in one_line(capsys)
    assert not out.exists()
