"""`mechlab prune --model FOLDER --dtype ...`: a model you bring pruned in the dtype asked
for (recorded in the circuit's settings), and a dtype refused in one line, exit 2, nothing
written."""

from __future__ import annotations

import pytest

from mechlab.cli import main
from mechlab.prune import Circuit

pytestmark = pytest.mark.usefixtures("one_thread")  # gpt2_folder, ioi_file: tests/cli/conftest.py


def test_prune_a_model_folder_in_bfloat16(gpt2_folder, ioi_file, tmp_path, capsys, monkeypatch):
    import mechlab.models.importers as importers

    dtypes = []
    real = importers._empty_model

    def spy(cfg, dtype, mamba):
        dtypes.append(dtype)
        return real(cfg, dtype, mamba)

    monkeypatch.setattr(importers, "_empty_model", spy)
    out = tmp_path / "c"
    args = ["prune", "--model", str(gpt2_folder), "--pairs", str(ioi_file), "--steps", "3", "--sparsity", "0.9",
            "--no-progress", "--out", str(out), "--threads", "1", "--dtype", "bfloat16"]  # fmt: skip
    code = main(args)
    assert code == 0, capsys.readouterr().err
    assert dtypes == [importers.torch.bfloat16]
    circuit = Circuit.from_json(out / "ioi_seed0.json")
    assert circuit.metadata["metrics"]["faithfulness"] is not None
    # a rerun in another dtype is of other settings: refused, naming it
    code = main([*args[:-1], "float32"])
    assert code == 2 and "dtype" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dtype", "bfloat17"], 'unknown dtype "bfloat17"; mechlab imports in float32, bfloat16'),
        (["--dtype", "int8"], 'unknown dtype "int8"'),
    ],
)
def test_a_dtype_mechlab_cannot_import_is_one_line_exit_2_and_writes_nothing(
    extra, message, gpt2_folder, ioi_file, tmp_path, capsys
):
    out = tmp_path / "c"
    code = main(["prune", "--model", str(gpt2_folder), "--pairs", str(ioi_file), "--no-progress",
                 "--out", str(out), *extra])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_dtype_is_for_a_model_folder(ioi_file, tmp_path, capsys):
    code = main(["prune", "--ckpt", str(tmp_path / "x.pt"), "--pairs", str(ioi_file), "--dtype", "bfloat16"])
    err = capsys.readouterr().err
    assert code == 2 and "--dtype applies with --model FOLDER only" in err
