"""A table as a folder of immutable Parquet segments, readable while it is written.

Layout: ``<store>/<table>/<time_ns>-<pid>-<counter>.parquet``. Writers never take a lock:
a segment is written under a hidden temporary name (``.<name>.tmp``, which the
``*.parquet`` glob does not match), fsynced and renamed into place, so a reader sees a
segment whole or not at all.

Compaction merges a table's segments into one. Readers hold a shared ``flock`` on
``<store>/.lock`` while they list and read files; compaction takes it exclusively only
for the swap (rename the merged segment in, delete the ones it replaces), so a reader
never sees both a merged segment and its sources (double counting) nor neither (loss).
Before the swap, compaction writes ``<table>/compact.intent`` naming both sides; a
compaction that died mid-swap is finished by the next reader or writer that sees it.
``flock`` is advisory and local: the store folder must be on a local file system.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

_counter = itertools.count()
INTENT = "compact.intent"
LOCK = ".lock"


def write_segment(folder: Path, data: pa.Table, name: str | None = None) -> Path:
    """Write ``data`` as a new segment of the table folder ``folder``; returns its path.
    The file appears atomically (temp file, fsync, rename). ``name`` (``*.parquet``): a
    fixed name, for idempotent writes: if a segment of that name exists, nothing is
    written (first writer wins, ``os.link`` refuses to replace)."""
    tmp, final = _stage(folder, data, name)
    if name is None:
        os.replace(tmp, final)
        return final
    try:
        os.link(tmp, final)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return final


def _stage(folder: Path, data: pa.Table, name: str | None = None) -> tuple[Path, Path]:
    """Write ``data`` to a hidden temp file; returns it and the segment name it gets."""
    if name is None:
        name, suffix = f"{time.time_ns()}-{os.getpid()}-{next(_counter)}.parquet", ""
    else:  # several writers may stage the same fixed name
        suffix = f".{os.getpid()}-{next(_counter)}"
    tmp = folder / f".{name}{suffix}.tmp"
    pq.write_table(data, tmp, compression="zstd", use_dictionary=False)  # smaller, faster
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    return tmp, folder / name


def segments(folder: Path) -> list[Path]:
    """The table folder's segments, oldest name first."""
    return sorted(folder.glob("*.parquet"), key=lambda p: p.name)


@contextlib.contextmanager
def store_lock(store: Path, exclusive: bool) -> Iterator[None]:
    """Hold the store-wide lock (shared for readers, exclusive for compaction swaps)."""
    path = store / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY)  # read-only users can still share-lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def read_lock(store: Path, tables: Iterable[str]) -> Iterator[None]:
    """Shared lock for reading ``tables``; first finishes any interrupted compaction.
    The check for one is made while the shared lock is held (a compaction that dies
    mid-swap after an unlocked check would leave merged and replaced segments side by
    side: rows counted twice)."""
    tables = list(tables)
    while True:
        with store_lock(store, exclusive=False):
            if not any((store / t / INTENT).exists() for t in tables):
                yield
                return
        with store_lock(store, exclusive=True):
            for t in tables:
                recover(store / t)


def recover(folder: Path) -> None:
    """Finish or roll back a compaction of ``folder`` that stopped mid-swap. Call with
    the store lock held exclusively."""
    intent = folder / INTENT
    if not intent.exists():
        return
    plan = json.loads(intent.read_text())
    if (folder / plan["merged"]).exists():
        for name in plan["replaced"]:
            (folder / name).unlink(missing_ok=True)
    (folder / f".{plan['merged']}.tmp").unlink(missing_ok=True)
    intent.unlink()


def compact(
    store: Path,
    folder: Path,
    schema: pa.Schema,
    sort_by: Iterable[str],
    below_bytes: int | None = None,
    wait: bool = True,
) -> int:
    """Merge a table folder's segments into one, sorted by ``sort_by``; returns how many
    segments were replaced (0 if fewer than two qualified). ``below_bytes``: merge only
    segments smaller than this (size-tiered: big merged segments are not rewritten
    again). Writers may keep inserting meanwhile: segments that land after the listing
    are left alone. One compaction per table at a time: others wait, or with
    ``wait=False`` return 0 at once."""
    fd = os.open(folder / ".compact.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return 0
        with store_lock(store, exclusive=True):
            recover(folder)
        sources = [p for p in segments(folder) if _smaller(p, below_bytes)]
        if len(sources) < 2:
            return 0
        merged = pa.concat_tables(_aligned(pq.read_table(p), schema) for p in sources)
        merged = merged.sort_by([(c, "ascending") for c in sort_by])
        tmp, final = _stage(folder, merged)
        try:
            return _swap(store, tmp, final, sources)
        finally:
            tmp.unlink(missing_ok=True)
            _remove_stale_temps(folder)
    finally:
        os.close(fd)


def _smaller(path: Path, limit: int | None) -> bool:
    """Whether ``path`` is smaller than ``limit`` bytes (always, with no limit)."""
    return limit is None or path.stat().st_size < limit


def _swap(store: Path, staged: Path, merged: Path, sources: list[Path]) -> int:
    """Rename ``staged`` to ``merged`` and delete ``sources``, in one step as far as
    readers can tell (they wait on the store lock meanwhile)."""
    folder = merged.parent
    with store_lock(store, exclusive=True):
        plan = {"merged": merged.name, "replaced": [p.name for p in sources]}
        tmp = folder / f".{INTENT}.tmp"
        tmp.write_text(json.dumps(plan))
        os.replace(tmp, folder / INTENT)
        os.replace(staged, merged)
        for path in sources:
            path.unlink(missing_ok=True)
        (folder / INTENT).unlink()
    return len(sources)


def _remove_stale_temps(folder: Path, age_s: float = 3600.0) -> None:
    """Delete temp files that writers which died mid-write left behind ``age_s`` ago."""
    cutoff = time.time() - age_s
    for path in folder.glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime < cutoff:
                path.unlink()


def _aligned(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` with ``schema``'s columns: cast, and missing ones filled with 0 / ""."""
    arrays = []
    for field in schema:
        if field.name in data.column_names:
            arrays.append(data.column(field.name).cast(field.type))
        elif pa.types.is_string(field.type):
            arrays.append(pa.array([""] * data.num_rows, field.type))
        else:
            arrays.append(pa.array(np.zeros(data.num_rows), field.type))
    return pa.Table.from_arrays(arrays, schema=schema)
