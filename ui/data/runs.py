"""The Runs page's table: every run with its status, mesh, steps, step time, findings.

Status is one of ``running``, ``finished``, ``hung``, ``crashed``, ``stopped``: the run
row's status (the trainer writes ``running`` at start, ``finished`` at a clean end, the
demo ``failed`` when the job dies) refined by progress: a run with a stored ``hang``
finding, or a ``running`` run whose steps stopped advancing for ``hang_after_s`` and 20
median steps while it still reports (progress snapshots), is ``hung``; a ``running``
run from which nothing at all (no step, no snapshot, no run row update) came for
``stopped_after_s`` is ``stopped``: it ended with no end recorded (killed, its node
gone, its agent stopped), or it is cut off from the store.
"""

from __future__ import annotations

import time

import pandas as pd

from ranksight.store import Store

STATUSES = ("running", "finished", "hung", "crashed", "stopped")

# run_id filter: a LIKE pattern bound as a parameter ('%' matches every run).
RUNS = """
SELECT run_id, attempt,
       min(created_ns) AS created, max(updated_ns) AS updated,
       argMax(status, updated_ns) AS last_status, max(world_size) AS world,
       max(dp) AS dp_size, max(tp) AS tp_size, max(pp) AS pp_size
FROM runs
WHERE lower(run_id) LIKE %(pattern)s
GROUP BY run_id, attempt
ORDER BY created DESC
LIMIT %(limit)s
"""

# Per run: steps seen, last step end, and the median over steps of the step's wall time
# (first start to last end over all ranks).
STEP_STATS = """
SELECT run_id, attempt, count() AS n_steps, max(step) + 1 AS steps, max(wall_end) AS last_end,
       median(wall_end - wall_start) AS median_step_ns
FROM
(
    SELECT run_id, attempt, step, min(start_ns) AS wall_start, max(end_ns) AS wall_end
    FROM steps
    WHERE lower(run_id) LIKE %(pattern)s
    GROUP BY run_id, attempt, step
) AS per_step
GROUP BY run_id, attempt
"""

# Per run: its newest progress snapshot (a hung job's hooks go on writing them).
NEWEST_SNAPSHOT = """
SELECT run_id, attempt, max(ts_ns) AS newest_snapshot
FROM progress
WHERE lower(run_id) LIKE %(pattern)s
GROUP BY run_id, attempt
"""

FINDING_COUNTS = """
SELECT run_id, attempt, analyzed_ns, count() AS n_findings, countIf(kind = 'hang') AS n_hangs
FROM findings
WHERE lower(run_id) LIKE %(pattern)s
GROUP BY run_id, attempt, analyzed_ns
"""


def like_pattern(search: str) -> str:
    """A LIKE pattern matching run ids that contain ``search`` (case-insensitive; ``%``,
    ``_`` and ``\\`` in it match themselves)."""
    escaped = search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def run_status(
    stored: str,
    last_progress_ns: int,
    median_step_ns: float,
    hang_findings: int,
    now_ns: int,
    hang_after_s: float,
    *,
    last_record_ns: int = 0,
    stopped_after_s: float | None = None,
) -> str:
    """One of :data:`STATUSES` for a run whose row says ``stored`` (see the module doc).
    Times in ns; ``last_progress_ns`` (last step end or run row update) 0 means no
    progress recorded; ``last_record_ns`` is the newest record of any kind (also
    progress snapshots), judged against ``stopped_after_s`` (None: never stopped)."""
    if hang_findings:  # also a run that ended hung: an import of a hang's dumps, a job
        return "hung"  # torn down by NCCL's watchdog (a crash the hang caused is folded in)
    if stored == "failed":
        return "crashed"
    if stored != "running":
        return "finished" if stored == "finished" else stored
    if stopped_reporting(max(last_record_ns, last_progress_ns), now_ns, stopped_after_s):
        return "stopped"
    quiet_ns = max(hang_after_s * 1e9, 20.0 * (median_step_ns or 0.0))
    if last_progress_ns and now_ns - last_progress_ns > quiet_ns:
        return "hung"
    return "running"


def stopped_reporting(last_record_ns: int, now_ns: int, after_s: float | None) -> bool:
    """Whether a run whose newest record is at ``last_record_ns`` (ns; 0: none) has
    been silent for more than ``after_s`` seconds at ``now_ns`` (None: never)."""
    return bool(after_s is not None and last_record_ns and now_ns - last_record_ns > after_s * 1e9)


def run_list(store: Store, limit: int = 500) -> pd.DataFrame:
    """The runs the sidebar offers, newest first (at most ``limit``): run_id, attempt,
    started_ns, stored_status (the run row's own status). Reads only the ``runs`` table,
    so it stays cheap however many steps the store holds. Raises StoreError."""
    got = store.query(RUNS, {"pattern": "%", "limit": int(limit)})
    return pd.DataFrame(
        {
            "run_id": got["run_id"].astype(str),
            "attempt": got["attempt"].astype(int),
            "started_ns": got["created"].astype("int64"),
            "stored_status": got["last_status"].astype(str),
        }
    )


def _latest_counts(counts: pd.DataFrame) -> pd.DataFrame:
    """Findings and hang counts of each run attempt's latest analysis."""
    if counts.empty:
        return pd.DataFrame(columns=["run_id", "attempt", "n_findings", "n_hangs"])
    latest = counts.sort_values("analyzed_ns").groupby(["run_id", "attempt"]).tail(1)
    return latest[["run_id", "attempt", "n_findings", "n_hangs"]]


def runs_table(
    store: Store,
    search: str = "",
    *,
    hang_after_s: float = 300.0,
    stopped_after_s: float | None = 300.0,
    limit: int = 500,
    now_ns: int | None = None,
) -> pd.DataFrame:
    """Runs whose id contains ``search``, newest first (at most ``limit``), one row per
    attempt: run_id, attempt, started_ns, status, world_size, dp, tp, pp, steps,
    step_ms (median wall time per step), findings (of the latest analysis; 0 if none).
    Raises StoreError."""
    p = {"pattern": like_pattern(search), "limit": int(limit)}
    runs = store.query(RUNS, p)
    if runs.empty:
        return pd.DataFrame(columns=list(_COLUMNS))
    keys = ["run_id", "attempt"]
    frame = runs.merge(store.query(STEP_STATS, p), on=keys, how="left")
    frame = frame.merge(_latest_counts(store.query(FINDING_COUNTS, p)), on=keys, how="left")
    frame = frame.merge(store.query(NEWEST_SNAPSHOT, p), on=keys, how="left")
    now = now_ns or time.time_ns()
    frame["status"] = [
        run_status(
            r.last_status,
            int(max(_num(r.last_end), _num(r.updated))),
            _num(r.median_step_ns),
            int(_num(r.n_hangs)),
            now,
            hang_after_s,
            last_record_ns=int(_num(r.newest_snapshot)),
            stopped_after_s=stopped_after_s,
        )
        for r in frame.itertuples()
    ]
    return _shape(frame)


_COLUMNS = {
    "run_id": "run_id",
    "attempt": "attempt",
    "created": "started_ns",
    "status": "status",
    "world": "world_size",
    "dp_size": "dp",
    "tp_size": "tp",
    "pp_size": "pp",
    "steps": "steps",
    "step_ms": "step_ms",
    "n_findings": "findings",
}


def _num(v) -> float:
    """A number from a merged cell (NaN where the run had no such rows -> 0)."""
    return 0.0 if v is None or v != v else float(v)


def _shape(frame: pd.DataFrame) -> pd.DataFrame:
    """Output columns and types of :func:`runs_table`."""
    frame = frame.copy()
    frame["step_ms"] = (frame["median_step_ns"].astype(float) / 1e6).round(1)
    frame["steps"] = frame["steps"].fillna(0).astype(int)
    frame["n_findings"] = frame["n_findings"].fillna(0).astype(int)
    return frame[list(_COLUMNS)].rename(columns=_COLUMNS).reset_index(drop=True)
