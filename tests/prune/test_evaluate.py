"""Scoring a circuit on held-out traces (mechlab.prune.evaluate): its progress bar."""

from __future__ import annotations

import pytest

from mechlab.prune.circuit import Circuit
from mechlab.prune.evaluate import evaluate_circuit
from tests.prune.test_planted import PLANTED, planted_data

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_the_bar_names_its_stage_and_is_off_by_default(capsys):
    model, planted = PLANTED["value-61"]()
    data = planted_data(0, n_test=6)
    circuit = Circuit.from_edges(dict.fromkeys(planted, 1.0), metadata={"target": "all"})
    quiet = evaluate_circuit(model, data, circuit)
    assert capsys.readouterr().err == ""  # no bar unless asked
    shown = evaluate_circuit(model, data, circuit, progress=True, stage="cross-evaluation 1/2, a on all")
    assert shown == quiet  # the bar changes nothing
    err = capsys.readouterr().err
    assert "cross-evaluation 1/2, a on all: circuit, complement, ablated on 6 held-out traces: 100%" in err, err
