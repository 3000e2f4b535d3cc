"""Translation across training: step parsing and order, resume per checkpoint, emergence,
the verdict, the refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from mechlab.pipelines.translation import (
    checkpoint_series,
    emergence,
    parse_step,
    summarize,
    translation_across_training,
    verdict,
)
from mechlab.tasks.translation import load_words
from mechlab.viz.translation import translation_figure
from tests.tasks.translation_helpers import word_tokenizer

SETTINGS = {"n_prompts": 4, "k": 1, "n_query": 2, "n_boot": 50}


def save_checkpoint(folder, n_layer=1, seed=0):
    import transformers as T

    tok = word_tokenizer(load_words())
    torch.manual_seed(seed)
    config = T.GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=n_layer, n_head=2, n_positions=64,
                          bos_token_id=0, eos_token_id=0)  # fmt: skip
    T.GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("series")
    for seed, name in enumerate(["step1000-tokens4B", "step20-tokens0B", "step300-tokens1B"]):
        save_checkpoint(root / name, seed=seed)
    return root


@pytest.mark.parametrize("name, step", [("step20000-tokens84B", 20000), ("step_1000", 1000),
                                        ("global_step300", 300), ("rev-STEP5", 5), ("main", None)])  # fmt: skip
def test_parse_step(name, step):
    assert parse_step(name) == step


def test_order_by_step_not_by_name(series, tmp_path):
    assert [s for s, _ in checkpoint_series(series)] == [20, 300, 1000]
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps([{"folder": str(series / "step300-tokens1B"), "step": 7},
                                    {"folder": str(series / "step20-tokens0B"), "step": 9}]))  # fmt: skip
    assert [(s, f.name) for s, f in checkpoint_series([], manifest)] == [(7, "step300-tokens1B"), (9, "step20-tokens0B")]
    tsv = tmp_path / "m.tsv"
    tsv.write_text(f"{series / 'step1000-tokens4B'}\t5\n{series / 'step20-tokens0B'}\t2\n")
    assert [s for s, _ in checkpoint_series([], tsv)] == [2, 5]


def test_emergence_and_verdict_by_hand():
    def curve(*means, width=0.1):
        return [{"mean": m, "low": m - width, "high": m + width} for m in means]

    steps = [0, 10, 20, 30]
    # mean crosses 0.5 at 20; its upper bound (mean + 0.1) at 10 (0.45); its lower bound at 30
    assert emergence(steps, curve(0.1, 0.45, 0.55, 0.9), 0.5) == {"step": 20, "low": 10, "high": 30}
    assert emergence(steps, curve(0.1, 0.1, 0.1, 0.1), 0.5) == {"step": None, "low": None, "high": None}
    late, early = emergence(steps, curve(0, 0, 0.2, 0.9, width=0.05), 0.5), emergence(steps, curve(0.9, 1, 1, 1), 0.5)
    assert late == {"step": 30, "low": 30, "high": 30} and early == {"step": 0, "low": 0, "high": 0}
    holds = verdict({"symbolic": {"start": late, "continue": early}, "semantic": {"start": early, "continue": early}}, 0.5)
    assert holds.startswith("holds:") and "symbolic: start 30 [30, 30], continue 0 [0, 0]" in holds
    fails = verdict({"symbolic": {"start": early, "continue": late}, "semantic": {"start": early, "continue": early}}, 0.5)
    assert fails.startswith("fails: the symbolic start emerges no later")
    gap_stays = verdict({"symbolic": {"start": late, "continue": early}, "semantic": {"start": late, "continue": early}}, 0.5)
    assert gap_stays.startswith("fails: with semantic labels")
    never = {"step": None, "low": None, "high": None}
    assert verdict({"symbolic": {"start": never, "continue": early}, "semantic": {"start": early, "continue": early}},
                   0.5).startswith("undecided: symbolic start never")  # fmt: skip


def test_runs_and_resumes_per_checkpoint(series, tmp_path):
    out = tmp_path / "out"
    seen = []
    summary = translation_across_training(series, out, on_checkpoint=lambda s, how: seen.append((s, how)), **SETTINGS)
    assert seen == [(20, "scored"), (300, "scored"), (1000, "scored")]
    assert summary["steps"] == [20, 300, 1000]
    assert set(summary["reports"]["20"]) == {"symbolic", "semantic", "misdirected_symbolic", "misdirected_semantic"}
    assert summary["verdict"].split(":")[0] in ("holds", "fails", "undecided")
    on_disk = json.loads((out / "across.json").read_text())
    assert on_disk["verdict"] == summary["verdict"] and (out / "across.html").is_file()
    assert summary["gap"]["symbolic"][0] == pytest.approx(
        summary["curves"]["symbolic"]["start"][0]["mean"] - summary["curves"]["symbolic"]["continue"][0]["mean"])
    (out / "step_300.json").unlink()  # as if stopped before the second checkpoint was written
    seen.clear()
    loads = []

    def load(folder):
        from mechlab.models.importers import from_pretrained

        loads.append(folder.name)
        return from_pretrained(folder)

    again = translation_across_training(series, out, load_model=load,
                                        on_checkpoint=lambda s, how: seen.append((s, how)), **SETTINGS)  # fmt: skip
    assert seen == [(20, "reused"), (300, "scored"), (1000, "reused")] and loads == ["step300-tokens1B"]
    assert again["curves"] == summary["curves"]
    with pytest.raises(ValueError, match="made with other settings"):
        translation_across_training(series, out, **{**SETTINGS, "seed": 1})


def test_a_stop_keeps_the_checkpoints_scored_and_the_rerun_scores_the_rest(series, tmp_path):
    from mechlab.models.importers import from_pretrained
    from mechlab.pipelines.stops import Interrupted

    loads = []

    def load(folder):
        loads.append(folder.name)
        if len(loads) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second checkpoint loads
        return from_pretrained(folder)

    out = tmp_path / "out"
    with pytest.raises(Interrupted) as stop:
        translation_across_training(series, out, load_model=load, **SETTINGS)
    assert stop.value.kept == ["step 20"] and stop.value.total == 3
    assert sorted(p.name for p in out.glob("*.json")) == ["step_20.json"]
    assert not list(out.glob(".*.tmp"))
    seen = []
    translation_across_training(series, out, on_checkpoint=lambda s, how: seen.append((s, how)), **SETTINGS)
    assert seen == [(20, "reused"), (300, "scored"), (1000, "scored")]


def test_figure_has_both_kinds_and_the_verdict():
    summary = summarize({s: _report(a) for s, a in [(0, 0.0), (10, 1.0)]}, 0.5)
    fig = translation_figure(summary)
    names = {t.name for t in fig.data if t.name}
    assert {"symbolic start", "symbolic continue", "semantic start", "semantic continue", "symbolic gap"} <= names
    assert summary["verdict"] in fig.layout.title.text
    assert summary["misdirection"]["symbolic"]["continue"][1]["mean"] == 0.25
    assert "misdirected semantic start" in names and len(fig.layout.annotations) == 3


def _report(acc):
    point = {"mean": acc, "low": acc, "high": acc, "n": 4}
    follows = {"mean": acc / 4, "low": 0.0, "high": 0.5, "n": 4}
    plain = {kind: {"start_acc": point, "continue_acc": point} for kind in ("symbolic", "semantic")}
    return plain | {f"misdirected_{kind}": {"start_follows_label": follows, "continue_follows_label": follows}
                    for kind in ("symbolic", "semantic")}  # fmt: skip


def test_refusals_write_nothing(series, tmp_path):
    out = tmp_path / "out"
    bad = tmp_path / "bad"
    shutil.copytree(series, bad)
    (bad / "step300-tokens1B").rename(bad / "latest")
    with pytest.raises(ValueError, match="'latest' names no step"):
        translation_across_training(bad, out, **SETTINGS)
    other = tmp_path / "arch"
    shutil.copytree(series, other)
    shutil.rmtree(other / "step300-tokens1B")
    save_checkpoint(other / "step300-tokens1B", n_layer=2)
    with pytest.raises(ValueError, match=r"steps 20 and 300 are different architectures \(n_layer: 1 vs 2\)"):
        translation_across_training(other, out, **SETTINGS)
    toks = tmp_path / "toks"
    shutil.copytree(series, toks)
    word_tokenizer(load_words(), extra=("zebra",)).save_pretrained(toks / "step300-tokens1B")  # same model
    with pytest.raises(ValueError, match="steps 20 and 300 have different tokenizers"):
        translation_across_training(toks, out, **SETTINGS)
    words = tmp_path / "w.tsv"
    words.write_text("english\tspanish\ndog\tperro\nzzyzx\tgato\n", encoding="utf-8")
    with pytest.raises(ValueError, match="cannot encode the word 'zzyzx'"):
        translation_across_training(series, out, words=words, **SETTINGS)
    with pytest.raises(ValueError, match="label 'dog' is a word of the word list"):
        translation_across_training(series, out, symbols=("X", "dog"), **SETTINGS)
    manifest = tmp_path / "m.tsv"
    manifest.write_text(f"{series / 'step20-tokens0B'}\t1\n{series / 'step300-tokens1B'}\t1\n")
    with pytest.raises(ValueError, match="two checkpoint folders of step 1"):
        translation_across_training([], out, manifest=manifest, **SETTINGS)
    assert not out.exists()


def _mechlab_run(folder, n_layers=1, steps=(10, 20)):
    """A folder of mechlab checkpoint files of a token transformer, named by step, with the
    bilingual corpus's tokenizer beside them; returns the folder and the word list."""
    from mechlab.checkpoint import save_checkpoint as save
    from mechlab.models import build_model
    from mechlab.tasks import bilingual

    vocab = bilingual.vocabulary(bilingual.BilingualConfig())
    for i, step in enumerate(steps):
        torch.manual_seed(i)
        model = build_model({"arch": "transformer", "io": "tokens", "d_model": 16, "n_layers": n_layers, "n_heads": 2,
                             "d_vocab": len(vocab.tokens), "d_vocab_out": len(vocab.tokens), "n_ctx": 64})  # fmt: skip
        save(model, folder / f"step_{step:07d}.pt", step=step)
    bilingual.tokenizer(vocab).save_pretrained(folder)
    bilingual.write_word_list(vocab, folder.parent / "words.tsv")
    return folder, folder.parent / "words.tsv"


@pytest.mark.usefixtures("one_thread")
def test_a_series_of_mechlab_checkpoint_files(tmp_path):
    run, words = _mechlab_run(tmp_path / "run" / "checkpoints")
    assert [(s, f.name) for s, f in checkpoint_series(run)] == [(10, "step_0000010.pt"), (20, "step_0000020.pt")]
    out = tmp_path / "out"
    seen = []
    summary = translation_across_training(run, out, words=words, on_checkpoint=lambda s, how: seen.append((s, how)),
                                          **SETTINGS)  # fmt: skip
    assert summary["steps"] == [10, 20] and seen == [(10, "scored"), (20, "scored")]
    # the same numbers as scoring the model directly
    from mechlab.evals.translation import start_vs_continue
    from mechlab.pipelines.prompts import open_model
    from mechlab.tasks import bilingual
    from mechlab.tasks.translation import episodes

    tok = bilingual.tokenizer(bilingual.vocabulary(bilingual.BilingualConfig()))
    prompts = {"symbolic": episodes(load_words(words), tok, n=4, kind="symbolic", k=1, n_query=2, seed=0)}
    direct = start_vs_continue(open_model(run / "step_0000020.pt")[0], prompts, n_boot=50)
    assert summary["curves"]["symbolic"]["start"][1] == direct["symbolic"]["start_acc"]
    seen.clear()
    translation_across_training(run, out, words=words, on_checkpoint=lambda s, how: seen.append((s, how)), **SETTINGS)
    assert seen == [(10, "reused"), (20, "reused")]
    save_checkpoint(tmp_path / "mixed" / "step5")
    manifest = tmp_path / "m.tsv"
    manifest.write_text(f"{tmp_path / 'mixed' / 'step5'}\t5\n{run / 'step_0000010.pt'}\t10\n")
    with pytest.raises(ValueError, match="mixes save_pretrained folders and mechlab checkpoint files"):
        translation_across_training([], tmp_path / "out2", manifest=manifest, words=words, **SETTINGS)
    other, _ = _mechlab_run(tmp_path / "other" / "checkpoints", steps=(10,))
    _mechlab_run(tmp_path / "deeper", n_layers=2, steps=(30,))
    (tmp_path / "deeper" / "step_0000030.pt").rename(other / "step_0000030.pt")
    with pytest.raises(ValueError, match=r"steps 10 and 30 are different architectures \(n_layers: 1 vs 2\)"):
        translation_across_training(other, tmp_path / "out2", words=words, **SETTINGS)
    assert not (tmp_path / "out2").exists()
