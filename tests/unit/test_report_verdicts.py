"""What the report says of whom it names. The JSON report's two flags: ``fault_found``
for any finding (exit code 3), and ``culprit_found`` only where a finding names one rank. A hang whose lines name no single
rank (every reporting rank blocked, the suspects silent) is a fault with no culprit: a
reader of the JSON must not take it for a named rank. A window too short to show a
straggler says so, not that every rank is fine."""

from __future__ import annotations

import json

from ranksight.analyzer.diagnose import Analysis
from ranksight.analyzer.findings import Finding
from ranksight.report import to_json


def _finding(rank: int) -> Finding:
    return Finding("hang", "stuck", rank, "", -1, -1, -1, 0.3, 100.0, "hang", {"suspects": [0, 1]})


def _doc(*findings: Finding) -> dict:
    return json.loads(to_json(Analysis("r", 0, list(findings), 0, 0.0)))


def test_a_finding_with_no_single_rank_is_a_fault_without_a_culprit():
    doc = _doc(_finding(-1))
    assert (doc["fault_found"], doc["culprit_found"]) == (True, False)


def test_a_finding_that_names_a_rank_is_a_culprit():
    doc = _doc(_finding(-1), _finding(3))
    assert (doc["fault_found"], doc["culprit_found"]) == (True, True)


def test_no_finding_is_neither():
    doc = _doc()
    assert (doc["fault_found"], doc["culprit_found"]) == (False, False)


def _text(analysis: Analysis) -> str:
    from rich.console import Console

    from ranksight.report import print_text

    console = Console(record=True, width=100)
    print_text(analysis, console, {"status": "finished"})
    return console.export_text()


def test_a_window_too_short_for_a_straggler_says_so_not_that_every_rank_is_fine():
    """``report --steps 4:6`` of the demo (rank 5 at 4.8x its peers) said 'No culprit
    found: every rank is within the threshold'; two steps cannot show a straggler."""
    short = _text(Analysis("r", 0, [], 2, 100.0))
    assert "Too few steps to judge" in short and "within the threshold" not in short
    assert "No culprit found" in _text(Analysis("r", 0, [], 20, 100.0))
