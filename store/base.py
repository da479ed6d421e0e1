"""The store interface both backends implement (chdb embedded, ClickHouse server)."""

from __future__ import annotations

import abc

import pandas as pd

from ranksight.store.schema import SCHEMA_VERSION


class StoreError(RuntimeError):
    """A store could not be opened, reached or queried. The message is one line that
    names the store URL (never credentials) and what is wrong."""


class Store(abc.ABC):
    """A place runs are written to and read from.

    SQL given to :meth:`query` names tables bare (``FROM collectives``), uses only
    syntax that ClickHouse 18.16 and current ClickHouse both accept (see
    ``store/schema.py``), and takes values only as ``%(name)s`` parameters, which are
    bound by escaping (clickhouse-driver's rules), never by string formatting.

    Found by running the same queries on 18.16 and chdb 26 (``tests/test_store.py``):

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

    @abc.abstractmethod
    def init_schema(self) -> None:
        """Create every table of ``schema.TABLES`` if missing and record
        ``SCHEMA_VERSION``. Idempotent. Raises StoreError if the store holds a newer
        schema version than this code knows."""

    @abc.abstractmethod
    def insert(self, table: str, frame: pd.DataFrame) -> int:
        """Append ``frame``'s rows to ``table``; returns the row count. Columns must be
        the table's columns (missing ones are filled with zero / empty string; unknown
        ones raise ValueError naming them)."""

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

    def close(self) -> None:  # noqa: B027 - optional for backends without resources
        """Release connections. Safe to call twice."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
