"""Edge attribution (EAP, EAP-IG over masks and inputs, exact single-edge ablation) on the
accelerator against the CPU, in float64: the scores agree to about 1e-9 on every family
(the traces live on the CPU; the objective moves them to the model's device)."""

from __future__ import annotations

import copy

import pytest
import torch

from mechlab.prune import attribute
from tests.cuda.test_prune import _data, make

METHODS = ["eap", "eap-ig", "eap-ig-inputs", "exact"]


@pytest.mark.parametrize("family", ["transformer", "transformer_llama", "lstm", "dense_ssm", "mamba"])
def test_edge_scores_match_the_cpu(family, accel):
    cpu = make(family)
    dev = copy.deepcopy(cpu).to(accel)
    data = _data(cpu, 11)
    for method in METHODS:
        a = attribute(cpu, data, "all", method, steps=4)
        b = attribute(dev, data, "all", method, steps=4)
        assert b.scores.device.type == "cpu" or b.scores.device == accel
        sa, sb = a.scores.cpu(), b.scores.cpu()
        assert sa.abs().sum() > 0, (family, method)
        assert torch.allclose(sa, sb, rtol=1e-8, atol=1e-9), (family, method, float((sa - sb).abs().max()))
        assert a.total_effect == pytest.approx(b.total_effect, rel=1e-8, abs=1e-10)
