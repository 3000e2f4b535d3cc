"""PatchResult: normalised view, long-form table, heatmap, lookups, validation."""

import plotly.graph_objects as go
import pytest
import torch

from mechlab.patching import PatchResult


def make_result(**overrides):
    fields = {
        "values": torch.tensor([[1.0, 3.0], [2.0, 0.0]]),
        "components": [("blocks.0.attn.hook_result", 1), ("blocks.0.hook_mlp_out", None)],
        "positions": [0, 4],
        "clean_metric": 3.0,
        "corrupted_metric": 1.0,
    }
    return PatchResult(**{**fields, **overrides})


def test_normalized_effect_and_top_follow_the_definitions():
    result = make_result()
    torch.testing.assert_close(result.normalized, torch.tensor([[0.0, 1.0], [0.5, -0.5]]))
    torch.testing.assert_close(result.effect, torch.tensor([[0.0, 2.0], [1.0, -1.0]]))
    assert result.top(2)[0] == ("blocks.0.attn.hook_result[1]", 4, 2.0)
    noise = make_result(direction="noise")
    torch.testing.assert_close(noise.effect, torch.tensor([[-2.0, 0.0], [-1.0, -3.0]]))
    torch.testing.assert_close(result.get("blocks.0.hook_mlp_out"), torch.tensor([2.0, 0.0]))


def test_dataframe_is_long_form_with_one_row_per_cell():
    frame = make_result().to_dataframe()
    assert len(frame) == 4
    assert list(frame["hook"]) == ["blocks.0.attn.hook_result"] * 2 + ["blocks.0.hook_mlp_out"] * 2
    assert frame["head"].tolist()[:2] == [1, 1] and frame["head"].isna().tolist()[2:] == [True, True]
    assert frame["pos"].tolist() == [0, 4, 0, 4]
    assert frame["normalized"].tolist() == [0.0, 1.0, 0.5, -0.5]


def test_plot_is_a_heatmap_of_the_grid():
    fig = make_result().plot()
    assert isinstance(fig, go.Figure)
    heatmap = fig.data[0]
    assert heatmap.type == "heatmap"
    # every row labelled, by its hook name and the pruning graph's name
    assert list(heatmap.y) == ["blocks.0.attn.hook_result[1] · a0.h1", "blocks.0.hook_mlp_out · m0"]
    assert list(fig.layout.yaxis.tickvals) == list(heatmap.y) and fig.layout.yaxis.tickmode == "array"
    assert [list(row) for row in heatmap.z] == [[0.0, 1.0], [0.5, -0.5]]


def test_validation_and_undefined_normalisation():
    with pytest.raises(ValueError, match=r"values must be \[component, pos\]"):
        make_result(values=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="unknown direction"):
        make_result(direction="up")
    equal = make_result(corrupted_metric=3.0)
    with pytest.raises(ValueError, match="metrics are equal"):
        _ = equal.normalized
    assert equal.plot().data[0].colorbar.title.text == "effect"
    with pytest.raises(ValueError, match="is not a row"):
        make_result().get("blocks.9.hook_mlp_out")
