"""Who waited for whom: wait-for edges from collective arrival order and send/recv, and
the queries that load them for the ranks under suspicion (pushed down to the store)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from ranksight.ground.sql import RUN as _RUN

_MS = 1e6


@dataclass(frozen=True)
class WaitSummary:
    """Wait-for edges between ranks, from two sources:

    - collectives: in each instance every member waits ``max(enqueue) - own enqueue`` for
      the last arriver (``arrivals``: rank, last_rank, group_id, step, op, n, waited_ns);
    - pipeline P2P: a receiver waits ``send enqueue - recv enqueue`` for its sender
      (``p2p``: rank, peer, step, n, waited_ns).

    ``axes`` maps group_id -> mesh axis ("tp", "dp", "pp", "world", "mixed").
    """

    arrivals: pd.DataFrame
    p2p: pd.DataFrame
    axes: dict[str, str]

    def edges(self, since_step: int = 0) -> pd.DataFrame:
        """Wait-for edges (waiter, holder, axis, op, waited_ns) from ``since_step`` on,
        self-edges removed."""
        parts = []
        a = self.arrivals
        if not a.empty:
            a = a[(a["step"] >= since_step) & (a["rank"] != a["last_rank"])]
            parts.append(
                pd.DataFrame(
                    {
                        "waiter": a["rank"].astype(int),
                        "holder": a["last_rank"].astype(int),
                        "axis": a["group_id"].map(self.axes).fillna("mixed"),
                        "op": a["op"],
                        "waited_ns": a["waited_ns"].astype(float),
                    }
                )
            )
        p = self.p2p
        if not p.empty:
            p = p[p["step"] >= since_step]
            parts.append(
                pd.DataFrame(
                    {
                        "waiter": p["rank"].astype(int),
                        "holder": p["peer"].astype(int),
                        "axis": "pp",
                        "op": "recv",
                        "waited_ns": p["waited_ns"].astype(float),
                    }
                )
            )
        if not parts:
            return pd.DataFrame(columns=["waiter", "holder", "axis", "op", "waited_ns"])
        return pd.concat(parts, ignore_index=True)

    def caused_by(self, rank: int, since_step: int = 0) -> dict:
        """How long other ranks waited directly for ``rank``: total and by mesh axis and
        op (ms), the top victims, and ``last_share``: the share of the collective
        instances ``rank`` took part in where it arrived last."""
        e = self.edges(since_step)
        mine = e[e["holder"] == rank]
        victims = mine.groupby("waiter")["waited_ns"].sum().sort_values(ascending=False)
        a = self.arrivals
        own = a[(a["rank"] == rank) & (a["step"] >= since_step)] if not a.empty else a
        n_all = float(own["n"].sum()) if not own.empty else 0.0
        n_last = float(own.loc[own["last_rank"] == rank, "n"].sum()) if not own.empty else 0.0
        return {
            "total_ms": round(float(mine["waited_ns"].sum()) / _MS, 1),
            "by_axis_ms": _ms(mine.groupby("axis")["waited_ns"].sum()),
            "by_op_ms": _ms(mine.groupby("op")["waited_ns"].sum()),
            "victims": [
                {"rank": int(r), "waited_ms": round(float(v) / _MS, 1)}
                for r, v in victims.head(8).items()
            ],
            "last_share": round(n_last / n_all, 3) if n_all else 0.0,
        }

    def waited_on(self, rank: int, holders: list[int]) -> float:
        """Total ns ``rank`` waited directly for any of ``holders``."""
        e = self.edges()
        return float(e[(e["waiter"] == rank) & e["holder"].isin(holders)]["waited_ns"].sum())

    def mostly_waited_on(self, rank: int, flagged: list[int]) -> bool:
        """True if ``rank`` waited for the other ``flagged`` ranks longer than all ranks
        together waited for it: then it is a victim of them, not a culprit."""
        others = [r for r in flagged if r != rank]
        if not others:
            return False
        e = self.edges()
        held = float(e[e["holder"] == rank]["waited_ns"].sum())
        return self.waited_on(rank, others) > held


def _ms(s: pd.Series) -> dict:
    return {str(k): round(float(v) / _MS, 1) for k, v in s.sort_values(ascending=False).items()}


def summarize_waits(arrivals: pd.DataFrame, p2p: pd.DataFrame, axes: dict[str, str]) -> WaitSummary:
    """Bundle the arrival and P2P frames (see WaitSummary) for queries."""
    return WaitSummary(arrivals, p2p, axes)


# Per collective instance (group_id, group_seq) the last arriver and each member's wait
# for it (max start - own start: arrival, see slow_comm), summed per (rank, last_rank,
# group, step). Only
# instances every member reported are counted, and only in the groups of %(holders)s
# (the ranks under suspicion): the join is the expensive part at scale.
_HOLDER_GROUPS = f"""group_id IN (SELECT group_id FROM collectives WHERE {_RUN} AND peer = -1
                       AND rank IN %(holders)s GROUP BY group_id)"""
ARRIVALS = f"""
SELECT rank, last_rank, group_id, step, any(op) AS op, count() AS n,
       sum(max_start - start_ns) AS waited_ns,
       sum(greatest(end_ns - max_start, 0)) AS after_last_ns
FROM
(
    SELECT rank, group_id, group_seq, step, op, start_ns, end_ns
    FROM collectives WHERE {_RUN} AND peer = -1 AND end_ns > 0 AND {_HOLDER_GROUPS}
) AS member
ALL INNER JOIN
(
    SELECT group_id, group_seq, max(start_ns) AS max_start,
           argMax(rank, start_ns) AS last_rank, count() AS n_seen,
           any(length(splitByChar(',', group_ranks))) AS n_members
    FROM collectives WHERE {_RUN} AND peer = -1 AND end_ns > 0 AND {_HOLDER_GROUPS}
    GROUP BY group_id, group_seq
    HAVING n_seen = n_members
) AS instance USING (group_id, group_seq)
GROUP BY rank, last_rank, group_id, step
"""

# Each recv from one of %(holders)s matched with its send by (group, src, dst, per-pair
# sequence): how long the receiver had been waiting when the sender issued the send.
P2P_WAITS = f"""
SELECT dst AS rank, src AS peer, step, count() AS n,
       sum(greatest(send_start - start_ns, 0)) AS waited_ns
FROM
(
    SELECT group_id, toInt64(rank) AS dst, toInt64(peer) AS src, group_seq, step, start_ns
    FROM collectives WHERE {_RUN} AND op = 'recv' AND peer IN %(holders)s
) AS recv_side
ALL INNER JOIN
(
    SELECT group_id, toInt64(rank) AS src, toInt64(peer) AS dst, group_seq,
           start_ns AS send_start
    FROM collectives WHERE {_RUN} AND op = 'send' AND rank IN %(holders)s
) AS send_side USING (group_id, src, dst, group_seq)
GROUP BY dst, src, step
"""


def fetch_waits(
    query: Callable[[str, dict], pd.DataFrame], params: dict, holders: list[int]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:data:`ARRIVALS` and :data:`P2P_WAITS` of the run ``params`` names, restricted to
    ``holders`` (empty frames for none); ``query(sql, params)`` runs one query on the
    store (raises StoreError)."""
    if not holders:
        return pd.DataFrame(columns=_ARRIVAL_COLUMNS), pd.DataFrame(columns=_P2P_COLUMNS)
    p = {**params, "holders": tuple(int(h) for h in holders)}
    return query(ARRIVALS, p), query(P2P_WAITS, p)


_ARRIVAL_COLUMNS = [
    "rank",
    "last_rank",
    "group_id",
    "step",
    "op",
    "n",
    "waited_ns",
    "after_last_ns",
]
_P2P_COLUMNS = ["rank", "peer", "step", "n", "waited_ns"]
