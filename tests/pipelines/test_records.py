"""Settings records (mechlab/pipelines/records.py): canonical, and compared leaving out what is
no setting."""

from __future__ import annotations

import pytest

from mechlab.pipelines.records import differences, settings_record


def test_differences_leave_out_what_is_no_setting():
    assert differences({"device": "cpu", "steps": 2}, {"steps": 3}) == "steps 2 (now 3)"


def test_settings_records_are_canonical():
    a = settings_record({"b": (1, 2), "a": float("inf"), "threads": 4, "progress": True})
    b = settings_record({"a": float("inf"), "b": [1, 2]})
    assert a == b and a["settings"] == {"a": "inf", "b": [1, 2]}
    assert settings_record({"a": 0.1})["settings_sha256"] != settings_record({"a": 0.1000001})["settings_sha256"]
    with pytest.raises(TypeError, match="cannot be recorded"):
        settings_record({"f": object()})
