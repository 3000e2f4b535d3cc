"""A run folder's files (mechlab/train/run_files.py): a damaged metrics line is named, not a
crash (the torn last line and resume are tested through the trainer in test_trainer.py)."""

from __future__ import annotations

import pytest

from mechlab.train.run_files import read_metrics_lines


def test_a_metrics_line_nested_too_deeply_is_a_damaged_line_not_a_recursion_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n' + "[" * 100_000 + "]" * 100_000 + '\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"line 2 of the metrics file .* is damaged \(nests more than 64 levels deep\)"):
        read_metrics_lines(path)
