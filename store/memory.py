"""A store that lives as long as the process that opens it: for a one-shot ``ranksight
import`` that nothing asks to keep (``--store memory:``, and ``import`` without
``--store`` or ``$RANKSIGHT_STORE``).

It is the embedded store (``store/chdb_store.py``: Parquet segments queried with chdb)
in a fresh folder in RAM (``/dev/shm`` where it can be written, else the temporary
folder), removed by :meth:`MemoryStore.close` or at exit. It is born at this ranksight's
schema, so there is no schema work: a table folder is made by its first insert, and a
table with no rows reads as empty through ClickHouse's ``null(structure)`` table
function (typed exactly as the table) instead of an empty segment written beforehand.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ranksight.store import schema, segments
from ranksight.store.base import StoreError
from ranksight.store.chdb_store import ChdbStore
from ranksight.store.types import structure


class MemoryStore(ChdbStore):
    """A chdb store in a new folder in RAM, gone at :meth:`close` or process exit;
    ``url``: the URL it was opened by (``store/url.py`` ``MEMORY``). Raises StoreError
    if no temporary folder can be made."""

    def __init__(self, url: str = "memory:") -> None:
        ram = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
        try:
            folder = tempfile.mkdtemp(prefix="ranksight-memory-", dir=ram)
            (Path(folder) / segments.LOCK).touch()
        except OSError as exc:
            raise StoreError(f"{url} cannot make a temporary folder: {exc}") from None
        super().__init__(folder, url=f"{url} (in {folder}, removed at exit)")
        atexit.register(self.close)

    def prepare(self) -> None:
        """Nothing to prepare: the folder is made at open, tables at their first insert."""

    def schema_changes(self) -> list[str]:
        """None: a new in-memory store is at this ranksight's schema."""
        return []

    def schema_version(self) -> int:
        """This ranksight's :data:`~ranksight.store.schema.SCHEMA_VERSION`."""
        return schema.SCHEMA_VERSION

    def insert(self, table: str, frame: pd.DataFrame, *, batch_id: int = 0) -> int:
        """:meth:`ChdbStore.insert`, making the table's folder first. Raises ValueError
        for an unknown table or bad columns, StoreError if RAM cannot be written."""
        try:
            (self.folder / schema.table(table).name).mkdir(exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot write to {table}: {exc}") from None
        return super().insert(table, frame, batch_id=batch_id)

    def stored_batches(self, table: str, batch_ids: Sequence[int]) -> dict[int, int]:
        """:meth:`ChdbStore.stored_batches`; none for a table not yet written."""
        if not (self.folder / schema.table(table).name).is_dir():
            return {}
        return super().stored_batches(table, batch_ids)

    def close(self) -> None:
        """Remove the folder and its rows. Safe to call twice."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def _source(self, name: str) -> str | None:
        """:meth:`ChdbStore._source`, or ``null(structure)`` for a table with no rows."""
        spec = schema.TABLES.get(name)
        if spec is not None and not segments.segments(self.folder / name):
            return f"null('{structure(spec)}')"
        return super()._source(name)
