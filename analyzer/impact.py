"""What a finding costs, checked against the measured step: before/after first, estimates
with a stated error, and impacts that together never exceed the measured excess.

A finding's first impact is an estimate: the culprit's excess time taken to be on the
critical path (``detectors/straggler.py: _impact``), or a what-if replay of its pipeline where the replay
reproduces the measured step (``whatif/impact.py``). Both can overstate it: a delay that
overlapped other work, or a replay that does not model the run. So:

1. **Before/after.** Where the run has at least ``min_before`` analyzed steps before the
   finding's onset, the measured impact is the job step since the onset against the
   median job step before it: ``(mean_after - median_before) / mean_after``. Its error is
   the spread of the steps before (half their interquartile range, or half their range
   under four steps) as points of the step after. This replaces the estimate, which is
   kept in the evidence (``estimated_impact_pct``).
2. **Estimate.** With no steps before the onset, the estimate stays, marked as such
   (``impact_method``) with the error it carries: up to the estimate itself below it (an
   upper bound: it assumes every excess millisecond delayed the step), and never above
   :data:`MAX_ESTIMATE_PCT` (it cannot leave a 0 ms step).
   A finding measured at less than :data:`MIN_MEASURED_PCT`, or less than its error, cost
   nothing that can be told from noise: it stays (the rank is slow; the schedule may hide
   it only for now) with impact 0, confidence at most :data:`HIDDEN_CONFIDENCE`, and says so.
3. **Composition.** The findings that cost step time (stragglers, slow links, transient
   stragglers) are capped together at the run's measured excess: the job step over the
   analyzed steps against a clean baseline (the median job step before the earliest
   onset; for findings without an onset, the 10th percentile of the analyzed job steps,
   which no fault left slow). Above it, each is scaled by the same factor and a note says
   so. Where the faults hold from the first analyzed step there is no clean step: the
   stragglers' impacts were composed by one what-if replay of them together
   (``whatif/impact.py: joint_impacts``) where it could run, and together they are capped
   at :data:`MAX_ESTIMATE_PCT`.

Job step: the first rank's start to the last rank's end of one step (README, "Reading a
report").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ranksight.ground.vocab import Kind

from .findings import Finding

COSTS_STEP_TIME = (Kind.STRAGGLER, Kind.SLOW_COMMUNICATION, Kind.TRANSIENT_STRAGGLER)
"""Finding kinds whose impact is a share of the job step (and so compose)."""

_MS = 1e6


@dataclass(frozen=True, slots=True)
class BeforeAfter:
    """A measured impact: the job step since a finding's onset against before it."""

    impact_pct: float
    error_pts: float
    before_ms: float
    """Median job step before the onset."""
    after_ms: float
    """Mean job step from the onset on."""
    steps_before: int
    steps_after: int


def before_after(wall: pd.Series, onset: int, min_before: int = 2) -> BeforeAfter | None:
    """The measured impact of a fault starting at step ``onset``; ``wall``: analyzed step
    -> job step (ns). None with fewer than ``min_before`` steps before the onset or none
    from it."""
    before, after = wall[wall.index < onset], wall[wall.index >= onset]
    if len(before) < min_before or after.empty:
        return None
    base, now = float(before.median()), float(after.mean())
    if now <= 0:
        return None
    spread = (
        (before.quantile(0.75) - before.quantile(0.25)) / 2
        if len(before) >= 4
        else (before.max() - before.min()) / 2
    )
    return BeforeAfter(
        impact_pct=max(0.0, 100.0 * (now - base) / now),
        error_pts=100.0 * float(spread) / now,
        before_ms=base / _MS,
        after_ms=now / _MS,
        steps_before=len(before),
        steps_after=len(after),
    )


def can_measure(f: Finding, wall: pd.Series) -> bool:
    """Whether ``f``'s impact can be measured before/after (rule 1) on ``wall`` (analyzed
    step -> job step, ns): then no replay is needed for it."""
    onset = _onset(f)
    return f.kind in COSTS_STEP_TIME and onset is not None and before_after(wall, onset) is not None


def _error_pts(f: Finding) -> float:
    """The error of an impact not measured before/after, in points: a replay's misfit to
    the measured step (``whatif`` / ``joint_whatif`` ``misfit_pct``: a replay 5% off the
    step it replays is taken as 5 points off), else the impact itself (an estimate whose
    truth may be anywhere from nothing to it)."""
    for key in ("joint_whatif", "whatif"):
        w = f.evidence.get(key)
        if isinstance(w, dict) and isinstance(w.get("misfit_pct"), (int, float)):
            return round(float(w["misfit_pct"]), 1)
    return float(f.impact_pct)


def _onset(f: Finding) -> int | None:
    onset = f.evidence.get("onset_step")
    if onset is None:
        onset = f.evidence.get("from_step")
    return int(onset) if isinstance(onset, (int, float, np.integer)) else None


def measured(f: Finding, wall: pd.Series) -> tuple[Finding, str | None]:
    """``f`` with its impact measured before/after where the run allows (rule 1), else
    marked as an estimate (rule 2); a note where the estimate was far off the measure."""
    if f.kind not in COSTS_STEP_TIME or f.kind == Kind.TRANSIENT_STRAGGLER:
        return f, None  # transient stragglers are measured step by step already
    onset = _onset(f)
    m = before_after(wall, onset) if onset is not None else None
    estimate = round(float(f.impact_pct), 1)
    if m is None:
        method = (
            "joint replay"
            if "joint_whatif" in f.evidence
            else "replay"
            if "whatif" in f.evidence
            else "excess estimate (upper bound)"
        )
        f = _capped(f) if method == "excess estimate (upper bound)" else f
        ev = {**f.evidence, "impact_method": method, "impact_error_pts": _error_pts(f)}
        return dataclasses.replace(f, evidence=ev), None
    ev = {
        **f.evidence,
        "impact_method": "before/after",
        "impact_error_pts": round(m.error_pts, 1),
        "estimated_impact_pct": estimate,
        "job_step_ms_before": round(m.before_ms, 1),
        "job_step_ms_after": round(m.after_ms, 1),
        "steps_before_after": [m.steps_before, m.steps_after],
    }
    note = None
    if abs(estimate - m.impact_pct) > m.error_pts + 10:
        note = (
            f"{f.who()}: measured {m.impact_pct:.0f}% (the job step went from "
            f"{m.before_ms:.0f} ms before step {onset} to {m.after_ms:.0f} ms after) where its "
            f"time alone suggested {estimate:.0f}%: the measure is reported"
        )
    summary = f.summary
    for tail in ("; without it the step time would drop by about", "; a what-if replay"):
        if tail in summary:
            summary = summary.split(tail, 1)[0]
    summary += (
        f"; the job step went from {m.before_ms:.0f} ms before step {onset} to "
        f"{m.after_ms:.0f} ms (±{m.error_pts:.0f} points): {m.impact_pct:.0f}% of it is this"
    )
    return dataclasses.replace(
        f, impact_pct=round(m.impact_pct, 1), evidence=ev, summary=summary
    ), note


MAX_ESTIMATE_PCT = 90.0
"""The most an excess estimate claims. Its extra time can reach the whole step (the
estimate then says the step would take 0 ms without it), but the peers' own work and the
communication stay: above this it is capped, and its summary says so."""


def _capped(f: Finding) -> Finding:
    """``f`` (an excess estimate) capped at :data:`MAX_ESTIMATE_PCT`, with the step
    without it (evidence ``step_ms_without``) what the cap leaves and the summary saying
    so; ``f`` itself under the cap."""
    if f.impact_pct <= MAX_ESTIMATE_PCT:
        return f
    now = float(f.evidence.get("step_ms_now", 0.0) or 0.0)
    left = round(now * (1.0 - MAX_ESTIMATE_PCT / 100.0), 1)
    summary = f.summary.rsplit("; without it the step time would drop by about", 1)[0] + (
        f"; its extra time is about as long as the step itself, so without it the step time "
        f"would drop by most of it (counted as {MAX_ESTIMATE_PCT:.0f}%, an upper bound: the "
        "peers' own work and the communication stay)"
    )
    ev = {
        **f.evidence,
        "step_ms_without": left,
        "uncapped_impact_pct": f.impact_pct,
        "uncapped_step_ms_without": f.evidence.get("step_ms_without"),
    }
    return dataclasses.replace(f, impact_pct=MAX_ESTIMATE_PCT, summary=summary, evidence=ev)


MIN_MEASURED_PCT = 2.0
"""A finding measured before/after at less than this (or less than its own error) cost
the job nothing that can be told from noise (a delayed pipeline link or a data stall the
schedule hid): its impact is 0 (:func:`_hidden`)."""


def _no_measurable_cost(f: Finding) -> bool:
    ev = f.evidence
    if ev.get("impact_method") != "before/after":
        return False
    return f.impact_pct < max(MIN_MEASURED_PCT, float(ev.get("impact_error_pts", 0.0)))


HIDDEN_CONFIDENCE = 0.5
"""The most confidence a finding keeps when it cost nothing measurable: the rank is slow,
but the schedule hides it now (a data stall in a pipeline bubble), or it is noise."""


def _hidden(f: Finding) -> Finding:
    """``f`` measured at no cost to tell from noise: impact 0, confidence at most
    :data:`HIDDEN_CONFIDENCE`, and its summary says so."""
    ev = f.evidence
    summary = f.summary.rsplit("; the job step went from", 1)[0] + (
        f"; it did not lengthen the job step measurably ({ev['job_step_ms_before']:.0f} ms "
        f"before step {_onset(f)}, {ev['job_step_ms_after']:.0f} ms after, "
        f"±{ev['impact_error_pts']:.0f} points): the schedule hides it for now"
    )
    return dataclasses.replace(
        f,
        impact_pct=0.0,
        confidence=min(f.confidence, HIDDEN_CONFIDENCE),
        summary=summary,
        evidence={**ev, "measured_impact_pct": f.impact_pct, "hidden": True},
    )


HIDDEN_MIN_STEPS = 8
"""A slow rank that cost nothing measurable is a finding (hidden by the schedule) only
over at least this many slow steps; fewer, at no cost, is noted, not named: on a loaded
2-core host a rank 1.37x its peers in the last 4 of 14 steps of an uneven-split run, at a
job step of 1707 ms before and 1642 ms after, was noise (the fault matrix's uneven_split)."""


def _too_brief(f: Finding) -> bool:
    n = f.evidence.get("slow_steps")
    return isinstance(n, (int, np.integer)) and bool(n < HIDDEN_MIN_STEPS)


def _brief_note(f: Finding) -> str:
    ev = f.evidence
    return (f"rank {f.culprit_rank} looked slow ({f.cause}) in {ev['slow_steps']} step(s) from "
            f"step {_onset(f)} but did not lengthen the job step ({ev['job_step_ms_before']:.0f} "
            f"ms before, {ev['job_step_ms_after']:.0f} ms after): too brief and too cheap to "
            "tell from noise")  # fmt: skip


def run_excess_pct(wall: pd.Series, first_onset: int | None) -> float | None:
    """The run's measured excess (rule 3): the mean job step from ``first_onset`` (all
    analyzed steps when None) over a clean baseline, as a percent of that mean. None where
    faults with an onset hold from (almost) the first analyzed step: no analyzed step is
    clean, and the 10th percentile of slow steps is no baseline (two slow ranks from step
    1 measured 7% over it while their clean twin ran 45% faster)."""
    if wall.empty:
        return 0.0
    before = wall[wall.index < first_onset] if first_onset is not None else wall.iloc[0:0]
    if first_onset is not None and len(before) < 2:
        return None
    base = float(before.median()) if len(before) >= 2 else float(wall.quantile(0.10))
    after = wall[wall.index >= first_onset] if len(before) >= 2 else wall
    now = float(after.mean())
    return max(0.0, 100.0 * (now - base) / now) if now > 0 else 0.0


def step_times(steps: pd.DataFrame) -> pd.Series:
    """step -> median over ranks of the step's duration (ns): the median rank's own step,
    which the findings' thresholds use. ``steps``: rank, step, start_ns, end_ns."""
    if steps.empty:
        return pd.Series(dtype=float)
    dur = (steps["end_ns"] - steps["start_ns"]).astype(float)
    return dur.groupby(steps["step"]).median()


def job_steps(steps: pd.DataFrame, analyzed: list[int]) -> pd.Series:
    """Analyzed step -> job step (ns): the first rank's start to the last rank's end;
    ``steps``: rank, step, start_ns, end_ns (``STEPS`` rows). Empty without rows."""
    sub = steps[steps["step"].isin(analyzed)]
    if sub.empty:
        return pd.Series(dtype=float)
    by = sub.groupby("step")
    return (by["end_ns"].max() - by["start_ns"].min()).astype(float).sort_index()


def checked_impacts(
    findings: list[Finding], steps: pd.DataFrame, analyzed: list[int]
) -> tuple[list[Finding], list[str]]:
    """``findings`` with rules 1-3 applied (see the module docstring), and notes.
    ``steps``: rank, step, start_ns, end_ns; ``analyzed``: the steps analyzed."""
    wall = job_steps(steps, analyzed)
    if wall.empty:
        return findings, []
    notes: list[str] = []
    out = []
    for f in findings:
        g, note = measured(f, wall)
        if _no_measurable_cost(g):
            if _too_brief(g):
                notes.append(_brief_note(g))
                continue
            g, note = _hidden(g), None
        out.append(g)
        notes += [note] if note else []
    costly = [i for i, f in enumerate(out) if f.kind in COSTS_STEP_TIME and f.impact_pct > 0]
    if len(costly) < 2:
        return out, notes
    onsets = [o for i in costly if (o := _onset(out[i])) is not None]
    cap = run_excess_pct(wall, min(onsets) if onsets else None)
    total = sum(out[i].impact_pct for i in costly)
    clean = cap is not None
    if cap is None:  # no clean step: the estimates together stay under the estimate cap
        cap = MAX_ESTIMATE_PCT
    if total > cap > 0:
        scale = cap / total
        for i in costly:
            f = out[i]
            out[i] = dataclasses.replace(
                f,
                impact_pct=round(f.impact_pct * scale, 1),
                evidence={**f.evidence, "impact_before_composing_pct": f.impact_pct},
            )
        notes.append(
            f"the findings' impacts added up to {total:.0f}% where the run's job step was "
            f"{cap:.0f}% over its clean steps: each is scaled by {scale:.2f} so that together "
            "they are what was measured"
            if clean
            else f"the findings' impacts added up to {total:.0f}%, and no analyzed step was "
            f"free of them to measure against: each is scaled by {scale:.2f} so that together "
            f"they claim at most {cap:.0f}% (an upper bound)"
        )
    return out, notes
