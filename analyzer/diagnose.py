"""From one run's data to ranked findings: culprit, cause, evidence, confidence, impact.

:func:`diagnose` runs the registered detectors (``analyzer/registry.py``) stage by stage
(``detectors/base.py: Stage``) and folds their results (``analyzer/folds.py``):

1. the faults, whose impacts are then checked against the measured step and composed
   (``analyzer/impact.py: checked_impacts``) and ordered by impact;
2. the job's design (stage imbalance), after the faults;
3. what stopped the job (crash, hang, an imported run's snapshots), folded into a desync
   that explains it or put first; beside a stop, milder slowness becomes a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ranksight.ground.vocab import STOPS

from .detectors.base import RunContext, Stage
from .detectors.crash import crash_finding, crash_of
from .detectors.desync import desync_findings
from .detectors.postmortem import postmortem
from .findings import Finding
from .folds import append, beside_the_stop
from .impact import checked_impacts, job_steps
from .queries import RunData
from .registry import DETECTORS
from .straggler import StragglerConfig

_MS = 1e6


@dataclass(frozen=True)
class Analysis:
    """The analyzer's answer for one run attempt."""

    run_id: str
    attempt: int
    findings: list[Finding]
    steps_analyzed: int
    median_step_ms: float
    notes: list[str] = field(default_factory=list)
    clock: dict = field(default_factory=dict)
    """Measured cross-rank clock alignment (analyzer/clock.py ``summarize``), when loaded."""
    median_wall_step_ms: float = 0.0
    """Median over the analyzed steps of the job's step: the first rank's start to the
    last rank's end (what the UI's overview plots); ``median_step_ms`` is the median
    rank's own step time, which the findings' thresholds use."""


def diagnose(data: RunData, cfg: StragglerConfig | None = None) -> Analysis:
    """Run every registered detector over ``data`` and fold their findings.

    Returns an Analysis whose faults are ordered by impact (largest first), after any
    finding that stopped the job and before the job's own design findings."""
    run = RunContext(data, cfg or StragglerConfig())
    if run.imported and data.steps.empty and not (data.ranks.empty and data.log_events.empty):
        return _artifacts_only(run)
    if data.ranks.empty or data.steps.empty:
        notes = ["no step records in the analyzed steps: nothing to analyze"]
        early = None if run.imported else crash_of(data)  # died before recording a step
        found = (
            []
            if early is None
            else [crash_finding(early, run.coords, data.progress, data.crash_stacks)]
        )
        return Analysis(data.run_id, data.attempt, found, 0, 0.0, notes)
    findings, notes = _stage(run, Stage.FAULT, [])
    findings, more = checked_impacts(findings, data.steps, run.steps_in)
    findings.sort(key=lambda f: -f.impact_pct)
    findings, notes = _stage(run, Stage.DESIGN, findings, notes + more)
    findings, notes = _stage(run, Stage.STOP, findings, notes)
    if any(f.kind in STOPS for f in findings):
        findings = beside_the_stop(findings, notes)
    wall = job_steps(data.steps, run.steps_in)
    return Analysis(
        data.run_id,
        data.attempt,
        findings,
        len(run.analyzed),
        run.median_step_ms,
        notes,
        median_wall_step_ms=float(wall.median()) / _MS if not wall.empty else 0.0,
    )


def _stage(
    run: RunContext, stage: Stage, findings: list[Finding], notes: list[str] | None = None
) -> tuple[list[Finding], list[str]]:
    """``findings`` with the findings of ``stage``'s detectors folded in, in registry
    order, and the notes so far with theirs."""
    notes = list(notes or [])
    for d in DETECTORS:
        if d.stage != stage or (d.hooked_only and run.imported):
            continue
        if d.imported_only and not run.imported:
            continue
        found, said = d.detect(run, findings)
        findings, more = (d.fold or append)(findings, found)
        notes += said + more
    return findings, notes


def _artifacts_only(run: RunContext) -> Analysis:
    """An imported run with no step records (dumps, stacks, logs of a stopped job): its
    snapshots' and its logs' findings, the logs' first."""
    data = run.data
    findings, notes = postmortem(data, run.coords)
    findings = desync_findings(data.mismatches, run.coords, data.usual) + findings
    logged: list[Finding] = []
    more: list[str] = []
    if not data.log_events.empty:  # the log readers load on use: dumps alone need none
        from .log_evidence import log_findings

        logged, more = log_findings(data.log_events, run.coords)
    return Analysis(data.run_id, data.attempt, logged + findings, 0, 0.0, notes + more)
