"""The per-rank-step metric queries (ns per rank and step), shared by the per-rank-step
summary (:mod:`ranksight.analyzer.summary`, which runs them once and stores the result)
and the UI's heatmap (``ui/data/heatmap.py``, for steps not yet summarized), which says
what each metric means."""

from __future__ import annotations

from ranksight.ground.sql import RUN

METRICS = {
    "compute": "compute time (self time of forward, backward, optimizer)",
    "waited": "time waited on others (collective arrival order, send/recv)",
    "waited_on": "time others waited on this rank",
    "collective": "time in collectives and send/recv",
}
"""Metric name -> what it shows (the UI's label)."""

STEP_WINDOW = "step >= %(s_lo)s AND step <= %(s_hi)s"

# {{steps}}: the step range clause (bound parameters), filled in by inner_query.
_COMPUTE = f"""
SELECT toInt64(rank) AS r, toInt64(step) AS s, toFloat64(sum(end_ns - start_ns - wait_ns)) AS val
FROM phases
WHERE {RUN} AND {{steps}} AND phase IN ('forward', 'backward', 'optimizer')
GROUP BY rank, step
"""

_COLLECTIVE = f"""
SELECT toInt64(rank) AS r, toInt64(step) AS s, toFloat64(sum(end_ns - start_ns)) AS val
FROM collectives
WHERE {RUN} AND {{steps}} AND end_ns > 0
GROUP BY rank, step
"""

# Every wait as (waiter, holder, step, ns): in a collective each member waits for the
# last arriver (one pass: members gathered per instance, no join); a receiver waits for
# its sender's enqueue (the send looked for in the recv's steps and one either side).
_PAIRS = f"""
    SELECT tupleElement(m, 1) AS waiter, last_rank AS holder, tupleElement(m, 2) AS s,
           max_enq - tupleElement(m, 3) AS w
    FROM
    (
        SELECT last_rank, max_enq, arrayJoin(members) AS m
        FROM
        (
            SELECT toInt64(argMax(rank, enqueue_ns)) AS last_rank, max(enqueue_ns) AS max_enq,
                   groupArray((toInt64(rank), toInt64(step), enqueue_ns)) AS members
            FROM collectives WHERE {RUN} AND {{steps}} AND peer = -1
            GROUP BY group_id, group_seq
        ) AS instance
    ) AS member
    UNION ALL
    SELECT dst AS waiter, src AS holder, toInt64(step) AS s,
           toInt64(greatest(send_enq - enqueue_ns, 0)) AS w
    FROM
    (
        SELECT group_id, toInt64(rank) AS dst, toInt64(peer) AS src, group_seq, step, enqueue_ns
        FROM collectives WHERE {RUN} AND {{steps}} AND op = 'recv' AND peer >= 0
    ) AS recv_side
    ALL INNER JOIN
    (
        SELECT group_id, toInt64(rank) AS src, toInt64(peer) AS dst, group_seq,
               enqueue_ns AS send_enq
        FROM collectives WHERE {RUN} AND {{send_steps}} AND op = 'send' AND peer >= 0
    ) AS send_side USING (group_id, src, dst, group_seq)
"""

# {{who}}: which rank a wait is charged to (waiter, or holder: the one waited on).
_WAITS = f"""
SELECT {{who}} AS r, s, toFloat64(sum(w)) AS val
FROM
(
{_PAIRS}
) AS waits
GROUP BY r, s
"""

# Both charges in one pass over the pairs: (r, s, waited, waited_on) in ns.
_WAITS_BOTH = f"""
SELECT toInt64(tupleElement(e, 1)) AS r, s, sum(tupleElement(e, 2)) AS waited,
       sum(tupleElement(e, 3)) AS waited_on
FROM
(
    SELECT arrayJoin([(waiter, w, toInt64(0)), (holder, toInt64(0), w)]) AS e, s
    FROM
    (
{_PAIRS}
    ) AS pairs
) AS charged
GROUP BY r, s
"""

INNER_QUERIES = {
    "compute": _COMPUTE,
    "collective": _COLLECTIVE,
    "waited": _WAITS.replace("{who}", "waiter"),
    "waited_on": _WAITS.replace("{who}", "holder"),
}


def _steps(sql: str, lo: str, hi: str) -> str:
    """``sql`` for the steps from bound parameter ``lo`` to ``hi`` (inclusive); sends
    are looked for one step further either side (a pipeline send and its recv are
    recorded in the same step; the margin keeps a pair that straddles a bin edge)."""
    steps = f"step >= %({lo})s AND step <= %({hi})s"
    around = f"step + 1 >= %({lo})s AND step <= %({hi})s + 1"
    return sql.replace("{send_steps}", around).replace("{steps}", steps)


def inner_query(metric: str, lo: str = "s_lo", hi: str = "s_hi") -> str:
    """The raw-row query of ``metric``: (r, s, val) per rank and step, ns, for the steps
    from bound parameter ``lo`` to ``hi``."""
    return _steps(INNER_QUERIES[metric], lo, hi)


def waits_both(lo: str, hi: str) -> str:
    """(r, s, waited, waited_on) per rank and step (ns) in one pass, for the steps from
    bound parameter ``lo`` to ``hi``."""
    return _steps(_WAITS_BOTH, lo, hi)
