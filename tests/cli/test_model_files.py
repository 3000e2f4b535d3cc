"""Issue 34 on the command line: a damaged or hostile file in the model folder given to
``prune --model F --pairs P`` is one line naming the file and what to do, exit 2, no
traceback and nothing written; a rerun after a shard's weights change (wherever the shard
is in the folder) does not read back the old circuit."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mechlab.cli import main
from tests.models.model_files import (
    CASES,
    bad_folder,
    copy,
    file_contents,
    good_folder,
    id_pairs,
    move_to_shard,
    write_case,
    write_safetensors,
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-model-files")


@pytest.fixture(scope="module")
def pairs(root):
    return id_pairs(root / "ids.jsonl")


def run(capsys, model, pairs, out, *extra) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["prune", "--model", str(model), "--pairs", str(pairs), "--steps", "1", "--no-progress",
                 "--threads", "1", "--out", str(out), *extra])  # fmt: skip
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines() + (
        [captured.out] if "Traceback" in captured.out else []
    )


def assert_one_line(code, err, *parts):
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("mechlab: error: "), err
    for part in parts:
        assert part in err[0], err


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_damaged_model_file_is_one_line_exit_2_and_writes_nothing(
    case, root, pairs, tmp_path, capsys
):
    folder, message = bad_folder(root, case)
    code, err = run(capsys, folder, pairs, tmp_path / "out")
    assert_one_line(code, err, message, str(folder))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "what, message",
    [
        (
            "token-id",
            "'answer' token id 1000000000000000000000000000000 is larger than any vocabulary",
        ),
        (
            "prompt-id",
            "'clean' holds the token id 1000000000000000000000000000000, larger than any vocabulary",
        ),
        ("seed", "--seed 1000000000000000000000000000000 is outside -2**63..2**63-1"),
    ],
)
def test_numbers_beyond_64_bits_are_named(what, message, root, pairs, tmp_path, capsys):
    big = 10**30
    records = [json.loads(line) for line in pairs.read_text().splitlines()]
    extra = []
    if what == "token-id":
        records[0]["answer"] = big
    elif what == "prompt-id":
        records[1]["clean"][0] = big
    else:
        extra = ["--seed", str(big)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, err = run(capsys, good_folder(root), path, tmp_path / "out", *extra)
    assert_one_line(code, err, message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "given", ["model.safetensors", "pytorch_model.bin", "legacy pytorch_model.bin", "folder"]
)
def test_a_hugging_face_folder_or_its_weights_given_to_ckpt_points_to_model(
    given, root, tmp_path, capsys
):
    folder = good_folder(
        root,
        {"pytorch_model.bin": "bin", "legacy pytorch_model.bin": "legacy-bin"}.get(
            given, "safetensors"
        ),
    )
    path = folder / given.split()[-1] if given != "folder" else folder
    capsys.readouterr()
    code = main(["prune", "--ckpt", str(path), "--target", "1-after", "--steps", "1", "--no-progress",
                 "--out", str(tmp_path / "out")])  # fmt: skip
    assert_one_line(code, capsys.readouterr().err.strip().splitlines(), "--model", str(path))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["sub/shard.safetensors", ".hidden.safetensors"])
def test_a_rerun_after_a_nested_or_hidden_shard_changed_does_not_read_back(
    where, root, pairs, tmp_path, capsys
):
    folder = copy(good_folder(root), tmp_path / "m")
    header, body = move_to_shard(folder, where)
    out = tmp_path / "out"
    code, err = run(capsys, folder, pairs, out)
    assert code == 0, err
    code, err = run(capsys, folder, pairs, out)
    assert code == 0, err  # the same inputs: read back
    changed = bytearray(body)
    begin = header["transformer.h.0.mlp.c_fc.weight"]["data_offsets"][0]
    changed[begin : begin + 4] = struct.pack("<f", 3.0)
    write_safetensors(folder / where, header, bytes(changed))
    written = (out / "ids_seed0.json").read_bytes()
    code, err = run(capsys, folder, pairs, out)
    assert_one_line(code, err, "was made with other settings", "model_sha256", "--force")
    assert (out / "ids_seed0.json").read_bytes() == written


# --- property: any bytes or JSON in any file, on the command line ---------------------


@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_any_content_of_any_model_file_is_one_line_exit_2_on_the_command_line(root, pairs, capsys):
    """Right- and wrong-shaped contents of each file (tests.models.model_files.file_contents):
    the command runs (a content that loads) or prints one line, exits 2, writes nothing."""
    contents = file_contents(root)
    cases = st.sampled_from(sorted(contents)).flatmap(
        lambda name: st.tuples(st.just(name), contents[name][0])
    )
    seen = {"ran": 0, "refused": 0}

    @settings(
        max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    @given(case=cases)
    def check(case):
        name, data = case
        with tempfile.TemporaryDirectory() as base:
            folder = write_case(Path(base), contents[name][1], name, data)
            out = Path(base) / "out"
            code, err = run(capsys, folder, pairs, out)
            if code == 0:
                seen["ran"] += 1
                return
            assert_one_line(code, err, str(folder))
            assert not out.exists()
            seen["refused"] += 1

    check()
    assert seen["refused"] >= 15, seen


@pytest.mark.parametrize(
    "name, given, message",
    [
        (
            "config.json",
            "model",
            "config.json' (the config) leads outside the model folder, to '/dev/zero'",
        ),
        ("config.json", "tokenizer", "config.json' is not a regular file"),
        ("tokenizer.json", "model", "tokenizer.json' is not a regular file"),
    ],
)
def test_a_folder_file_linked_to_a_device_is_refused_before_the_tokenizer_reads_it(
    name, given, message, root, tmp_path, capsys
):
    """Text pairs load the tokenizer first (the model folder's, or --tokenizer's);
    transformers reads config.json and tokenizer.json to their end, which a link to
    /dev/zero never has. The model folder is checked first (its config gets the importer's
    message); a --tokenizer folder by the tokenizer's own check."""
    from tests.tasks.tokenizers import word_level

    folder = copy(good_folder(root), tmp_path / "m")
    word_level(folder)
    linked = folder if given == "model" else copy(folder, tmp_path / "tok")
    (linked / name).unlink(missing_ok=True)
    (linked / name).symlink_to("/dev/zero")
    pairs = _text_pairs(tmp_path)
    extra = ["--tokenizer", str(linked)] if given == "tokenizer" else []
    code, err = run(capsys, folder, pairs, tmp_path / "out", *extra)
    assert_one_line(code, err, message, str(linked / name))
    assert not (tmp_path / "out").exists()


def _text_pairs(tmp_path: Path) -> Path:
    """A pair file of four text pairs (prompts the folder's tokenizer splits)."""
    pairs = tmp_path / "text.jsonl"
    record = {"clean": "When Mary and John", "corrupted": "When Anne and Paul", "answer": " Mary", "wrong": " John"}
    pairs.write_text((json.dumps(record) + "\n") * 4)
    return pairs


def test_a_seed_beyond_64_bits_is_named_for_a_checkpoint_too(tmp_path, capsys):
    ckpt = Path(__file__).parents[2] / "examples/checkpoints/recall-cpu/checkpoints/step_0000006.pt"
    capsys.readouterr()
    code = main(["prune", "--ckpt", str(ckpt), "--seed", str(-(10**30)), "--steps", "1", "--no-progress",
                 "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert_one_line(code, err, "--seed -1000000000000000000000000000000 is outside -2**63..2**63-1")
    assert not (tmp_path / "out").exists()


def test_text_pairs_get_the_importers_message_for_a_damaged_config(root, tmp_path, capsys):
    """The model folder is checked before transformers reads its config.json for the
    tokenizer (which said 'cannot load the tokenizer in ...: Validation error for field')."""
    from tests.models.model_files import edit_config
    from tests.tasks.tokenizers import word_level

    folder = copy(good_folder(root), tmp_path / "m")
    word_level(folder)
    edit_config(folder, n_embd="32")
    pairs = _text_pairs(tmp_path)
    code, err = run(capsys, folder, pairs, tmp_path / "out")
    assert_one_line(
        code, err, 'config.json\': n_embd must be an integer in 1..2147483647, got "32"'
    )
    assert not (tmp_path / "out").exists()
