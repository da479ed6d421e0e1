"""From one run's data to ranked findings: culprit, cause, evidence, confidence, impact."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from .causes import refine_cause
from .crash import CrashReport, crash_finding, find_crash
from .desync import issued_after
from .findings import Finding
from .gpu_causes import refine_gpu_cause
from .groups import group_axes, group_names
from .hang import find_hang, recovered_stalls, stopped_now
from .hang_finding import hang_finding, recovered_finding
from .imbalance import imbalance_findings
from .impact import can_measure, checked_impacts
from .imported import is_imported, postmortem, replay_impacts
from .log_evidence import log_findings
from .more_findings import desync_findings, nan_findings, slow_comm_findings
from .queries import RunData
from .replay_impact import straggler_impacts
from .straggler import StragglerConfig, find_slow_ranks
from .transient import transient_findings
from .waits import WaitSummary, summarize_waits

_MS = 1e6
_WHAT = {
    "compute": "compute (forward/backward)",
    "data_loader": "data loading",
    "gc": "compute, through Python GC pauses",
    "cpu_contention": "compute, through CPU contention on its core",
    "gpu_throttle": "compute, through its GPU's clocks slowed down (NVML clock-event reason)",
    "gpu_contention": "compute, through another process on its GPU",
}


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


def wall_step_times(steps: pd.DataFrame) -> pd.Series:
    """step -> the job's step: last rank's end minus first rank's start (ns)."""
    if steps.empty:
        return pd.Series(dtype=float)
    by = steps.groupby("step")
    return (by["end_ns"].max() - by["start_ns"].min()).astype(float)


def step_times(steps: pd.DataFrame) -> pd.Series:
    """step -> median over ranks of the step's duration (ns)."""
    if steps.empty:
        return pd.Series(dtype=float)
    dur = (steps["end_ns"] - steps["start_ns"]).astype(float)
    return dur.groupby(steps["step"]).median()


def _coords(ranks: pd.DataFrame) -> pd.DataFrame:
    return ranks.set_index("rank")[["dp", "tp", "pp", "host"]]


def _phase_evidence(phases: pd.DataFrame, rank: int, peers: list[int], onset: int) -> dict:
    """Median self time per call (ms) of each phase: the rank against its peers."""
    sub = phases[phases["step"] >= onset]
    out = {}
    for phase, rows in sub.groupby("phase"):
        per_call = rows["self_ns"] / rows["n"].clip(lower=1)
        own = per_call[rows["rank"] == rank]
        peer = per_call[rows["rank"].isin(peers)]
        if own.empty or peer.empty:
            continue
        out[phase] = {
            "rank_ms": round(float(own.median()) / _MS, 3),
            "peers_ms": round(float(peer.median()) / _MS, 3),
            "ratio": round(float(own.median() / max(peer.median(), 1.0)), 2),
        }
    return out


def _impact(excess_ns: pd.Series, step_ns: pd.Series) -> tuple[float, float, float]:
    """(percent of step time saved, mean step ms now, mean step ms without the excess).

    The culprit's excess self time per step is taken to be on the step's critical path:
    in synchronous training every rank waits for it at the next collective (tensor and
    data parallel) or send/recv (pipeline). Bounded below by zero saving."""
    steps = step_ns.reindex(excess_ns.index).dropna()
    if steps.empty:
        return 0.0, 0.0, 0.0
    excess = excess_ns.reindex(steps.index).fillna(0.0).clip(upper=steps)
    now, without = float(steps.mean()), float((steps - excess).mean())
    return 100.0 * (now - without) / now, now / _MS, without / _MS


def _confidence(slow_fraction: float, ratio: float, last_share: float) -> float:
    """0..1: how consistently slow, how far above threshold, how often the rank was the
    last arriver in the collectives where others waited for it."""
    margin = min(1.0, max(0.0, (ratio - 1.0) / 1.0))
    return round(float(np.clip(0.4 * slow_fraction + 0.3 * margin + 0.3 * last_share, 0, 1)), 2)


def diagnose(data: RunData, cfg: StragglerConfig | None = None) -> Analysis:
    """Find compute and data-loader stragglers in ``data`` and say what they cost.

    Flagged ranks that mostly waited for another flagged rank are victims, not culprits.
    Returns an Analysis whose findings are ordered by impact (largest first)."""
    cfg = cfg or StragglerConfig()
    notes: list[str] = []
    imported = is_imported(data.run)
    if imported and data.steps.empty and not (data.ranks.empty and data.log_events.empty):
        coords = _coords(data.ranks)
        findings, notes = postmortem(data, coords)
        findings = desync_findings(data.mismatches, coords, data.usual) + findings
        logged, more = log_findings(data.log_events, coords)
        return Analysis(data.run_id, data.attempt, logged + findings, 0, 0.0, notes + more)
    if data.ranks.empty or data.steps.empty:
        notes.append("no step records in the analyzed steps: nothing to analyze")
        early = None if imported else _crash(data)  # died before recording a step
        found = [] if early is None else [_early_crash(early, data)]
        return Analysis(data.run_id, data.attempt, found, 0, 0.0, notes)
    coords = _coords(data.ranks)
    st = step_times(data.steps)
    analyzed = st.sort_index().iloc[cfg.skip_steps :]
    axes = group_axes(data.groups, coords) if not data.groups.empty else {}
    totals = data.phase_totals if not data.phase_totals.empty else data.phases
    slow = find_slow_ranks(totals, coords["pp"], st, cfg)
    waits = summarize_waits(*data.waits_for([s.rank for s in slow]), axes)
    culprits = [s for s in slow if not waits.mostly_waited_on(s.rank, [o.rank for o in slow])]
    for s in slow:
        if s not in culprits:
            notes.append(f"rank {s.rank} looked slow but mostly waited for another slow rank")
    culprits = _worth_reporting(culprits, float(analyzed.sum()), notes)
    peers = {s.rank: stage_peers(coords, s.rank) for s in culprits}
    wanted = sorted({r for s in culprits for r in (s.rank, *peers[s.rank])})
    detail = data.phases_of(wanted) if wanted else data.phases.iloc[0:0]
    findings = [_finding(s, data, coords, st, waits, detail, peers[s.rank]) for s in culprits]
    steps_in = [int(x) for x in analyzed.index]
    wall_in = wall_step_times(data.steps).reindex(analyzed.index).dropna()
    measured = [f for f in findings if can_measure(f, wall_in)]  # before/after beats a replay
    findings = [f for f in findings if f not in measured]
    if imported:
        findings, more = replay_impacts(findings, data, coords)
        notes += more
    else:
        findings, more = straggler_impacts(findings, data, coords, peers)
        notes += more
    findings = measured + findings
    med_ms = float(analyzed.median()) / _MS if not analyzed.empty else 0.0
    comm = slow_comm_findings(data.transfer, data.groups, axes, coords, med_ms, steps_in)
    findings += [_with_link_counters(f, data, coords) for f in comm]
    findings += desync_findings(data.mismatches, coords, data.usual)
    findings += nan_findings(data.steps, coords)
    moving, more = transient_findings(data.steps, totals, coords, steps_in, [s.rank for s in slow])
    findings, notes = findings + moving, notes + more
    findings, more = checked_impacts(findings, data.steps, steps_in)
    notes += more
    findings.sort(key=lambda f: -f.impact_pct)
    culprit_ranks = [s.rank for s in culprits]
    design, more = imbalance_findings(data, coords, totals, steps_in, med_ms, culprit_ranks)
    findings, notes = findings + design, notes + more  # not a fault: after the faults
    crashed = None if imported else _crash(data)
    stopped = crashed is not None or any(f.kind == "desync" for f in findings)
    if imported:
        found, more = postmortem(data, coords)
        findings, notes = found + findings, notes + more
    elif crashed is not None:
        findings, more = _with_crash(
            findings, crash_finding(crashed, coords, data.progress, data.crash_stacks)
        )
        notes += more
    elif data.run.get("status") != "finished" and not data.progress.empty:
        report = find_hang(data.progress, int(data.steps["end_ns"].max()))
        if report is not None:
            names = group_names(data.groups, coords)
            stopped_ranks = stopped_now(data.crash_stacks)
            findings = _with_hang(
                findings, hang_finding(report, coords, names, stopped_ranks, data.stacks)
            )
    if crashed is None and not imported and not any(f.kind == "hang" for f in findings):
        window = data.steps[data.steps["step"].isin(analyzed.index)]
        for stall in recovered_stalls(window)[:MAX_STALLS]:  # the hangs it got over
            findings = _with_hang(
                findings,
                recovered_finding(stall, coords, data.crash_stacks, totals, float(analyzed.sum())),
            )
    if stopped or any(f.kind == "hang" for f in findings):
        findings = _beside_the_stop(findings, notes)
    wall = wall_step_times(data.steps).reindex(analyzed.index).dropna()
    wall_ms = float(wall.median()) / _MS if not wall.empty else 0.0
    return Analysis(
        data.run_id,
        data.attempt,
        findings,
        len(analyzed),
        med_ms,
        notes,
        median_wall_step_ms=wall_ms,
    )


MIN_RATIO_BESIDE_STOP = 2.0
"""Beside a finding that stopped the job (hang, crash, desync), a straggler is named only
this much slower than its peers; a milder slowdown in the few steps before the stop is
noted instead."""


def _beside_the_stop(findings: list[Finding], notes: list[str]) -> list[Finding]:
    """Keep the stop and the stragglers that stand out even in a run cut short."""
    kept = []
    for f in findings:
        if f.kind == "transient_straggler":
            notes.append(f"before the job stopped: {f.summary} (not named beside the stop)")
            continue
        ratio = float(f.evidence.get("median_ratio", 0) or 0) if f.kind == "straggler" else 0.0
        if f.kind == "straggler" and ratio < MIN_RATIO_BESIDE_STOP:
            notes.append(
                f"rank {f.culprit_rank} was {ratio:.2f}x its peers ({f.cause}) in the steps "
                "before the job stopped: not named beside the stop"
            )
            continue
        kept.append(f)
    return kept


MAX_PEERS = 63
"""Same-stage peers whose phases are loaded as a finding's evidence: an even sample of at
most this many (a median over 63 is as good as over 4,095, at 1/65 the rows)."""


def stage_peers(coords: pd.DataFrame, rank: int, limit: int = MAX_PEERS) -> list[int]:
    """Up to ``limit`` ranks of ``rank``'s pipeline stage, other than it, evenly spaced."""
    same = coords.index[(coords["pp"] == coords.loc[rank, "pp"]) & (coords.index != rank)]
    same = np.asarray(same, dtype=int)
    if len(same) > limit:
        same = same[np.linspace(0, len(same) - 1, limit).round().astype(int)]
    return [int(r) for r in same]


MAX_STALLS = 3
"""Recovered stalls reported of one run (the longest first would need a sort: they are
rare; the first three in step order)."""


def _early_crash(report: CrashReport, data: RunData) -> Finding:
    """The crash of a job that ended before any rank recorded a step (died before the
    hooks attached, or in its first step): from the launcher's and the ranks' ends."""
    cols = ["dp", "tp", "pp", "host"]
    coords = _coords(data.ranks) if not data.ranks.empty else pd.DataFrame(columns=cols)
    return crash_finding(report, coords, data.progress, data.crash_stacks)


def _crash(data: RunData) -> CrashReport | None:
    """The crash in ``data`` (analyzer/crash.py), from its rank ends and last records."""
    if data.ends.empty and data.run.get("status") == "running":
        return None
    seen = data.steps.groupby("rank")["end_ns"].max() if not data.steps.empty else pd.Series()
    if not data.progress.empty:
        seen = (
            pd.concat([seen, data.progress.groupby("rank")["seen_ns"].max()]).groupby(level=0).max()
        )
    if not data.ends.empty:  # a rank known only from its end (no step, no snapshot)
        seen = seen.combine_first(data.ends.groupby("rank")["ts_ns"].min())
    last_step = data.steps.groupby("rank")["step"].max() if not data.steps.empty else pd.Series()
    if not data.progress.empty and "at_step" in data.progress.columns:  # the step it was in
        last_step = (
            pd.concat([last_step, data.progress.groupby("rank")["at_step"].max()])
            .groupby(level=0)
            .max()
        )
    return find_crash(data.ends, seen, last_step, str(data.run.get("status", "")))


def _fold_into_desync(
    findings: list[Finding],
    event: Finding,
    explains: Callable[[Finding], bool],
    key: str,
    evidence: dict,
    then: str,
) -> list[Finding]:
    """``event`` (a crash or hang) first in ``findings``, unless a desync finding it
    ``explains`` is there: then it is that finding's consequence, kept in its evidence
    under ``key`` and said after its summary (``; then``)."""
    for i, f in enumerate(findings):
        if f.kind == "desync" and explains(f):
            findings[i] = replace(
                f, evidence={**f.evidence, key: evidence}, summary=f"{f.summary}; {then}"
            )
            return findings
    return [event, *findings]


def _with_crash(findings: list[Finding], crash: Finding) -> tuple[list[Finding], list[str]]:
    """Add the crash finding first, unless a desync explains it: a rank that died inside
    a collective its group's members issued differently (gloo aborts on a size mismatch)
    is a consequence, kept as the desync finding's evidence. A desync the dead rank did
    not take part in as an odd rank, at a sequence some other member issued after the
    death (:func:`analyzer.desync.issued_after`), is the survivors' error handling: it
    becomes a note and the crash leads. Returns (findings, notes)."""
    rank, died = int(crash.culprit_rank), int(crash.evidence.get("ended_ns", 0))
    notes, kept = [], []
    for f in findings:
        late = (
            issued_after(f.evidence, rank, died)
            if f.kind == "desync" and died > 0 and rank not in f.evidence.get("odd_ranks", [])
            else []
        )
        if not late:
            kept.append(f)
            continue
        notes.append(
            f"after rank {rank} ended, rank(s) {', '.join(map(str, late))} issued "
            f"{f.evidence.get('group_id')} #{f.evidence.get('seq')} and its members' "
            "collectives there differ: the survivors' error handling, not taken as a desync"
        )
    how = crash.evidence.get("detail") or crash.cause
    folded = _fold_into_desync(
        kept,
        crash,
        lambda f: (
            crash.culprit_rank
            in [int(m) for m in str(f.evidence.get("members", "")).split(",") if m]
        ),
        "then_crashed",
        {"rank": crash.culprit_rank, **crash.evidence},
        f"then rank {crash.culprit_rank}'s process ended ({how})",
    )
    return folded, notes


def _with_link_counters(f: Finding, data: RunData, coords: pd.DataFrame) -> Finding:
    """A slow-communication finding with the NIC and NVLink counters of its ranks' hosts
    over the analyzed steps (analyzer/links.py), where the collectors recorded them."""
    if data.fetch_links is None or data.steps.empty:
        return f
    ranks = set(f.evidence.get("shared_ranks") or [])
    for g in f.evidence.get("slow_groups", []):
        ranks |= set(g.get("members", []))
    hosts = sorted({str(coords.loc[r, "host"]) for r in ranks if r in coords.index})
    t0, t1 = int(data.steps["start_ns"].min()), int(data.steps["end_ns"].max())
    counters = data.fetch_links(hosts, t0, t1)
    if not counters["nic"] and not counters["nvlink"]:
        return replace(
            f, evidence={**f.evidence, "link_counters": "no errors or congestion recorded"}
        )
    return replace(f, evidence={**f.evidence, "link_counters": counters})


MIN_RUN_SHARE = 0.05
"""A straggler is reported only if its excess time is at least this share of the analyzed
run's step time (5%): a few slow steps on a shared host are noted, not named."""


def _worth_reporting(culprits: list, run_ns: float, notes: list[str]) -> list:
    """The culprits whose summed excess is at least MIN_RUN_SHARE of ``run_ns``; the
    others are kept as notes."""
    kept = []
    for s in culprits:
        share = float(s.excess_ns.sum()) / run_ns if run_ns > 0 else 1.0
        if share >= MIN_RUN_SHARE:
            kept.append(s)
        else:
            notes.append(
                f"rank {s.rank} was slow ({s.cause}, {s.median_ratio:.2f}x its peers) in "
                f"{s.slow_steps} step(s) from step {s.onset_step}, costing {100 * share:.1f}% "
                f"of the run: under the {100 * MIN_RUN_SHARE:.0f}% reporting threshold"
            )
    return kept


def _with_hang(findings: list[Finding], hang: Finding) -> list[Finding]:
    """Add the hang finding first, unless a desync explains it: ranks that issued
    different collectives at one sequence number wait for each other forever, so a hang
    with no root outside the desync (every rank blocked, or the root is the desync's odd
    rank) is its consequence, kept as the desync finding's evidence."""
    stalled = hang.evidence.get("stalled_s", 0)
    return _fold_into_desync(
        findings,
        hang,
        lambda f: hang.culprit_rank in (-1, f.culprit_rank),
        "then_hung",
        hang.evidence,
        f"the job then hung ({stalled:.0f} s without a step)",
    )


def _finding(
    s,
    data: RunData,
    coords: pd.DataFrame,
    st: pd.Series,
    waits: WaitSummary,
    phases: pd.DataFrame,
    peers: list[int],
) -> Finding:
    """One straggler finding; ``phases``: PHASES rows of the rank and ``peers`` (a sample
    of its same-stage peers, :func:`stage_peers`)."""
    c = coords.loc[s.rank]
    impact, now_ms, without_ms = _impact(s.excess_ns, st)
    caused = waits.caused_by(s.rank, since_step=s.onset_step)
    slow_fraction = s.slow_steps / max(s.steps_from_onset, 1)
    cause = s.cause
    cause_evidence: dict[str, Any] = {}
    if s.cause == "compute":
        excess_ms = float(s.excess_ns.mean()) / _MS
        since = data.steps[data.steps["step"] >= s.onset_step]
        onset_ns = int(since.loc[since["step"] == s.onset_step, "start_ns"].min())
        mine = since[since["rank"] == s.rank]
        step_ms = float((mine["end_ns"] - mine["start_ns"]).mean()) / _MS if len(mine) else 0.0
        procs = (
            data.fetch_procs([s.rank, *peers], onset_ns)
            if data.fetch_procs is not None
            else data.procs
        )
        cause, cause_evidence = refine_cause(
            s.rank, peers, excess_ms, phases, procs, s.onset_step, step_ms
        )
        if cause == "compute":
            gpu, gpu_evidence = refine_gpu_cause(data, s, peers)
            cause, cause_evidence = gpu or cause, {**cause_evidence, **gpu_evidence}
    what = _WHAT[cause]
    summary = (
        f"rank {s.rank} (dp={c['dp']}, tp={c['tp']}, pp={c['pp']}, host {c['host']}) is slow in "
        f"{what}: {s.median_ratio:.2f}x its same-stage peers from step {s.onset_step}; "
        f"others waited {caused['total_ms'] / 1000:.1f} s for it; "
        f"without it the step time would drop by about {impact:.0f}%"
    )
    evidence = {
        "onset_step": s.onset_step,
        "slow_steps": s.slow_steps,
        "steps_from_onset": s.steps_from_onset,
        "median_ratio": round(s.median_ratio, 3),
        "same_stage_peers": int((coords["pp"] == c["pp"]).sum() - 1),
        "peers_compared": peers if len(peers) <= 16 else f"{len(peers)} evenly spaced",
        "phases": _phase_evidence(phases, s.rank, peers, s.onset_step),
        "waited_for_it": caused,
        "step_ms_now": round(now_ms, 1),
        "step_ms_without": round(without_ms, 1),
        "excess_ms_per_step": round(float(s.excess_ns.mean()) / _MS, 1),
    }
    evidence.update(cause_evidence)
    return Finding(
        kind="straggler",
        cause=cause,
        culprit_rank=s.rank,
        host=str(c["host"]),
        dp=int(c["dp"]),
        tp=int(c["tp"]),
        pp=int(c["pp"]),
        confidence=_confidence(slow_fraction, s.median_ratio, caused["last_share"]),
        impact_pct=round(impact, 1),
        summary=summary,
        evidence=evidence,
    )
