"""Hangs, localized from progress rather than timeouts.

Every rank's hooks snapshot, every few seconds and from a thread that keeps running while
training is stuck, how far each process group (and each P2P peer and direction) has been
issued and completed. A hang is a run whose snapshots keep arriving while no step has
ended for ``stall_s``. Then, per group, the ranks that never entered the op the others
are blocked in are "missing"; following blocked -> missing edges through the mesh (TP,
PP neighbours, DP) leads to the root: a rank missing from some op and blocked in none
(stuck outside communication), or a rank whose snapshots stopped (its process is gone).
This is what PyTorch's Flight Recorder analysis (fr_trace) does from dumps after the
watchdog fires; here it runs live, seconds after the stop, not 10 minutes later.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

LATEST = """
SELECT rank, group_id, direction, peer,
       argMax(issued_seq, ts_ns) AS issued, argMax(completed_seq, ts_ns) AS completed,
       argMax(last_op, ts_ns) AS op, argMax(group_ranks, ts_ns) AS members,
       max(ts_ns) AS seen_ns, argMax(step, ts_ns) AS at_step
FROM progress WHERE run_id = %(run_id)s AND attempt = %(attempt)s
GROUP BY rank, group_id, direction, peer
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class HangConfig:
    """When a run counts as hung."""

    stall_s: float = 20.0
    """No step ended for this long (s) while progress snapshots keep coming."""
    gone_s: float = 8.0
    """A rank whose snapshots stopped this long (s) before the newest is gone (dead)."""

    def __post_init__(self) -> None:
        if self.stall_s <= 0 or self.gone_s <= 0:
            raise ValueError("stall_s and gone_s must be > 0")


@dataclass(frozen=True)
class HangReport:
    """A localized hang: the root rank(s), who waits for whom, and in which ops."""

    roots: list[int]
    gone: list[int]
    stalled_s: float
    waits: list[dict] = field(default_factory=list)  # {waiter, holder, group_id, op, seq, kind}
    blocked: dict[int, dict] = field(default_factory=dict)  # rank -> {group_id, op, seq}


def _members(s: str) -> list[int]:
    return [int(x) for x in str(s).split(",") if x != ""]


def wait_edges(latest: pd.DataFrame) -> tuple[list[dict], dict[int, dict]]:
    """Blocked -> missing edges from the latest snapshot per (rank, group, direction,
    peer): in a collective group, a rank blocked in seq n waits for members that have not
    issued n; a rank blocked in a recv waits for the peer whose matching send is not
    issued, and one whose send never completed for the peer that has not posted the
    matching recv."""
    edges, blocked = [], {}
    coll = latest[latest["direction"] == ""]
    for gid, rows in coll.groupby("group_id"):
        issued = dict(zip(rows["rank"].astype(int), rows["issued"], strict=True))
        for member in _members(rows["members"].iloc[0]):
            issued.setdefault(member, -1)
        for r in rows[rows["completed"] < rows["issued"]].itertuples():
            blocked[int(r.rank)] = {"group_id": gid, "op": r.op, "seq": int(r.issued)}
            for m, n in issued.items():
                if n < r.issued:
                    edges.append(
                        {
                            "waiter": int(r.rank),
                            "holder": m,
                            "group_id": gid,
                            "op": r.op,
                            "seq": int(r.issued),
                            "kind": "collective",
                        }
                    )
    p2p = latest[latest["direction"] != ""]
    posted = {
        (d, int(r.rank), int(r.peer), r.group_id): int(r.issued)
        for d in ("send", "recv")
        for r in p2p[p2p["direction"] == d].itertuples()
    }
    pending = p2p[p2p["completed"] < p2p["issued"]]
    # a recv waits for its peer's send; a send that never completed (pipelining waits on
    # its sends too) waits for the peer's recv
    for d, other in (("recv", "send"), ("send", "recv")):
        for r in pending[pending["direction"] == d].itertuples():
            blocked.setdefault(int(r.rank), {"group_id": r.group_id, "op": d, "seq": int(r.issued)})
            if posted.get((other, int(r.peer), int(r.rank), r.group_id), -1) < r.issued:
                edges.append(
                    {
                        "waiter": int(r.rank),
                        "holder": int(r.peer),
                        "group_id": r.group_id,
                        "op": d,
                        "seq": int(r.issued),
                        "kind": "p2p",
                    }
                )
    return edges, blocked


def roots_of(edges: list[dict], blocked: dict[int, dict], gone: list[int]) -> list[int]:
    """Holders reachable from the blocked ranks that are not blocked themselves (or are
    gone): the ranks everyone ends up waiting for."""
    holders = {e["holder"] for e in edges}
    return sorted(r for r in holders if r not in blocked or r in gone)


def find_hang(
    latest: pd.DataFrame, last_step_end_ns: int, cfg: HangConfig | None = None
) -> HangReport | None:
    """The hang in a run, or None if it is progressing. ``latest``: the LATEST query's
    frame; ``last_step_end_ns``: the newest step end over all ranks (ns)."""
    cfg = cfg or HangConfig()
    if latest.empty:
        return None
    newest = int(latest["seen_ns"].max())
    stalled_s = (newest - last_step_end_ns) / 1e9
    if stalled_s < cfg.stall_s:
        return None
    seen = latest.groupby("rank")["seen_ns"].max()
    gone = sorted(int(r) for r, t in seen.items() if (newest - t) / 1e9 >= cfg.gone_s)
    edges, blocked = wait_edges(latest)
    if not blocked and not gone:
        return None
    roots = roots_of(edges, blocked, gone) or gone
    return HangReport(roots=roots, gone=gone, stalled_s=stalled_s, waits=edges, blocked=blocked)


def stopped_now(states: pd.DataFrame) -> dict[int, str]:
    """rank -> its stopped state, for the ranks the agent last saw stopped and not
    running again since. ``states``: ``crash.CRASH_STACKS`` rows (``stopped_ns``,
    ``stopped_state``, ``continued_ns``); empty or without them: none."""
    if states.empty or "stopped_ns" not in states.columns:
        return {}
    now = states[(states["stopped_ns"] > 0) & (states["stopped_ns"] > states["continued_ns"])]
    return {int(r.rank): str(r.stopped_state) for r in now.itertuples()}


@dataclass(frozen=True, slots=True)
class Stall:
    """A step during which the whole job stood still, then went on (a recovered hang)."""

    step: int
    start_ns: int
    end_ns: int
    median_ns: float
    """The run's median job step (ns)."""


STALL_TIMES = 10.0
"""A recovered stall's step took at least this many times the median step (and at least
``HangConfig.stall_s``): a step 10x the usual is no straggler's jitter."""


def recovered_stalls(steps: pd.DataFrame, cfg: HangConfig | None = None) -> list[Stall]:
    """Steps that took at least ``cfg.stall_s`` and :data:`STALL_TIMES` x the median job
    step, on the job as a whole: from the first rank's start to the last rank's end.
    ``steps``: rank, step, start_ns, end_ns (ns). The live analysis saw these as hangs;
    once the job went on they are still the thing to report."""
    cfg = cfg or HangConfig()
    if steps.empty:
        return []
    job = steps.groupby("step").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    took = job["end_ns"] - job["start_ns"]
    median = float(took.median())
    long = job[(took >= cfg.stall_s * 1e9) & (took >= STALL_TIMES * median)]
    return [Stall(int(s), int(r.start_ns), int(r.end_ns), median) for s, r in long.iterrows()]
