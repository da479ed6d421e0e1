"""The embedded store: Parquet segments in a folder, queried with chdb (no server).

Each :meth:`ChdbStore.insert` writes one immutable segment (``store/segments.py``), so
any number of processes can read a run while one process writes it. A query names tables
bare; each is rewritten into ``file('<folder>/<table>/*.parquet', Parquet, '<columns>')``
with the table's ClickHouse column types given explicitly, so results are typed exactly
as on the server and a table with no segments reads as empty.

Measured on a 2-core VM (chdb 4.4): an insert of 1,000 ``steps`` rows takes 1.6 ms,
100,000 rows 26 ms (3.9 M rows/s). ``GROUP BY rank`` with quantile and argMax takes 4 ms
over 1 segment, 31 ms over 100 segments (99 k rows), 88 ms over 300 and 280 ms over
1,000 (about 0.25 ms per segment); after compacting those 1,000 into one (1.6 s), 65 ms
for 1 M rows. Hence automatic compaction (``auto_compact``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from ranksight.store import schema, segments
from ranksight.store.base import Store, StoreError
from ranksight.store.frames import conform, frame_from_arrow, with_batch_id
from ranksight.store.sql import bind, referenced_tables, rewrite_tables
from ranksight.store.types import structure, table_schema

_GLOB_CHARS = set("*?{}'\\")
AUTO_COMPACT_BELOW_BYTES = 64 << 20
"""Automatic compaction merges only segments smaller than this (bytes)."""


class ChdbStore(Store):
    """A store in a local folder (``<folder>/<table>/*.parquet``).

    ``folder`` need not exist until :meth:`init_schema`. ``auto_compact``: after an insert
    that leaves a table with more segments than this, merge its segments under
    ``AUTO_COMPACT_BELOW_BYTES`` (size-tiered, so finished big segments are not rewritten;
    skipped if another process is compacting it); ``None`` turns this off. Query time grows
    about 0.25 ms per segment, so this keeps reads fast over long runs.
    Raises StoreError if the folder path contains ``* ? { }``, quotes or backslashes.
    """

    def __init__(
        self, folder: str | os.PathLike, url: str | None = None, auto_compact: int | None = 200
    ) -> None:
        self.folder = Path(os.path.abspath(folder))
        self.url = url or str(self.folder)
        self.auto_compact = auto_compact
        if _GLOB_CHARS & set(str(self.folder)):
            raise StoreError(f"{self.url}: store folder path may not contain * ? {{ }} ' \\")

    def prepare(self) -> None:
        """Create the folder and the ``schema_version`` table folder if missing. Raises
        StoreError if the folder cannot be written."""
        self._create_tables([schema.SCHEMA_VERSION_TABLE.name])
        try:
            (self.folder / segments.LOCK).touch()
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot create the store: {exc}") from None

    def schema_changes(self) -> list[str]:
        """One action per missing table folder. Columns need none: a segment written
        before a column was added reads it as the column's default (0 / "")."""
        return [
            f"create table folder {self.folder / name} with an empty segment"
            for name in schema.TABLES
            if not segments.segments(self.folder / name)
        ]

    def apply_schema_changes(self, statements: Sequence[str]) -> None:
        """Create every missing table folder (the actions of :meth:`schema_changes`)."""
        self._create_tables(list(schema.TABLES))

    def _create_tables(self, names: list[str]) -> None:
        """A folder holding an empty segment for each table of ``names`` that has none."""
        try:
            for name in names:
                folder = self.folder / name
                folder.mkdir(parents=True, exist_ok=True)
                if not segments.segments(folder):
                    segments.write_segment(folder, table_schema(schema.TABLES[name]).empty_table())
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot create the store: {exc}") from None

    def insert(self, table: str, frame: pd.DataFrame, *, batch_id: int = 0) -> int:
        """Write ``frame`` as one new segment of ``table``; returns its row count (an empty
        frame writes nothing). With ``batch_id`` the segment is named after it
        (``b<hex>.parquet``) and a segment of that name already there is kept as it is, so
        writing the same batch twice stores it once. Raises ValueError for an unknown
        table or bad columns (see ``frames.conform``), StoreError if the store is not
        initialized or not writable."""
        spec = schema.table(table)
        data = conform(spec, with_batch_id(table, frame, batch_id))
        if data.num_rows == 0:
            return 0
        folder = self.folder / table
        if not folder.is_dir():
            raise StoreError(f"{self.url}: no table {table!r} here; run init_schema first")
        name = f"b{batch_id:016x}.parquet" if batch_id else None
        try:
            segments.write_segment(folder, data, name=name)
            if self.auto_compact and len(segments.segments(folder)) > self.auto_compact:
                self._compact(table, AUTO_COMPACT_BELOW_BYTES, wait=False)
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot write to {table}: {exc}") from None
        return data.num_rows

    def query(self, sql: str, params: dict | None = None) -> pd.DataFrame:
        """Run a SELECT over the store's tables; see :class:`Store`. Reads see every segment
        whose rename finished before the query started. Raises StoreError with chdb's
        message on failure, or if the store folder does not exist."""
        try:
            text = bind(sql, params)
        except ValueError as exc:
            raise StoreError(f"{self.url}: {exc}") from None
        used = referenced_tables(text, set(schema.TABLES))
        text = rewrite_tables(text, self._source)
        if not self.folder.is_dir():
            raise StoreError(f"{self.url}: no store here; run init_schema first")
        from ranksight.store import chdb_engine  # ~200 MB: loaded by the first query only

        try:
            with segments.read_lock(self.folder, used):
                data = chdb_engine.run(text)
        except (chdb_engine.EngineError, OSError) as exc:
            raise StoreError(f"{self.url}: query failed: {exc}") from None
        return frame_from_arrow(data)

    def tables_version(self, tables: Sequence[str]) -> tuple:
        """Per table, the number of its segments and a hash of their names: segments are
        immutable and their names never reused (``store/segments.py``), so any insert,
        compaction or deletion changes it. One directory listing per table (about a
        millisecond), no query; a table folder that is missing counts as empty."""
        out = []
        for table in tables:
            names = tuple(p.name for p in segments.segments(self.folder / table))
            out.append((table, len(names), hash(names)))
        return tuple(out)

    def schema_version(self) -> int:
        """The highest version in the ``schema_version`` segments (0 if none), read with
        pyarrow: writers (the node agent) never load the chdb engine. Raises StoreError if
        the store cannot be read."""
        versions = self._column("schema_version", "version")
        return max((int(v) for v in versions), default=0)

    def stored_batches(self, table: str, batch_ids: Sequence[int]) -> dict[int, int]:
        """Rows per batch id of ``batch_ids`` in ``table`` (ids with none left out), from
        the segments' ``batch_id`` columns with pyarrow (see :meth:`schema_version`)."""
        import numpy as np

        wanted = np.array(sorted({int(i) for i in batch_ids}), dtype=np.uint64)
        found: dict[int, int] = {}
        for values in self._column(schema.table(table).name, "batch_id", chunks=True):
            hits = values[np.isin(values, wanted)]
            for batch_id, n in zip(*np.unique(hits, return_counts=True), strict=True):
                found[int(batch_id)] = found.get(int(batch_id), 0) + int(n)
        return found

    def _column(self, table: str, column: str, chunks: bool = False) -> list:
        """Every value of ``column`` in ``table``'s segments (segments without the column
        have none); with ``chunks``, one numpy array per segment. Raises StoreError."""
        folder = self.folder / table
        if not folder.is_dir():
            raise StoreError(f"{self.url}: no table {table!r} here; run init_schema first")
        out: list = []
        try:
            with segments.read_lock(self.folder, [table]):
                for path in segments.segments(folder):
                    segment = pq.ParquetFile(path)  # not pq.read_table: no pyarrow.dataset
                    if column not in segment.schema_arrow.names:
                        continue
                    values = segment.read(columns=[column]).column(0).to_numpy()
                    out.append(values) if chunks else out.extend(values.tolist())
        except (OSError, ValueError) as exc:
            raise StoreError(f"{self.url}: cannot read {table}: {exc}") from None
        return out

    def compact(self, table: str) -> int:
        """Merge ``table``'s segments into one, sorted by its ``ORDER BY`` key; returns how
        many segments it replaced. Safe while writers insert and readers query (see
        ``store/segments.py``); memory use is the whole table. Raises ValueError for an
        unknown table, StoreError if the files cannot be read or written."""
        try:
            return self._compact(table)
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot compact {table}: {exc}") from None

    def _compact(self, table: str, below_bytes: int | None = None, wait: bool = True) -> int:
        """:func:`segments.compact` for ``table``."""
        spec = schema.table(table)
        folder, arrow = self.folder / table, table_schema(spec)
        return segments.compact(self.folder, folder, arrow, spec.order_by, below_bytes, wait)

    def _source(self, name: str) -> str | None:
        """The ``file()`` table function reading table ``name``; None for other names."""
        spec = schema.TABLES.get(name)
        if spec is None:
            return None
        return f"file('{self.folder}/{name}/*.parquet', Parquet, '{structure(spec)}')"
