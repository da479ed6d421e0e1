"""The analyzer's extra steps for runs made by ``ranksight import`` (the run's
``meta_json`` says ``"source": "import"``): snapshot-based hang findings instead of the
live stall test, and what-if replay impacts for stragglers."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd

from ranksight.words import counted

from .findings import Finding
from .postmortem import postmortem_findings
from .whatif import ReplayError, balanced_stages, ops_from_tables, peer_median_durations, replay

MAX_REPLAY_ROWS = 3_000_000
"""Most phase + collective rows replayed (about 10 s of replay per million ops)."""


def is_imported(run: dict) -> bool:
    """True for a run written by ``ranksight import``."""
    try:
        meta = json.loads(run.get("meta_json") or "{}")
    except (TypeError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("source") == "import"


def postmortem(data, coords: pd.DataFrame) -> tuple[list[Finding], list[str]]:
    """:func:`postmortem.postmortem_findings` over the run's loaded frames."""
    world = int(data.ranks["world_size"].max()) if not data.ranks.empty else 0
    return postmortem_findings(data.progress, data.stacks, coords, world, partial_ranks(data.run))


def partial_ranks(run: dict) -> dict[int, str]:
    """rank -> why its artifact tells nothing of its progress (the import's
    ``partial_ranks``: a damaged Flight Recorder dump), from the run's ``meta_json``."""
    try:
        meta = json.loads(run.get("meta_json") or "{}")
        return {int(r): str(why) for r, why in (meta.get("partial_ranks") or {}).items()}
    except (TypeError, ValueError, AttributeError):
        return {}


def replay_impacts(
    findings: list[Finding], data, coords: pd.DataFrame
) -> tuple[list[Finding], list[str]]:
    """``findings`` with each compute straggler's impact from a what-if replay of the
    recorded steps (``whatif.py``): the culprit's compute at its same-stage peers' median.
    The evidence gains ``whatif`` (slowdown, step times) and ``worker_or_stage``: how much
    faster balancing the stages would make the job once the culprit is fixed; a worker
    problem when fixing the worker gains more. Findings stay as they were (with a note)
    when there is nothing to replay or the records do not replay."""
    todo = [f for f in findings if f.kind == "straggler" and f.culprit_rank >= 0]
    if not todo or data.fetch_ops is None:
        return findings, []
    phases, colls = data.fetch_ops()
    if len(phases) + len(colls) > MAX_REPLAY_ROWS or phases.empty:
        return findings, ["what-if replay skipped: too many or no op records"]
    ops = ops_from_tables(phases, colls)
    role = coords["pp"]
    try:
        now = replay(ops)
    except ReplayError as exc:
        return findings, [f"what-if replay failed: {exc}"]
    out = []
    for f in findings:
        if f not in todo:
            out.append(f)
            continue
        fixed = peer_median_durations(ops, [f.culprit_rank], role)
        without, balanced = replay(fixed), replay(balanced_stages(fixed))
        out.append(_with_replay(f, now, without, balanced))
    return out, []


def _with_replay(f: Finding, now: pd.Series, without: pd.Series, balanced: pd.Series) -> Finding:
    s = float(now.sum() / without.sum())
    stage = float(without.sum() / balanced.sum())
    verdict = "worker" if s - 1 >= stage - 1 else "stage imbalance"
    impact = 100.0 * (1 - 1 / s)
    summary = f.summary.rsplit("; without it", 1)[0] + (
        f"; a what-if replay of {counted(len(now), 'step')} with its compute at its same-stage peers' "
        f"median makes the job {s:.2f}x faster ({now.mean() / 1e9:.2f} s -> "
        f"{without.mean() / 1e9:.2f} s per step); balancing the stages after that would gain "
        f"{stage:.2f}x: a {verdict} problem"
    )
    evidence = {
        **f.evidence,
        "whatif": {"slowdown": round(s, 4), "steps": len(now),
                   "step_s_now": round(now.mean() / 1e9, 3),
                   "step_s_without": round(without.mean() / 1e9, 3), "method": "replay"},
        "worker_or_stage": {"worker_slowdown": round(s, 4), "stage_slowdown": round(stage, 4),
                            "verdict": verdict},
    }  # fmt: skip
    return dataclasses.replace(f, impact_pct=round(impact, 1), summary=summary, evidence=evidence)
