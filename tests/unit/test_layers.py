"""The house's shape: no import circle and no import against the layer order
(tools/import_graph.py, docs/architecture.md). That no library module imports the CLI is
tests/multiprocess/test_cli_layout.py's."""

from __future__ import annotations

from tests.multiprocess.test_cli_layout import _import_graph as _tool


def test_no_import_circle_and_no_arrow_against_the_layers():
    tool = _tool()
    g = tool.graph()
    assert len(g) > 200 and "ranksight.store.base" in g and "ranksight.cli" in g
    assert tool.circles(g) == []
    assert tool.against_layers(g) == []


def test_the_checker_sees_a_circle_and_an_arrow_up():
    """The checks can fail: a made-up circle and an upward arrow are found."""
    tool = _tool()
    assert tool.circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    up = {"ranksight.store.base": {"ranksight.analyzer.api"}, "ranksight.analyzer.api": set()}
    assert tool.against_layers(up) == [("ranksight.store.base", "ranksight.analyzer.api")]
