"""The node agent: spool -> disk buffer -> store, nothing lost, nothing stored twice.

Two loops, one per thread in :meth:`Agent.run` (one after the other in :meth:`poll_once`
and :meth:`drain`):

- **read**: every ``interval_s``, read the spool's new frames or lines
  (``agent/tailer.py``), parse and validate them (rejects are logged and counted), add
  rows handed over by :meth:`Agent.submit` and, every ``stats_interval_s``, a row of the
  agent's counters (``agent_stats``); seal them as batches of at most about
  ``batch_rows`` into the disk buffer (``agent/buffer.py``); commit the spool offsets;
  enforce the buffer's bound; delete spool segments the store has every record of.
- **ship**: send buffered batches oldest first (``agent/deliver.py``), delete each once
  the store has it; on a store error back off (doubling from ``interval_s`` up to
  ``retry_max_s``) and retry the same batch, checked against the store first. To a
  ClickHouse server each shipper thread sends through a child process of its own
  (``agent/shipper.py``), so that sending does not share the read loop's interpreter
  lock.

The read loop never waits for the store, so a store outage or a stalled server fills the
buffer, not the ranks' spool, and never slows training (the ranks only append to their
spool files). One agent per spool and store: a second one is refused (``flock``).
"""

from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa

from ranksight.ground.ownership import secure_spool_dir
from ranksight.store import Store, StoreError, schema
from ranksight.store.frames import conform
from ranksight.trainer_hooks.spool_format import SUFFIX as SPOOL_SUFFIX

from . import heap
from . import tailer as tailer_mod
from .buffer import DiskBuffer, disk_full
from .config import AgentConfig
from .deliver import deliver
from .parse import Parsed
from .shipper import BatchUnreadable, ShipperProcess
from .tailer import OFFSETS, SpoolTailer, legacy_state_dir, state_dir_for

log = logging.getLogger("ranksight.agent")
_MAX_LOGGED = 20  # rejection reasons logged one by one per poll; the rest summed up


@dataclass
class AgentStats:
    """Counters since the agent started (records = rows)."""

    accepted: int = 0
    """Valid records read from the spool (or handed to :meth:`Agent.submit`)."""
    rejected: int = 0
    """Malformed records skipped (each logged with its reason)."""
    quarantined: int = 0
    """Records that broke decoding (``agent/poison.py``), moved to the quarantine folder
    and named in the log once (``agent/quarantine.py``)."""
    dropped: int = 0
    """Records lost because the disk buffer was full (see ``config.DROP_POLICIES``)."""
    dropped_by_table: dict[str, int] = field(default_factory=dict)
    shipped: int = 0
    """Rows inserted into the store."""
    already_stored: int = 0
    """Rows of retried batches found already stored (not sent again)."""
    store_errors: int = 0
    """Failed batch sends (the batch is retried, checked first)."""
    last_error: str = ""
    buffered_rows: int = 0
    buffered_bytes: int = 0
    spool_deleted: int = 0
    """Spool segments deleted because the store has every record in them."""


class Agent:
    """Ships the records ranks leave in ``spool_dir`` to ``store`` (see the module doc).

    ``interval_s`` is the flush interval (it overrides ``config.interval_s``). Raises
    RuntimeError if another agent already serves this spool and store, PermissionError if
    the spool folder belongs to another user.
    """

    def __init__(
        self,
        spool_dir: str,
        store: Store,
        *,
        interval_s: float | None = None,
        config: AgentConfig | None = None,
    ) -> None:
        config = config or AgentConfig()
        if interval_s is not None:
            config = AgentConfig(**{**_fields(config), "interval_s": interval_s})
        self.config, self.store = config, store
        secure_spool_dir(spool_dir)
        self.state_dir = config.buffer_dir or _adopted_state_dir(spool_dir, store.url)
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        self._lock_file = _exclusive(self.state_dir)
        self.tailer = SpoolTailer(spool_dir, store.url, self.state_dir, fsync=config.fsync)
        self._ship_spec = store.reopen_spec() if config.ship_processes else None
        self.buffer = DiskBuffer(
            self.state_dir, config.buffer_bytes, config.drop_policy, config.fsync,
            **({"keep_in_memory": 0} if self._ship_spec else {}),
        )  # fmt: skip
        self._last_batch: dict[str, int] = {}
        """Per spool file: the newest buffered batch holding records read from it."""
        self._recover()
        self.stats = AgentStats()
        self._submitted: queue.SimpleQueue[tuple[str, pa.Table]] = queue.SimpleQueue()
        self._committed = self.tailer.durable_seq
        self._warned: dict[str, bool] = {}
        self._suspect: set[int] = set()
        self._backoff = 0.0
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._sealed = threading.Event()  # wakes idle shippers
        self._started_ns = time.time_ns()
        self._last_stats = 0.0
        self.shipper_processes: list[ShipperProcess] = []
        """The shipper processes of :meth:`run` (none to a chdb folder)."""
        self.taps: list[Callable[[dict[str, pa.Table]], None]] = []
        """Called with each batch's tables (table -> rows) as it is sealed, before it is
        shipped (e.g. ``agent/otel.py``); a tap must not raise and must not block."""

    @property
    def interval_s(self) -> float:
        """The flush interval, seconds."""
        return self.config.interval_s

    def _recover(self) -> None:
        """Re-apply the offsets of batches sealed after the last offsets commit."""
        for seq, offsets in self.buffer.offsets_after(self.tailer.seq):
            self.tailer.apply(offsets)
            self.tailer.seq = seq
        try:
            self.tailer.save()
        except OSError as exc:  # a full disk: shipping waits until they are saved
            log.warning("cannot save the recovered spool offsets: %s", exc)
        for seq, offsets in self.buffer.offsets_after(0):
            for path in offsets:
                self._last_batch[path] = max(seq, self._last_batch.get(path, 0))

    # ------------------------------------------------------------------ read side
    def submit(self, table: str, rows: pd.DataFrame | pa.Table) -> None:
        """Queue rows for ``table`` (e.g. from a collector in this process); they go out
        with the next batch. Raises ValueError for an unknown table or bad columns."""
        spec = schema.table(table)
        data = conform(spec, rows)
        if "batch_id" in data.column_names:
            data = data.drop_columns(["batch_id"])
        self._submitted.put((table, data))

    def read_once(self) -> int:
        """Read the spool and seal what is new (several batches if over ``batch_rows``);
        returns rows sealed (the spool's and :meth:`submit`'s). A batch that cannot be written (the disk is full and
        nothing buffered may be dropped) leaves its records in the spool, uncounted, for
        the next call."""
        if not self.config.keep_spool:
            self.delete_stored_segments()
        if self.tailer.durable_seq < self.tailer.seq:  # an offsets save failed before
            self._commit(None)
        total = 0
        while True:
            parsed = self.tailer.read(self.config.batch_rows, self.config.read_bytes)
            self._log_quarantined(parsed)
            from_spool = parsed.count
            local = self._add_local_rows(parsed)
            if not parsed.count and not self.tailer.pending():
                return total
            if not self._seal(parsed):
                self._requeue(local)
                return total
            self._note_rejects(parsed)
            self.stats.accepted += from_spool
            total += parsed.count
            if self.tailer.lines_read < self.config.batch_rows:
                return total

    def _add_local_rows(self, parsed: Parsed) -> list[tuple[str, pa.Table]]:
        """Move submitted rows, and a stats row when due, into ``parsed``; returns them."""
        now = time.monotonic()
        if self.config.stats_interval_s and now - self._last_stats >= self.config.stats_interval_s:
            self._last_stats = now
            self.submit("agent_stats", pd.DataFrame([self._stats_row(parsed)]))
        local = []
        while True:
            try:
                local.append(self._submitted.get_nowait())
            except queue.Empty:
                break
        for table, rows in local:
            parsed.extend(Parsed({table: rows}))
        return local

    def _requeue(self, local: list[tuple[str, pa.Table]]) -> None:
        """Put back submitted rows whose batch could not be written, the newest
        ``batch_rows`` of them (older ones are dropped and counted: memory stays bounded
        while the disk is full)."""
        kept, rows = [], 0
        for table, data in reversed(local):
            rows += data.num_rows
            if rows > self.config.batch_rows:
                self._count_dropped({table: data.num_rows}, "the disk buffer is full")
            else:
                kept.append((table, data))
        for item in reversed(kept):
            self._submitted.put(item)

    def _seal(self, parsed: Parsed) -> bool:
        """Write ``parsed`` as the next batch, commit the offsets, enforce the bound;
        False if the batch could not be written (a full disk, nothing to drop)."""
        seq = max(self.tailer.seq, self.buffer.last_seq) + 1
        if parsed.count:
            pending = self.tailer.pending()
            if not self._write_batch(seq, parsed.tables, pending):
                return False
            self._commit(seq)
            self._sealed.set()
            for path in pending:
                self._last_batch[path] = seq
        else:  # only offsets moved (rejected lines, headers)
            self._commit(None)
        for tap in self.taps:
            tap(parsed.tables)
        self._committed = self.tailer.durable_seq
        dropped = self.buffer.enforce(seq, self._committed)
        self._count_dropped(dropped, f"disk buffer over {self.config.buffer_bytes} bytes")
        return True

    def _write_batch(self, seq: int, tables: dict[str, pa.Table], offsets: dict) -> bool:
        """Seal batch ``seq``; on a full disk drop the oldest buffered batches (counted)
        until it fits. False if it does not fit with nothing left to drop (or the policy
        is ``drop_newest``, which keeps the backlog: the records wait in the spool)."""
        while True:
            try:
                self.buffer.seal(seq, tables, offsets)
            except OSError as exc:
                if not disk_full(exc):
                    raise
                oldest = self.config.drop_policy == "drop_oldest"
                dropped = self.buffer.drop_oldest(self._committed) if oldest else {}
                if not dropped:
                    self._warn_once(
                        "full", "disk buffer %s is full (%s) with nothing to drop: the "
                        "records wait in the spool until there is room",
                        self.buffer.folder, exc.strerror or exc,
                    )  # fmt: skip
                    return False
                self._count_dropped(dropped, f"disk full ({exc.strerror or exc})")
                continue
            if self._warned.pop("full", None):
                log.warning("disk buffer %s takes batches again", self.buffer.folder)
            return True

    def _commit(self, seq: int | None) -> None:
        """Commit the tailer's offsets (with batch ``seq``); a failed save is logged once
        and retried by the next read (the batches after it wait, buffered)."""
        try:
            self.tailer.commit(seq)
        except OSError as exc:
            self._warn_once(
                "offsets", "cannot save the spool offsets (%s): batches after %d stay "
                "buffered until they are saved", exc, self.tailer.durable_seq,
            )  # fmt: skip
        else:
            self._warned.pop("offsets", None)
        self._committed = self.tailer.durable_seq

    def _warn_once(self, key: str, message: str, *args) -> None:
        """Log ``message`` unless warning ``key`` is already in force."""
        if key not in self._warned:
            self._warned[key] = True
            log.warning(message, *args)

    def _count_dropped(self, dropped: dict[str, int], why: str) -> None:
        """Count and log rows ``dropped`` (per table) and why."""
        if not dropped:
            return
        for table, n in dropped.items():
            self.stats.dropped += n
            self.stats.dropped_by_table[table] = self.stats.dropped_by_table.get(table, 0) + n
        log.warning(
            "%s: dropped %s (%s); %d dropped so far",
            why, dict(dropped), self.config.drop_policy, self.stats.dropped,
        )  # fmt: skip

    def delete_stored_segments(self) -> list[str]:
        """Delete the binary spool segments that are sealed (read to their end frame, or
        to the end of one whose writer is gone and that has been unchanged for
        ``tailer.ABANDONED_S``) and whose records the store has acknowledged (no batch
        holding any of them is still buffered); returns their paths. A segment another running agent on this spool
        has not read to its end yet is kept. JSON spool files are never deleted."""
        oldest = min(self.buffer.seqs(), default=None)
        done = [
            path
            for path, st in self.tailer.files.items()
            if (st.sealed == "end" or (st.sealed == "gone" and _abandoned(path)))
            and path.endswith(SPOOL_SUFFIX)
            and (oldest is None or oldest > self._last_batch.get(path, 0))
        ]
        if not done:
            return []
        others = _other_agents(self.tailer.spool_dir, self.state_dir)
        deleted = []
        for path in done:
            if any(o.get(path, {}).get("sealed") not in ("end", "gone") for o in others):
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot delete stored spool segment %s: %s", path, exc)
                continue
            del self.tailer.files[path]
            self._last_batch.pop(path, None)
            deleted.append(path)
        self.stats.spool_deleted += len(deleted)
        return deleted

    def _note_rejects(self, parsed: Parsed) -> None:
        """Log each rejection reason (the first few one by one; a run of the same reason,
        e.g. a damaged frame's records, as one line) and count them, and the records
        quarantined (logged by :meth:`_log_quarantined`)."""
        runs: list[list] = []
        for reason in parsed.rejected:
            if runs and runs[-1][0] == reason:
                runs[-1][1] += 1
            else:
                runs.append([reason, 1])
        for reason, n in runs[:_MAX_LOGGED]:
            if n == 1:
                log.warning("rejected record: %s", reason)
            else:
                log.warning("rejected %d records: %s", n, reason)
        if len(runs) > _MAX_LOGGED:
            more = sum(n for _, n in runs[_MAX_LOGGED:])
            log.warning("rejected %d more records", more)
        self.stats.rejected += len(parsed.rejected)
        self.stats.quarantined += sum(p.records for p in parsed.quarantined)

    def _log_quarantined(self, parsed: Parsed) -> None:
        """Name each quarantined item in the log, the first time it is kept (a read
        whose batch could not be written, or one before a restart, comes again)."""
        for poison in parsed.quarantined:
            if poison.new:
                log.error(
                    "quarantined %d record(s) of %s at byte %d (%s): %s",
                    poison.records, poison.source, poison.offset, poison.reason,
                    poison.kept or "not kept (see above)",
                )  # fmt: skip

    def _stats_row(self, parsed: Parsed | None = None) -> dict:
        """This agent's counters as an ``agent_stats`` row, with the spool records of
        ``parsed`` (the batch the row goes in: counted once it is sealed) included."""
        s, parsed = self.stats, parsed or Parsed()
        rows, size = self.buffer.size
        return {
            "host": socket.gethostname(),
            "ts_ns": time.time_ns(),
            "pid": os.getpid(),
            "started_ns": self._started_ns,
            "accepted": s.accepted + parsed.count,
            "rejected": s.rejected + len(parsed.rejected),
            "quarantined": s.quarantined + sum(p.records for p in parsed.quarantined),
            "dropped": s.dropped,
            "shipped": s.shipped,
            "store_errors": s.store_errors,
            "buffered_rows": rows,
            "buffered_bytes": size,
        }

    # ------------------------------------------------------------------ ship side
    def ship_once(self, store: Store | ShipperProcess | None = None) -> int:
        """Send the oldest buffered batch no other shipper holds, through ``store`` (default
        :attr:`store`; another connection to it, or a :class:`ShipperProcess`, for another
        shipper thread); returns rows inserted or found stored (0 if there is none or the
        store failed)."""
        seq = self.buffer.take_oldest(self._committed)
        if seq is None:
            return 0
        try:
            return self._ship(seq, store or self.store)
        finally:
            self.buffer.release(seq)

    def _ship(self, seq: int, via: Store | ShipperProcess) -> int:
        """Deliver batch ``seq`` through ``via`` and delete it; on a store error count it
        and back off."""
        try:
            batch = None if isinstance(via, ShipperProcess) else self.buffer.load(seq)
            attempted = batch.attempted if batch else self.buffer.attempted(seq)
        except (OSError, ValueError) as exc:
            log.error("buffered batch %d is unreadable, dropped: %s", seq, exc)
            self.buffer.remove(seq)
            return 0
        verify = attempted or seq in self._suspect
        if not attempted:
            try:
                self.buffer.mark_attempted(seq)
            except OSError as exc:  # unmarked, a crash mid-insert could store it twice
                self._warn_once(
                    "mark", "cannot mark batch %d as sent, not sending it: %s", seq, exc
                )
                return 0
            self._warned.pop("mark", None)
        try:
            with self._schema_lock:
                if not self._schema_ready:  # the store may have been down at start
                    self.store.init_schema()
                    self._schema_ready = True
            if isinstance(via, ShipperProcess):
                done = via.deliver(seq, verify, self.config.settle_s)
            elif batch is not None:  # loaded above for a store
                done = deliver(via, batch, verify=verify, settle_s=self.config.settle_s)
        except BatchUnreadable as exc:
            log.error("buffered batch %d is unreadable, dropped: %s", seq, exc)
            self.buffer.remove(seq)
            return 0
        except StoreError as exc:
            with self._stats_lock:
                self._suspect.add(seq)
                self.stats.store_errors += 1
                self.stats.last_error = str(exc)
                backoff = max(self._backoff * 2, self.interval_s)
                self._backoff = min(self.config.retry_max_s, backoff)
            log.warning("store insert failed, retrying in %.1f s: %s", self._backoff, exc)
            return 0
        self.buffer.remove(seq)
        with self._stats_lock:
            self._backoff = 0.0
            self._suspect.discard(seq)
            self.stats.shipped += done.inserted
            self.stats.already_stored += done.already_stored
        if done.already_stored:
            log.info("batch %d: %d rows were already stored", seq, done.already_stored)
        return done.inserted + done.already_stored

    # ------------------------------------------------------------------ loops
    def poll_once(self) -> int:
        """Read and seal what is new, then send what is buffered; returns rows sent (0 on
        a store error: they stay buffered for the next call)."""
        self.read_once()
        shipped = 0
        while True:
            n = self.ship_once()
            shipped += n
            if n == 0:
                break
        self._refresh()
        return shipped

    def drain(self, max_polls: int = 1000) -> int:
        """Poll until the spool has nothing new and the buffer is empty, or the store
        fails; returns rows sent."""
        total = 0
        for _ in range(max_polls):
            n = self.poll_once()
            total += n
            if n == 0:
                break
        return total

    def run(self, stop: threading.Event) -> None:
        """Read in this thread and ship in ``config.shippers`` threads (each with its own
        store connection) until ``stop`` is set; then read once more and keep shipping for
        up to ``drain_timeout_s`` (the rest stays buffered on disk)."""
        if self._ship_spec:
            folder = str(self.buffer.folder)
            self.shipper_processes = [
                ShipperProcess(self._ship_spec, folder, self.config.shipper_idle_s)
                for _ in range(self.config.shippers)
            ]
            stores: list[Store] = []
            vias: Sequence[Store | ShipperProcess] = self.shipper_processes
        else:
            stores = [self.store] + [self.store.copy() for _ in range(self.config.shippers - 1)]
            vias = stores
        shippers = [
            threading.Thread(target=self._ship_loop, args=(stop, v), name=f"ranksight-ship{i}")
            for i, v in enumerate(vias)
        ]
        for shipper in shippers:
            shipper.start()
        heap.keep()  # reuse a batch's memory for the next (agent/heap.py)
        busy = False
        while not stop.is_set():
            t0 = time.monotonic()
            read = self._guard(self.read_once)
            self._refresh()
            if read:
                busy = True
            elif busy and not self.stats.buffered_rows:  # caught up: give the memory back
                heap.release()
                busy = False
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))
        self._guard(self.read_once)
        for shipper in shippers:
            shipper.join()
        for extra in stores[1:]:
            extra.close()
        deadline = time.monotonic() + self.config.drain_timeout_s
        while time.monotonic() < deadline and self._guard(self.ship_once):
            pass
        self._refresh()

    def _ship_loop(self, stop: threading.Event, via: Store | ShipperProcess) -> None:
        """Ship through ``via`` until ``stop``; when idle wait for the next sealed batch
        (at most ``interval_s``), after errors the backoff. A shipper process is started
        by (and ends with) this thread: its parent-death signal follows the thread."""
        try:
            if isinstance(via, ShipperProcess):
                self._guard(via.start)  # ready before the first batch; else on first use
            while not stop.is_set():
                if self._guard(lambda: self.ship_once(via)) == 0:
                    if isinstance(via, ShipperProcess):
                        via.close_if_idle()
                    if self._backoff:
                        stop.wait(self._backoff)
                    else:
                        self._sealed.wait(min(self.interval_s, 0.25))
                        self._sealed.clear()
        finally:
            if isinstance(via, ShipperProcess):
                via.close()

    def _guard(self, step) -> int:
        """Run one loop step; log (never raise) unexpected errors so the agent stays up."""
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - a daemon logs and carries on
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("agent step failed")
            time.sleep(min(self.interval_s, 1.0))
            return 0

    def _refresh(self) -> None:
        """Update the buffer gauges in :attr:`stats`."""
        self.stats.buffered_rows, self.stats.buffered_bytes = self.buffer.size

    def close(self) -> None:
        """Release the agent's lock on its state folder. Safe to call twice."""
        if not self._lock_file.closed:
            self._lock_file.truncate(0)  # no longer a running agent (see _other_agents)
            self._lock_file.close()


def _fields(config: AgentConfig) -> dict:
    """A config's fields as a dict (slots dataclasses have no ``__dict__``)."""
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def _abandoned(path: str) -> bool:
    """Whether a segment whose writer is gone has been unchanged for ``ABANDONED_S``."""
    try:
        return time.time() - os.stat(path).st_mtime > tailer_mod.ABANDONED_S
    except OSError:
        return True


def _other_agents(spool_dir: str, state_dir: str) -> list[dict]:
    """The committed spool offsets of the other agents running on ``spool_dir`` now (one
    per store: ``<spool>/.agent-*`` folders whose lock file names a live process; read,
    not locked, so that probing never keeps another agent from starting)."""
    from ranksight.collectors.local_ranks import is_alive

    found = []
    for folder in glob.glob(os.path.join(glob.escape(spool_dir), ".agent-*")):
        if os.path.realpath(folder) == os.path.realpath(state_dir):
            continue
        lock = os.path.join(folder, "lock")
        try:
            pid = int(open(lock).read().split()[0])
            if not is_alive(pid, os.stat(lock).st_mtime):
                continue  # no agent runs there
        except (OSError, ValueError, IndexError):
            continue
        try:
            with open(os.path.join(folder, OFFSETS)) as f:
                found.append(json.load(f)["files"])
        except (OSError, ValueError, KeyError):
            found.append({})  # running, offsets unknown: keep every segment
    return found


def _adopted_state_dir(spool_dir: str, url: str) -> str:
    """:func:`~.tailer.state_dir_for` the store ``url`` names; a folder an agent of an
    earlier version kept for this spelling of it is renamed to it first (its offsets and
    batches carry on: nothing is read twice after an upgrade)."""
    folder = state_dir_for(spool_dir, url)
    legacy = legacy_state_dir(spool_dir, url)
    if legacy != folder and os.path.isdir(legacy) and not os.path.exists(folder):
        try:
            os.rename(legacy, folder)
            log.info("state folder %s is now %s (one per store, however spelled)", legacy, folder)
        except OSError as exc:
            log.warning("cannot adopt the state folder %s: %s", legacy, exc)
    return folder


def _exclusive(state_dir: str):
    """Hold ``<state>/lock`` exclusively for the life of the returned file, which then
    names this process (its pid: other agents on the spool see that it runs)."""
    handle = open(os.path.join(state_dir, "lock"), "a+")  # noqa: SIM115 - held while alive
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(
            f"another ranksight agent already ships this spool to this store "
            f"(state folder {state_dir} is locked)"
        ) from None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
