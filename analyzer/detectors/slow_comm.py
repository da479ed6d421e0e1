"""Slow communication: collectives of one group slow after everyone has arrived.

A collective's time after its last member arrived (``max(end) - max(start)``) is transfer,
not waiting. ``start_ns`` is the arrival: the issue time on CPU, the device-side arrival
(a CUDA event before the op) on GPU. A group whose transfer time per collective is far above that of the other
groups of the same mesh axis (same op mix, same sizes by construction of the mesh) has a
slow link; the rank(s) shared by every slow group localize it (MegaScale, NSDI 2024, 5.2:
intersect the slow groups).

Query: :data:`TRANSFER` and :data:`TRANSFER_P2P` (per group and step, pushed down), and
the hosts' NIC and NVLink counters (``analyzer/links.py``) for the evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ranksight.ground.sql import RUN as _RUN
from ranksight.ground.vocab import Cause, Kind

from ..findings import Finding, finding_at
from ..peers import loo_median, sustained_onset
from .base import Detector, RunContext, Stage

if TYPE_CHECKING:
    from ..queries import RunData


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowCommConfig:
    """Thresholds of the slow-communication test."""

    ratio: float = 2.0
    """Transfer time per collective over the median of same-axis groups that counts as slow."""
    min_excess_ms: float = 2.0
    """And at least this much slower per collective (ms): tiny ops are noisy."""
    min_step_fraction: float = 0.5
    """Share of the analyzed steps on which the group must be slow."""
    min_slow_steps: int = 3
    """And at least this many slow steps (or step buckets): in a run cut short after a
    few steps, two noisy steps of one group on a shared host are half of them."""

    def __post_init__(self) -> None:
        if self.ratio <= 1 or self.min_excess_ms < 0 or not 0 < self.min_step_fraction <= 1:
            raise ValueError("ratio must be > 1, min_excess_ms >= 0, min_step_fraction in (0, 1]")
        if self.min_slow_steps < 1:
            raise ValueError(f"min_slow_steps must be >= 1, got {self.min_slow_steps}")


@dataclass(frozen=True)
class SlowGroup:
    """One group slow in transfer: its per-collective transfer and skew (ms), and its
    same-axis peers' median transfer (ms)."""

    group_id: str
    axis: str
    members: list[int]
    transfer_ms: float
    peers_transfer_ms: float
    skew_ms: float
    slow_steps: int
    steps: int
    onset_step: int = -1
    """The first step of its sustained slow run (:func:`~.peers.sustained_onset`); -1:
    none found (slow on scattered steps only)."""


TRANSFER = f"""
SELECT group_id, at_step AS step, avgIf(transfer, open = 0) AS transfer_mean,
       avgIf(skew, open = 0) AS skew_mean, countIf(open = 0) AS instances,
       sumIf(payload, open = 0) AS step_bytes, sum(differ) AS mismatched
FROM
(
    SELECT group_id, group_seq, any(step) AS at_step, max(bytes) AS payload,
           max(end_ns) - max(start_ns) AS transfer, max(start_ns) - min(start_ns) AS skew,
           countIf(end_ns = 0) AS open,
           min(op) != max(op) OR min(dtype) != max(dtype)
             OR min(multiIf(op = 'scatter', numel_out, op = 'all_to_all', toUInt64(0), numel_in))
                != max(multiIf(op = 'scatter', numel_out, op = 'all_to_all', toUInt64(0), numel_in))
             AS differ
    FROM collectives WHERE {_RUN} AND peer = -1
    GROUP BY group_id, group_seq
)
GROUP BY group_id, at_step
"""
"""Per (group, step): mean time from the last member's arrival to the end (transfer, ns),
mean spread of arrivals (skew, ns), the number of collective instances and the bytes
they moved (groups are compared only with groups that move as much), over the instances
every member completed; and how many instances had members issuing different ops, sizes
or dtypes (``mismatched``: the desync query then runs on those groups only). One
aggregation, no join: every member of an instance ends within microseconds of the others."""


TRANSFER_P2P = f"""
SELECT concat(group_id, ':', toString(src), '>', toString(dst)) AS group_id,
       intDiv(at_step, %(bucket)s) * %(bucket)s AS step,
       avg(transfer) AS transfer_mean, avg(skew) AS skew_mean,
       count() AS instances, sum(payload) AS step_bytes
FROM
(
    SELECT group_id, src, dst, group_seq, any(step) AS at_step, max(bytes) AS payload,
           maxIf(end_ns, op = 'recv') - max(start_ns) AS transfer,
           max(start_ns) - min(start_ns) AS skew, count() AS sides
    FROM
    (
        SELECT group_id, group_seq, step, bytes, op, start_ns, end_ns,
               toInt64(if(op = 'send', rank, peer)) AS src,
               toInt64(if(op = 'send', peer, rank)) AS dst
        FROM collectives WHERE {_RUN}
          AND peer >= 0 AND end_ns > 0
    )
    GROUP BY group_id, src, dst, group_seq
    HAVING sides = 2
)
GROUP BY group_id, src, dst, step
"""
"""TRANSFER for point-to-point links (pipeline sends and recvs): one "group" per
direction of a pair, ``<group>:<src>><dst>``; an instance is a send and its recv (matched
by their per-pair sequence number); transfer is the recv's end after both were posted.
A slow link out of a rank shows as its pairs being slow against the other pairs of the
same axis. Steps are taken ``%(bucket)s`` at a time (1 for short runs): a big job has
tens of thousands of pairs, each pair's transfer per bucket is what is compared."""


def pair_members(group_id: str) -> list[int] | None:
    """``[src, dst]`` of a TRANSFER_P2P group id, None for a collective group."""
    if ":" not in group_id or ">" not in group_id:
        return None
    src, dst = group_id.rsplit(":", 1)[1].split(">")
    return [int(src), int(dst)]


def transfer_matrix(transfer: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """group x step mean transfer and mean arrival skew per instance (ns), from the
    TRANSFER query's frame."""
    t = transfer.set_index(["group_id", "step"])
    return t["transfer_mean"].astype(float).unstack("step"), t["skew_mean"].astype(float).unstack(
        "step"
    )


def find_slow_groups(
    transfer: pd.DataFrame,
    axes: dict[str, str],
    members: dict[str, list[int]],
    steps: Sequence[int] | None = None,
    cfg: SlowCommConfig | None = None,
) -> list[SlowGroup]:
    """Groups whose transfer per collective exceeds the median of the other groups of
    their axis moving the same bytes per step by ``ratio`` and ``min_excess_ms`` on most
    steps.

    ``steps``: the analyzed steps (after warm-up, ended by the ranks); only columns from
    the first to the last of them are compared (None: all). Collectives issued before
    step 0 (set-up) and in a step the job never finished (a crashed or hung rank's peers
    erroring out of its collectives) are not a link's speed."""
    cfg = cfg or SlowCommConfig()
    if transfer.empty:
        return []
    if steps is not None:
        transfer = _within(transfer, steps)
        if transfer.empty:
            return []
    tm, skew = transfer_matrix(transfer)
    payload = transfer.groupby("group_id")["step_bytes"].median().reindex(tm.index)
    axis_of = np.array(
        [f"{axes.get(g, axes.get(g.split(':')[0], 'mixed'))}:{int(b)}" for g, b in payload.items()]
    )
    found = []
    for role in set(axis_of):
        axis = role.split(":")[0]
        rows = np.flatnonzero(axis_of == role)
        if len(rows) < 2 or axis in ("world", "mixed"):
            continue
        own = tm.to_numpy(dtype=float)[rows]
        others = loo_median(own)
        slow = (own > cfg.ratio * others) & ((own - others) > cfg.min_excess_ms * 1e6)
        n = (~np.isnan(own)).sum(axis=1)
        need = np.maximum(cfg.min_slow_steps, cfg.min_step_fraction * n)
        hit = (n > 0) & (slow.sum(axis=1) >= need)
        for i in np.flatnonzero(hit):
            g = tm.index[rows[i]]
            found.append(SlowGroup(
                group_id=g, axis=axis, members=members.get(g) or pair_members(g) or [],
                transfer_ms=float(np.nanmedian(own[i])) / 1e6,
                peers_transfer_ms=float(np.nanmedian(others[i])) / 1e6,
                skew_ms=float(np.nanmedian(skew.loc[g])) / 1e6,
                slow_steps=int(slow[i].sum()), steps=int(n[i]),
                onset_step=_onset(slow[i], own[i], tm.columns, cfg)))  # fmt: skip
    return found


def _onset(slow: np.ndarray, own: np.ndarray, steps: pd.Index, cfg: SlowCommConfig) -> int:
    """The step that starts a group's sustained slow run (:func:`~.peers.sustained_onset`
    over the steps it has data for: a pair's buckets leave the steps between them empty),
    -1 for none. ``slow``, ``own``: its row of flags and transfer times, over ``steps``."""
    has = ~np.isnan(own)
    first = sustained_onset(slow[has][None, :], cfg.min_slow_steps, cfg.min_step_fraction)[0]
    return int(steps[has][first]) if first >= 0 else -1


def _within(transfer: pd.DataFrame, steps: Sequence[int]) -> pd.DataFrame:
    """The rows of ``transfer`` wholly inside ``min(steps)..max(steps)``: a collective
    group's step, or a pair's bucket of steps (TRANSFER_P2P: its ``step`` is the bucket's
    first; the bucket size is the spacing of the pairs' steps)."""
    if not len(steps):
        return transfer.iloc[0:0]
    lo, hi = min(steps), max(steps)
    step = transfer["step"].astype(int)
    pair = transfer["group_id"].str.contains(">", regex=False)
    starts = np.unique(step[pair])
    bucket = int(np.diff(starts).min()) if len(starts) > 1 else 1
    last = step + np.where(pair, bucket - 1, 0)
    return transfer[(step >= lo) & (last <= hi)]


def shared_ranks(groups: list[SlowGroup]) -> list[int]:
    """Ranks that are members of every slow group."""
    if not groups:
        return []
    common = set(groups[0].members)
    for g in groups[1:]:
        common &= set(g.members)
    return sorted(common)


MIN_STEP_SHARE = 0.05
"""A slow group is reported only if its extra transfer costs at least this share of the
median step time (5%): below that it is noise on a shared host, or not worth a finding."""


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
        finding_at(
            Kind.SLOW_COMMUNICATION,
            Cause.COMMUNICATION,
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


CPU_MOVED = frozenset({"gloo"})
"""Backends whose bytes are moved by the ranks' own CPU threads: a rank whose CPU is
contended transfers slowly too, so its groups look like slow links."""


def explained_by_cpu(f: Finding, found: list[Finding], ranks: pd.DataFrame) -> Finding | None:
    """The straggler of cause ``cpu_contention`` that explains the slow-communication
    finding ``f``, or None: every slow group of ``f`` holds such a straggler, on a backend
    of :data:`CPU_MOVED` (``ranks``: the ``ranks`` table), slow from no later than the
    group. Seen in the fault matrix: three busy processes on rank 4's cores (gloo, 2
    cores) made its tp group's transfers 17.6 ms against 7.5 ms, reported as a slow link
    beside the straggler that caused it."""
    cpu = {
        int(g.culprit_rank): g
        for g in found
        if g.kind == Kind.STRAGGLER and g.cause == Cause.CPU_CONTENTION and g.culprit_rank >= 0
    }
    groups = f.evidence.get("slow_groups") or []
    if not cpu or not groups:
        return None
    backend = dict(zip(ranks["rank"], ranks["backend"].astype(str), strict=True)) if (
        "backend" in ranks.columns
    ) else {}  # fmt: skip
    why = None
    for g in groups:
        onset = int(g.get("onset_step", 0) or 0)
        hit = [
            cpu[r]
            for r in g.get("members", [])
            if r in cpu
            and backend.get(r) in CPU_MOVED
            and int(cpu[r].evidence.get("onset_step", 0) or 0) <= onset
        ]
        if not hit:
            return None
        why = why or hit[0]
    return why


def detect(run: RunContext, found: list[Finding]) -> tuple[list[Finding], list[str]]:
    """:func:`slow_comm_findings` over the analyzed steps, with the link counters; a slow
    link that a CPU-contended straggler in it explains (:func:`explained_by_cpu`) is a
    note, not a finding."""
    d = run.data
    comm = slow_comm_findings(
        d.transfer, d.groups, run.axes, run.coords, run.median_step_ms, run.steps_in
    )
    out, notes = [], []
    for f in comm:
        why = explained_by_cpu(f, found, d.ranks)
        if why is None:
            out.append(_with_link_counters(f, d, run.coords))
            continue
        g = f.evidence["slow_groups"][0]
        notes.append(
            f"the {g.get('axis', '')} group of ranks {', '.join(map(str, g.get('members', [])))} "
            f"transferred slowly ({g.get('transfer_ms', 0):.1f} ms per collective against "
            f"{g.get('peers_transfer_ms', 0):.1f} ms) from step {g.get('onset_step')}: rank "
            f"{why.culprit_rank}, in it, is slowed by CPU contention from step "
            f"{why.evidence.get('onset_step')}, and gloo moves its bytes on that CPU: not a "
            "slow link"
        )
    return out, notes


DETECTOR = Detector(Kind.SLOW_COMMUNICATION, Stage.FAULT, detect)
