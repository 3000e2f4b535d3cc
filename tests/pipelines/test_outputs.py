"""The output policy (mechlab/pipelines/outputs.py): single files and output folders checked
before any work, never an input or a checkpoint, nothing git tracks without force, one lock
per folder (its tests: test_locks.py), temporary files of interrupted writes removed, and
results reused only when the settings they record are the run's."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mechlab.pipelines import outputs
from mechlab.pipelines.outputs import OutputFolder, check_output_file, settings_record

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture
def repo(tmp_path):
    """A git work tree with one committed file, results/a.json."""
    root = tmp_path / "repo"
    (root / "results").mkdir(parents=True)
    (root / "results" / "a.json").write_text("{}")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-c", "init.defaultBranch=main", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    return root


def torch_like(path: Path) -> Path:
    path.write_bytes(b"PK\x03\x04" + bytes(60))  # a zip archive, as torch.save writes
    return path


# --------------------------------------------------------------------------- single files


def test_a_single_output_file_is_checked_before_any_work(tmp_path):
    a = tmp_path / "a.json"
    a.write_text("{}")
    with pytest.raises(ValueError, match="is one of the inputs"):
        check_output_file(a, inputs=[a], force=True)  # never, even with force
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match="is one of the inputs"):
        check_output_file(tmp_path / "sub" / ".." / "a.json", inputs=[a], force=True)  # by any path
    for checkpoint in (torch_like(tmp_path / "last.pt"), torch_like(tmp_path / "model.json")):
        with pytest.raises(ValueError, match="is a checkpoint; mechlab never writes an output over one"):
            check_output_file(checkpoint, force=True)
    with pytest.raises(ValueError, match=r"exists; pass --force to replace it"):
        check_output_file(a)
    assert check_output_file(a, force=True) == a
    with pytest.raises(ValueError, match="is a folder"):
        check_output_file(tmp_path, force=True)
    with pytest.raises(ValueError, match=r"must be a \.html file"):
        check_output_file(tmp_path / "x.json", suffixes=(".html",))
    with pytest.raises(ValueError, match="is a file, not a folder"):
        check_output_file(a / "x.html")  # its folder would have to be a file
    assert check_output_file(tmp_path / "new" / "x.html") == tmp_path / "new" / "x.html"
    assert not (tmp_path / "new").exists()  # checking writes nothing


@needs_git
def test_files_git_tracks_are_refused_without_force(repo):
    tracked = repo / "results" / "a.json"
    assert outputs.git_tracked(tracked) == ["results/a.json"]
    assert outputs.git_tracked(repo / "results") == ["results/a.json"]
    assert outputs.git_tracked(repo / "results" / "new" / "b.json") == []
    assert outputs.git_tracked(repo.parent) == []  # outside the work tree
    with pytest.raises(ValueError, match="holds files git tracks .results/a.json.; pass --force"):
        OutputFolder(repo / "results", "prune")
    OutputFolder(repo / "results", "prune", force=True)
    OutputFolder(repo / "results" / "mine", "prune")  # nothing tracked in it
    with pytest.raises(ValueError, match="holds files git tracks"):
        OutputFolder(repo, "report")  # the work tree's root holds them too


# --------------------------------------------------------------------------- folders


def test_a_folder_is_checked_at_construction_and_leaves_nothing_when_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        OutputFolder(tmp_path / "f", "eval")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        OutputFolder(tmp_path / "f" / "deeper", "eval")
    with pytest.raises(ValueError, match="cannot be made|not writable"):
        with OutputFolder("/proc/mechlab-x", "report"):
            pass
    folder = OutputFolder(tmp_path / "a" / "b", "eval")
    with pytest.raises(RuntimeError), folder:
        assert (tmp_path / "a" / "b" / outputs.LOCK_NAME).is_file()
        raise RuntimeError("the checkpoint was refused")
    assert not (tmp_path / "a").exists()  # the folders it made for nothing are gone
    with OutputFolder(tmp_path / "a" / "b", "eval") as folder:
        folder.write_json("x.json", {"k": 1})
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["x.json"]  # and the lock is gone


def test_a_file_where_a_folder_goes_is_refused_before_writing(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "circuits").write_text("not a folder")
    with OutputFolder(tmp_path / "r", "report") as folder:
        with pytest.raises(ValueError, match="circuits' is a file where mechlab writes a folder"):
            folder.plan({"circuits/1-after_seed0.json": {"a": 1}})
    assert sorted(os.listdir(tmp_path / "r")) == ["circuits"]


def test_no_write_replaces_an_input_or_a_checkpoint(tmp_path):
    config = tmp_path / "out" / "c.yaml"
    config.parent.mkdir()
    config.write_text("a: 1")
    torch_like(tmp_path / "out" / "x.json")
    with OutputFolder(tmp_path / "out", "eval", force=True, inputs=[config]) as folder:
        with pytest.raises(ValueError, match="one of the inputs"):
            folder.write_text("c.yaml", "b: 2")
        with pytest.raises(ValueError, match="is a checkpoint"):
            folder.write_json("x.json", {})
    assert config.read_text() == "a: 1"


def test_no_output_replaces_a_path_that_is_not_a_regular_file(tmp_path):
    """Issue 34: ``view --out <a device node> --force`` replaced the node with a page (as root,
    ``--out /dev/null --force`` would have replaced /dev/null). A pipe stands in for the device."""
    import stat

    pipe = tmp_path / "page.html"
    os.mkfifo(pipe)
    for force in (False, True):
        with pytest.raises(ValueError, match=r"--out '.*page.html' is not a regular file .*not even with --force"):
            check_output_file(pipe, force=force, suffixes=(".html",))
    with pytest.raises(ValueError, match="is not a regular file"):
        outputs.write_text(pipe, "<p>page</p>")  # the low-level write refuses it too
    (tmp_path / "out").mkdir()
    os.mkfifo(tmp_path / "out" / "x.json")
    with OutputFolder(tmp_path / "out", "eval", force=True) as folder:
        with pytest.raises(ValueError, match="x.json' is not a regular file"):
            folder.write_json("x.json", {})
    assert stat.S_ISFIFO(pipe.stat().st_mode) and stat.S_ISFIFO((tmp_path / "out" / "x.json").stat().st_mode)


def test_a_file_of_an_input_folder_is_an_input(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    for force in (False, True):
        with pytest.raises(ValueError, match="is a file of the input folder"):
            check_output_file(model / "config.json", force=force, inputs=[model])
    assert check_output_file(model / "pairs.jsonl", inputs=[model]) == model / "pairs.jsonl"  # a new file is fine
    with OutputFolder(model, "prune", force=True, inputs=[tmp_path / "p.jsonl"]) as folder:
        folder.plan({"x.json": {"a": 1}})
    with OutputFolder(tmp_path / "out", "prune", force=True, inputs=[model]) as folder:
        assert folder.check_path("config.json") == tmp_path / "out" / "config.json"
    assert (model / "config.json").read_text() == "{}"


def test_plan_reuses_only_results_of_the_same_settings(tmp_path):
    settings = {"analysis": "prune", "checkpoint_sha256": "ab" * 32, "sparsity": 0.95, "steps": 2, "device": "cpu"}
    with OutputFolder(tmp_path / "o", "prune") as folder:
        assert folder.plan({"a.json": settings}) == {"a.json": "new"}
        folder.write_json("a.json", {"metadata": settings_record(settings)})  # as a circuit records it
        folder.write_json("b.json", {"x": 1})  # no record
        # device is not a setting: the same result on another device is reused
        assert folder.plan({"a.json": {**settings, "device": "cuda"}}) == {"a.json": "same"}
        with pytest.raises(ValueError) as err:
            folder.plan({"a.json": {**settings, "steps": 3, "sparsity": 0.9}})
        line = str(err.value)
        assert "a.json' was made with other settings: sparsity 0.95 (now 0.9), steps 2 (now 3)" in line
        assert "pass --force to recompute and replace" in line and "\n" not in line
        with pytest.raises(ValueError, match="b.json' holds no settings record"):
            folder.plan({"b.json": settings})
    with OutputFolder(tmp_path / "o", "prune", force=True) as folder:
        assert folder.plan({"a.json": {**settings, "steps": 3}, "b.json": settings}) == {"a.json": "redo", "b.json": "redo"}


def test_files_another_command_wrote_are_named_and_refused_without_force(tmp_path):
    """A command that owns its folder's layout (a report) refuses a folder holding another
    command's files (a prune's circuits), naming them, and leaves them as they are with --force."""
    out = tmp_path / "o"
    (out / "eval").mkdir(parents=True)
    for name in ("1-after_seed0.json", "1-after_seed0.html", "plotly.min.js", ".mechlab.lock.x", "eval/nih.json",
                 "eval/extra.json", "notes.txt", "zz.json"):  # fmt: skip
        (out / name).write_text("{}")
    (out / "joint").mkdir()
    layout = {"plotly.min.js": None, "eval": ("nih.json", "ood.json"), "circuits": None}
    with OutputFolder(out, "report") as folder:
        assert [str(p.relative_to(out)) for p in folder.foreign(layout)] == [
            "1-after_seed0.html", "1-after_seed0.json", "eval/extra.json", "joint", "notes.txt", "zz.json"]
        with pytest.raises(ValueError) as err:
            folder.check_foreign(layout, "a report")
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"--out {str(out)!r} holds files a report does not write")
    assert "(1-after_seed0.html, 1-after_seed0.json, eval/extra.json and 3 more)" in line
    assert "pass --force to write beside them, or choose another --out" in line
    with OutputFolder(out, "report", force=True) as folder:
        assert len(folder.check_foreign(layout, "a report")) == 6
    assert (out / "1-after_seed0.json").read_text() == "{}" and (out / "joint").is_dir()  # left as they were
    with OutputFolder(tmp_path / "fresh", "report") as folder:
        assert folder.check_foreign(layout, "a report") == []


def test_a_rerun_rewrites_no_file_whose_content_it_would_not_change(tmp_path):
    with OutputFolder(tmp_path, "eval") as folder:
        path = folder.write_json("t.json", {"a": 1})
    before = path.stat().st_mtime_ns, path.stat().st_ino
    with OutputFolder(tmp_path, "eval") as folder:
        folder.write_json("t.json", {"a": 1})
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before


def test_temporary_files_of_interrupted_writes_are_removed_when_claimed(tmp_path):
    (tmp_path / "joint" / "share-0").mkdir(parents=True)
    orphans = [tmp_path / ".1-after_seed0.html.ab12cd34.tmp", tmp_path / "joint" / "share-0" / ".x.json.zz99yy88.tmp"]
    kept = [tmp_path / ".last.pt.ab12cd34.tmp", tmp_path / "notes.tmp"]  # a trainer's, a user's
    for path in orphans + kept:
        path.write_text("half")
    with OutputFolder(tmp_path, "prune") as folder:
        assert sorted(folder.removed_temps) == sorted(orphans)
    assert all(p.exists() for p in kept) and not any(p.exists() for p in orphans)


def test_default_folders_sit_under_mechlab_out_never_beside_the_checkpoint():
    assert outputs.run_name("examples/checkpoints/recall-cpu/last.pt") == "recall-cpu"
    assert outputs.run_name("runs/x/checkpoints/step_0000040.pt") == "x-step_0000040"
    assert outputs.run_name("runs/x/other.pt") == "x-other"
    assert outputs.default_out("examples/checkpoints/recall-cpu/last.pt", "eval") == Path("mechlab-out/recall-cpu/eval")
