"""The hang view: per process group, how far each rank got, and aggregated stacks.

A hang is localized from progress, not timeouts (DESIGN): for each group, the last
sequence number each member entered (issued) and completed; the members behind the
furthest-entered one never entered the next collective, and those that entered one
without completing it are blocked in it.

Two sources give those numbers. The ``progress`` table: each rank's hooks snapshot every
2 s, from a thread that keeps running while training is stuck, the highest sequence
issued and completed per (group, P2P direction, peer) (``trainer_hooks/collective_log.py``);
it shows a hang live, while the ops the ranks are stuck in have no ``collectives`` row
yet (a row is written when its op completes, or at exit). Runs without snapshots fall
back to the ``collectives`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ranksight.analyzer.detectors.hang import LATEST
from ranksight.store import Store

from .run import RUN, RunView

PROGRESS_NEWEST = f"SELECT count() AS n, max(ts_ns) AS newest FROM progress WHERE {RUN}"

PROGRESS = f"""
SELECT group_id, rank, any(group_ranks) AS members, max(group_seq) AS last_entered,
       maxIf(group_seq, end_ns > 0) AS last_done, countIf(end_ns = 0) AS open_ops,
       argMax(op, group_seq) AS last_op, max(enqueue_ns) AS last_enqueue
FROM collectives
WHERE {RUN} AND peer = -1
GROUP BY group_id, rank
"""


def progress_newest(store: Store, run: RunView) -> int:
    """Time (ns) of the run's newest progress snapshot; 0 if it has none. Cheap: the
    Hang page keys its reads on it, so new snapshots show at once. Raises StoreError."""
    got = store.query(PROGRESS_NEWEST, run.params)
    return int(got["newest"].iloc[0]) if len(got) and int(got["n"].iloc[0]) else 0


def latest_snapshots(store: Store, run: RunView) -> pd.DataFrame:
    """Each rank's latest snapshot per (group, direction, peer): rank, group_id,
    direction ("" for collectives, "send"/"recv"), peer, issued, completed (sequence
    numbers, -1 for none), op, members, seen_ns (snapshot time), at_step. The
    analyzer's own query (``analyzer.detectors.hang.LATEST``). Raises StoreError."""
    return store.query(LATEST, run.params)


def snapshot_progress(latest: pd.DataFrame) -> pd.DataFrame:
    """:func:`group_progress`'s frame from :func:`latest_snapshots` (collective groups
    only), plus at_step and seen_ns per rank. ``open_ops`` is issued minus completed."""
    coll = latest[latest["direction"] == ""]
    if coll.empty:
        return pd.DataFrame()
    got = pd.DataFrame(
        {
            "group_id": coll["group_id"].astype(str),
            "rank": coll["rank"].astype(int),
            "members": coll["members"].astype(str),
            "last_entered": coll["issued"].astype(int),
            "last_done": coll["completed"].astype(int),
            "open_ops": (coll["issued"] - coll["completed"]).clip(lower=0).astype(int),
            "last_op": coll["op"].astype(str),
            "at_step": coll["at_step"].astype(int),
            "seen_ns": coll["seen_ns"].astype("int64"),
        }
    )
    return _per_group(got)


@dataclass(frozen=True)
class Snapshots:
    """A run's progress snapshots as the Hang page reads them: ``latest`` (see
    :func:`latest_snapshots`), ``progress`` (:func:`snapshot_progress`), ``open_by_rank``
    (:func:`snapshot_open_ops`), the newest snapshot time (ns) and ranks reporting.
    Empty frames and 0 when the run has none."""

    latest: pd.DataFrame
    progress: pd.DataFrame
    open_by_rank: pd.Series
    newest_ns: int
    ranks: int


def load_snapshots(store: Store, run: RunView) -> Snapshots:
    """The run's :class:`Snapshots`. Raises StoreError."""
    latest = latest_snapshots(store, run)
    if latest.empty:
        return Snapshots(latest, pd.DataFrame(), pd.Series(dtype=int), 0, 0)
    return Snapshots(
        latest,
        snapshot_progress(latest),
        snapshot_open_ops(latest),
        int(latest["seen_ns"].max()),
        int(latest["rank"].nunique()),
    )


PROGRESS_IN_GROUPS = PROGRESS.replace("AND peer = -1", "AND peer = -1 AND group_id IN %(groups)s")

MERGE_GROUPS_UP_TO = 1000
"""Most groups whose collective rows are read by id; more read the whole table."""


def settle(store: Store, run: RunView, snap: Snapshots) -> tuple[pd.DataFrame, pd.Series]:
    """The snapshot progress raised to what the ``collectives`` rows show, for the groups
    where some rank looks behind or blocked, and the open ops per rank to match.

    Both sources lag the truth: a snapshot is up to 2 s old (a run that ended without a
    last one shows its final step in flight), a collective row lands when its op
    completes. The larger sequence number of the two is the better one. Returns
    (progress as :func:`snapshot_progress`, rank -> open ops). Raises StoreError."""
    prog = snap.progress
    unsettled = prog[prog["stuck"] | (prog["behind"] > 0)]
    if unsettled.empty:
        return prog, snap.open_by_rank
    groups = tuple(sorted(set(unsettled["group_id"])))
    if len(groups) <= MERGE_GROUPS_UP_TO:
        rows = store.query(PROGRESS_IN_GROUPS, {**run.params, "groups": groups})
    else:
        rows = store.query(PROGRESS, run.params)
    if rows.empty:
        return prog, snap.open_by_rank
    rows = rows.assign(rank=rows["rank"].astype(int))[
        ["group_id", "rank", "last_entered", "last_done"]
    ]
    merged = prog.merge(rows, on=["group_id", "rank"], how="left", suffixes=("", "_rows"))
    for col in ("last_entered", "last_done"):
        merged[col] = merged[[col, f"{col}_rows"]].max(axis=1).astype(int)
    merged["open_ops"] = (merged["last_entered"] - merged["last_done"]).clip(lower=0)
    out = _per_group(merged.drop(columns=["last_entered_rows", "last_done_rows"]))
    p2p = snap.latest[snap.latest["direction"] != ""]
    open_ = pd.concat(
        [
            out[["rank", "open_ops"]],
            pd.DataFrame(
                {
                    "rank": p2p["rank"].astype(int),
                    "open_ops": (p2p["issued"] - p2p["completed"]).clip(lower=0),
                }
            ),
        ]
    )
    return out, open_.groupby("rank")["open_ops"].sum().astype(int)


def snapshot_open_ops(latest: pd.DataFrame) -> pd.Series:
    """rank -> ops issued and not completed over all its streams (collectives and
    send/recv), from :func:`latest_snapshots`."""
    open_ = (latest["issued"] - latest["completed"]).clip(lower=0)
    return open_.groupby(latest["rank"].astype(int)).sum().astype(int)


def group_progress(store: Store, run: RunView) -> pd.DataFrame:
    """Per (group, member rank) from the ``collectives`` rows: last_entered, last_done
    (sequence numbers; an op entered and never completed makes them differ), open_ops,
    last_op, and per group: size, behind (the group's furthest entered minus this
    rank's), stuck (entered past done). Raises StoreError."""
    got = store.query(PROGRESS, run.params)
    if got.empty:
        return got
    return _per_group(got)


def _per_group(got: pd.DataFrame) -> pd.DataFrame:
    """Add size, behind and stuck to per (group, rank) progress; sorted."""
    got["size"] = got["members"].map(lambda s: len([x for x in str(s).split(",") if x]))
    furthest = got.groupby("group_id")["last_entered"].transform("max")
    got["behind"] = (furthest - got["last_entered"]).astype(int)
    got["stuck"] = got["last_entered"] > got["last_done"]
    return got.sort_values(["group_id", "rank"]).reset_index(drop=True)


def group_summary(
    progress: pd.DataFrame, suspect_ranks: tuple[int, ...] | list[int] = ()
) -> pd.DataFrame:
    """One row per group: group_id, size, seen (members with records), furthest
    (highest sequence entered), lagging (ranks behind it, "3,7"), stuck (ranks inside an
    op that never completed), last_op. Groups where a suspect lags come first, then
    groups with ranks lagging or stuck. Vectorized over groups (16,384 ranks make
    thousands of them)."""
    cols = ["group_id", "size", "seen", "furthest", "lagging", "stuck", "last_op"]
    if progress.empty:
        return pd.DataFrame(columns=cols)
    g = progress.groupby("group_id", sort=True)
    out = pd.DataFrame(
        {
            "size": g["size"].first().astype(int),
            "seen": g.size().astype(int),
            "furthest": g["last_entered"].max().astype(int),
            "last_op": progress.loc[g["last_entered"].idxmax(), ["group_id", "last_op"]]
            .set_index("group_id")["last_op"]
            .astype(str),
        }
    )
    lag = _rank_lists(progress[progress["behind"] > 0])
    for gid, missing in _missing_members(progress).items():
        lag[gid] = sorted(lag.get(gid, []) + missing)
    stuck = _rank_lists(progress[progress["stuck"]])
    out["lagging"] = [",".join(map(str, lag.get(gid, []))) for gid in out.index]
    out["stuck"] = [",".join(map(str, stuck.get(gid, []))) for gid in out.index]
    out = out.reset_index()[cols]
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


def _rank_lists(rows: pd.DataFrame) -> dict[str, list[int]]:
    """group_id -> sorted ranks of ``rows``."""
    return {gid: sorted(int(r) for r in rs) for gid, rs in rows.groupby("group_id")["rank"]}


def _missing_members(progress: pd.DataFrame) -> dict[str, list[int]]:
    """group_id -> members with no record in it (only groups with fewer records than
    members are looked at)."""
    g = progress.groupby("group_id")
    short = g.size() < g["size"].first()
    out = {}
    for gid in short[short].index:
        rows = progress[progress["group_id"] == gid]
        members = {int(x) for x in str(rows["members"].iloc[0]).split(",") if x}
        out[gid] = sorted(members - set(rows["rank"].astype(int)))
    return out


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
    for missing in _missing_members(progress).values():
        behind |= set(missing)  # never issued anything there
    return sorted(r for r in behind if int(open_by_rank.get(r, 0)) == 0)
