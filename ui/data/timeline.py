"""The aligned timeline of one step (or a few): every rank's phases and collectives.

Times come back relative to the window's first step start (ms), on the hosts' realtime
clocks as recorded (see DESIGN: cross-rank alignment is the hosts' clock agreement).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ranksight.store import Store

from .run import RUN, RunView, ordered_ranks

_WINDOW = "step >= %(s_lo)s AND step <= %(s_hi)s AND rank IN %(ranks)s"

ORIGIN = (
    f"SELECT min(start_ns) AS t0 FROM steps WHERE {RUN} AND step >= %(s_lo)s AND step <= %(s_hi)s"
)

PHASES = f"""
SELECT rank, step, phase, microbatch, start_ns, end_ns, wait_ns
FROM phases WHERE {RUN} AND {_WINDOW}
ORDER BY rank, start_ns
"""

COLLECTIVES = f"""
SELECT rank, step, op, group_id, group_seq, peer, bytes, enqueue_ns, start_ns, end_ns, wait_ns
FROM collectives WHERE {RUN} AND {_WINDOW}
ORDER BY rank, enqueue_ns
"""

# Collective instances of the window over all ranks, the most skewed (latest arriver
# furthest behind the first) first.
INSTANCES = f"""
SELECT group_id, group_seq, any(op) AS op_name, count() AS members,
       max(enqueue_ns) - min(enqueue_ns) AS skew_ns, argMax(rank, enqueue_ns) AS last_rank,
       min(enqueue_ns) AS first_enqueue
FROM collectives
WHERE {RUN} AND step >= %(s_lo)s AND step <= %(s_hi)s AND peer = -1
GROUP BY group_id, group_seq
ORDER BY skew_ns DESC, group_id, group_seq
LIMIT %(limit)s
"""

MEMBERS = f"""
SELECT rank, enqueue_ns, start_ns, end_ns
FROM collectives
WHERE {RUN} AND group_id = %(group_id)s AND group_seq = %(group_seq)s
ORDER BY enqueue_ns
"""


@dataclass(frozen=True)
class Timeline:
    """Rows of one window: ``ranks`` (the drawn ranks in order, with ``pos`` and
    ``label``), ``phases`` and ``collectives`` with ``t0_ms``/``t1_ms`` relative to
    ``origin_ns`` (collectives also ``enq_ms``; an op that never completed ends at the
    window's last time)."""

    steps: tuple[int, int]
    origin_ns: int
    ranks: pd.DataFrame
    phases: pd.DataFrame
    collectives: pd.DataFrame


def rank_window(ranks: pd.DataFrame, center: int | None, size: int) -> pd.DataFrame:
    """At most ``size`` consecutive ranks of the ordered ``ranks`` (see
    ``run.ordered_ranks``), around rank ``center`` where given, else from the start."""
    if len(ranks) <= size:
        return ranks
    at = 0
    if center is not None and (ranks["rank"] == center).any():
        at = int(ranks.index[ranks["rank"] == center][0])
    lo = min(max(0, at - size // 2), len(ranks) - size)
    return ranks.iloc[lo : lo + size]


def load_timeline(
    store: Store,
    run: RunView,
    steps: tuple[int, int],
    order: tuple[str, ...],
    center_rank: int | None,
    max_ranks: int,
) -> Timeline:
    """The window ``steps`` (inclusive) for at most ``max_ranks`` ranks around
    ``center_rank`` in ``order``. Raises ValueError for an empty step range, StoreError."""
    s_lo, s_hi = steps
    if s_hi < s_lo:
        raise ValueError(f"empty step range {s_lo}..{s_hi}")
    from .run import rank_label

    ranks = rank_window(ordered_ranks(run.ranks, order, run.shape), center_rank, max_ranks)
    ranks = ranks.assign(label=[rank_label(r) for r in ranks.to_dict("records")])
    p = {**run.params, "s_lo": s_lo, "s_hi": s_hi, "ranks": tuple(int(r) for r in ranks["rank"])}
    t0 = store.query(ORIGIN, p)["t0"]
    origin = int(t0.iloc[0]) if len(t0) else 0
    phases = store.query(PHASES, p) if p["ranks"] else pd.DataFrame()
    colls = store.query(COLLECTIVES, p) if p["ranks"] else pd.DataFrame()
    return Timeline(steps, origin, ranks, _relative(phases, origin), _relative(colls, origin))


def _relative(frame: pd.DataFrame, origin: int) -> pd.DataFrame:
    """Add t0_ms/t1_ms (and enq_ms) relative to ``origin``; open ends (0) end at the
    latest time seen."""
    if frame.empty:
        return frame
    out = frame.copy()
    last = max(int(out["end_ns"].max()), int(out["start_ns"].max()))
    end = out["end_ns"].where(out["end_ns"] > 0, last)
    out["t0_ms"] = (out["start_ns"] - origin) / 1e6
    out["t1_ms"] = (end - origin) / 1e6
    out["open"] = out["end_ns"] <= 0
    if "enqueue_ns" in out:
        out["enq_ms"] = (out["enqueue_ns"] - origin) / 1e6
    return out


def collective_instances(
    store: Store, run: RunView, steps: tuple[int, int], limit: int = 50
) -> pd.DataFrame:
    """The window's collective instances over all ranks, most skewed first: group_id,
    group_seq, op, members, skew_ms, last_rank. Raises StoreError."""
    p = {**run.params, "s_lo": steps[0], "s_hi": steps[1], "limit": int(limit)}
    got = store.query(INSTANCES, p)
    got["skew_ms"] = got["skew_ns"].astype(float) / 1e6
    return got.rename(columns={"op_name": "op"})


def instance_members(
    store: Store, run: RunView, group_id: str, group_seq: int, origin_ns: int
) -> pd.DataFrame:
    """Every member of one collective instance: rank, enq_ms (relative to
    ``origin_ns``), end (open: end_ns 0), ordered by arrival. Raises StoreError."""
    p = {**run.params, "group_id": group_id, "group_seq": int(group_seq)}
    got = store.query(MEMBERS, p)
    got["enq_ms"] = (got["enqueue_ns"] - origin_ns) / 1e6
    return got
