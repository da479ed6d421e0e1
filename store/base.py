"""The store interface both backends implement (chdb embedded, ClickHouse server)."""

from __future__ import annotations

import abc

import pandas as pd


class StoreError(RuntimeError):
    """A store could not be opened, reached or queried. The message is one line that
    names the store URL (never credentials) and what is wrong."""


class Store(abc.ABC):
    """A place runs are written to and read from.

    SQL given to :meth:`query` names tables bare (``FROM collectives``), uses only
    syntax that ClickHouse 18.16 and current ClickHouse both accept (see
    ``store/schema.py``), and takes values only as ``%(name)s`` parameters, which are
    bound by escaping (clickhouse-driver's rules), never by string formatting.
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

    def close(self) -> None:  # noqa: B027 - optional for backends without resources
        """Release connections. Safe to call twice."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
