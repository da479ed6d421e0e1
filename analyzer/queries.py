"""The analyzer's SQL: heavy aggregation pushed down into the store.

Every query runs unchanged on ClickHouse 18.16 and current ClickHouse (chdb): explicit
``ALL INNER JOIN ... USING`` between subqueries (18.16 needs the strictness word and
knows no table aliases in joins), no CTEs, no window functions, values only as bound
``%(name)s`` parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from ranksight.ground.sql import RUN as _RUN
from ranksight.store import Store, StoreError

from . import causes, gpu_causes, links
from .detectors import crash, desync, hang, slow_comm
from .straggler import COMPUTE_PHASES, DATA_PHASES
from .waits import fetch_waits
from .whatif import slice as slice_replay

# Aggregates never reuse the name of a column they read (an alias is visible to the whole
# query on both dialects); frames are renamed to the column names after the query.
_RENAMES = {
    "created": "created_ns",
    "updated": "updated_ns",
    "last_status": "status",
    "world": "world_size",
    "dp_size": "dp",
    "tp_size": "tp",
    "pp_size": "pp",
    "meta": "meta_json",
    "step_start": "start_ns",
    "step_end": "end_ns",
    "step_loss": "loss",
    "step_tokens": "tokens",
    "dur_sum": "dur_ns",
    "wait_sum": "wait_ns",
    "self_sum": "self_ns",
    "stage_index": "stage",
}


def _query(store: Store, sql: str, params: dict | None = None) -> pd.DataFrame:
    frame = store.query(sql, params)
    return frame.rename(columns={k: v for k, v in _RENAMES.items() if k in frame.columns})


RUNS = """
SELECT run_id, attempt,
       min(created_ns) AS created, max(updated_ns) AS updated,
       argMax(status, updated_ns) AS last_status, max(world_size) AS world,
       max(dp) AS dp_size, max(tp) AS tp_size, max(pp) AS pp_size,
       argMax(meta_json, length(meta_json)) AS meta
FROM runs
GROUP BY run_id, attempt
ORDER BY created DESC
"""

RUN_STEP_COUNTS = """
SELECT run_id, attempt, max(step) + 1 AS steps, uniqExact(rank) AS ranks_seen,
       min(start_ns) AS first_ns, max(end_ns) AS last_ns
FROM steps
GROUP BY run_id, attempt
"""

RANKS = f"""
SELECT rank, any(host) AS host, any(local_rank) AS local_rank, any(pid) AS pid,
       any(device) AS device, any(backend) AS backend, max(world_size) AS world_size,
       any(dp) AS dp, any(tp) AS tp, any(pp) AS pp
FROM ranks WHERE {_RUN}
GROUP BY rank ORDER BY rank
"""

STEPS = f"""
SELECT rank, step, min(start_ns) AS step_start, max(end_ns) AS step_end,
       any(loss) AS step_loss, any(tokens) AS step_tokens
FROM steps WHERE {_RUN}
GROUP BY rank, step ORDER BY step, rank
"""

PHASES = f"""
SELECT rank, step, phase, count() AS n, sum(end_ns - start_ns) AS dur_sum,
       sum(wait_ns) AS wait_sum, sum(end_ns - start_ns - wait_ns) AS self_sum,
       max(stage) AS stage_index
FROM phases WHERE {_RUN}
GROUP BY rank, step, phase ORDER BY step, rank, phase
"""

PHASE_TOTALS = f"""
SELECT rank, step,
       sumIf(end_ns - start_ns - wait_ns, phase IN %(compute)s) AS compute_self,
       sumIf(end_ns - start_ns - wait_ns, phase IN %(data)s) AS data_self,
       sumIf(end_ns - start_ns - wait_ns, phase = 'gc') AS gc_self
FROM phases WHERE {_RUN}
GROUP BY rank, step
"""
"""One row per (rank, step): the straggler and transient-straggler tests' inputs, pivoted in
the store (a quarter of the rows of PHASES at 16k ranks). ``gc_self``: GC pause time (the
hooks' ``gc`` phase), which also lies inside the compute phase it interrupted."""

PHASES_OF = f"""
SELECT rank, step, phase, count() AS n, sum(end_ns - start_ns) AS dur_sum,
       sum(wait_ns) AS wait_sum, sum(end_ns - start_ns - wait_ns) AS self_sum,
       max(stage) AS stage_index
FROM phases WHERE {_RUN} AND rank IN %(ranks)s
GROUP BY rank, step, phase ORDER BY step, rank, phase
"""
"""PHASES for a few ranks (a suspect and its peers): the evidence of a finding."""

GROUPS = f"""
SELECT group_id, any(group_ranks) AS group_ranks, count() AS n, any(op) AS op
FROM collectives WHERE {_RUN}
GROUP BY group_id
"""

STACKS = f"""
SELECT rank, argMax(summary, ts_ns) AS stack_summary
FROM stacks WHERE {_RUN} AND ok = 1
GROUP BY rank ORDER BY rank
"""

LOG_EVENTS = f"""
SELECT kind, rank, local_rank, group_rank, host, pid, file, line, pg, pg_name, seq, op,
       numel_in, numel_out, enqueued, completed, peer, code, detail, count, text
FROM log_events WHERE {_RUN}
ORDER BY file, line
"""
"""What an imported job's text logs said (``analyzer/log_evidence`` reads it)."""

OPS_PHASES = f"""
SELECT rank, step, phase, microbatch, stage, start_ns, end_ns, wait_ns
FROM phases WHERE {_RUN}
"""

OPS_COLLECTIVES = f"""
SELECT rank, step, group_id, group_ranks, group_seq, op, peer, enqueue_ns, start_ns, end_ns
FROM collectives WHERE {_RUN}
"""

FINDINGS = f"""
SELECT * FROM findings
WHERE {_RUN}
  AND analyzed_ns = (SELECT max(analyzed_ns) FROM findings
                     WHERE {_RUN})
ORDER BY finding_id
"""


@dataclass(frozen=True)
class RunData:
    """Everything the analyzer reads for one run attempt (frames as the queries above;
    ``progress`` as ``hang.LATEST``)."""

    run_id: str
    attempt: int
    run: dict
    ranks: pd.DataFrame
    steps: pd.DataFrame
    phases: pd.DataFrame
    arrivals: pd.DataFrame
    p2p: pd.DataFrame
    groups: pd.DataFrame
    progress: pd.DataFrame = field(default_factory=pd.DataFrame)
    transfer: pd.DataFrame = field(default_factory=pd.DataFrame)
    mismatches: pd.DataFrame = field(default_factory=pd.DataFrame)
    phase_totals: pd.DataFrame = field(default_factory=pd.DataFrame)
    """rank, step, compute_self, data_self (ns; ``PHASE_TOTALS``). Empty: derive them from
    ``phases``."""
    fetch_phases: Callable[[list[int]], pd.DataFrame] | None = None
    """Loads ``PHASES`` rows for the given ranks; None: ``phases`` holds every rank's."""
    procs: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per-rank process samples (``causes.PROCS`` columns) where given up front."""
    fetch_procs: Callable[[list[int], int], pd.DataFrame] | None = None
    """Loads ``causes.PROCS`` for the given ranks since a time (ns); None: use ``procs``."""
    stacks: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Each rank's latest good stack dump: rank, stack_summary (``STACKS``)."""
    usual: pd.DataFrame = field(default_factory=pd.DataFrame)
    """How often each signature occurs in the mismatched groups (``desync.USUAL``)."""
    fetch_links: Callable[[list[str], int, int], dict] | None = None
    """NIC and NVLink counters of some hosts in a time window (``links.link_counters``);
    None: no collector tables to read."""
    ends: pd.DataFrame = field(default_factory=pd.DataFrame)
    """How ranks ended (``crash.ENDS``: rank_ends rows from the hooks and the launcher)."""
    crash_stacks: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Python stacks written on a fatal signal: rank, crash_stack (``crash.CRASH_STACKS``)."""
    log_events: pd.DataFrame = field(default_factory=pd.DataFrame)
    """What an imported job's text logs said (``LOG_EVENTS``); empty for a hooked run."""
    fetch_ops: Callable[[], tuple[pd.DataFrame, pd.DataFrame]] | None = None
    """Loads the raw ``(phases, collectives)`` rows for the what-if replay (``whatif/engine.py``);
    None where not available."""
    fetch_waits: Callable[[list[int]], tuple[pd.DataFrame, pd.DataFrame]] | None = None
    """Loads ``(arrivals, p2p)`` for the given holder ranks from the store; None: the
    frames above already hold every rank's."""
    fetch_gpu: Callable[[pd.DataFrame, list[int], int, int], gpu_causes.GpuTables] | None = None
    """Loads the NVML tables (``gpu_causes.fetch_gpu_tables``) for some ranks (ranks
    frame, ranks, since ns, until ns); None: no GPU tables to read."""
    fetch_slice: Callable[..., slice_replay.SliceTables] | None = None
    """Loads one pipeline slice's rows for the bounded what-if replay
    (``slice_replay.fetch_slice_tables``: ranks, groups, steps, peers); None: none."""

    def phases_of(self, ranks: list[int]) -> pd.DataFrame:
        """PHASES rows (rank, step, phase, n, dur_ns, wait_ns, self_ns, stage) of ``ranks``."""
        if self.fetch_phases is not None:
            return self.fetch_phases(ranks)
        return (
            self.phases[self.phases["rank"].isin(ranks)] if not self.phases.empty else self.phases
        )

    def waits_for(self, holders: list[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Arrival rows of the groups the ``holders`` belong to, and P2P waits on them."""
        if self.fetch_waits is not None:
            return self.fetch_waits(holders)
        a, p = self.arrivals, self.p2p
        if not a.empty:
            groups = set(a.loc[a["rank"].isin(holders), "group_id"])
            a = a[a["group_id"].isin(groups)]
        if not p.empty:
            p = p[p["peer"].isin(holders)]
        return a, p


class UnknownRun(StoreError):
    """The run id (or attempt) is not in the store."""


def list_runs(store: Store) -> pd.DataFrame:
    """Runs in the store, newest first, with step counts where steps were recorded."""
    runs = _query(store, RUNS)
    counts = _query(store, RUN_STEP_COUNTS)
    if runs.empty:
        return runs
    return runs.merge(counts, on=["run_id", "attempt"], how="left")


def resolve_attempt(store: Store, run_id: str, attempt: int | None) -> tuple[dict, int]:
    """The run's row and attempt (the latest when ``attempt`` is None).
    Raises UnknownRun naming the run id and the runs that do exist."""
    runs = _query(store, RUNS)
    mine = runs[runs["run_id"] == run_id]
    if attempt is not None:
        mine = mine[mine["attempt"] == attempt]
    if mine.empty:
        known = ", ".join(runs["run_id"].head(5)) or "none"
        what = run_id if attempt is None else f"{run_id} attempt {attempt}"
        raise UnknownRun(f"unknown run {what!r} (recent runs: {known}); see 'ranksight runs'")
    row = mine.sort_values("attempt").iloc[-1].to_dict()
    return row, int(row["attempt"])


def load_run(store: Store, run_id: str, attempt: int | None = None) -> RunData:
    """Run the pushdown queries for one run attempt. Raises UnknownRun or StoreError."""
    run, attempt = resolve_attempt(store, run_id, attempt)
    p = {"run_id": run_id, "attempt": attempt}
    steps = _query(store, STEPS, p)
    bucket = max(1, int(steps["step"].max() + 1) // 10) if not steps.empty else 1
    transfer = _query(store, slow_comm.TRANSFER, p)
    odd = (
        sorted(transfer.loc[transfer["mismatched"] > 0, "group_id"].unique())
        if not transfer.empty
        else []
    )
    mismatches = (
        _query(store, desync.MISMATCHES, {**p, "groups": tuple(odd)}) if odd else pd.DataFrame()
    )
    transfer = transfer[transfer["instances"] > 0] if not transfer.empty else transfer
    usual = (
        _query(store, desync.USUAL, {**p, "groups": tuple(mismatches["group_id"].unique())})
        if not mismatches.empty
        else pd.DataFrame()
    )
    return RunData(
        run_id=run_id,
        attempt=attempt,
        run=run,
        ranks=_query(store, RANKS, p),
        steps=steps,
        phases=pd.DataFrame(),
        phase_totals=_query(
            store, PHASE_TOTALS, {**p, "compute": COMPUTE_PHASES, "data": DATA_PHASES}
        ),
        fetch_phases=lambda ranks: _query(
            store, PHASES_OF, {**p, "ranks": tuple(int(r) for r in ranks) or (-1,)}
        ),
        arrivals=pd.DataFrame(),
        p2p=pd.DataFrame(),
        groups=_query(store, GROUPS, p),
        progress=_query(store, hang.LATEST, p),
        transfer=pd.concat(
            [transfer, _query(store, slow_comm.TRANSFER_P2P, {**p, "bucket": bucket})],
            ignore_index=True,
        ),
        fetch_waits=lambda holders: fetch_waits(lambda sql, q: _query(store, sql, q), p, holders),
        mismatches=mismatches,
        usual=usual,
        fetch_procs=lambda ranks, since_ns: _optional(
            store,
            causes.PROCS,
            {**p, "ranks": tuple(int(r) for r in ranks) or (-1,), "since_ns": int(since_ns)},
        ),
        stacks=_stacks(store, p),
        ends=_optional(store, crash.ENDS, p),
        fetch_links=lambda hosts, t0, t1: links.link_counters(
            lambda sql, q: _optional(store, sql, q), hosts, t0, t1
        ),
        crash_stacks=_optional(store, crash.CRASH_STACKS, p),
        log_events=_optional(store, LOG_EVENTS, p),
        fetch_ops=lambda: (_query(store, OPS_PHASES, p), _query(store, OPS_COLLECTIVES, p)),
        fetch_gpu=lambda ranks, wanted, since, until: gpu_causes.fetch_gpu_tables(
            lambda sql, q: _optional(store, sql, q), p, ranks, wanted, since, until
        ),
        fetch_slice=lambda ranks, groups, steps, peers: slice_replay.fetch_slice_tables(
            lambda sql, q: _query(store, sql, q), p, ranks, groups, steps, peers
        ),
    )


def _optional(store: Store, sql: str, params: dict) -> pd.DataFrame:
    """``sql``'s rows, or an empty frame for a store made before the table it reads."""
    try:
        return _query(store, sql, params)
    except StoreError:
        return pd.DataFrame()


def _stacks(store: Store, params: dict) -> pd.DataFrame:
    """STACKS, or an empty frame for a store made before the ``stacks`` table."""
    try:
        return _query(store, STACKS, params)
    except StoreError:
        return pd.DataFrame(columns=["rank", "stack_summary"])


def load_findings(store: Store, run_id: str, attempt: int) -> pd.DataFrame:
    """The latest analysis' findings for a run attempt (empty if never analyzed)."""
    return _query(store, FINDINGS, {"run_id": run_id, "attempt": attempt})
