"""Chronic stragglers: ranks slower than their same-stage peers over many steps.

Query: ``queries.PHASE_TOTALS`` (per rank and step self times, pushed down), the waits on
the suspects (``waits.ARRIVALS``, ``P2P_WAITS``) and the suspects' phases
(``PHASES_OF``). Detection: ``analyzer/straggler.py`` (self time against the same-stage
peer median, after MegaScale section 5). A flagged rank that mostly waited for another
flagged rank is a victim, not a culprit (``analyzer/waits.py``). Cause: data loader or
compute, refined by the host (``analyzer/causes.py``: GC, CPU contention) and the GPU
(``analyzer/gpu_causes.py``). Impact: before/after where the run has steps before the
onset, else a what-if replay (``analyzer/whatif/impact.py``), else the excess estimate
(:func:`_impact`); several stragglers without an onset to measure from are composed by
one replay of them together (``whatif/impact.py: joint_impacts``); all checked and
composed afterwards (``analyzer/impact.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ranksight.ground.vocab import Kind, cause_of

from ..causes import refine_cause
from ..findings import Finding, finding_at, rank_place
from ..gpu_causes import refine_gpu_cause
from ..impact import before_after, can_measure, job_steps
from ..straggler import SlowRank
from ..waits import WaitSummary, summarize_waits
from ..whatif.impact import joint_impacts, replay_impacts, straggler_impacts
from .base import Detector, RunContext, Stage

if TYPE_CHECKING:
    from ..queries import RunData

_MS = 1e6
_WHAT = {
    "compute": "compute (forward/backward)",
    "data_loader": "data loading",
    "gc": "compute, through Python GC pauses",
    "cpu_contention": "compute, through CPU contention on its core",
    "gpu_throttle": "compute, through its GPU's clocks slowed down (NVML clock-event reason)",
    "gpu_thermal": "compute, through its GPU's clocks slowed down by heat (NVML thermal slowdown)",
    "gpu_contention": "compute, through another process on its GPU",
}


MIN_RUN_SHARE = 0.05
"""A straggler is reported only if its excess time is at least this share of the analyzed
run's step time (5%): a few slow steps on a shared host are noted, not named."""


def run_share(s: SlowRank, run_ns: float, wall: pd.Series) -> float:
    """The share of the analyzed run (``run_ns``) that slow rank ``s`` cost: its summed
    excess self time, or, where more, the job's measured rise in step time from its onset
    (``impact.before_after`` on ``wall``, analyzed step -> job step in ns) when the rise
    is larger than the steps' own spread before it. The second counts a slowness that
    lands in the collectives the rank takes part in rather than in its own compute: a
    rank starved of CPU on gloo, which reduces and copies on the calling thread, shows
    a few times its peers' compute while the job step grows several-fold."""
    if run_ns <= 0:
        return 1.0
    share = float(s.excess_ns.sum()) / run_ns
    m = before_after(wall, s.onset_step) if not wall.empty else None
    if m is not None and m.impact_pct > m.error_pts:
        share = max(share, (m.after_ms - m.before_ms) * _MS * m.steps_after / run_ns)
    return share


def _worth_reporting(culprits: list, run_ns: float, notes: list[str], wall: pd.Series) -> list:
    """The culprits that cost at least MIN_RUN_SHARE of ``run_ns`` (:func:`run_share`,
    ``wall``: analyzed step -> job step, ns); the others are kept as notes."""
    kept = []
    for s in culprits:
        share = run_share(s, run_ns, wall)
        if share >= MIN_RUN_SHARE:
            kept.append(s)
        else:
            notes.append(
                f"rank {s.rank} was slow ({s.cause}, {s.median_ratio:.2f}x its peers) in "
                f"{s.slow_steps} step(s) from step {s.onset_step}, costing {100 * share:.1f}% "
                f"of the run: under the {100 * MIN_RUN_SHARE:.0f}% reporting threshold"
            )
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


def straggler_finding(
    s: SlowRank,
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
        f"{rank_place(s.rank, c)} is slow in "
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
    return finding_at(
        Kind.STRAGGLER,
        cause_of(cause),
        s.rank,
        coords,
        confidence=_confidence(slow_fraction, s.median_ratio, caused["last_share"]),
        impact_pct=round(impact, 1),
        summary=summary,
        evidence=evidence,
    )


def detect(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """The straggler findings of ``run`` (culprits only, each worth
    :data:`MIN_RUN_SHARE` of the run), with their impacts, and notes for the victims and
    the ranks under the threshold."""
    data, coords, notes = run.data, run.coords, []
    slow = run.slow
    waits = summarize_waits(*data.waits_for([s.rank for s in slow]), run.axes)
    culprits = [s for s in slow if not waits.mostly_waited_on(s.rank, [o.rank for o in slow])]
    for s in slow:
        if s not in culprits:
            notes.append(f"rank {s.rank} looked slow but mostly waited for another slow rank")
    wall_in = job_steps(data.steps, run.steps_in)
    culprits = _worth_reporting(culprits, float(run.analyzed.sum()), notes, wall_in)
    peers = {s.rank: stage_peers(coords, s.rank) for s in culprits}
    wanted = sorted({r for s in culprits for r in (s.rank, *peers[s.rank])})
    detail = data.phases_of(wanted) if wanted else data.phases.iloc[0:0]
    findings = [
        straggler_finding(s, data, coords, run.step_ns, waits, detail, peers[s.rank])
        for s in culprits
    ]
    measured = [f for f in findings if can_measure(f, wall_in)]  # before/after beats a replay
    rest = [f for f in findings if f not in measured]
    if run.imported:
        rest, more = replay_impacts(rest, data, coords)
    else:
        rest, more = straggler_impacts(rest, data, coords, peers)
        rest, joint = joint_impacts(rest, data, coords)
        more += joint
    return measured + rest, notes + more


DETECTOR = Detector(Kind.STRAGGLER, Stage.FAULT, detect)
