"""Hand records from a rank to the node agent without ever blocking the training loop.

The training thread appends to a bounded in-memory buffer (a deque append: no lock, no
I/O). A daemon writer thread moves records to a node-local JSON-lines spool file, which
the agent tails. When the buffer is full, or the spool file is over its byte budget, or
the disk refuses a write, records are dropped and counted; training never waits.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

HEADER_TABLE = "_header"
"""The first line of every spool file: ``{"t": "_header", "run_id", "attempt", "rank", ...}``.
Record lines carry ``"t"`` (the table) and the table's columns minus run_id/attempt/rank."""


def spool_path(spool_dir: str, run_id: str, attempt: int, rank: int) -> str:
    """``<spool_dir>/<run_id>/a<attempt>/rank<rank:05d>-<pid>.jsonl`` for this process."""
    return os.path.join(spool_dir, run_id, f"a{attempt}", f"rank{rank:05d}-{os.getpid()}.jsonl")


class SpoolWriter:
    """Bounded, non-blocking record hand-off to one spool file.

    ``put(record)`` costs one deque append. ``records`` counts records written to the
    file, ``dropped`` counts records lost (buffer full, budget exhausted, write error).
    ``tick()``, if given, is called from the writer thread every ``tick_interval_s`` and its
    records are written too (progress snapshots that go on while training is stuck).
    """

    def __init__(
        self,
        path: str,
        header: dict[str, Any],
        *,
        max_buffered: int,
        budget_bytes: int,
        flush_interval_s: float,
        tick: Callable[[], list[dict[str, Any]]] | None = None,
        tick_interval_s: float = 2.0,
    ) -> None:
        self.path = path
        self._tick, self._tick_interval = tick, tick_interval_s
        self.records = 0
        self.dropped = 0
        self.error: str | None = None
        self._buf: collections.deque[dict[str, Any]] = collections.deque()
        self._max = max_buffered
        self._budget = budget_bytes
        self._interval = flush_interval_s
        self._written = 0
        self._stop = threading.Event()
        self._file = self._open(header)
        self._thread = threading.Thread(target=self._run, name="ranksight-spool", daemon=True)
        self._thread.start()

    def _open(self, header: dict[str, Any]):
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - owned by the writer
            line = json.dumps({"t": HEADER_TABLE, **header}) + "\n"
            f.write(line)
            f.flush()
            self._written += len(line)
            return f
        except OSError as e:
            self.error = f"cannot open spool file {self.path}: {e}"
            return None

    def put(self, record: dict[str, Any]) -> None:
        """Queue one record (``record["t"]`` names its table). Never blocks."""
        if len(self._buf) >= self._max or self._file is None:
            self.dropped += 1
            return
        self._buf.append(record)

    def _drain(self) -> None:
        buf, lines = self._buf, []
        while buf:
            lines.append(json.dumps(buf.popleft(), separators=(",", ":")))
        if not lines:
            return
        if self._file is None:
            self.dropped += len(lines)
            return
        data = "\n".join(lines) + "\n"
        if self._written + len(data) > self._budget:
            self.dropped += len(lines)
            return
        try:
            self._file.write(data)
            self._file.flush()
            self._written += len(data)
            self.records += len(lines)
        except (OSError, ValueError) as e:
            self.dropped += len(lines)
            self.error = f"spool write failed: {e}"

    def _run(self) -> None:
        next_tick = time.monotonic() + self._tick_interval
        while not self._stop.wait(self._interval):
            if self._tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self._tick_interval
                try:
                    for record in self._tick():
                        self.put(record)
                except Exception as e:  # a snapshot must never stop the writer
                    self.error = f"progress snapshot failed: {e}"
            self._drain()

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is buffered and close the file. Safe to call twice."""
        self._stop.set()
        self._thread.join(timeout_s)
        self._drain()
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
