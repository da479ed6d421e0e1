"""The store interface both backends implement (chdb embedded, ClickHouse server)."""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ranksight.store import schema
from ranksight.store.errors import StoreError
from ranksight.store.schema import SCHEMA_VERSION

if TYPE_CHECKING:  # loaded by the backends; the interface itself needs neither
    import numpy as np
    import pandas as pd

__all__ = ["Store", "StoreError"]

MAX_ATOMIC_ROWS = 1_000_000
"""Most rows one :meth:`Store.insert` with a ``batch_id`` may carry: below the server's
insert block size (1,048,576 rows in clickhouse-driver and ClickHouse), so one insert is
one block, written as one part per partition."""


class Store(abc.ABC):
    """A place runs are written to and read from.

    SQL given to :meth:`query` names tables bare (``FROM collectives``), uses only
    syntax that ClickHouse 18.16 and current ClickHouse both accept (see
    ``store/schema.py``), and takes values only as ``%(name)s`` parameters, which are
    bound by escaping (clickhouse-driver's rules), never by string formatting.

    Found by running the same queries on 18.16 and chdb 26 (``tests/store/test_store.py``):

    - alias every sub-query that is joined (26 rejects ``JOIN (SELECT ..) USING``);
    - join keys must have the same type on 18.16 (``UInt32`` vs ``Int32`` is an error;
      26 converts): cast one side, e.g. ``toUInt32(peer) AS src``;
    - an alias is visible in the whole query, so ``max(end_ns) AS end_ns`` next to
      ``min(end_ns)`` is "aggregate inside aggregate" on both: name aggregates apart
      from the columns they read;
    - ``JOIN ... ON`` takes only ``a = b [AND c = d]`` on 18.16 (no ``<``, no OR);
      ``ALL INNER JOIN`` / ``ANY LEFT JOIN`` work on both; unmatched LEFT JOIN columns are
      0 / "" on both (not NULL);
    - ``IN %(p)s`` needs a tuple parameter: a list binds as an array ``[..]``, which
      18.16 rejects after IN (26 accepts); ``IN ()`` is a syntax error on 18.16;
    - no window functions, no ``WITH name AS (SELECT ...)``; ``WITH 2 AS k`` is fine;
    - never use the server-only ``time`` column (chdb's files do not have it);
    - ``WITH TOTALS``: the server appends the totals row, chdb drops it; avoid;
    - ``groupArray`` order follows storage order, which differs between backends:
      wrap in ``arraySort``; ``topK`` and ``quantileTDigest`` differ between versions;
      ``quantile``, ``quantiles``, ``quantileExact``, ``median``, ``argMax``,
      ``uniqExact``, ``countIf`` agree (``quantile`` samples above 8192 rows, so large
      inputs may differ slightly: use ``quantileExact`` where equality matters);
    - alias computed columns (unaliased: ``minus(end_ns, start_ns)``);
    - result dtypes follow the ClickHouse types on both (``count()`` -> uint64,
      ``rank`` -> uint32, ``UInt32 - 1`` -> int64, String -> str); a string's trailing
      NUL bytes are dropped by the server backend (clickhouse-driver's numpy mode).
    """

    url: str
    insert_grace_s: float = 0.0
    """How long after an insert stops showing in :meth:`inserts_in_flight` one that was
    sent before may still start (0: inserts cannot outlive the call that made them)."""

    def init_schema(self) -> None:
        """Create every table of ``schema.TABLES`` that is missing, add missing columns to
        older tables and record ``SCHEMA_VERSION`` (see ``store/migrate.py``). Idempotent.
        Raises StoreError if the store holds a newer schema version than this code knows,
        or, naming what to run by hand, if the store refuses the change."""
        from ranksight.store.migrate import migrate

        self.prepare()
        migrate(self)

    @abc.abstractmethod
    def prepare(self) -> None:
        """Create the database / folder and the ``schema_version`` table if missing, so
        the version can be read. Raises StoreError if that fails."""

    @abc.abstractmethod
    def schema_changes(self) -> list[str]:
        """What :meth:`apply_schema_changes` would do to match ``schema.TABLES``: server
        SQL, or a description of folder actions. Raises StoreError on a column type
        mismatch (see ``store/migrate.py``)."""

    @abc.abstractmethod
    def apply_schema_changes(self, statements: Sequence[str]) -> None:
        """Carry out ``statements`` from :meth:`schema_changes`. Raises StoreError."""

    def record_schema_version(self, version: int) -> None:
        """Add ``version`` to the ``schema_version`` table."""
        import pandas as pd

        self.insert(
            "schema_version", pd.DataFrame([{"version": version, "applied_ns": time.time_ns()}])
        )

    @abc.abstractmethod
    def insert(self, table: str, frame: pd.DataFrame, *, batch_id: int = 0) -> int:
        """Append ``frame``'s rows to ``table``; returns the row count. Columns must be
        the table's columns (missing ones are filled with zero / empty string; unknown
        ones raise ValueError naming them).

        ``batch_id`` (non-zero; only for tables with a ``batch_id`` column, see
        ``schema.DELIVERED_TABLES``) sets that column on every row and names the insert,
        so that :meth:`stored_batches` can tell later whether it landed: one call is one
        atomic part or segment provided the rows fall in one :meth:`partitions` key and
        number at most ``MAX_ATOMIC_ROWS``. Raises ValueError if the table has no such
        column or the frame is too big."""

    def partitions(self, table: str, frame: pd.DataFrame) -> np.ndarray | None:
        """The storage partition of each row of ``frame`` for ``table`` (rows of one
        :meth:`insert` in several partitions are stored as several parts, not atomically);
        ``None`` when an insert is always one unit. This default: ``None``."""
        return None

    def tables_version(self, tables: Sequence[str]) -> object | None:
        """A hashable value that changes whenever rows are added to or removed from any
        of ``tables``, cheap to get (no query), so that readers can cache results per
        version; None where the backend has no such value (then every read queries).
        This default: None."""
        return None

    def shard_column(self, table: str) -> str | None:
        """The column whose value picks the shard a row of ``table`` is stored on (a
        cluster's sharding key, ``store/cluster.py``): rows of one insert with several
        values land as several parts, one per shard. This default: None (one store)."""
        return None

    def stored_batches(self, table: str, batch_ids: Sequence[int]) -> dict[int, int]:
        """Rows stored in ``table`` per batch id of ``batch_ids`` (ids with no rows are
        left out). Raises StoreError."""
        frame = self.query(
            f"SELECT batch_id, count() AS n FROM {schema.table(table).name} "
            "WHERE batch_id IN %(ids)s GROUP BY batch_id",
            {"ids": tuple(int(i) for i in batch_ids)},
        )
        return {int(b): int(n) for b, n in zip(frame["batch_id"], frame["n"], strict=True)}

    def inserts_in_flight(self, batch_ids: Sequence[int]) -> set[int]:
        """Which of ``batch_ids`` have an insert still running in the store (one whose
        client gave up waiting may still finish). This default: none (inserts finish
        before :meth:`insert` returns). Raises StoreError."""
        return set()

    @abc.abstractmethod
    def query(self, sql: str, params: dict | None = None) -> pd.DataFrame:
        """Run a SELECT and return its result as a DataFrame (one column per selected
        expression, named by its alias). Raises StoreError on failure."""

    def schema_version(self) -> int:
        """The highest schema version recorded in the store's ``schema_version`` table
        (0 if none). Raises StoreError if the store cannot be read."""
        frame = self.query("SELECT max(version) AS version FROM schema_version")
        return int(frame["version"].iloc[0]) if len(frame) else 0

    def check_schema_version(self) -> int:
        """The store's schema version (0: none yet); raises StoreError naming both versions
        if it is newer than this code's ``schema.SCHEMA_VERSION``."""
        found = self.schema_version()
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"{self.url}: store has schema version {found}, newer than this ranksight's "
                f"{SCHEMA_VERSION}; upgrade ranksight to use it"
            )
        return found

    def copy(self) -> Store:
        """A store for the same place with its own connection, for use from another thread
        at the same time (this default: the store itself, for backends that need no
        connection)."""
        return self

    def reopen_spec(self) -> dict | None:
        """How another process opens this store (JSON-able; ``store.clickhouse_store.
        reopen``), or None if it cannot (this default: a store that lives in this process,
        such as a chdb folder, is written from here). The node agent ships from separate
        processes only to stores that have one (``agent/shipper.py``)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional for backends without resources
        """Release connections. Safe to call twice."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
