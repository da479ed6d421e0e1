"""Fuzzing the text-log reader and the log reasoning with hypothesis, seeded from the
real posted lines of tests/data/realworld: lines cut, spliced, repeated, prefixed and
sprinkled with bytes must never raise, and every row must fit its column."""

from __future__ import annotations

import glob
import os

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ranksight.analyzer.log_evidence import log_findings
from ranksight.importer.logs import read_lines
from ranksight.store.schema import table
from tests.helpers.realworld import CORPUS

SEEDS = sorted(
    line
    for path in glob.glob(os.path.join(CORPUS, "*", "*"))
    if not path.endswith("case.json")
    for line in open(path, encoding="utf-8", errors="replace").read().splitlines()[:40]
    if line.strip()
)
PREFIXES = ["", "[rank7]:", "[default3]:", "[1,5]<stderr>:", "node-1: ", "12: ", "> ",
            "[rank99999999999]:", "(RayWorkerWrapper pid=1) ", "2024-05-01 12:00:00,1 "]  # fmt: skip
COLUMNS = dict(table("log_events").columns)
BOUNDS = {"Int32": (-(1 << 31), 1 << 31), "UInt32": (0, 1 << 32), "Int64": (-(1 << 63), 1 << 63)}


@st.composite
def mangled(draw) -> str:
    line = draw(st.sampled_from(SEEDS))
    cut = draw(st.integers(0, len(line)))
    how = draw(st.sampled_from(["cut", "splice", "noise", "digits", "whole"]))
    if how == "cut":
        line = line[:cut]
    elif how == "splice":
        line = line[:cut] + draw(st.sampled_from(SEEDS))
    elif how == "noise":
        line = line[:cut] + draw(st.text(max_size=40)) + line[cut:]
    elif how == "digits":
        line = line[:cut] + str(draw(st.integers(-(1 << 70), 1 << 70))) + line[cut:]
    return draw(st.sampled_from(PREFIXES)) + line


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mangled(), min_size=1, max_size=30))
def test_mangled_real_lines_never_break_the_reader(lines: list[str]) -> None:
    events = read_lines(lines, "fuzz.log")
    rows = [e.row() for e in events]
    for r in rows:
        for col, value in r.items():
            kind = COLUMNS[col]
            if kind in BOUNDS:
                lo, hi = BOUNDS[kind]
                assert lo <= value < hi, (col, value)
            else:
                value.encode("utf-8")
    if rows:
        frame = pd.DataFrame(rows)
        coords = pd.DataFrame(columns=["dp", "tp", "pp", "host"])
        findings, _ = log_findings(frame, coords)
        assert all(0.0 <= f.confidence <= 1.0 for f in findings)
