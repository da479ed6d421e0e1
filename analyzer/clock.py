"""Cross-rank clock alignment, measured rather than assumed.

Every rank stamps times with its own host's realtime clock. The members of one
collective all finish within microseconds of each other (the op completes when the last
member's data arrives), so a rank whose completion times sit consistently before or after
its group's median completion has a clock offset. Per rank: the median of (own end - the
instance's median end) over recent collectives is the offset estimate; half the
interquartile range of that deviation is its uncertainty. On one host both come out at the
completion jitter of the backend's threads (tens of microseconds), the floor of what can
be aligned.
"""

from __future__ import annotations

import pandas as pd

from ranksight.ground.sql import RUN as _RUN

OFFSETS = f"""
SELECT rank, quantileExact(0.5)(d) AS offset_ns, quantileExact(0.25)(d) AS q25_ns,
       quantileExact(0.75)(d) AS q75_ns, count() AS samples
FROM
(
    SELECT rank, toInt64(end_ns) - toInt64(med_end) AS d
    FROM
    (
        SELECT rank, group_id, group_seq, end_ns
        FROM collectives WHERE {_RUN}
          AND peer = -1 AND end_ns > 0 AND step >= %(since_step)s
    ) AS member
    ALL INNER JOIN
    (
        SELECT group_id, group_seq, quantileExact(0.5)(end_ns) AS med_end, count() AS n
        FROM collectives WHERE {_RUN}
          AND peer = -1 AND end_ns > 0 AND step >= %(since_step)s
        GROUP BY group_id, group_seq
        HAVING n > 1
    ) AS instance USING (group_id, group_seq)
)
GROUP BY rank
ORDER BY rank
"""
"""Per rank over the collectives from ``since_step`` on: the median deviation of its
completion from its group's median completion (the offset, ns), the quartiles of that
deviation (half their distance is the uncertainty), and the number of collectives."""


def summarize(offsets: pd.DataFrame) -> dict:
    """The alignment in one line's numbers: worst |offset| and median uncertainty (µs)."""
    if offsets.empty:
        return {"ranks": 0}
    return {
        "ranks": int(len(offsets)),
        "max_abs_offset_us": round(float(offsets["offset_ns"].abs().max()) / 1e3, 1),
        "median_uncertainty_us": round(
            float(((offsets["q75_ns"] - offsets["q25_ns"]) / 2).median()) / 1e3, 1
        ),
        "samples_per_rank": int(offsets["samples"].median()),
    }


def offset_rows(offsets: pd.DataFrame, run_id: str, attempt: int, analyzed_ns: int) -> pd.DataFrame:
    """The ``clock_offsets`` table rows for an OFFSETS frame."""
    return pd.DataFrame({
        "run_id": run_id, "attempt": attempt, "analyzed_ns": analyzed_ns,
        "rank": offsets["rank"].astype("uint32"),
        "offset_ns": offsets["offset_ns"].astype("int64"),
        "uncertainty_ns": ((offsets["q75_ns"] - offsets["q25_ns"]) / 2).astype("int64"),
        "samples": offsets["samples"].astype("uint64"),
    })  # fmt: skip
