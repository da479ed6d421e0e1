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

# The window's span: its steps' first start and last end over all ranks, and how many of
# its steps have rows (a step still running, or hung, has none yet).
SPAN = f"""
SELECT min(start_ns) AS t0, max(end_ns) AS t1, uniqExact(step) AS n
FROM steps WHERE {RUN} AND step >= %(s_lo)s AND step <= %(s_hi)s
"""

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
    ``origin_ns`` and clipped to the window ``[0, end_ms]`` (collectives also
    ``enq_ms``); ``open`` marks an op that never completed, ``past_ms`` how far a row
    ran past the window's end (ms; 0 if it did not, NaN if it never ended)."""

    steps: tuple[int, int]
    origin_ns: int
    end_ms: float
    """The window's end: its last step's last end over all ranks (ms since
    ``origin_ns``); while a step of it has no step rows yet, the latest time its rows
    show."""
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
    span = store.query(SPAN, p)
    n = int(span["n"].iloc[0]) if len(span) else 0
    phases = store.query(PHASES, p) if p["ranks"] else pd.DataFrame()
    colls = store.query(COLLECTIVES, p) if p["ranks"] else pd.DataFrame()
    origin = int(span["t0"].iloc[0]) if n else _first(phases, colls)
    end = int(span["t1"].iloc[0]) if n == s_hi - s_lo + 1 else _latest(phases, colls, floor=origin)
    return Timeline(
        steps,
        origin,
        (end - origin) / 1e6,
        ranks,
        _relative(phases, origin, end),
        _relative(colls, origin, end),
    )


def _first(*frames: pd.DataFrame) -> int:
    """The earliest start (ns) in ``frames``; 0 if there is none."""
    starts = [int(f["start_ns"].min()) for f in frames if not f.empty]
    return min(starts) if starts else 0


def _latest(*frames: pd.DataFrame, floor: int) -> int:
    """The latest start or end (ns) in ``frames``; ``floor`` if there is none."""
    times = [int(f[c].max()) for f in frames if not f.empty for c in ("start_ns", "end_ns")]
    return max([floor, *times])


def _relative(frame: pd.DataFrame, origin: int, end: int) -> pd.DataFrame:
    """Add t0_ms/t1_ms (and enq_ms) relative to ``origin``, clipped to ``origin..end``
    (ns), ``open`` (never completed: end 0, drawn to ``end``) and ``past_ms``."""
    if frame.empty:
        return frame
    out = frame.copy()
    out["open"] = out["end_ns"] <= 0
    stop = out["end_ns"].where(~out["open"], end)
    out["past_ms"] = ((stop - end).clip(lower=0) / 1e6).where(~out["open"])
    out["t0_ms"] = (out["start_ns"].clip(lower=origin, upper=end) - origin) / 1e6
    out["t1_ms"] = (stop.clip(lower=origin, upper=end) - origin) / 1e6
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
