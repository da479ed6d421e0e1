"""Aggregated stacks: each rank's latest stack dump, identical stacks grouped with
their rank lists (the odd group out first: in a hang it holds the suspects)."""

from __future__ import annotations

import pandas as pd

from ranksight.store import Store, StoreError

from .run import RUN, RunView

AGGREGATED = f"""
SELECT latest AS stack, arraySort(groupArray(rank)) AS rank_list, count() AS n_ranks,
       max(dumped) AS last_dump_ns
FROM
(
    SELECT rank, argMax(summary, ts_ns) AS latest, max(ts_ns) AS dumped
    FROM stacks WHERE {RUN} AND ok = 1
    GROUP BY rank
) AS per_rank
GROUP BY latest
ORDER BY n_ranks ASC, last_dump_ns DESC
"""


def missing_table(exc: StoreError) -> bool:
    """Whether a store error says a table does not exist (a store made before the
    collector tables; the chdb store reads missing tables as empty)."""
    text = str(exc).lower()
    return "doesn't exist" in text or "unknown_table" in text or "does not exist" in text


def aggregated_stacks(store: Store, run: RunView) -> pd.DataFrame | None:
    """Groups of identical latest stacks: stack (one line per thread), ranks ("3,7"),
    n_ranks; fewest ranks first. None if the store has no ``stacks`` table.
    Raises StoreError for other failures."""
    try:
        got = store.query(AGGREGATED, run.params)
    except StoreError as exc:
        if missing_table(exc):
            return None
        raise
    got["ranks"] = got["rank_list"].map(lambda rs: ",".join(str(int(r)) for r in rs))
    return got[["stack", "ranks", "n_ranks", "last_dump_ns"]]
