"""The agent's disk buffer: sealed batches waiting for the store, oldest first, bounded.

Layout under ``<state>/batches/``: one folder per batch, ``<seq:012d>/``, holding one
file per table (``<table>.arrow``: an uncompressed Arrow IPC file, sealed while the
shippers keep up; ``<table>.parquet``: zstd Parquet, once a backlog builds (see
:data:`BACKLOG_S`) or for a batch over an eighth of the bound) and
``manifest.json``: the
batch's sequence number, its random 63-bit ``uid`` (the root of its delivery ids, see
``agent/deliver.py``), row counts, and the spool offsets reached when it was sealed. A
batch is written under ``.<seq>.tmp/``, fsynced and renamed into place, so a batch folder
is whole or absent. ``<seq>/attempted`` marks a batch an insert was tried for: it is
checked against the store before it is sent again. A shipped or dropped batch is renamed
to ``.<seq>.gone`` before it is deleted, so a crash mid-delete cannot leave half a batch.

When the folders pass ``max_bytes``, :meth:`DiskBuffer.enforce` drops by the policy of
``agent/config.py`` and returns the rows dropped per table. When the disk itself is full
(ENOSPC: other files, or a bound larger than the disk), a seal fails whole and leaves
nothing behind; the agent then drops the oldest batches (:meth:`DiskBuffer.drop_oldest`)
until it fits (``agent/agent.py``).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST = "manifest.json"
ATTEMPTED = "attempted"
FAST, DENSE = "arrow", "zstd"
"""How a batch is sealed. ``arrow`` while the shippers keep up: an uncompressed Arrow IPC
file, about 0.05 µs and 141 bytes a record of the hooks' mix on the test VM, which a
shipper process maps back for free (the batch is gone from disk within a second or two).
``zstd`` once a backlog builds up (a store outage, :data:`BACKLOG_S`): Parquet, no
dictionary encoding, about 0.23 µs and 9 bytes a record, so the bound holds 15x more
records; reading it back costs a shipper about 0.25-0.35 µs a record. Parquet with lz4 (the earlier fast format) took
0.15-0.3 µs to write, 0.3 µs to read back, 22 bytes; Arrow IPC with lz4 0.1 µs each way,
42 bytes (``bench/ingest.py``'s notes in ``bench/RESULTS.md``)."""
BACKLOG_S = 5.0
"""New batches are sealed :data:`DENSE` while the oldest buffered batch was sealed more
than this long ago (seconds: the store is down or slower than the spool), or while the
buffered batches take over 1/:data:`_FAST_SHARE` of the bound. A few batches waiting for
a moment (the reader sealing a burst faster than the shippers send it) are no backlog:
sealing them dense would cost the reader about 0.2 µs and each shipper 0.3 µs a record
more than it saves (``bench/ingest.py``)."""
_FAST_SHARE = 8
"""A batch over 1/8 of the buffer's bound is sealed :data:`DENSE` even without a backlog."""
_KEEP_IN_MEMORY = 2  # newest sealed batches the shipper takes without reading them back


@dataclass(frozen=True, slots=True)
class SealedBatch:
    """One buffered batch: ``tables`` (table name -> rows), its identity and offsets."""

    seq: int
    uid: int
    tables: dict[str, pa.Table]
    offsets: dict
    attempted: bool

    @property
    def rows(self) -> int:
        """Rows across tables."""
        return sum(t.num_rows for t in self.tables.values())


class DiskBuffer:
    """Sealed batches in ``folder``, at most about ``max_bytes`` on disk.

    Thread-safe: a reader thread seals and enforces the bound while a shipper thread loads
    and removes; the batch being shipped (:attr:`in_flight`) is never dropped.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        max_bytes: int,
        policy: str,
        fsync: bool,
        keep_in_memory: int = _KEEP_IN_MEMORY,
    ):
        self.folder = Path(folder) / "batches"
        self.keep_in_memory = keep_in_memory
        """Newest sealed batches kept in memory for :meth:`load` (0 when shipper
        processes read them from disk)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.policy, self.fsync = max_bytes, policy, fsync
        self.in_flight: set[int] = set()
        """Batches a shipper holds now (several shippers may each hold one)."""
        self._lock = threading.Lock()
        self._recent: dict[int, tuple[dict[str, pa.Table], dict]] = {}  # sealed, still in memory
        for leftover in list(self.folder.glob(".*")):  # half-written or half-deleted
            shutil.rmtree(leftover, ignore_errors=True)
        self._sizes = {seq: _du(self._path(seq)) for seq in self._listed()}
        manifests = {seq: self._manifest(seq) for seq in self._sizes}
        self._rows = {seq: sum(m["rows"].values()) for seq, m in manifests.items()}
        self._created = {seq: int(m.get("created_ns", 0)) for seq, m in manifests.items()}

    def _path(self, seq: int) -> Path:
        return self.folder / f"{seq:012d}"

    def _listed(self) -> list[int]:
        return sorted(int(p.name) for p in self.folder.iterdir() if p.name.isdigit())

    def _manifest(self, seq: int) -> dict:
        return json.loads((self._path(seq) / MANIFEST).read_text())

    @property
    def last_seq(self) -> int:
        """Highest sequence number present (0 if empty)."""
        with self._lock:
            return max(self._sizes, default=0)

    def seqs(self) -> list[int]:
        """Buffered batches, oldest first."""
        with self._lock:
            return sorted(self._sizes)

    @property
    def size(self) -> tuple[int, int]:
        """(rows, bytes) buffered."""
        with self._lock:
            return sum(self._rows.values()), sum(self._sizes.values())

    def take_oldest(self, committed: int) -> int | None:
        """The oldest batch up to ``committed`` that no shipper holds, now in
        :attr:`in_flight` until :meth:`release` (None if none)."""
        with self._lock:
            ready = [s for s in self._sizes if s <= committed and s not in self.in_flight]
            if not ready:
                return None
            self.in_flight.add(min(ready))
            return min(ready)

    def release(self, seq: int) -> None:
        """A shipper is done with batch ``seq`` (shipped and removed, or to be retried)."""
        with self._lock:
            self.in_flight.discard(seq)

    def oldest_created_ns(self) -> int | None:
        """When the oldest batch still in the buffer was sealed (ns), None if it is empty:
        how far the store lags behind the spool."""
        seqs = self.seqs()
        return int(self._manifest(seqs[0])["created_ns"]) if seqs else None

    def offsets_after(self, seq: int) -> list[tuple[int, dict]]:
        """``(seq, offsets)`` of each batch newer than ``seq``, oldest first (recovery)."""
        return [(s, self._manifest(s)["offsets"]) for s in self.seqs() if s > seq]

    def seal(self, seq: int, tables: dict[str, pa.Table], offsets: dict) -> int:
        """Write a batch as number ``seq``; returns its size in bytes. Raises OSError
        (:func:`disk_full` tells a full disk), leaving nothing behind: a batch folder is
        whole or absent, and a failed write's temp folder is removed."""
        tmp = self.folder / f".{seq:012d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # a write of ``seq`` that failed before
        with self._lock:
            if seq not in self._sizes:  # one whose seal raised after its rename
                shutil.rmtree(self._path(seq), ignore_errors=True)
        tmp.mkdir()
        try:
            return self._seal(seq, tables, offsets, tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _seal(self, seq: int, tables: dict[str, pa.Table], offsets: dict, tmp: Path) -> int:
        raw = sum(t.nbytes for t in tables.values())
        now_ns = time.time_ns()
        with self._lock:
            buffered = sum(self._sizes.values())
            oldest = min(self._created.values(), default=now_ns)
        backlog = buffered * _FAST_SHARE > self.max_bytes or now_ns - oldest > BACKLOG_S * 1e9
        # FAST only while the shippers keep up and the batch is small beside the bound
        # (a bound of a few batches holds them compressed)
        compression = DENSE if backlog or raw * _FAST_SHARE > self.max_bytes else FAST
        for name, table in tables.items():
            if compression == FAST:
                with pa.OSFile(str(tmp / f"{name}.arrow"), "wb") as sink:
                    with pa.ipc.new_file(sink, table.schema) as writer:
                        writer.write_table(table)
            else:
                pq.write_table(
                    table, str(tmp / f"{name}.parquet"), compression=compression,
                    use_dictionary=False,
                )  # fmt: skip
        manifest: dict[str, Any] = {
            "seq": seq,
            "uid": secrets.randbits(63) or 1,
            "created_ns": now_ns,
            "rows": {name: t.num_rows for name, t in tables.items()},
            "offsets": offsets,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest))
        if self.fsync:
            for path in tmp.iterdir():
                _fsync(path)
            _fsync(tmp)
        os.rename(tmp, self._path(seq))
        if self.fsync:
            _fsync(self.folder)
        size = _du(self._path(seq))
        with self._lock:
            self._sizes[seq], self._rows[seq] = size, sum(manifest["rows"].values())
            self._created[seq] = now_ns
            if self.keep_in_memory:
                self._recent[seq] = (tables, manifest)
            while len(self._recent) > self.keep_in_memory:
                del self._recent[min(self._recent)]
        return size

    def load(self, seq: int) -> SealedBatch:
        """Read batch ``seq`` back. Raises OSError / ValueError if it is damaged."""
        with self._lock:
            recent = self._recent.get(seq)
        if recent is None:
            return read_batch(self.folder, seq)
        tables, manifest = recent  # just sealed: no need to read it back
        attempted = self.attempted(seq)
        return SealedBatch(seq, manifest["uid"], tables, manifest["offsets"], attempted)

    def attempted(self, seq: int) -> bool:
        """Whether an insert of batch ``seq`` was tried before (:meth:`mark_attempted`)."""
        return (self._path(seq) / ATTEMPTED).exists()

    def mark_attempted(self, seq: int) -> None:
        """Note that an insert of batch ``seq`` is being tried (it may land); durable before
        the insert starts (fsync), so that even after a machine crash the batch is checked
        against the store before it is sent again."""
        marker = self._path(seq) / ATTEMPTED
        marker.touch()
        if self.fsync:
            _fsync(marker)
            _fsync(self._path(seq))

    def remove(self, seq: int) -> None:
        """Delete batch ``seq`` (shipped or dropped); a missing one is fine."""
        with self._lock:
            self._sizes.pop(seq, None)
            self._rows.pop(seq, None)
            self._created.pop(seq, None)
            self._recent.pop(seq, None)
        gone = self.folder / f".{seq:012d}.gone"
        try:
            os.rename(self._path(seq), gone)
        except FileNotFoundError:
            return
        shutil.rmtree(gone, ignore_errors=True)

    def enforce(self, newest: int, committed: int) -> dict[str, int]:
        """Bring the buffer under ``max_bytes`` by the drop policy; returns rows dropped
        per table. ``newest`` is the batch just sealed; only batches up to ``committed``
        (whose spool offsets are durable) and not :attr:`in_flight` may go."""
        dropped: dict[str, int] = {}
        while True:
            with self._lock:
                total = sum(self._sizes.values())
                allowed = [
                    s for s in sorted(self._sizes) if s <= committed and s not in self.in_flight
                ]
            if total <= self.max_bytes or not allowed:
                return dropped
            victim = newest if self.policy == "drop_newest" else allowed[0]
            if victim not in allowed:
                return dropped
            for name, n in self.drop(victim).items():
                dropped[name] = dropped.get(name, 0) + n
            if self.policy == "drop_newest":
                return dropped

    def drop_oldest(self, committed: int) -> dict[str, int]:
        """Delete the oldest batch up to ``committed`` that no shipper holds (to make room
        on a full disk); returns its rows per table (empty if there is none to drop)."""
        with self._lock:
            allowed = [s for s in self._sizes if s <= committed and s not in self.in_flight]
        return self.drop(min(allowed)) if allowed else {}

    def drop(self, seq: int) -> dict[str, int]:
        """Delete batch ``seq`` unsent; returns its rows per table."""
        with self._lock:
            recent = self._recent.get(seq)
        try:
            rows = (recent[1] if recent else self._manifest(seq))["rows"]
        except (OSError, ValueError):
            rows = {"?": self._rows.get(seq, 0)}  # a damaged manifest: its count at start
        self.remove(seq)
        return rows


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(exc: OSError) -> bool:
    """Whether ``exc`` says the disk (or the user's quota, or the file size limit) is full."""
    return exc.errno in _FULL or "No space left on device" in str(exc)


def read_batch(folder: str | os.PathLike, seq: int) -> SealedBatch:
    """Batch ``seq`` of the buffer's ``batches`` folder ``folder``, read from disk (Arrow
    IPC files are memory-mapped, not copied); usable from another process than the one
    that sealed it (a shipper process, ``agent/shipper.py``). Raises OSError / ValueError
    (pyarrow's errors included) if it is missing or damaged."""
    path = Path(folder) / f"{seq:012d}"
    manifest = json.loads((path / MANIFEST).read_text())
    tables = {}
    for name in manifest["rows"]:
        if (path / f"{name}.parquet").exists():
            tables[name] = pq.ParquetFile(path / f"{name}.parquet").read()
            continue
        with pa.memory_map(str(path / f"{name}.arrow")) as source:
            tables[name] = pa.ipc.open_file(source).read_all()
    attempted = (path / ATTEMPTED).exists()
    return SealedBatch(seq, manifest["uid"], tables, manifest["offsets"], attempted)


def _du(path: Path) -> int:
    """Bytes of the files in folder ``path``."""
    return sum(p.stat().st_size for p in path.iterdir())


def _fsync(path: Path) -> None:
    """fsync a file or folder."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
