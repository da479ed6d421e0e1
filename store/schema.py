"""The store's tables: one definition, used by both backends.

Every time is int64 nanoseconds since the Unix epoch on the host's realtime clock
(``time.time_ns()``). Types stay inside what ClickHouse 18.16 (Debian) and current
ClickHouse (chdb 26.x) both accept: no DateTime64, Map, Bool, LowCardinality, TTL or
CODEC. A ``DateTime`` column for partitioning is MATERIALIZED from the nanosecond times
on the server and never sent by writers.

Bump :data:`SCHEMA_VERSION` whenever a table or column changes.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 1
"""Version of the table layout below; stored in the ``schema_version`` table."""


@dataclass(frozen=True, slots=True)
class Table:
    """One table: its columns as ``(name, ClickHouse type)``, its sort key and the
    column its ``DateTime`` partition column is derived from (``None``: unpartitioned)."""

    name: str
    columns: tuple[tuple[str, str], ...]
    order_by: tuple[str, ...]
    time_column: str | None = None
    engine: str = "MergeTree()"

    @property
    def column_names(self) -> list[str]:
        """Column names in declaration order."""
        return [c for c, _ in self.columns]

    def type_of(self, column: str) -> str:
        """ClickHouse type of ``column``; raises KeyError naming the table if unknown."""
        for name, ch_type in self.columns:
            if name == column:
                return ch_type
        raise KeyError(f"table {self.name!r} has no column {column!r}")


_RUN = (("run_id", "String"), ("attempt", "UInt32"))

RUNS = Table(
    "runs",
    _RUN
    + (
        ("created_ns", "Int64"),
        ("updated_ns", "Int64"),
        ("status", "String"),  # running | finished | failed
        ("world_size", "UInt32"),
        ("dp", "UInt32"),
        ("tp", "UInt32"),
        ("pp", "UInt32"),
        ("meta_json", "String"),  # launch config and injected-fault ground truth
    ),
    order_by=("run_id", "attempt", "updated_ns"),
    time_column="created_ns",
)

RANKS = Table(
    "ranks",
    _RUN
    + (
        ("rank", "UInt32"),
        ("world_size", "UInt32"),
        ("host", "String"),
        ("local_rank", "UInt32"),
        ("pid", "UInt32"),
        ("device", "String"),  # "cpu", or the GPU UUID where known
        ("backend", "String"),
        ("dp", "Int32"),
        ("tp", "Int32"),
        ("pp", "Int32"),
        ("start_ns", "Int64"),
    ),
    order_by=("run_id", "attempt", "rank"),
    time_column="start_ns",
)

STEPS = Table(
    "steps",
    _RUN
    + (
        ("rank", "UInt32"),
        ("step", "UInt32"),
        ("start_ns", "Int64"),
        ("end_ns", "Int64"),
        ("loss", "Float64"),  # NaN where this rank has no loss (non-last pipeline stage)
        ("tokens", "UInt64"),
        ("lr", "Float64"),
        ("rss_bytes", "UInt64"),
    ),
    order_by=("run_id", "attempt", "step", "rank"),
    time_column="start_ns",
)

PHASES = Table(
    "phases",
    _RUN
    + (
        ("rank", "UInt32"),
        ("step", "UInt32"),
        ("phase", "String"),  # data_wait | forward | backward | optimizer | checkpoint
        ("microbatch", "Int32"),  # -1 where the phase is per step
        ("stage", "Int32"),  # pipeline stage index, -1 if none
        ("start_ns", "Int64"),
        ("end_ns", "Int64"),
        ("wait_ns", "Int64"),  # time blocked waiting on collectives inside the phase
    ),
    order_by=("run_id", "attempt", "step", "rank", "start_ns"),
    time_column="start_ns",
)

COLLECTIVES = Table(
    "collectives",
    _RUN
    + (
        ("rank", "UInt32"),
        ("step", "Int32"),  # -1 outside any step
        ("phase", "String"),  # the phase it was issued in, "" if none
        ("group_id", "String"),  # stable across ranks: member ranks + creation order
        ("group_ranks", "String"),  # comma-separated global ranks
        ("group_seq", "UInt64"),  # per-group count of collectives; P2P: per (peer, direction)
        ("op", "String"),  # all_reduce, all_gather, reduce_scatter, broadcast, send, recv, ...
        ("peer", "Int32"),  # global rank of the P2P peer, -1 for collectives
        ("dtype", "String"),
        ("numel_in", "UInt64"),
        ("numel_out", "UInt64"),
        ("bytes", "UInt64"),
        ("enqueue_ns", "Int64"),  # host time the op was issued
        ("start_ns", "Int64"),  # device start where known, else the issue time
        ("end_ns", "Int64"),  # completion; 0 if it never completed
        ("wait_ns", "Int64"),  # time the issuing thread blocked waiting for it
    ),
    order_by=("run_id", "attempt", "group_id", "group_seq", "rank"),
    time_column="enqueue_ns",
)

HOOK_STATS = Table(
    "hook_stats",
    _RUN
    + (
        ("rank", "UInt32"),
        ("ts_ns", "Int64"),
        ("level", "String"),
        ("records", "UInt64"),  # records handed to the agent so far
        ("dropped", "UInt64"),  # records dropped so far (buffer full, spool over budget)
    ),
    order_by=("run_id", "attempt", "rank", "ts_ns"),
    time_column="ts_ns",
)

FINDINGS = Table(
    "findings",
    _RUN
    + (
        ("analyzed_ns", "Int64"),
        ("finding_id", "UInt32"),  # order within one analysis, by impact
        ("kind", "String"),  # straggler | slow_link | hang | ...
        ("cause", "String"),  # compute | communication | ...
        ("culprit_rank", "Int32"),  # -1 when no single rank
        ("host", "String"),
        ("dp", "Int32"),
        ("tp", "Int32"),
        ("pp", "Int32"),
        ("confidence", "Float64"),  # 0..1
        ("impact_pct", "Float64"),  # how much faster the job runs without it, percent
        ("summary", "String"),
        ("evidence_json", "String"),
    ),
    order_by=("run_id", "attempt", "analyzed_ns", "finding_id"),
    time_column="analyzed_ns",
)

SCHEMA_VERSION_TABLE = Table(
    "schema_version",
    (("version", "UInt32"), ("applied_ns", "Int64")),
    order_by=("version",),
)

TABLES: dict[str, Table] = {
    t.name: t
    for t in (RUNS, RANKS, STEPS, PHASES, COLLECTIVES, HOOK_STATS, FINDINGS, SCHEMA_VERSION_TABLE)
}
"""Every table by name."""

RECORD_TABLES = ("ranks", "steps", "phases", "collectives", "hook_stats")
"""Tables the trainer hooks write records for (through the node agent)."""


def table(name: str) -> Table:
    """The table called ``name``; raises ValueError listing the known tables."""
    try:
        return TABLES[name]
    except KeyError:
        raise ValueError(f"unknown table {name!r}; known: {', '.join(TABLES)}") from None
