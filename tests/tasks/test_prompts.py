"""Prompt pairs: reading text (local tokenizer) and token-id files, the refusals, the traces
they make, and pruning on them with the logit difference reported against a direct computation."""

import json

import pytest
import torch

from mechlab.models import build_model
from mechlab.prune import Circuit, find_circuit, prune
from mechlab.prune.evaluate import target_outputs
from mechlab.prune.graph import build_graph
from mechlab.tasks.prompts import (
    TARGET,
    PromptPairs,
    load_pairs,
    load_tokenizer,
    logit_diff_metrics,
    pairs_from_records,
    write_jsonl,
)
from tests.tasks.tokenizers import word_level

torch.set_num_threads(1)

PAIRS = [
    {"clean": "When Mary and John went to the store, John gave a drink to",
     "corrupted": "When Anne and Paul went to the store, Tom gave a drink to",
     "answer": " Mary", "wrong": " John"},
    {"clean": "After Lucy and Tom went to the garden, Tom gave a ball to",
     "corrupted": "After Sarah and Mark went to the garden, Paul gave a ball to",
     "answer": " Lucy", "wrong": " Tom"},
    {"clean": "Anne and Paul went to the park, Paul gave a book to",
     "corrupted": "Mary and Lucy went to the park, Mark gave a book to",
     "answer": " Anne", "wrong": " Paul", "position": -1},
]  # fmt: skip


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return word_level(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tokenizer(tok_dir):
    return load_tokenizer(tok_dir)


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_text_pairs_are_tokenized_with_the_local_tokenizer(tmp_path, tok_dir, tokenizer):
    pairs = load_pairs(write(tmp_path / "p.jsonl", PAIRS), tok_dir)
    assert len(pairs) == 3 and pairs.metric == "logit-diff"
    for i, record in enumerate(PAIRS):
        ids = tokenizer(record["clean"])["input_ids"]
        n = len(ids)
        assert pairs.lengths[i] == n and pairs.position[i] == n - 1
        assert pairs.clean[i, :n].tolist() == ids
        assert pairs.corrupted[i, :n].tolist() == tokenizer(record["corrupted"])["input_ids"]
        assert pairs.answer[i] == tokenizer.convert_tokens_to_ids(record["answer"].strip())
        assert pairs.wrong[i] == tokenizer.convert_tokens_to_ids(record["wrong"].strip())
        assert (pairs.clean[i, n:] == tokenizer.pad_token_id).all()  # right-padded
    traces = pairs.traces()
    assert traces.observed.sum(1).tolist() == [1, 1, 1]  # the explained position only
    rows = torch.arange(3)
    assert (traces.observed[rows, pairs.position]).all()
    assert traces.truth[rows, pairs.position].tolist() == pairs.answer.tolist()
    assert (traces.truth[~traces.observed] == -100).all()


def test_token_id_pairs_need_no_tokenizer(tmp_path):
    records = [
        {"clean": [1, 2, 3, 4], "corrupted": [1, 5, 3, 4], "answer": 2, "wrong": 5, "position": 2},
        {"clean": [1, 6, 7], "corrupted": [1, 8, 7], "answer": [6], "wrong": 8},
    ]
    pairs = load_pairs(write(tmp_path / "ids.jsonl", records), pad_id=0)
    assert pairs.clean.tolist() == [[1, 2, 3, 4], [1, 6, 7, 0]]
    assert pairs.position.tolist() == [2, 2] and pairs.answer.tolist() == [2, 6]
    kl = load_pairs(write(tmp_path / "kl.jsonl", [{"clean": [1, 2], "corrupted": [3, 2]}] * 2), metric="kl")
    assert kl.answer is None and kl.traces().truth is None


def one_line_error(fn, *args, match, **kwargs):
    with pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "records, match",
    [
        ([{**PAIRS[0], "corrupted": "When Anne and Paul went to the store, Tom gave a drink to Mary"}, PAIRS[1]],
         r"line 1: the clean prompt has 13 tokens and the corrupted 14; the prompts of a pair must have equal token lengths"),
        ([PAIRS[0], {**PAIRS[1], "answer": " Lucy Tom"}], r"line 2: 'answer' ' Lucy Tom' is 2 tokens .* single tokens"),
        ([PAIRS[0], {k: v for k, v in PAIRS[1].items() if k != "wrong"}], r"line 2: the logit-diff metric needs 'answer' and 'wrong'"),
        ([PAIRS[0], {"clean": [1, 2], "corrupted": [1, 3]}], r"line 2: 'clean' is ids but earlier prompts are text"),
        ([PAIRS[0], {**PAIRS[1], "position": 40}], r"line 2: position 40 is outside the prompt's 13 tokens"),
        ([PAIRS[0]], r"1 pair\(s\); at least two are needed"),
        ([PAIRS[0], {"clean": "a b"}], r"line 2: no 'corrupted' prompt"),
        ([PAIRS[0], {**PAIRS[1], "extra": 1}], r"line 2: unknown key\(s\) \['extra'\]"),
    ],
)
def test_bad_pairs_are_refused_in_one_line(tmp_path, tok_dir, records, match):
    one_line_error(load_pairs, write(tmp_path / "bad.jsonl", records), tok_dir, match=match)


def test_bad_files_and_tokenizer_folders_are_refused_in_one_line(tmp_path, tok_dir):
    one_line_error(load_pairs, tmp_path / "missing.jsonl", tok_dir, match="not found")
    (tmp_path / "broken.jsonl").write_text(json.dumps(PAIRS[0]) + "\n{oops\n")
    one_line_error(load_pairs, tmp_path / "broken.jsonl", tok_dir, match="line 2 is not JSON")
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    one_line_error(load_pairs, write(tmp_path / "p.jsonl", PAIRS), empty, match="has no tokenizer")
    one_line_error(load_pairs, tmp_path / "p.jsonl", None, match="line 1: 'clean' is text; give a tokenizer")
    one_line_error(load_pairs, tmp_path / "p.jsonl", tok_dir, metric="accuracy", match="unknown metric")
    one_line_error(load_tokenizer, tmp_path / "p.jsonl", match="is not a folder")


def token_model(vocab: int, n_ctx: int = 16, causal: bool = True):
    torch.manual_seed(0)
    return build_model("transformer", d_model=32, n_layers=2, n_heads=4, io="tokens",
                       d_vocab=vocab, n_ctx=n_ctx, causal=causal).eval()  # fmt: skip


def test_check_model_refuses_what_the_model_cannot_run(tmp_path, tok_dir, tokenizer):
    pairs = load_pairs(write(tmp_path / "p.jsonl", PAIRS), tok_dir)
    V = len(tokenizer)
    pairs.check_model(token_model(V))
    one_line_error(pairs.check_model, token_model(V - 3), match="outside the model's vocabulary")
    one_line_error(pairs.check_model, token_model(V, n_ctx=8), match="more than the model's context of 8")
    one_line_error(pairs.check_model, token_model(V, causal=False), match="right-padded")
    continuous = build_model("transformer", d_model=16, n_layers=1, n_heads=2, d_in=3, d_out=3, n_ctx=16)
    one_line_error(pairs.check_model, continuous, match="need a token model")


def test_prune_on_prompt_pairs_and_logit_difference_against_direct_runs(tmp_path, tokenizer):
    # 24 pairs of token ids of two lengths; a random 2-layer model (no circuit to find:
    # the metrics are checked against direct runs, not for quality)
    gen = torch.Generator().manual_seed(0)
    V = 30
    records = []
    for i in range(24):
        n = 7 if i % 2 else 9
        clean = torch.randint(1, V, (n,), generator=gen).tolist()
        corrupted = list(clean)
        corrupted[2] = (clean[2] % (V - 1)) + 1
        records.append({"clean": clean, "corrupted": corrupted, "answer": clean[2], "wrong": corrupted[2]})
    path = tmp_path / "pairs.jsonl"
    write_jsonl(path, records)
    pairs = load_pairs(path)
    model = token_model(V)
    pairs.check_model(model)
    data = pairs.prune_data(test_fraction=0.5, seed=3)
    assert len(data.train) == len(data.test) == 12
    circuit = prune(model, data, TARGET, sparsity=0.8, steps=20, progress=False)
    assert circuit.metadata["data"]["metric"] == "logit-diff"
    train, test = pairs.split(0.5, seed=3)
    assert torch.equal(data.test.inputs, test.clean)

    outputs = target_outputs(model, data, circuit)
    rows = torch.arange(len(test))
    with torch.no_grad():
        full = model(test.clean)[rows, test.position]
        corrupt = model(test.corrupted)[rows, test.position]
    assert torch.allclose(outputs["full"], full, atol=1e-5)
    assert torch.allclose(outputs["ablated"], corrupt, atol=1e-4)  # every edge from the corrupted run
    metrics = logit_diff_metrics(outputs, test)
    direct = (full[rows, test.answer] - full[rows, test.wrong]).mean()
    assert metrics["logit_diff_full"] == pytest.approx(float(direct), abs=1e-5)
    assert metrics["logit_diff_ablated"] == pytest.approx(
        float((corrupt[rows, test.answer] - corrupt[rows, test.wrong]).mean()), abs=1e-4
    )
    # the whole graph as a circuit recovers all of the logit difference; its complement none
    graph = build_graph(model)
    whole = Circuit.from_edges(dict.fromkeys(graph.edges, 1.0), metadata=circuit.metadata)
    everything = logit_diff_metrics(target_outputs(model, data, whole), test)
    assert everything["logit_diff_recovered"] == pytest.approx(1.0, abs=1e-4)
    assert everything["logit_diff_complement_recovered"] == pytest.approx(0.0, abs=1e-3)
    one_line_error(logit_diff_metrics, outputs, train.subset(torch.arange(5)), match="rows of 'full' outputs for")
    # the attribution methods take the same data
    scored = find_circuit(model, data, TARGET, "eap-ig", n_edges=10, steps=3)
    assert scored.metadata["metrics"]["n_positions"] == len(test)  # one explained position per pair
    assert 0 < scored.n_edges <= 10


def test_prompt_pairs_validate_their_fields():
    ids = torch.tensor([[1, 2], [3, 4]])
    one_line_error(PromptPairs, ids, ids, torch.tensor([2, 2]), torch.tensor([1, 1]), match="logit-diff metric needs")
    one_line_error(PromptPairs, ids, ids[:, :1], torch.tensor([2, 2]), torch.tensor([1, 1]), metric="kl",
                   match="must be \\[n, T\\] token ids of one shape")
    pairs = PromptPairs(ids, ids, torch.tensor([2, 2]), torch.tensor([1, 1]), metric="kl")
    one_line_error(pairs.split, 1.5, match="test_fraction must be in")
    one_line_error(pairs_from_records, [{"clean": [1], "corrupted": [2]}] * 2, metric="kl", position="last",
                   match="position must be an integer")


def test_oversized_pair_files_are_refused_before_a_line_is_parsed(tmp_path, monkeypatch):
    """Sizes of a pair file are checked before tokenizing or padding: its bytes, its number
    of pairs, pairs x bytes of its longest line (a bound on the padded batch)."""
    import time

    from mechlab import limits
    from mechlab.tasks import prompts

    def parsed(*args, **kwargs):
        raise AssertionError("a line was parsed before the sizes were checked")

    ids = json.dumps({"clean": [1, 2], "corrupted": [1, 3], "answer": 1, "wrong": 2})
    n = 1_400_000
    long = json.dumps({"clean": [1] * n, "corrupted": [2] * n, "answer": 1, "wrong": 2})
    (tmp_path / "long.jsonl").write_text((ids + "\n") * 300 + long + "\n")  # 301 x 8.4 MB: 2.5e9
    (tmp_path / "many.jsonl").write_text("{}\n" * (limits.MAX_PROMPT_PAIRS + 1))
    monkeypatch.setattr(prompts.json, "loads", parsed)
    start = time.perf_counter()
    one_line_error(load_pairs, tmp_path / "long.jsonl", metric="kl",
                   match=r"the padded pairs of .*long.jsonl' \(line 301 is the longest\) would hold pairs "
                         r"301 x bytes of the longest line 8\.4e\+06 = 2\.53e\+09 elements")  # fmt: skip
    one_line_error(load_pairs, tmp_path / "many.jsonl", metric="kl",
                   match=r"many.jsonl' holds more than mechlab's limit of 100,000 pairs")  # fmt: skip
    monkeypatch.setattr(prompts, "MAX_PAIR_FILE_BYTES", 1000)
    one_line_error(load_pairs, tmp_path / "long.jsonl", metric="kl",
                   match=r"is 8,4\d\d,\d\d\d bytes, more than mechlab's limit of 1,000; split it")  # fmt: skip
    assert time.perf_counter() - start < 5


def test_a_line_nested_100000_deep_is_one_line_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.jsonl"
    deep = '{"clean": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path.write_text(json.dumps(PAIRS[0]) + "\n" + deep + "\n")
    match = r"deep.jsonl: line 2 nests more than 64 levels deep"
    one_line_error(load_pairs, path, metric="kl", match=match)


def test_pairs_from_records_bound_their_count_and_padded_size(monkeypatch):
    from mechlab.tasks import prompts

    monkeypatch.setattr(prompts, "MAX_PROMPT_PAIRS", 3)
    records = ({"clean": [1, 2], "corrupted": [1, 3]} for _ in range(10**9))  # never all drawn
    one_line_error(pairs_from_records, records, metric="kl", source="gen",
                   match="gen holds more than mechlab's limit of 3 pairs")  # fmt: skip
    monkeypatch.setenv("MECHLAB_MAX_ELEMENTS", "10")
    records = [{"clean": [1] * 6, "corrupted": [2] * 6}, {"clean": [1], "corrupted": [2]}]
    one_line_error(pairs_from_records, records, metric="kl",
                   match=r"the padded pairs would hold pairs 2 x tokens of the longest prompt 6 = 12")  # fmt: skip
