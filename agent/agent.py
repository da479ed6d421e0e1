"""The node agent: moves the ranks' spooled records into the store in batches."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from ranksight.store import Store, StoreError

from .tailer import SpoolTailer

log = logging.getLogger("ranksight.agent")


@dataclass
class AgentStats:
    """Counters since the agent started."""

    shipped: int = 0
    """Rows inserted into the store."""
    rejected: int = 0
    """Malformed records skipped (each logged with its reason)."""
    store_errors: int = 0
    """Failed batch inserts (the batch is retried on the next poll)."""
    last_error: str = ""


class Agent:
    """Polls the spool every ``interval_s`` seconds and ships new records to ``store``.

    Delivery is at-least-once per batch: offsets are committed only after every table of
    the batch was inserted; a failed insert leaves the records in the spool for the next
    poll, so a store outage loses nothing the ranks wrote.
    """

    def __init__(self, spool_dir: str, store: Store, *, interval_s: float = 1.0) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.store = store
        self.tailer = SpoolTailer(spool_dir, key=store.url)
        self.interval_s = interval_s
        self.stats = AgentStats()

    def poll_once(self) -> int:
        """Read, insert and commit one batch; returns rows shipped (0 on store error)."""
        batch = self.tailer.read()
        for reason in batch.rejected:
            log.warning("rejected record: %s", reason)
        self.stats.rejected += len(batch.rejected)
        try:
            for table, frame in batch.frames().items():
                self.store.insert(table, frame)
        except StoreError as e:
            self.stats.store_errors += 1
            self.stats.last_error = str(e)
            log.warning("store insert failed, will retry: %s", e)
            return 0
        self.tailer.commit()
        self.stats.shipped += batch.count
        return batch.count

    def drain(self, max_polls: int = 1000) -> int:
        """Poll until nothing new is read; returns rows shipped."""
        total = 0
        for _ in range(max_polls):
            n = self.poll_once()
            total += n
            if n == 0:
                break
        return total

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop`` is set, then drain once more."""
        while not stop.is_set():
            t0 = time.monotonic()
            self.poll_once()
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))
        self.drain()
