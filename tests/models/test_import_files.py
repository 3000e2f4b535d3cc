"""Issue 34: the files of model folders users bring. Every damaged or hostile file of a
``save_pretrained`` folder (config.json, the weight index, model.safetensors,
pytorch_model.bin) is one ImportProblem naming the file and what to do; legacy torch files,
shards in subfolders and a hub cache's links load; the prompt digest covers every file the
import reads."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from mechlab.models.importers import ImportProblem, from_pretrained, weight_files
from mechlab.pipelines.prompts import source_digest
from tests.models.hf_models import hf_model, tokens
from tests.models.model_files import (
    CASES,
    RunsACommand,
    bad_folder,
    copy,
    file_contents,
    good_folder,
    move_to_shard,
    write_case,
    write_safetensors,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("model-files")


def _same_logits(model, hf) -> bool:
    x = tokens()
    with torch.no_grad():
        return float((model(x) - hf(x).logits).abs().max()) < 1e-5


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_damaged_file_is_one_import_problem_naming_it(case, root):
    folder, message = bad_folder(root, case)
    with pytest.raises(ImportProblem) as info:
        from_pretrained(folder)
    text = str(info.value)
    assert message in text, text
    assert "\n" not in text and str(folder) in text, text
    assert any(
        advice in text for advice in ("save_pretrained", "copy the file", "keep every shard")
    ), text


def test_a_legacy_torch_file_loads_without_mmap_and_still_weights_only(root):
    hf = hf_model("gpt2")
    legacy, current = good_folder(root, "legacy-bin"), good_folder(root, "bin")
    assert not __import__("zipfile").is_zipfile(legacy / "pytorch_model.bin")
    assert _same_logits(from_pretrained(legacy), hf) and _same_logits(from_pretrained(current), hf)
    hostile = copy(legacy, root / "legacy-hostile")  # legacy or zip, no code runs
    torch.save(
        {"w": RunsACommand()}, hostile / "pytorch_model.bin", _use_new_zipfile_serialization=False
    )
    with pytest.raises(ImportProblem, match="holds Python objects besides tensors"):
        from_pretrained(hostile)


@pytest.mark.parametrize(
    "where", ["sub/dir/shard.safetensors", ".hidden/shard.safetensors", ".shard.safetensors"]
)
def test_shards_anywhere_inside_the_folder_load_and_count_in_the_digest(where, root, tmp_path):
    hf = hf_model("gpt2")
    folder = copy(good_folder(root), tmp_path / "m")
    header, body = move_to_shard(folder, where)
    assert weight_files(folder) == [folder / where]
    assert _same_logits(from_pretrained(folder), hf)
    before = source_digest(folder)
    name = next(k for k in header if k != "__metadata__")
    begin = header[name]["data_offsets"][0]
    changed = bytearray(body)
    changed[begin : begin + 4] = struct.pack(
        "<f", 123.0
    )  # the weights change, nothing top-level does
    write_safetensors(folder / where, header, bytes(changed))
    assert source_digest(folder) != before


def test_the_digest_of_a_folder_without_an_index_is_what_it_was(root):
    """A rerun of a circuit made before this change still reads it back (same digest)."""
    import hashlib

    from mechlab.pipelines import outputs

    for kind in ("safetensors", "sharded"):
        folder = good_folder(root, kind)
        old = hashlib.sha256()
        for item in sorted(
            p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
        ):
            old.update(f"{item.name}\0{outputs.file_sha256(item)}\0".encode())
        assert source_digest(folder) == old.hexdigest()


def test_an_index_pointing_outside_is_refused_by_the_digest_too(root):
    folder, _ = bad_folder(root, "index-points-up-and-out")
    with pytest.raises(ImportProblem, match="outside the model folder"):
        source_digest(folder)


def test_a_hugging_face_cache_snapshot_with_links_into_blobs_loads(root, tmp_path):
    """The hub cache's layout (snapshots/<rev>/file -> ../../blobs/<hash>) is not a link out."""
    hf = hf_model("gpt2")
    repo = tmp_path / "models--test"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, item in enumerate(sorted(good_folder(root).iterdir())):
        shutil.copy(item, blobs / f"blob{i}")
        (snapshot / item.name).symlink_to(Path("../../blobs") / f"blob{i}")
    assert _same_logits(from_pretrained(snapshot), hf)
    other = (
        tmp_path / "elsewhere" / "snapshots" / "x"
    )  # a folder merely named like it: no blobs rule
    other.mkdir(parents=True)
    for item in snapshot.iterdir():
        (other / item.name).symlink_to(item.resolve())
    with pytest.raises(ImportProblem, match="leads outside the model folder"):
        from_pretrained(other)


def test_a_folder_over_the_size_limit_is_an_import_problem(root, monkeypatch):
    monkeypatch.setenv("MECHLAB_MAX_ELEMENTS", "1000")
    with pytest.raises(ImportProblem, match="MECHLAB_MAX_ELEMENTS"):
        from_pretrained(good_folder(root))


def test_in_memory_configs_of_the_wrong_type_are_named():
    hf = hf_model("llama")
    hf.config.__dict__["rms_norm_eps"] = "1e-6"  # (transformers refuses it as an attribute)
    with pytest.raises(
        ImportProblem,
        match='the LlamaConfig: rms_norm_eps must be a finite number >= 0, got "1e-6"',
    ):
        from_pretrained(hf)


# --- property: any bytes or JSON in any file ------------------------------------------


@pytest.fixture(scope="module")
def contents(root):
    return file_contents(root)


@pytest.mark.filterwarnings("ignore:Generating overly large repr")
@pytest.mark.parametrize(
    "name",
    ["config.json", "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json"],
)
def test_any_content_of_any_file_loads_or_is_one_import_problem(name, contents):
    strategy, folder = contents[name]
    seen = {"loads": 0, "refused": 0}

    @settings(
        max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    @given(data=strategy)
    def check(data):
        with tempfile.TemporaryDirectory() as base:
            target = write_case(Path(base), folder, name, data)
            try:
                from_pretrained(target)
                seen["loads"] += 1
            except ImportProblem as exc:
                assert "\n" not in str(exc) and str(target) in str(exc), str(exc)
                seen["refused"] += 1

    check()
    print(name, seen)
    assert seen["refused"] >= 25, seen


def test_a_symlink_loop_is_named(root, tmp_path):
    folder = copy(good_folder(root), tmp_path / "loop")
    (folder / "model.safetensors").unlink()
    os.symlink("a", folder / "b")
    os.symlink("b", folder / "a")
    os.symlink("a", folder / "model.safetensors")
    with pytest.raises(ImportProblem, match="cannot be followed"):
        from_pretrained(folder)
