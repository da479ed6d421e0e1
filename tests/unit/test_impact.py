"""Impacts checked against the measured step (analyzer/impact.py): before/after first, an
estimate marked as one, and findings that together never exceed the measured excess."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from ranksight.analyzer.findings import Finding
from ranksight.analyzer.impact import before_after, checked_impacts

MS = 1_000_000


def steps_of(walls_ms: list[float], world: int = 4) -> pd.DataFrame:
    rows, t = [], 0
    for step, w in enumerate(walls_ms):
        for r in range(world):
            rows.append({"rank": r, "step": step, "start_ns": t + r, "end_ns": t + int(w * MS)})
        t += int(w * MS) + MS
    return pd.DataFrame(rows)


def straggler(rank: int, onset: int, estimate: float) -> Finding:
    return Finding(kind="straggler", cause="compute", culprit_rank=rank, host="h", dp=0, tp=0,
                   pp=0, confidence=0.8, impact_pct=estimate,
                   summary=f"rank {rank} is slow; without it the step time would drop by about {estimate:.0f}%",
                   evidence={"onset_step": onset})  # fmt: skip


def test_before_after_is_the_measured_share_with_the_spread_before_as_its_error():
    wall = pd.Series([100.0, 102.0, 98.0, 100.0, 150.0, 150.0, 150.0]) * MS
    m = before_after(wall, onset=4)
    assert m.impact_pct == pytest.approx(100 * 50 / 150) and m.steps_before == 4
    assert m.error_pts == pytest.approx(100 * ((100.5 - 99.5) / 2) / 150)  # half the IQR
    assert before_after(wall, onset=1) is None  # one step before: nothing to measure against


def test_a_measured_impact_replaces_an_overstated_estimate_and_says_so():
    steps = steps_of([300] + [100] * 5 + [125] * 10)
    [f], notes = checked_impacts([straggler(2, 6, 76.0)], steps, list(range(1, 16)))
    assert f.impact_pct == pytest.approx(20.0, abs=0.1)
    assert (
        f.evidence["impact_method"] == "before/after" and f.evidence["estimated_impact_pct"] == 76
    )
    assert "measured 20%" in notes[0] and "without it the step time" not in f.summary
    assert "the job step went from 100 ms before step 6 to 125 ms" in f.summary


def test_a_delay_that_did_not_change_the_step_costs_nothing_and_says_so():
    steps = steps_of([300] + [100] * 15)
    [f], notes = checked_impacts([straggler(1, 6, 76.0)], steps, list(range(1, 16)))
    assert (f.impact_pct, f.confidence, f.evidence["hidden"]) == (0.0, 0.5, True)
    assert (
        "did not lengthen the job step measurably (100 ms before step 6, 100 ms after" in f.summary
    )


def test_without_steps_before_the_estimate_stays_marked_as_an_upper_bound():
    steps = steps_of([300] + [125] * 15)
    [f], notes = checked_impacts([straggler(2, 1, 40.0)], steps, list(range(1, 16)))
    assert f.impact_pct == 40.0 and notes == []
    assert f.evidence["impact_method"] == "excess estimate (upper bound)"


def test_several_findings_together_are_capped_at_the_measured_excess():
    steps = steps_of([300] + [100] * 5 + [145] * 10)  # two slow ranks together: 31% measured
    found, notes = checked_impacts(
        [straggler(2, 6, 67.0), straggler(5, 6, 27.0)], steps, list(range(1, 16))
    )
    total = sum(f.impact_pct for f in found)
    assert total == pytest.approx(100 * 45 / 145, abs=0.5)
    assert "scaled by" in notes[-1]


def test_an_estimate_that_would_leave_a_0_ms_step_is_capped_and_says_so():
    ev = {"onset_step": 1, "step_ms_now": 500.0, "step_ms_without": 0.0}
    f = dataclasses.replace(straggler(2, 1, 100.0), evidence=ev)
    [g], _ = checked_impacts([f], steps_of([300] + [125] * 15), list(range(1, 16)))
    assert g.impact_pct == 90.0 and g.evidence["uncapped_impact_pct"] == 100.0
    assert g.evidence["step_ms_without"] == 50.0 and "100%" not in g.summary
    assert "counted as 90%, an upper bound" in g.summary


def test_a_finding_on_a_group_is_titled_by_its_group_never_rank_minus_1():
    group = {"axis": "tp", "members": [2, 3], "group_id": "g1"}
    f = Finding(kind="slow_communication", cause="communication", culprit_rank=-1, host="",
                dp=-1, tp=-1, pp=-1, confidence=0.8, impact_pct=10.0, summary="slow link",
                evidence={"slow_groups": [group, {**group, "members": [6, 7]}]})  # fmt: skip
    assert f.who() == "tp group of ranks 2,3 and 1 more"


def test_a_brief_slowness_that_cost_nothing_is_a_note_not_a_finding():
    """The fault matrix's uneven_split on a loaded host: rank 1 at 1.37x its peers in the
    last 4 steps, the job step 1707 ms before and 1642 ms after: noted, not named."""
    steps = steps_of([300] + [100] * 15)
    brief = straggler(1, 12, 30.0)
    brief = dataclasses.replace(brief, evidence={**brief.evidence, "slow_steps": 4})
    found, notes = checked_impacts([brief], steps, list(range(1, 16)))
    assert found == [] and "too brief and too cheap to tell from noise" in notes[0]
    long = dataclasses.replace(brief, evidence={**brief.evidence, "slow_steps": 8})
    [f], _ = checked_impacts([long], steps, list(range(1, 16)))
    assert f.evidence["hidden"]


def test_a_replays_error_is_its_misfit_to_the_measured_step_not_its_impact():
    """A replay 4.2% off the step it replays is 4.2 points off; an excess estimate with no
    step before its onset may be off by all of itself."""
    steps = steps_of([300] + [125] * 15)
    replayed = straggler(2, 1, 30.0)
    replayed = dataclasses.replace(
        replayed, evidence={**replayed.evidence, "whatif": {"misfit_pct": 4.2}}
    )
    [f], _ = checked_impacts([replayed], steps, list(range(1, 16)))
    assert (f.evidence["impact_method"], f.evidence["impact_error_pts"]) == ("replay", 4.2)
    [g], _ = checked_impacts([straggler(2, 1, 30.0)], steps, list(range(1, 16)))
    assert g.evidence["impact_error_pts"] == g.impact_pct
