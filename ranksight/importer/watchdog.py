"""NCCL watchdog timeout lines from rank logs, older and newer formats.

Newer (torch >= 2.2)::

    [rank0]:[E1129 03:14:00.000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught
      collective operation timeout: WorkNCCL(SeqNum=904, OpType=ALLREDUCE, NumelIn=1,
      NumelOut=1, Timeout(ms)=1800000) ran for 1800037 milliseconds before timing out.
    [rank0]:[E1129 ...] [PG ID 0 PG GUID 0(default_pg) Rank 0] failure detected by watchdog
      at work sequence id: 904 PG status: last enqueued work: 904, last completed work: 903

Older (torch 1.13-2.1): ``WorkNCCL(SeqNum=904, OpType=ALLREDUCE, Timeout(ms)=1800000)``
without element counts, and ``[Rank 0] Timeout at NCCL work: 904, last enqueued NCCL work:
904, last completed NCCL work: 903.``

Mapped to: a ``collectives`` row for the op that timed out (group, sequence, op, element
counts, never completed), and a ``progress`` row per rank and group (last enqueued and
completed). Group members: every rank with a log in the import (the watchdog line does
not list them); a rank whose log has no timeout line still counts as a member, with
nothing issued, so a rank that never entered the op stands out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .rows import Rows, group_id, norm_op, ranks_text

WORK = re.compile(
    r"WorkNCCL\(SeqNum=(?P<seq>\d+),\s*OpType=(?P<op>\w+)"
    r"(?:,\s*NumelIn=(?P<nin>-?\d+),\s*NumelOut=(?P<nout>-?\d+))?"
    r"(?:,\s*Timeout\(ms\)=(?P<timeout>\d+))?"
)
RANK = re.compile(r"\[Rank (?P<rank>\d+)\]|^\[rank(?P<rank2>\d+)\]:")
PG = re.compile(r"PG GUID (?P<guid>\w+)(?:\((?P<desc>[^)]*)\))?")
STATUS_NEW = re.compile(r"last enqueued work: (?P<enq>-?\d+), last completed work: (?P<done>-?\d+)")
STATUS_OLD = re.compile(
    r"last enqueued NCCL work: (?P<enq>-?\d+), last completed NCCL work: (?P<done>-?\d+)"
)
MARKERS = (
    "Watchdog caught collective operation timeout",
    "last enqueued NCCL work",
    "last enqueued work",
)


@dataclass
class RankLog:
    """What one rank's log says."""

    rank: int | None
    timeouts: list[dict] = field(
        default_factory=list
    )  # {seq, op, numel_in, numel_out, timeout_ms, pg}
    status: dict[str, tuple[int, int]] = field(default_factory=dict)  # pg -> (enqueued, completed)


def read(path: str, rank: int | None) -> RankLog:
    """Parse one rank's log (any size: read line by line). The rank comes from the lines
    (``[Rank 3]``) when the caller does not know it."""
    log = RankLog(rank)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if "WorkNCCL(" not in line and "last enqueued" not in line:
                continue
            m = RANK.search(line)
            if log.rank is None and m:
                log.rank = int(m.group("rank") or m.group("rank2"))
            pg = PG.search(line)
            desc = (pg.group("desc") or f"pg{pg.group('guid')}") if pg else "default_pg"
            w = WORK.search(line)
            if w and "timeout" in line.lower():
                log.timeouts.append(
                    {"seq": int(w.group("seq")), "op": norm_op(w.group("op")),
                     "numel_in": int(w.group("nin") or 0), "numel_out": int(w.group("nout") or 0),
                     "timeout_ms": int(w.group("timeout") or 0), "pg": desc}
                )  # fmt: skip
            s = STATUS_NEW.search(line) or STATUS_OLD.search(line)
            if s:
                log.status[desc] = (int(s.group("enq")), int(s.group("done")))
    return log


def rows_of(logs: list[RankLog], ts_ns: int) -> Rows:
    """Rows of every rank's log together (members: every rank with a log)."""
    out = Rows()
    members = sorted({lg.rank for lg in logs if lg.rank is not None})
    pgs = sorted(
        {t["pg"] for lg in logs for t in lg.timeouts} | {p for lg in logs for p in lg.status}
    )
    for lg in logs:
        if lg.rank is None:
            continue
        out.add(
            "ranks", {"rank": lg.rank, "world_size": len(members), "dp": -1, "tp": -1, "pp": -1}
        )
        for pg in pgs:
            gid = group_id(pg, members)
            enq, done = lg.status.get(pg, (-1, -1))
            mine = [t for t in lg.timeouts if t["pg"] == pg]
            if mine and enq < 0:
                enq, done = max(t["seq"] for t in mine), max(t["seq"] for t in mine) - 1
            out.add(
                "progress",
                {"rank": lg.rank, "ts_ns": ts_ns, "step": -1, "group_id": gid,
                 "group_ranks": ranks_text(members), "direction": "", "peer": -1,
                 "issued_seq": enq, "completed_seq": done,
                 "last_op": mine[-1]["op"] if mine else "", "last_issue_ns": 0},
            )  # fmt: skip
            for t in mine:
                out.add(
                    "collectives",
                    {"rank": lg.rank, "step": -1, "group_id": gid, "group_ranks": ranks_text(members),
                     "group_seq": t["seq"], "op": t["op"], "peer": -1, "numel_in": t["numel_in"],
                     "numel_out": t["numel_out"], "enqueue_ns": ts_ns, "start_ns": ts_ns, "end_ns": 0},
                )  # fmt: skip
    return out
