"""Run the node's collectors inside the agent process: a thread per collector, each on its
own interval, writing through one batching sink into the store.

A collector that cannot read its signal here (no NVML, no RDMA devices, no py-spy) says
so once — a log line and a ``collector_status`` row ``unavailable`` — and its thread
ends. A collector that raises is logged (first time per message), counted in a
``collector_status`` row ``error`` and asked again at its next interval: a collector never
takes the agent down. The sink inserts every ``flush_s`` seconds; when the store refuses,
rows wait for the next flush (at most ``max_buffered_rows``; past that the oldest are
dropped and counted).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from ranksight.collectors.base import Collector, NodeContext, Rows, Unavailable, frame
from ranksight.collectors.fr_ingest import FrCollector
from ranksight.collectors.host import HostCollector
from ranksight.collectors.local_ranks import LocalRanks
from ranksight.collectors.netdev import NetdevCollector
from ranksight.collectors.nvml import NvmlCollector
from ranksight.collectors.nvml_events import XidCollector
from ranksight.collectors.postmortem import PostmortemCollector
from ranksight.collectors.pressure import PressureCollector
from ranksight.collectors.rdma import RdmaCollector
from ranksight.collectors.topology import TopologyCollector
from ranksight.ground.words import counted
from ranksight.store import Store, StoreError

from .stall import StallWatcher

log = logging.getLogger("ranksight.agent.collect")

NAMES = (
    "nvml", "xid", "topology", "rdma", "netdev", "host", "pressure", "fr", "stacks", "postmortem",
)  # fmt: skip
"""Every collector, by the name ``--collectors`` takes."""


def parse_collectors(spec: str) -> tuple[str, ...]:
    """``default`` or ``all`` (every collector), ``none``, or a comma-separated list of
    :data:`NAMES`. Raises ValueError naming an unknown collector."""
    spec = spec.strip()
    if spec in ("default", "all"):
        return NAMES
    if spec in ("none", ""):
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"unknown collectors {unknown}; known: default, none, {', '.join(NAMES)}")
    return names


@dataclass(kw_only=True, slots=True)
class CollectConfig:
    """Which collectors run and how."""

    collectors: tuple[str, ...] = NAMES
    """Names from :data:`NAMES`."""
    spool_dir: str = ""
    """The local ranks' spool folder (how collectors find the rank processes)."""
    data_dir: str = "."
    """Folder whose disk space ``host`` reports."""
    sysfs_root: str = "/sys"
    """sysfs root for ``rdma``, ``netdev`` and ``topology``."""
    host: str = field(default_factory=socket.gethostname)
    """Host name on every row."""
    flush_s: float = 5.0
    """Seconds between inserts into the store."""
    stall_s: float = 60.0
    """A rank whose spool has not grown this long is dumped with py-spy (``stacks``)."""
    fr_prefixes: tuple[str, ...] = ()
    """Flight Recorder dump file prefixes (empty: ``fr_ingest.default_prefixes()``)."""
    max_buffered_rows: int = 500_000
    """Rows kept while the store refuses inserts; past this the oldest are dropped."""

    def __post_init__(self) -> None:
        unknown = [n for n in self.collectors if n not in NAMES]
        if unknown:
            raise ValueError(f"unknown collectors {unknown}; known: {', '.join(NAMES)}")
        if self.flush_s <= 0 or self.stall_s <= 0:
            raise ValueError(f"flush_s and stall_s must be > 0, got {self.flush_s}, {self.stall_s}")
        if self.max_buffered_rows < 1:
            raise ValueError(f"max_buffered_rows must be >= 1, got {self.max_buffered_rows}")
        self.data_dir = os.path.abspath(self.data_dir)


def build(config: CollectConfig) -> list[Collector]:
    """The collectors ``config`` names, sharing one node context and local-rank scan."""
    ctx = NodeContext(
        host=config.host,
        spool_dir=config.spool_dir,
        data_dir=config.data_dir,
        sysfs_root=config.sysfs_root,
    )
    ranks = LocalRanks(config.spool_dir)
    make = {
        "nvml": lambda: NvmlCollector(ctx, local_ranks=ranks),
        "xid": lambda: XidCollector(ctx),
        "topology": lambda: TopologyCollector(ctx),
        "rdma": lambda: RdmaCollector(ctx),
        "netdev": lambda: NetdevCollector(ctx),
        "host": lambda: HostCollector(ctx, local_ranks=ranks),
        "pressure": lambda: PressureCollector(ctx),
        "fr": lambda: FrCollector(ctx, prefixes=config.fr_prefixes),
        "postmortem": lambda: PostmortemCollector(ctx),
        "stacks": lambda: StallWatcher(
            ctx, stall_s=config.stall_s, interval_s=min(2.0, config.stall_s / 2), local_ranks=ranks
        ),
    }
    return [make[name]() for name in config.collectors]


class Sink:
    """Rows from every collector thread, inserted per table every flush (thread-safe)."""

    def __init__(self, store: Store, max_rows: int = 500_000) -> None:
        self.store = store
        self.max_rows = max_rows
        self.inserted = 0
        self.dropped = 0
        self.store_errors = 0
        self._rows: Rows = {}
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    def add(self, rows: Rows) -> None:
        """Queue ``rows``; drops the oldest past ``max_rows``."""
        with self._lock:
            for table, items in rows.items():
                if items:
                    self._rows.setdefault(table, []).extend(items)
            self._trim()

    def _trim(self) -> None:
        over = sum(len(v) for v in self._rows.values()) - self.max_rows
        for items in self._rows.values():
            if over <= 0:
                break
            cut = min(over, len(items))
            del items[:cut]
            self.dropped += cut
            over -= cut

    def flush(self) -> int:
        """Insert what is queued; returns rows inserted. Rows of a table whose insert
        fails are queued again (a row the schema rejects is dropped and logged)."""
        with self._flush_lock:
            with self._lock:
                pending, self._rows = self._rows, {}
            done = 0
            for table, items in pending.items():
                done += self._insert(table, items)
            return done

    def _insert(self, table: str, items: list[dict]) -> int:
        try:
            n = self.store.insert(table, frame(table, items))
        except StoreError as exc:
            self.store_errors += 1
            log.warning("insert into %s failed, will retry: %s", table, exc)
            self.add({table: items})
            return 0
        except ValueError as exc:
            self.dropped += len(items)
            log.error("dropped %d %s rows the schema rejects: %s", len(items), table, exc)
            return 0
        self.inserted += n
        return n


class Collection:
    """The running collectors of one agent: :meth:`start`, then :meth:`stop`."""

    def __init__(
        self, store: Store, config: CollectConfig, collectors: list[Collector] | None = None
    ) -> None:
        self.config = config
        self.sink = Sink(store, config.max_buffered_rows)
        self.collectors = build(config) if collectors is None else collectors
        self.state: dict[str, str] = {}
        """Each collector's state: starting | running | unavailable | stopped."""
        self.errors: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start a thread per collector and the flush thread."""
        for c in self.collectors:
            self.state[c.name] = "starting"
            t = threading.Thread(
                target=self._run, args=(c,), name=f"ranksight-{c.name}", daemon=True
            )
            self._threads.append(t)
        self._threads.append(
            threading.Thread(target=self._flusher, name="ranksight-sink", daemon=True)
        )
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every thread (waiting up to ``timeout_s`` in all) and flush once more."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.sink.flush()

    def _status(self, c: Collector, state: str, message: str) -> None:
        self.state[c.name] = state
        row = {
            "host": self.config.host,
            "ts_ns": time.time_ns(),
            "collector": c.name,
            "state": state,
            "message": message[:2000],
        }
        self.sink.add({"collector_status": [row]})

    def _run(self, c: Collector) -> None:
        """One collector's thread: open, then collect every ``interval_s`` until stopped."""
        try:
            c.open()
        except Unavailable as exc:
            log.info("collector %s unavailable: %s", c.name, exc)
            self._status(c, "unavailable", str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a broken collector must not stop the agent
            log.exception("collector %s failed to open", c.name)
            self._status(c, "unavailable", f"failed to open: {type(exc).__name__}: {exc}")
            return
        self._status(c, "running", f"every {c.interval_s:g} s")
        try:
            self._loop(c)
            if getattr(c, "collect_on_stop", False):  # what ended with the job
                self.sink.add(c.collect(time.time_ns()))
        except Exception as exc:  # noqa: BLE001
            self._error(c, exc, set())
        finally:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                log.exception("collector %s failed to close", c.name)
            self._status(c, "stopped", counted(self.errors.get(c.name, 0), "error"))

    def _loop(self, c: Collector) -> None:
        seen: set[str] = set()
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.sink.add(c.collect(time.time_ns()))
            except Exception as exc:  # noqa: BLE001 - logged, counted, retried next interval
                self._error(c, exc, seen)
            if c.interval_s > 0:
                self._stop.wait(max(0.0, c.interval_s - (time.monotonic() - t0)))

    def _error(self, c: Collector, exc: Exception, seen: set[str]) -> None:
        n = self.errors[c.name] = self.errors.get(c.name, 0) + 1
        message = f"{type(exc).__name__}: {exc}"
        if message not in seen:
            seen.add(message)
            log.warning("collector %s failed (will retry): %s", c.name, message, exc_info=exc)
            self._status(c, "error", message)
        elif n % 100 == 0:
            self._status(c, "error", f"{counted(n, 'error')} so far; last: {message}")
        if c.interval_s == 0:
            self._stop.wait(1.0)  # a failing blocking collector must not spin

    def _flusher(self) -> None:
        while not self._stop.wait(self.config.flush_s):
            self.sink.flush()


def default_data_dir() -> str:
    """The agent's data folder for disk-space samples: ``$RANKSIGHT_HOME``, else ``.``."""
    from ranksight.ground import env

    return os.path.abspath(os.environ.get(env.HOME) or ".")
