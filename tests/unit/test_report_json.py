"""The JSON report's two flags: ``fault_found`` for any finding (exit code 3), and
``culprit_found`` only where a finding names one rank. A hang whose lines name no single
rank (every reporting rank blocked, the suspects silent) is a fault with no culprit: a
reader of the JSON must not take it for a named rank."""

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
