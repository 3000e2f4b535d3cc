"""`mechlab bench lm` on tiny shapes: the mechanism (processes, records, ratios, refusals), not timings."""

from __future__ import annotations

import json

import pytest

from mechlab.bench.goals import lm_goal
from mechlab.bench.lm import (
    SHAPES,
    LMBenchConfig,
    ShapeResult,
    ToolRun,
    lm_table,
    run_tool,
)
from mechlab.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(tool: str, load: tuple[float, int], cache: tuple[float, int], **extra) -> ToolRun:
    phases = [{"name": "load", "seconds": load[0], "peak_rss": load[1]},
              {"name": "cache", "seconds": cache[0], "peak_rss": cache[1]}]  # fmt: skip
    for name, (s, peak) in extra.items():
        phases.append({"name": name, "seconds": s, "peak_rss": peak})
    info = {"cached_tensors": 3, "cached_bytes": 3 << 20}
    return ToolRun.from_output(tool, {"tool": tool, "base_rss": 10, "phases": phases, "info": info})


def _result() -> ShapeResult:
    write = ToolRun.from_output("write", {"phases": [{"name": "write", "seconds": 2.0, "peak_rss": 1}],
                                          "info": {"parameters": 1_000, "weight_bytes": 2_000}})  # fmt: skip
    runs = {
        "mechlab": _run("mechlab", (2.0, 3 * 10**9), (4.0, 4 * 10**9), attribute=(30.0, 9 * 10**9)),
        "bridge": _run("bridge", (5.0, 8 * 10**9), (12.0, 6 * 10**9)),
        "nnsight": ToolRun.from_output(
            "nnsight", {"tool": "nnsight", "refused": "ValueError: no such thing"}
        ),
    }
    return ShapeResult("llama-tiny", write, runs)


def test_ratios_are_the_competitors_over_mechlabs_and_a_refusal_is_one_line():
    cfg = LMBenchConfig(shapes=("llama-tiny",), threads=2)
    table = lm_table([_result()], cfg)
    by_tool = {v["tool"]: v for v in table.values}
    bridge = by_tool["bridge"]
    assert bridge["load_ratio"] == pytest.approx(5.0 / 2.0)
    assert bridge["cache_ratio"] == pytest.approx(12.0 / 4.0)
    assert bridge["total_ratio"] == pytest.approx((5.0 + 12.0) / (2.0 + 4.0))
    # memory: the highest peak of loading and caching, EAP-IG's left out (the bridge has none)
    assert bridge["memory_ratio"] == pytest.approx(8 / 4)
    assert by_tool["mechlab"]["peak_rss"] == 9 * 10**9  # the whole run's peak, EAP-IG's included
    rows = {r[1]: r for r in table.rows}
    assert rows["TransformerLens bridge"][-4:] == ["2.50x", "3.00x", "2.83x", "2.00x"]
    assert rows["mechlab"][2:5] == ["2.0", "3.00", "4.0"] and rows["mechlab"][7:9] == [
        "30.0",
        "9.00",
    ]
    assert set(rows["nnsight"][2:]) == {"-"}
    assert "llama-tiny, nnsight: cannot run it: ValueError: no such thing" in table.notes
    assert table.notes[0].startswith("llama-tiny: 1,000 parameters")
    # the goal: mechlab's whole run within 24 GB on two threads; competitors have none
    assert lm_goal(by_tool["mechlab"]) == "<= 24 GB on 2 threads: **met** (9.0 GB)"
    assert lm_goal({**by_tool["mechlab"], "peak_rss": 25 * 10**9}).endswith("missed (25.0 GB)")
    assert lm_goal({**by_tool["mechlab"], "threads": 1}) == "no goal: 1 threads"
    assert lm_goal(bridge) == "-" and lm_goal(by_tool["nnsight"]) == "-"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shapes": ("llama-7b",)}, "unknown shape 'llama-7b'; choose from llama-3.2-1b"),
        ({"shapes": ()}, "unknown shape ''"),
        ({"shapes": ("llama-tiny",), "tools": ("mechlab",)}, "unknown tool 'mechlab'"),
        ({"shapes": ("llama-tiny",), "n_pos": 1}, "n_pos must be a number >= 2"),
        ({"shapes": ("llama-tiny",), "steps": 0}, "steps must be a number >= 1"),
        (
            {"shapes": ("gemma-tiny",), "n_pos": 9000},
            "longer than shape 'gemma-tiny' accepts (8192)",
        ),
    ],
)
def test_bad_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=None) as err:
        LMBenchConfig(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_real_shapes_are_the_checkpoints_configs():
    llama, gemma = SHAPES["llama-3.2-1b"].fields, SHAPES["gemma-2-2b"].fields
    assert (llama["hidden_size"], llama["num_hidden_layers"], llama["num_attention_heads"],
            llama["num_key_value_heads"], llama["head_dim"], llama["intermediate_size"],
            llama["vocab_size"]) == (2048, 16, 32, 8, 64, 8192, 128256)  # fmt: skip
    assert llama["rope_parameters"]["rope_type"] == "llama3" and llama["tie_word_embeddings"]
    assert (gemma["hidden_size"], gemma["num_hidden_layers"], gemma["num_attention_heads"],
            gemma["num_key_value_heads"], gemma["head_dim"], gemma["intermediate_size"], gemma["vocab_size"],
            gemma["sliding_window"], gemma["attn_logit_softcapping"], gemma["final_logit_softcapping"],
            gemma["query_pre_attn_scalar"]) == (2304, 26, 8, 4, 256, 9216, 256000, 4096, 50.0, 30.0, 256)  # fmt: skip
    assert SHAPES["llama-3.2-1b"].attribute and not SHAPES["gemma-2-2b"].attribute


def test_a_process_that_fails_is_a_refusal_with_its_reason(tmp_path):
    run = run_tool("nope", tmp_path, threads=1, steps=0, timeout=120)
    assert (
        run.refused == "unknown tool 'nope'; choose from write, mechlab, bridge, nnsight"
        and not run.phases
    )
    run = run_tool("mechlab", tmp_path / "missing", threads=1, steps=0, timeout=120)
    assert run.refused.startswith(("ImportProblem", "FileNotFoundError")) and not run.phases


def test_bench_lm_writes_its_record_with_ratios_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "lm.json"
    args = ["bench", "lm", "--shapes", "llama-tiny", "--pos", "12", "--steps", "1", "--threads", "1",
            "--tools", "nnsight", "--json", str(out)]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    assert record["bench"] == "lm" and record["settings"]["tools"] == ["nnsight"]
    assert record["settings"]["n_pos"] == 12 and record["machine"]["threads"] == 1
    values = {v["tool"]: v for v in record["tables"][0]["values"]}
    ours, theirs = values["mechlab"], values["nnsight"]
    assert ours["refused"] is None and theirs["refused"] is None, (
        ours["refused"],
        theirs["refused"],
    )
    assert ours["dtype"] == theirs["dtype"] == "torch.bfloat16"
    assert (
        ours["method"] == "eap-ig"
        and ours["steps"] == 1
        and ours["edges"] > 0
        and ours["scores_finite"]
    )
    # every ratio is the competitor's phase over mechlab's, from the processes' raw outputs
    raw = record["data"]["runs"]["llama-tiny"]
    seconds = {
        t: {p["name"]: p["seconds"] for p in raw[t]["phases"].values()}
        for t in ("mechlab", "nnsight")
    }
    for phase in ("load", "cache"):
        assert theirs[f"{phase}_ratio"] == pytest.approx(
            seconds["nnsight"][phase] / seconds["mechlab"][phase]
        )
    total = {t: seconds[t]["load"] + seconds[t]["cache"] for t in seconds}
    assert theirs["total_ratio"] == pytest.approx(total["nnsight"] / total["mechlab"])
    for v in (ours, theirs):  # peaks are the process's resident memory: above what it started with
        assert v["load_peak_rss"] >= v["base_rss"] > 0 and v["cache_peak_rss"] > 0
    assert ours["attribute_s"] > 0 and theirs["attribute_s"] is None
    assert theirs["cached_tensors"] == 2 + 1  # two decoder layers and the logits
    assert ours["cached_tensors"] > theirs["cached_tensors"]  # every hook point
    assert ours["parameters"] == raw["write"]["info"]["parameters"] > 0
    # a second run is refused before anything runs; the record is left as it was
    before = out.read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--force" in err and len(err.strip().splitlines()) == 1
    assert out.read_bytes() == before


def test_bad_input_writes_nothing(tmp_path, capsys):
    out = tmp_path / "lm.json"
    for bad in (
        ["--shapes", "llama-70b"],
        ["--tools", "pyvene"],
        ["--shapes", "llama-tiny", "--pos", "4096"],
    ):
        assert main(["bench", "lm", *bad, "--json", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("mechlab: error: ") and len(err.strip().splitlines()) == 1
    assert not out.exists()
