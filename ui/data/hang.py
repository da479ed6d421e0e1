"""The hang view: per process group, how far each rank got, and aggregated stacks.

A hang is localized from progress, not timeouts (DESIGN): for each group, the last
sequence number each member entered (issued) and completed; the members behind the
furthest-entered one never entered the next collective, and those that entered one
without completing it are blocked in it.
"""

from __future__ import annotations

import pandas as pd

from ranksight.store import Store

from .run import RUN, RunView

PROGRESS = f"""
SELECT group_id, rank, any(group_ranks) AS members, max(group_seq) AS last_entered,
       maxIf(group_seq, end_ns > 0) AS last_done, countIf(end_ns = 0) AS open_ops,
       argMax(op, group_seq) AS last_op, max(enqueue_ns) AS last_enqueue
FROM collectives
WHERE {RUN} AND peer = -1
GROUP BY group_id, rank
"""


def group_progress(store: Store, run: RunView) -> pd.DataFrame:
    """Per (group, member rank): last_entered, last_done (sequence numbers; an op
    entered and never completed makes them differ), open_ops, last_op, and per group:
    size, behind (the group's furthest entered minus this rank's). Raises StoreError."""
    got = store.query(PROGRESS, run.params)
    if got.empty:
        return got
    got["size"] = got["members"].map(lambda s: len([x for x in str(s).split(",") if x]))
    furthest = got.groupby("group_id")["last_entered"].transform("max")
    got["behind"] = (furthest - got["last_entered"]).astype(int)
    got["stuck"] = got["last_entered"] > got["last_done"]
    return got.sort_values(["group_id", "rank"]).reset_index(drop=True)


def group_summary(progress: pd.DataFrame, suspect_ranks: list[int] = ()) -> pd.DataFrame:
    """One row per group: group_id, size, seen (members with records), furthest
    (highest sequence entered), lagging (ranks behind it, "3,7"), stuck (ranks inside an
    op that never completed), last_op. Groups where a suspect lags come first, then
    groups with ranks lagging or stuck."""
    if progress.empty:
        return pd.DataFrame(
            columns=["group_id", "size", "seen", "furthest", "lagging", "stuck", "last_op"]
        )
    rows = []
    for gid, g in progress.groupby("group_id"):
        lag = g[g["behind"] > 0]["rank"].astype(int).tolist()
        stuck = g[g["stuck"]]["rank"].astype(int).tolist()
        members = [int(x) for x in str(g["members"].iloc[0]).split(",") if x]
        missing = sorted(set(members) - set(g["rank"].astype(int)))
        rows.append(
            {
                "group_id": gid,
                "size": int(g["size"].iloc[0]),
                "seen": len(g),
                "furthest": int(g["last_entered"].max()),
                "lagging": ",".join(map(str, lag + missing)),
                "stuck": ",".join(map(str, stuck)),
                "last_op": str(g.loc[g["last_entered"].idxmax(), "last_op"]),
            }
        )
    out = pd.DataFrame(rows)
    suspect = {str(r) for r in suspect_ranks}
    has_suspect = out["lagging"].map(lambda lag: bool(suspect & set(lag.split(","))))
    score = (
        has_suspect.astype(int) * 4
        + (out["lagging"] != "").astype(int) * 2
        + (out["stuck"] != "").astype(int)
    )
    return (
        out.assign(_s=score)
        .sort_values(["_s", "group_id"], ascending=[False, True])
        .drop(columns="_s")
        .reset_index(drop=True)
    )


OPEN_OPS = f"""
SELECT rank, countIf(end_ns = 0) AS open_ops, max(enqueue_ns) AS last_enqueue
FROM collectives WHERE {RUN}
GROUP BY rank
"""


def open_ops(store: Store, run: RunView) -> pd.Series:
    """rank -> ops (collectives and send/recv) it issued that never completed."""
    got = store.query(OPEN_OPS, run.params)
    return pd.Series(got["open_ops"].to_numpy(int), index=got["rank"].astype(int).to_numpy())


def suspects(progress: pd.DataFrame, open_by_rank: pd.Series) -> list[int]:
    """Ranks behind in some group that are blocked in no op at all: they never entered
    the collective their peers wait in, and are stuck elsewhere (compute, data, a
    Python lock): their stacks say where. Ranks blocked in an op are victims."""
    if progress.empty:
        return []
    behind = set(progress.loc[progress["behind"] > 0, "rank"].astype(int))
    for _, g in progress.groupby("group_id"):
        members = {int(x) for x in str(g["members"].iloc[0]).split(",") if x}
        behind |= members - set(g["rank"].astype(int))  # never issued anything there
    return sorted(r for r in behind if int(open_by_rank.get(r, 0)) == 0)
