"""Every name that moved still resolves, with a DeprecationWarning naming its new home
(mechlab._deprecated), and the renamed options still work."""

from __future__ import annotations

import importlib

import pytest

from mechlab._deprecated import MOVED, resolve


@pytest.mark.parametrize("old, new", sorted(MOVED.items()), ids=sorted(MOVED))
def test_a_moved_name_warns_and_is_the_new_object(old, new):
    module, _, name = old.partition(":")
    with pytest.warns(DeprecationWarning, match=new.replace(":", ".").replace(".", r"\.")):
        value = getattr(importlib.import_module(module), name)
    assert value is resolve(new)


def test_an_unknown_name_of_a_shim_is_an_attribute_error():
    import mechlab.recall

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mechlab.recall.nope  # noqa: B018


def test_circuit_figures_moved_to_viz(tmp_path):
    from mechlab.prune import Circuit
    from mechlab.viz import circuit_figure

    c = Circuit.from_edges({("embed", "out"): 1.0}, metadata={"graph": {"arch": "lstm", "n_layers": 1}})
    with pytest.warns(DeprecationWarning, match="circuit_figure"):
        fig = c.plot()
    assert fig.to_dict() == circuit_figure(c).to_dict()
    with pytest.warns(DeprecationWarning, match="write_html"):
        assert c.write_html(tmp_path / "c.html").read_text().count("Plotly.newPlot(") == 1


def test_the_recipe_keeps_its_old_keyword(tiny_lds_checkpoint):
    from mechlab.pipelines import ReportConfig, prune_checkpoint

    with pytest.warns(DeprecationWarning, match="recipe="):
        assert ReportConfig(protocol="study").recipe == "study"
    with pytest.warns(DeprecationWarning, match="ReportConfig.recipe"):
        assert ReportConfig(recipe="uniform").protocol == "uniform"
    with pytest.warns(DeprecationWarning, match="recipe="), pytest.raises(ValueError, match="unknown recipe"):
        prune_checkpoint(tiny_lds_checkpoint, "1-after", protocol="paper")


@pytest.mark.parametrize(
    "command, new",
    [(["prune", "--target", "bogus"], "--recipe"), (["report", "--out", "r", "--target", "bogus"], "--recipe"),
     (["eval"], "--nih"), (["recall"], "--nih"), (["curve"], "--nih")],
)
def test_the_old_protocol_option_warns_and_still_applies(command, new, tiny_lds_checkpoint, tmp_path, capsys,
                                                          monkeypatch):  # fmt: skip
    from mechlab.cli import main

    monkeypatch.chdir(tmp_path)
    # an unknown value shows the option reached the command: it is refused as the new one would be
    assert main([*command, "--ckpt", str(tiny_lds_checkpoint), "--protocol", "paper"]) == 2
    err = capsys.readouterr().err
    assert f"--protocol is deprecated and goes in mechlab 0.2.0; use {new}" in err
    assert "paper" in err.splitlines()[-1]
