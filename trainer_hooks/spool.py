"""Hand records from a rank to the node agent without ever blocking the training loop.

The training thread appends to a bounded in-memory buffer (a deque append: no lock, no
I/O). A daemon writer thread moves records to node-local spool segments in the binary
frame format of ``trainer_hooks/spool_format.py`` (columnar, one frame per table per
flush), which the agent reads. When the buffer is full, or the rank's segments on disk
are over their byte budget, or the disk refuses a write, records are dropped and
counted; training never waits.

Segments: ``<spool_dir>/<run_id>/a<attempt>/rank<rank:05d>-<pid>-<n:04d>.spool``. Each
starts with a header frame (run_id, attempt, rank) and, once the writer moves on to the
next one (past ``segment_bytes``) or closes, ends with an end frame. The agent deletes a
segment once it has read it to its end frame and the store has acknowledged every record
in it, so a rank's spool uses about ``segment_bytes`` of disk while an agent keeps up, and
at most the budget while none runs.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .folders import make_private_dirs
from .guard import warn
from .spool_format import SUFFIX, encode, end_frame, header_frame

HEADER_TABLE = "_header"
"""Table name of a segment's header frame (and the ``"t"`` of a JSON spool's header
line, the format older hooks wrote: ``{"t": "_header", "run_id", "attempt", "rank"}``)."""


def spool_path(spool_dir: str, run_id: str, attempt: int, rank: int, segment: int = 0) -> str:
    """``<spool_dir>/<run_id>/a<attempt>/rank<rank:05d>-<pid>-<segment:04d>.spool`` for
    this process."""
    name = f"rank{rank:05d}-{os.getpid()}-{segment:04d}{SUFFIX}"
    return os.path.join(spool_dir, run_id, f"a{attempt}", name)


class SpoolWriter:
    """Bounded, non-blocking record hand-off to a rank's spool segments.

    ``put(record)`` costs one deque append. ``records`` counts records written to the
    spool, ``dropped`` counts records lost (buffer full, budget exhausted, write error,
    ``lost``): ``records + dropped`` is every record put.

    The open segment deleted under the writer (``rm -rf <spool_dir>/<run_id>``) is noticed
    by the writer thread every ``check_interval_s`` (an ``fstat`` of the open file against
    a ``stat`` of its path: unlinked, or another file there) and at close: the records
    written to it since the previous check are moved from ``records`` to ``dropped`` and
    counted in ``lost``, and the writer goes on in a new segment (its folders made again,
    ``0700``, with a header frame). Records written before that check are not counted
    lost: the agent may have read them.
    ``tick()``, if given, is called from the writer thread every ``tick_interval_s`` and its
    records are written too (progress snapshots that go on while training is stuck).
    ``budget_bytes`` bounds this process's segments on disk (segments the agent deleted
    no longer count); ``segment_bytes``: a segment past this size is closed and the next
    one started. ``path`` is the segment being written.
    """

    def __init__(
        self,
        path: str,
        header: dict[str, Any],
        *,
        max_buffered: int,
        budget_bytes: int,
        flush_interval_s: float,
        segment_bytes: int = 64 << 20,
        tick: Callable[[], list[dict[str, Any]]] | None = None,
        tick_interval_s: float = 2.0,
        check_interval_s: float = 1.0,
    ) -> None:
        self.path = path
        self._check_interval = check_interval_s
        self._next_check = time.monotonic() + check_interval_s
        self._since_check = 0  # records written to the open segment since the last check
        self._tick, self._tick_interval = tick, tick_interval_s
        self.records = 0
        self.dropped = 0
        self.lost = 0
        self.error: str | None = None
        self._buf: collections.deque[dict[str, Any]] = collections.deque()
        self._max = max_buffered
        self._budget = budget_bytes
        self._segment_bytes = segment_bytes
        self._interval = flush_interval_s
        self._header = header
        self._segment = 0
        self._segment_records = 0
        self._size = 0  # bytes of the open segment
        self._closed_segments: list[tuple[str, int]] = []  # (path, bytes) still on disk
        self._stop = threading.Event()
        self._wake = threading.Event()  # flush_soon(), close(): drain before the interval
        self._closed = False  # set by close(): nothing drains the buffer after it
        self._fd = self._open(path)
        self._thread = threading.Thread(target=self._run, name="ranksight-spool", daemon=True)
        self._thread.start()

    def _open(self, path: str) -> int | None:
        """Create segment ``path`` with its header frame; None (and :attr:`error`) if not."""
        try:
            make_private_dirs(os.path.dirname(path))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            head = header_frame({**self._header, "segment": self._segment})
            os.write(fd, head)
            self.path, self._size, self._segment_records = path, len(head), 0
            return fd
        except OSError as e:
            self.error = f"cannot open spool file {path}: {e}"
            return None

    def put(self, record: dict[str, Any]) -> None:
        """Queue one record (``record["t"]`` names its table). Never blocks.

        Does not look at the open segment: between two segments (the writer thread is
        rotating) the record waits in the buffer; if no segment can be opened the writer
        counts it dropped when it drains."""
        if len(self._buf) >= self._max or self._closed:
            self.dropped += 1
            return
        self._buf.append(record)

    def _on_disk(self) -> int:
        """Bytes of this process's segments still on disk (the agent deletes stored ones)."""
        self._closed_segments = [(p, n) for p, n in self._closed_segments if os.path.exists(p)]
        return self._size + sum(n for _, n in self._closed_segments)

    def _drain(self) -> None:
        if time.monotonic() >= self._next_check:
            self._check_segment()
        buf = self._buf
        records = [buf.popleft() for _ in range(len(buf))]
        if not records:
            return
        if self._fd is None:
            self.dropped += len(records)
            return
        try:
            data = encode(records)
        except Exception as e:  # noqa: BLE001 - a record the encoder chokes on is dropped
            self.dropped += len(records)
            self.error = f"spool encoding failed: {e}"
            return
        closed = sum(n for _, n in self._closed_segments)
        if self._size + closed + len(data) > self._budget:
            if self._on_disk() + len(data) > self._budget:  # after the agent's deletions
                self.dropped += len(records)
                return
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes)")
        except OSError as e:
            self.dropped += len(records)
            self.error = f"spool write failed: {e}"
            try:  # never leave half a frame that later frames would follow
                os.ftruncate(self._fd, self._size)
            except OSError:
                self._rotate(seal=False)
            return
        self._size += len(data)
        self.records += len(records)
        self._since_check += len(records)
        self._segment_records += len(records)
        if self._size >= self._segment_bytes:
            self._check_segment()  # a deleted segment is counted before it is sealed
            if self._size >= self._segment_bytes:
                self._rotate()

    def _check_segment(self) -> None:
        """Is the open segment still the file at its path? If it was deleted, count what
        was written to it since the last check as lost and open the next segment; if no
        segment is open (opening failed), try again."""
        self._next_check = time.monotonic() + self._check_interval
        if self._fd is None:
            if not self._closed:
                self._rotate(seal=False)
            return
        if not _gone(self._fd, self.path):
            self._since_check = 0
            return
        lost, self._since_check = self._since_check, 0
        gone = self.path
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = None  # not a closed segment on disk: it is gone
        self._rotate(seal=False)
        self.error = (f"spool segment {gone} was deleted under the writer: {lost} records "
                      f"written to it since the last check are lost; now writing {self.path}")  # fmt: skip
        self.records -= lost
        self.dropped += lost
        self.lost += lost  # last: a reader that sees it sees the rest
        warn(f"ranksight: {self.error}", stacklevel=1)  # from the writer thread; never raises

    def _rotate(self, seal: bool = True) -> None:
        """Close the open segment (with its end frame) and start the next one."""
        self._close_segment(seal)
        self._segment += 1
        directory, name = os.path.split(self.path)
        prefix = name.rsplit("-", 1)[0]
        self._fd = self._open(os.path.join(directory, f"{prefix}-{self._segment:04d}{SUFFIX}"))

    def _close_segment(self, seal: bool = True) -> None:
        self._since_check = 0
        if self._fd is None:
            return
        try:
            if seal:
                tail = end_frame(self._segment_records)
                os.write(self._fd, tail)
                self._size += len(tail)
        except OSError as e:
            self.error = f"spool write failed: {e}"
        finally:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._closed_segments.append((self.path, self._size))
            self._fd = None

    def _run(self) -> None:
        next_tick = time.monotonic() + self._tick_interval
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self._tick_interval
                try:
                    for record in self._tick():
                        self.put(record)
                except Exception as e:  # a snapshot must never stop the writer
                    self.error = f"progress snapshot failed: {e}"
            self._drain()

    def flush_soon(self) -> None:
        """Have the writer thread write what is buffered now, not at its next interval
        (a record the process may not live long after). Never blocks."""
        self._wake.set()

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is buffered, end the segment and close it. Safe to call twice."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self._next_check = 0.0  # a deletion since the last check is counted, not hidden
        self._drain()
        self._closed = True
        self._drain()  # a record put between the two drains
        self._close_segment()


def _gone(fd: int, path: str) -> bool:
    """Whether the file open as ``fd`` is no longer the one at ``path`` (unlinked, or
    replaced). An error other than the path missing counts as not gone."""
    try:
        mine = os.fstat(fd)
        if mine.st_nlink == 0:
            return True
        there = os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return (mine.st_ino, mine.st_dev) != (there.st_ino, there.st_dev)
