"""Per rank and step, the heatmap's metrics computed once from the raw rows and kept in
the store (table ``rank_step_summary``), so the UI's heatmap reads about one row per rank
and step instead of the tens of phase and collective rows behind it.

The analyzer makes it when it saves a run's findings (``analyze(save=True)``, ``ranksight
report --save``); readers (the UI) only read it. The raw queries are the heatmap's own
(:mod:`ranksight.analyzer.metrics_sql`): the metrics are the same numbers.

Steps are summarized once *settled*: every rank has recorded a later step (a running
run), or all of them (a run whose stored status is no longer ``running``). A page reads
settled steps from the summary and the steps after them from the raw rows, so a running
job's newest steps show at once and each new settled step is summarized once, at the next
save (``ensure``). The summary is written in segments of its own (chdb: new immutable
Parquet segments; readers of a run being written are not disturbed). Two savers that
summarize the same steps at once store them twice; reads take one row per rank and step
(``any``), so the numbers do not change.

A store without the table (an older schema, not migrated), one the analyzer may not write
(a read-only user) or a run never analyzed with ``save`` is read from the raw rows.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd

from ranksight.ground.sql import RUN
from ranksight.store import Store, StoreError

from .metrics_sql import inner_query, waits_both

TABLE = "rank_step_summary"

BITS = {"compute": 1, "collective": 2, "waited": 4, "waited_on": 8, "step": 16}
"""Metric -> its bit in ``has`` (set: the rank had raw rows for it in that step)."""

COLUMNS = {
    "compute": "compute_ns",
    "collective": "collective_ns",
    "waited": "waited_ns",
    "waited_on": "waited_on_ns",
    "step": "step_ns",
}
"""Metric -> its column in the summary table."""

RANK_STEPS_PER_CHUNK = 262_144
"""Rank-steps summarized per query round (1,024 ranks: 256 steps): bounds the memory of
the join behind the wait metrics."""

STEPS = "step >= %(b_lo)s AND step <= %(b_hi)s"

# How far the summary goes, and how far it may go: each rank's last step.
STATE = f"""
SELECT min(last) AS settled_running, max(last) AS last_step, count() AS n_ranks,
       toInt64(ifNull((SELECT max(step) FROM {TABLE} WHERE {RUN}), -1)) AS covered,
       toInt64(ifNull((SELECT count() FROM {TABLE} WHERE {RUN}), 0)) AS n_rows,
       toInt64(ifNull((SELECT min(step) FROM steps WHERE {RUN}), 0)) AS first_step
FROM
(
    SELECT rank, max(step) AS last FROM steps WHERE {RUN} GROUP BY rank
) AS per_rank
"""

COVERAGE = f"SELECT count() AS n_rows, max(step) AS covered FROM {TABLE} WHERE {RUN}"

STEP_TIME = f"""
SELECT toInt64(rank) AS r, toInt64(step) AS s, toInt64(sum(end_ns - start_ns)) AS val
FROM steps WHERE {RUN} AND {{steps}}
GROUP BY rank, step
"""

_locks: dict[tuple, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(store: Store, run_id: str, attempt: int) -> threading.Lock:
    """One lock per store and run attempt in this process: one summarizer at a time."""
    key = (getattr(store, "url", id(store)), run_id, attempt)
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def settled_step(state: dict, running: bool) -> int:
    """The last step to summarize: every rank's last recorded step for a finished run,
    the step before the slowest rank's last one while it runs (-1: none)."""
    if not state["n_ranks"]:
        return -1
    return int(state["last_step"] if not running else state["settled_running"] - 1)


def read_state(store: Store, run_id: str, attempt: int) -> dict:
    """``{settled_running, last_step, n_ranks, covered, n_rows, first_step}`` (covered:
    the last summarized step, -1 if none). Raises StoreError (e.g. no summary table)."""
    got = store.query(STATE, {"run_id": run_id, "attempt": attempt})
    state = {k: int(got[k].iloc[0] or 0) for k in got.columns}
    if not state["n_rows"]:  # max() of no rows reads 0 on some engines
        state["covered"] = -1
    return state


def covered_step(store: Store, run_id: str, attempt: int) -> int | None:
    """The last step the stored summary covers (-1: none yet), None if the store has no
    summary table (or it cannot be read). One small query; never writes."""
    try:
        got = store.query(COVERAGE, {"run_id": run_id, "attempt": attempt})
    except StoreError:
        return None
    return int(got["covered"].iloc[0]) if int(got["n_rows"].iloc[0]) else -1


def ensure(
    store: Store,
    run_id: str,
    attempt: int,
    *,
    running: bool,
    last_step: int | None = None,
) -> int | None:
    """Summarize the run attempt's settled steps not yet in the store (``running``: its
    stored status is ``running``, so only steps every rank has moved past); returns the
    last step the summary covers (-1: none yet), or None if the store has no summary
    table. A store that refuses the write (read-only) keeps what it had. ``last_step``:
    the run's last recorded step, if known: a run no longer running whose summary reaches
    it costs one small query. Raises StoreError if the raw rows cannot be read."""
    with _lock(store, run_id, attempt):
        try:
            if last_step is not None and not running:
                got = covered_step(store, run_id, attempt)
                if got is not None and got >= last_step:
                    return got
            state = read_state(store, run_id, attempt)
        except StoreError:
            return None
        covered, target = state["covered"], settled_step(state, running)
        lo = max(covered + 1, state["first_step"])
        if target < lo:
            return covered
        per_chunk = max(1, RANK_STEPS_PER_CHUNK // max(1, state["n_ranks"]))
        for b_lo in range(lo, target + 1, per_chunk):
            b_hi = min(target, b_lo + per_chunk - 1)
            rows = summarize(store, run_id, attempt, b_lo, b_hi)
            try:
                if not rows.empty:
                    store.insert(TABLE, rows)
            except StoreError:
                return covered
            covered = b_hi
        return covered


def summarize(store: Store, run_id: str, attempt: int, b_lo: int, b_hi: int) -> pd.DataFrame:
    """The summary rows of steps ``b_lo..b_hi`` (inclusive) from the raw rows: one per
    rank and step that has any, columns as the ``rank_step_summary`` table. Raises
    StoreError."""
    params = {"run_id": run_id, "attempt": attempt, "b_lo": b_lo, "b_hi": b_hi}
    parts = {
        "compute": store.query(inner_query("compute", "b_lo", "b_hi"), params),
        "collective": store.query(inner_query("collective", "b_lo", "b_hi"), params),
        "step": store.query(STEP_TIME.format(steps=STEPS), params),
    }
    waits = store.query(waits_both("b_lo", "b_hi"), params)
    parts["waited"] = waits[["r", "s", "waited"]].rename(columns={"waited": "val"})
    parts["waited_on"] = waits[["r", "s", "waited_on"]].rename(columns={"waited_on": "val"})
    return _combine(run_id, attempt, parts)


def _combine(run_id: str, attempt: int, parts: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (rank, step) of any part, each metric's column and bit from its part."""
    frames = [p[["r", "s"]] for p in parts.values() if not p.empty]
    if not frames:
        return pd.DataFrame(columns=["rank", "step"])
    keys = pd.concat(frames).drop_duplicates().reset_index(drop=True)
    index = pd.MultiIndex.from_frame(keys.astype("int64"))
    out = pd.DataFrame({"rank": keys["r"].to_numpy(), "step": keys["s"].to_numpy()})
    has = np.zeros(len(keys), dtype=np.uint8)
    for metric, column in COLUMNS.items():
        part = parts.get(metric)
        values = np.zeros(len(keys), dtype=np.int64)
        if part is not None and not part.empty:
            at = index.get_indexer(pd.MultiIndex.from_frame(part[["r", "s"]].astype("int64")))
            values[at] = np.rint(part["val"].to_numpy(float)).astype(np.int64)
            has[at] |= BITS[metric]
        out[column] = values
    out["has"] = has
    out["run_id"], out["attempt"], out["built_ns"] = run_id, attempt, time.time_ns()
    return out
