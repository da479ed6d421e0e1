"""Node agent settings: batching, the disk buffer and its drop policy, retries."""

from __future__ import annotations

from dataclasses import dataclass

from ranksight.store.base import MAX_ATOMIC_ROWS

DROP_POLICIES = ("drop_oldest", "drop_newest")
"""What a full disk buffer gives up. ``drop_oldest`` (default): the oldest unsent batches
are deleted to make room, so the store gets the most recent records (what a hang or a
late slowdown is diagnosed from). ``drop_newest``: batches sealed while the buffer is full
are discarded, so the oldest backlog stays whole. Either way every dropped record is
counted (``AgentStats.dropped`` per table, the ``agent_stats`` table, the log). A full
disk (ENOSPC) is met the same way: ``drop_oldest`` deletes the oldest batches until the new
one fits; ``drop_newest`` keeps the backlog, and new records wait in the spool (whose
writers drop and count once their own budget is spent) until there is room."""


@dataclass(kw_only=True, slots=True)
class AgentConfig:
    """How the node agent batches, buffers and retries."""

    interval_s: float = 1.0
    """Flush interval: how often the spool is read and a batch sealed, seconds."""
    batch_rows: int = 500_000
    """Most records in one batch (all tables together); a poll that finds more seals
    several. At most ``store.base.MAX_ATOMIC_ROWS`` so that each table's rows of a batch
    are one atomic insert. Each insert is a part the server merges later: over a
    10-million-record burst on the 2-core test VM, 500,000-record batches left the server
    about a fifth of a core more for inserts than 200,000 did (``bench/RESULTS.md``); a
    node's usual flow (thousands of records a second) seals one small batch a poll."""
    read_bytes: int = 256 << 20
    """Most spool bytes read in one poll."""
    buffer_dir: str | None = None
    """Disk buffer and offsets folder; default ``<spool>/.agent-<hash of the store>``, the
    store as ``store.url.canonical_target`` spells it (one folder however it is written)."""
    buffer_bytes: int = 1 << 30
    """Bound on the disk buffer's size, bytes (compressed Arrow batches, about 40-60 bytes
    a record). It may be passed by one batch while that batch is written."""
    drop_policy: str = "drop_oldest"
    """One of :data:`DROP_POLICIES`."""
    fsync: bool = True
    """fsync each batch and offsets file (survives a machine crash, not only the agent's)."""
    shippers: int = 2
    """Threads sending batches at once, each with its own store connection: one batch's
    client-side encoding overlaps another's insert in the server (oldest batches first)."""
    ship_processes: bool = True
    """In :meth:`Agent.run`, each shipper thread hands its batches to a child process of
    its own (``agent/shipper.py``) when the store can be opened from another process (a
    ClickHouse server), so that sending runs beside reading and sealing instead of
    sharing one interpreter lock with them. False, or a chdb folder: threads send."""
    shipper_idle_s: float = 30.0
    """A shipper process with no batch for this long exits (about 110 MB each); the next
    batch starts it again, seconds."""
    retry_max_s: float = 10.0
    """Longest wait between retries of a failed insert (backoff doubles from interval_s)."""
    settle_s: float = 60.0
    """Before re-checking a batch whose insert failed, wait up to this long for the store to
    finish an insert of it that may still be running (``system.processes``)."""
    stats_interval_s: float = 10.0
    """How often a row of the agent's counters goes to the ``agent_stats`` table, seconds."""
    keep_spool: bool = False
    """Keep spool segments the store has acknowledged (default: delete them, which bounds
    the spool's disk use). Another agent running on the same spool is waited for."""
    drain_timeout_s: float = 10.0
    """On stop: how long to keep shipping the buffer before leaving the rest on disk."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if not 1 <= self.batch_rows <= MAX_ATOMIC_ROWS:
            raise ValueError(f"batch_rows must be in 1..{MAX_ATOMIC_ROWS}, got {self.batch_rows}")
        if not 1 <= self.shippers <= 16:
            raise ValueError(f"shippers must be in 1..16, got {self.shippers}")
        if self.read_bytes < 1 << 16:
            raise ValueError(f"read_bytes must be >= 65536, got {self.read_bytes}")
        if self.buffer_bytes < 1 << 16:
            raise ValueError(f"buffer_bytes must be >= 65536, got {self.buffer_bytes}")
        if self.drop_policy not in DROP_POLICIES:
            raise ValueError(
                f"drop policy (--drop) {self.drop_policy!r} is not one of "
                f"{', '.join(DROP_POLICIES)}"
            )
        for name in (
            "retry_max_s", "settle_s", "stats_interval_s", "drain_timeout_s", "shipper_idle_s"
        ):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
