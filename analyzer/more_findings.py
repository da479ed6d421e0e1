"""Findings beyond compute stragglers: slow communication, desync, NaN/Inf loss."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from .desync import first_desyncs
from .findings import Finding, coords_at
from .nan import nan_onsets
from .slow_comm import SlowGroup, find_slow_groups, shared_ranks

MIN_STEP_SHARE = 0.05
"""A slow group is reported only if its extra transfer costs at least this share of the
median step time (5%): below that it is noise on a shared host, or not worth a finding."""


def _finding(kind: str, cause: str, rank: int, coords: pd.DataFrame, **kw) -> Finding:
    c = coords_at(coords, rank)
    return Finding(
        kind=kind,
        cause=cause,
        culprit_rank=int(rank),
        host=str(c["host"]),
        dp=int(c["dp"]),
        tp=int(c["tp"]),
        pp=int(c["pp"]),
        **kw,
    )


def _members(groups: pd.DataFrame) -> dict[str, list[int]]:
    return {
        g: [int(x) for x in str(r).split(",") if x]
        for g, r in zip(groups["group_id"], groups["group_ranks"], strict=True)
    }


def slow_comm_findings(
    transfer: pd.DataFrame,
    groups: pd.DataFrame,
    axes: dict[str, str],
    coords: pd.DataFrame,
    step_ms: float,
    steps: Sequence[int],
) -> list[Finding]:
    """One finding for the slow groups: culprit the rank shared by all of them (-1 when
    they share none or several: the link between the members). ``steps``: the analyzed
    steps (see :func:`~.slow_comm.find_slow_groups`); ``step_ms``: their median step."""
    if groups.empty or transfer.empty:
        return []
    slow = find_slow_groups(transfer, axes, _members(groups), steps)
    per_step = transfer.groupby("group_id")["instances"].median()
    slow = [
        s
        for s in slow  # too small to matter (or noise): under MIN_STEP_SHARE of a step
        if (s.transfer_ms - s.peers_transfer_ms) * per_step.get(s.group_id, 0)
        >= MIN_STEP_SHARE * step_ms
    ]
    if not slow:
        return []
    common = shared_ranks(slow)
    rank = common[0] if len(common) == 1 else -1
    per_step = _excess_per_step_ms(transfer, slow)
    impact = min(100.0, 100.0 * per_step / step_ms) if step_ms else 0.0
    where = f"rank {rank}" if rank >= 0 else f"the link between ranks {common or slow[0].members}"
    g = slow[0]
    summary = (
        f"communication is slow in {len(slow)} {g.axis} group(s) while arrival skew is low "
        f"({g.transfer_ms:.1f} ms per collective after the last arrival vs "
        f"{g.peers_transfer_ms:.1f} ms in the other {g.axis} groups): {where}"
    )
    evidence = {
        "slow_groups": [_group_evidence(s) for s in slow],
        "shared_ranks": common,
        "excess_ms_per_step": round(per_step, 1),
    }
    onsets = [s.onset_step for s in slow if s.onset_step >= 0]
    if onsets:  # the earliest slow group's onset: where the impact's before/after splits
        evidence["onset_step"] = min(onsets)
    return [
        _finding(
            "slow_communication",
            "communication",
            rank,
            coords,
            confidence=0.8,
            impact_pct=round(impact, 1),
            summary=summary,
            evidence=evidence,
        )
    ]


def _group_evidence(s: SlowGroup) -> dict:
    return {
        "group_id": s.group_id,
        "axis": s.axis,
        "members": s.members,
        "transfer_ms": round(s.transfer_ms, 2),
        "peers_transfer_ms": round(s.peers_transfer_ms, 2),
        "arrival_skew_ms": round(s.skew_ms, 2),
        "slow_steps": s.slow_steps,
        "steps": s.steps,
        "onset_step": s.onset_step,
    }


def _excess_per_step_ms(transfer: pd.DataFrame, slow: list[SlowGroup]) -> float:
    """Extra transfer per step (ms): per slow group, its excess per collective times its
    median number of collectives per step."""
    per_step = transfer.groupby("group_id")["instances"].median()
    return float(
        sum((s.transfer_ms - s.peers_transfer_ms) * per_step.get(s.group_id, 0) for s in slow)
    )


def desync_findings(
    mismatches: pd.DataFrame, coords: pd.DataFrame, usual: pd.DataFrame | None = None
) -> list[Finding]:
    """One finding per odd rank at the first mismatched sequence of its group (``usual``:
    the groups' usual signatures, to break one-against-one ties)."""
    out = []
    for d in first_desyncs(mismatches, usual) if not mismatches.empty else []:
        for rank in d["odd_ranks"][:1]:
            mine = d["signatures"][str(rank)]
            summary = (
                f"desync: at {d['group_id']} #{d['seq']} rank {rank} issued {mine['op']} of "
                f"{mine['numel']} {mine['dtype']} elements while the other members "
                "issued something else; the job will hang or compute garbage"
            )
            out.append(
                _finding(
                    "desync",
                    "mismatched_collective",
                    rank,
                    coords,
                    confidence=0.9,
                    impact_pct=100.0,
                    summary=summary,
                    evidence=d,
                )
            )
    return out


def nan_findings(steps: pd.DataFrame, coords: pd.DataFrame) -> list[Finding]:
    """The rank(s) whose loss turned NaN/Inf first."""
    onsets = nan_onsets(steps)
    if not onsets:
        return []
    first = min(onsets.values())
    out = []
    for rank in sorted(r for r, s in onsets.items() if s == first):
        summary = f"loss on rank {rank} became NaN/Inf at step {first} (finite before)"
        out.append(
            _finding(
                "nan",
                "numerics",
                rank,
                coords,
                confidence=0.9,
                impact_pct=100.0,
                summary=summary,
                evidence={"first_bad_step": first, "all_onsets": onsets},
            )
        )
    return out
