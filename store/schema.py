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

SCHEMA_VERSION = 8
"""Version of the table layout below; stored in the ``schema_version`` table.
1: the first tables. 2: ``batch_id`` on the agent-shipped tables; the ``progress``,
``agent_stats``, ``clock_offsets`` and collector tables (added by ``store/migrate.py``).
3: ``rank_ends``; ``proc_samples.run_delay_ns``. 4: ``rank_step_summary``.
5: ``steps.grad_norm``, ``steps.gpu_mem_allocated_bytes``, ``steps.gpu_mem_reserved_bytes``.
6: ``log_events``. 7: ``agent_stats.quarantined``. 8: ``host_pressure``."""


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
_DELIVERY = (("batch_id", "UInt64"),)
"""The node agent's delivery unit (one table's rows of one agent batch, one partition): a
retried insert with the same id is skipped, so nothing is stored twice. 0 for rows written
by anything else (analyzer, demo)."""

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
    )
    + _DELIVERY,
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
    )
    + _DELIVERY,
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
        ("grad_norm", "Float64"),  # as the script reported it; NaN (0 in rows from before) if not
        ("gpu_mem_allocated_bytes", "UInt64"),  # CUDA caching allocator at the step's end; 0 on CPU
        ("gpu_mem_reserved_bytes", "UInt64"),
    )
    + _DELIVERY,
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
    )
    + _DELIVERY,
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
    )
    + _DELIVERY,
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
    )
    + _DELIVERY,
    order_by=("run_id", "attempt", "rank", "ts_ns"),
    time_column="ts_ns",
)

PROGRESS = Table(
    "progress",
    _RUN
    + (
        ("rank", "UInt32"),
        ("ts_ns", "Int64"),  # when the rank's writer thread took this snapshot
        ("step", "Int32"),  # the step the rank is in, -1 between steps
        ("group_id", "String"),
        ("group_ranks", "String"),
        ("direction", "String"),  # "" for collectives; "send" / "recv" for P2P
        ("peer", "Int32"),  # P2P peer's global rank, -1 for collectives
        ("issued_seq", "Int64"),  # highest group_seq issued, -1 if none
        ("completed_seq", "Int64"),  # highest group_seq completed, -1 if none
        ("last_op", "String"),
        ("last_issue_ns", "Int64"),
    )
    + _DELIVERY,
    order_by=("run_id", "attempt", "group_id", "rank", "ts_ns"),
    time_column="ts_ns",
)
"""Per rank, group and P2P direction: how far it has issued and completed, every few
seconds from a thread that keeps running while training is stuck (hang localization)."""

RANK_ENDS = Table(
    "rank_ends",
    _RUN
    + (
        ("rank", "UInt32"),
        ("host", "String"),
        ("pid", "UInt32"),
        ("ts_ns", "Int64"),  # when the end was seen
        ("source", "String"),  # hooks (the rank itself) | launcher (torchrun's summary)
        ("reason", "String"),  # finished | exception | signal | exit | exit_code
        ("code", "Int32"),  # signal number (signal), exit code (exit_code), else -1
        ("detail", "String"),  # exception type and message, signal name, launcher line
        ("last_step", "Int32"),  # the step the rank was in or last began, -1 if none
    )
    + _DELIVERY,
    order_by=("run_id", "attempt", "rank", "ts_ns"),
    time_column="ts_ns",
)
"""How each rank's process ended, as far as anyone saw: the rank's own hooks (a clean
close, an uncaught exception, a SIGTERM from the launcher, interpreter exit) and the
launcher's exit codes. A rank killed outright (SIGKILL, os._exit, a segfault, the OOM
killer) leaves no hooks row: its records simply stop (analyzer/detectors/crash.py)."""

LOG_EVENTS = Table(
    "log_events",
    _RUN
    + (
        ("kind", "String"),  # timeout | status | desync_report | mismatch | child_failed | ...
        ("rank", "Int32"),  # global rank where the line says it, else -1
        ("local_rank", "Int32"),
        ("group_rank", "Int32"),  # the rank inside ``pg`` ([PG 1 Rank 3]), else -1
        ("host", "String"),
        ("pid", "Int64"),
        ("file", "String"),
        ("line", "UInt32"),
        ("pg", "String"),  # process group uid / GUID, communicator, as the line names it
        ("pg_name", "String"),
        ("seq", "Int64"),
        ("op", "String"),
        ("numel_in", "Int64"),
        ("numel_out", "Int64"),
        ("enqueued", "Int64"),
        ("completed", "Int64"),
        ("peer", "Int32"),
        ("code", "Int64"),  # exit code, XID, timeout (ms), a size
        ("detail", "String"),  # JSON object
        ("count", "UInt32"),  # identical lines this row stands for
        ("text", "String"),  # the line, cut to 400 characters
    ),
    order_by=("run_id", "attempt", "kind", "rank"),
)
"""What the text logs of an imported job say, one row per observation
(``ranksight/importer/logs``): the evidence the analyzer's log reasoning reads."""

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

CLOCK_OFFSETS = Table(
    "clock_offsets",
    _RUN
    + (
        ("analyzed_ns", "Int64"),
        ("rank", "UInt32"),
        ("offset_ns", "Int64"),  # this rank's clock minus its groups' (median completion)
        ("uncertainty_ns", "Int64"),  # half the interquartile range of that deviation
        ("samples", "UInt64"),  # collectives the estimate rests on
    ),
    order_by=("run_id", "attempt", "analyzed_ns", "rank"),
    time_column="analyzed_ns",
)
"""Each rank's measured clock offset, written by the analyzer (analyzer/clock.py)."""

RANK_STEP_SUMMARY = Table(
    "rank_step_summary",
    _RUN
    + (
        ("rank", "UInt32"),
        ("step", "UInt32"),
        ("has", "UInt8"),  # bit 0 compute, 1 collective, 2 waited, 3 waited_on, 4 step
        ("compute_ns", "Int64"),  # forward + backward + optimizer self time
        ("collective_ns", "Int64"),  # time in collectives and send/recv
        ("waited_ns", "Int64"),  # time this rank waited on others (arrival order)
        ("waited_on_ns", "Int64"),  # time others waited on this rank
        ("step_ns", "Int64"),  # the rank's own step time (end - start)
        ("built_ns", "Int64"),  # when the summary row was computed
    ),
    order_by=("run_id", "attempt", "step", "rank"),
)
"""Per rank and step, the heatmap's metrics, computed once from the raw rows by the
analyzer when it saves findings (analyzer/summary.py) for steps every rank has moved past, so a page reads about one row
per rank and step instead of tens (a bit of ``has`` clear: no raw rows for that metric)."""

SCHEMA_VERSION_TABLE = Table(
    "schema_version",
    (("version", "UInt32"), ("applied_ns", "Int64")),
    order_by=("version",),
)

# ---------------------------------------------------------------- node collectors
# Written by the node agent's collectors (``collectors/``, ``agent/collect.py``). A numeric
# field a device or driver does not report is NaN in Float64 columns ("empty", never 0).

_NODE = (("host", "String"), ("ts_ns", "Int64"))

GPU_SAMPLES = Table(
    "gpu_samples",
    _NODE
    + (
        ("gpu_index", "UInt32"),
        ("gpu_uuid", "String"),
        ("pci_bus_id", "String"),  # 0000:3b:00.0
        ("sm_clock_mhz", "Float64"),
        ("sm_clock_max_mhz", "Float64"),
        ("mem_clock_mhz", "Float64"),
        ("mem_clock_max_mhz", "Float64"),
        ("clock_events", "Int64"),  # NVML clock-event (throttle) reason bitmask, -1 if unknown
        ("clock_event_names", "String"),  # decoded: sw_power_cap,hw_thermal_slowdown,...
        ("power_w", "Float64"),
        ("power_limit_w", "Float64"),
        ("temperature_c", "Float64"),
        ("util_gpu_pct", "Float64"),
        ("util_mem_pct", "Float64"),
        ("mem_used_bytes", "Float64"),
        ("mem_total_bytes", "Float64"),
        ("ecc_corrected", "Float64"),  # volatile (since driver load)
        ("ecc_uncorrected", "Float64"),
        ("remapped_correctable", "Float64"),  # rows remapped for correctable errors
        ("remapped_uncorrectable", "Float64"),
        ("remap_pending", "Float64"),  # 1: a remap waits for a GPU reset
        ("remap_failure", "Float64"),  # 1: a remap failed
        ("pcie_gen", "Float64"),
        ("pcie_width", "Float64"),
        ("pcie_tx_bytes_s", "Float64"),
        ("pcie_rx_bytes_s", "Float64"),
        ("pcie_replays", "Float64"),
        ("nvlink_active", "Float64"),  # links up
        ("nvlink_tx_bytes", "Float64"),  # cumulative data bytes, all links
        ("nvlink_rx_bytes", "Float64"),
        ("nvlink_tx_bytes_s", "Float64"),
        ("nvlink_rx_bytes_s", "Float64"),
        ("nvlink_crc_errors", "Float64"),  # flit + data CRC, all links, cumulative
        ("nvlink_replay_errors", "Float64"),
        ("nvlink_recovery_errors", "Float64"),
        ("unsupported", "String"),  # comma-separated fields this GPU/driver does not report
    ),
    order_by=("host", "gpu_index", "ts_ns"),
    time_column="ts_ns",
)

GPU_EVENTS = Table(
    "gpu_events",
    _NODE
    + (
        ("gpu_index", "Int32"),  # -1 if unknown
        ("gpu_uuid", "String"),
        ("kind", "String"),  # xid | gpu_lost
        ("code", "Int64"),  # the XID number; NVML error code for gpu_lost
        ("detail", "String"),
    ),
    order_by=("host", "ts_ns"),
    time_column="ts_ns",
)

GPU_PROCS = Table(
    "gpu_procs",
    _NODE
    + (
        ("gpu_index", "UInt32"),
        ("gpu_uuid", "String"),
        ("pid", "UInt32"),
        ("used_mem_bytes", "Float64"),
        ("run_id", "String"),  # "" if the process is no local rank
        ("attempt", "UInt32"),
        ("rank", "Int32"),  # -1 if the process is no local rank
    ),
    order_by=("host", "ts_ns", "gpu_index"),
    time_column="ts_ns",
)

GPU_NIC = Table(
    "gpu_nic",
    _NODE
    + (
        ("gpu_index", "Int32"),  # -1 where NVML is not available
        ("gpu_uuid", "String"),
        ("gpu_pci", "String"),
        ("nic", "String"),  # mlx5_0 (rdma) or eth0 (netdev)
        ("nic_kind", "String"),  # rdma | netdev
        ("nic_pci", "String"),
        ("relation", "String"),  # PIX | PXB | PHB | NODE | SYS (nvidia-smi topo's words)
        ("hops", "Int32"),  # PCIe links between the two through their lowest common bridge
        ("nearest", "UInt8"),  # 1: the closest NIC of this kind for this GPU
    ),
    order_by=("host", "ts_ns", "gpu_pci", "nic"),
    time_column="ts_ns",
)

NIC_PORTS = Table(
    "nic_ports",
    _NODE
    + (
        ("kind", "String"),  # rdma | netdev
        ("device", "String"),
        ("port", "UInt32"),  # 0 for netdev
        ("state", "String"),  # ACTIVE / DOWN ... (rdma), up / down (netdev operstate)
        ("phys_state", "String"),
        ("rate", "String"),  # "400 Gb/sec (4X NDR)"; netdev: speed in Mb/s
        ("link_layer", "String"),  # InfiniBand | Ethernet
        ("pci", "String"),
    ),
    order_by=("host", "ts_ns", "device", "port"),
    time_column="ts_ns",
)

NIC_SAMPLES = Table(
    "nic_samples",
    _NODE
    + (
        ("kind", "String"),  # rdma | netdev
        ("device", "String"),
        ("port", "UInt32"),
        ("counter", "String"),  # the sysfs file name
        ("unit", "String"),  # bytes (port_*_data are converted from 4-byte words) | count
        ("value", "UInt64"),
        ("delta", "UInt64"),  # since the previous sample (wrap and reset handled)
        ("rate_per_s", "Float64"),  # NaN on a device's first sample
        ("note", "String"),  # "" | wrap32 | wrap64 | reset | jump (garbage: no delta, no rate)
    ),
    order_by=("host", "device", "counter", "ts_ns"),
    time_column="ts_ns",
)

HOST_SAMPLES = Table(
    "host_samples",
    _NODE
    + (
        ("cpu_pct", "Float64"),  # all cores, 0-100
        ("cpu_core_pct", "String"),  # per core, comma-separated, 0-100
        ("cpu_cores", "UInt32"),
        ("load1", "Float64"),
        ("load5", "Float64"),
        ("load15", "Float64"),
        ("mem_total_bytes", "UInt64"),
        ("mem_used_bytes", "UInt64"),
        ("mem_available_bytes", "UInt64"),
        ("swap_used_bytes", "UInt64"),
        ("disk_path", "String"),
        ("disk_total_bytes", "UInt64"),
        ("disk_free_bytes", "UInt64"),
    ),
    order_by=("host", "ts_ns"),
    time_column="ts_ns",
)

HOST_PRESSURE = Table(
    "host_pressure",
    _NODE
    + (
        ("resource", "String"),  # cpu | memory | io | irq (the file under /proc/pressure)
        ("some_avg10", "Float64"),  # % of wall time some task stalled, last 10 s; NaN: none
        ("some_avg60", "Float64"),
        ("some_avg300", "Float64"),
        ("some_total_us", "Int64"),  # stalled time since boot (us); -1: not reported
        ("full_avg10", "Float64"),  # % of wall time every non-idle task stalled at once
        ("full_avg60", "Float64"),
        ("full_avg300", "Float64"),
        ("full_total_us", "Int64"),
    ),
    order_by=("host", "resource", "ts_ns"),
    time_column="ts_ns",
)
"""The kernel's pressure stall information (PSI, Linux >= 4.20, ``/proc/pressure/*``;
Documentation/accounting/psi.rst): how much wall time tasks of the host waited for CPU,
memory or I/O. CPU "some" pressure is runnable tasks waiting for a core: the contention
the reference trainer's ``cpu_contention`` fault makes."""

PROC_SAMPLES = Table(
    "proc_samples",
    _RUN
    + (
        ("rank", "UInt32"),
        ("host", "String"),
        ("pid", "UInt32"),
        ("ts_ns", "Int64"),
        ("cpu_pct", "Float64"),  # of one core (100 = one core busy)
        ("rss_bytes", "UInt64"),
        ("threads", "UInt32"),
        ("ctx_voluntary", "UInt64"),  # cumulative
        ("ctx_involuntary", "UInt64"),
        ("io_read_bytes", "Float64"),  # cumulative; NaN where not readable
        ("io_write_bytes", "Float64"),
        ("run_delay_ns", "Float64"),  # cumulative, all threads; NaN where not readable
    ),
    order_by=("run_id", "attempt", "rank", "ts_ns"),
    time_column="ts_ns",
)

STACKS = Table(
    "stacks",
    _RUN
    + (
        ("rank", "UInt32"),
        ("host", "String"),
        ("pid", "UInt32"),
        ("ts_ns", "Int64"),
        ("trigger", "String"),  # manual | no_progress
        ("native", "UInt8"),
        ("ok", "UInt8"),
        ("error", "String"),
        ("threads", "UInt32"),
        ("summary", "String"),  # one line per thread: name, state, innermost frames
        ("stack_json", "String"),  # py-spy dump --json
        ("took_ms", "Float64"),
    ),
    order_by=("run_id", "attempt", "ts_ns", "rank"),
    time_column="ts_ns",
)

FR_DUMPS = Table(
    "fr_dumps",
    _RUN
    + (
        ("rank", "Int32"),  # -1 if unknown
        ("host", "String"),
        ("ts_ns", "Int64"),  # when it was ingested
        ("source", "String"),
        ("format", "String"),  # pickle | json
        ("version", "String"),
        ("comm_lib_version", "String"),
        ("entries", "UInt32"),
        ("pg_config_json", "String"),
        ("pg_status_json", "String"),
        ("problems", "String"),  # what could not be read, one per line
    ),
    order_by=("run_id", "attempt", "rank", "ts_ns"),
    time_column="ts_ns",
)

FR_ENTRIES = Table(
    "fr_entries",
    _RUN
    + (
        ("rank", "Int32"),
        ("host", "String"),
        ("source", "String"),
        ("record_id", "Int64"),
        ("pg_id", "Int64"),
        ("pg_name", "String"),
        ("pg_desc", "String"),
        ("collective_seq_id", "Int64"),
        ("p2p_seq_id", "Int64"),
        ("op_id", "Int64"),
        ("op", "String"),  # profiling name: nccl:all_reduce, nccl:send 0->1, gloo:broadcast
        ("is_p2p", "UInt8"),
        ("input_sizes", "String"),  # JSON
        ("input_dtypes", "String"),
        ("output_sizes", "String"),
        ("output_dtypes", "String"),
        ("state", "String"),  # scheduled | started | completed
        ("time_created_ns", "Int64"),
        ("time_started_ns", "Int64"),  # discovered start, 0 if none
        ("time_completed_ns", "Int64"),  # discovered completion, 0 if none
        ("duration_ms", "Float64"),  # NaN if not timed
        ("timeout_ms", "Int64"),
        ("retired", "UInt8"),
        ("thread_name", "String"),
        ("frames", "String"),  # JSON [[name, filename, line], ...], innermost first
    ),
    order_by=("run_id", "attempt", "pg_name", "collective_seq_id", "rank"),
    time_column="time_created_ns",
)

COLLECTOR_STATUS = Table(
    "collector_status",
    _NODE
    + (
        ("collector", "String"),
        ("state", "String"),  # ok | unavailable | error | stopped
        ("message", "String"),
    ),
    order_by=("host", "ts_ns", "collector"),
    time_column="ts_ns",
)

AGENT_STATS = Table(
    "agent_stats",
    _NODE
    + (
        ("pid", "UInt32"),
        ("started_ns", "Int64"),  # when this agent process started
        ("accepted", "UInt64"),  # valid records read from the spool since it started
        ("rejected", "UInt64"),  # malformed records rejected, each logged with its reason
        ("quarantined", "UInt64"),  # records that broke decoding, moved aside (logged once)
        ("dropped", "UInt64"),  # records dropped because the disk buffer was full
        ("shipped", "UInt64"),  # rows the store took
        ("store_errors", "UInt64"),  # failed insert attempts (retried)
        ("buffered_rows", "UInt64"),  # rows waiting in the disk buffer
        ("buffered_bytes", "UInt64"),
    )
    + _DELIVERY,
    order_by=("host", "ts_ns"),
    time_column="ts_ns",
)

COLLECTOR_TABLES = (
    "gpu_samples",
    "gpu_events",
    "gpu_procs",
    "gpu_nic",
    "nic_ports",
    "nic_samples",
    "host_samples",
    "proc_samples",
    "stacks",
    "fr_dumps",
    "fr_entries",
    "collector_status",
)
"""Tables the node agent's collectors write."""

TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        RUNS,
        RANKS,
        STEPS,
        PHASES,
        COLLECTIVES,
        HOOK_STATS,
        PROGRESS,
        RANK_ENDS,
        LOG_EVENTS,
        FINDINGS,
        CLOCK_OFFSETS,
        RANK_STEP_SUMMARY,
        SCHEMA_VERSION_TABLE,
        GPU_SAMPLES,
        GPU_EVENTS,
        GPU_PROCS,
        GPU_NIC,
        NIC_PORTS,
        NIC_SAMPLES,
        HOST_SAMPLES,
        HOST_PRESSURE,
        PROC_SAMPLES,
        STACKS,
        FR_DUMPS,
        FR_ENTRIES,
        COLLECTOR_STATUS,
        AGENT_STATS,
    )
}
"""Every table by name."""

RECORD_TABLES = (
    "ranks",
    "steps",
    "phases",
    "collectives",
    "hook_stats",
    "progress",
    "rank_ends",
)
"""Tables the trainer hooks write records for (through the node agent)."""

DELIVERED_TABLES = tuple(n for n, t in TABLES.items() if "batch_id" in t.column_names)
"""Tables with a ``batch_id`` column: the node agent stores their rows exactly once."""


def table(name: str) -> Table:
    """The table called ``name``; raises ValueError listing the known tables."""
    try:
        return TABLES[name]
    except KeyError:
        raise ValueError(f"unknown table {name!r}; known: {', '.join(TABLES)}") from None
