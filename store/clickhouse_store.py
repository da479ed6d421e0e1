"""The server store: a ClickHouse database over clickhouse-driver's native protocol."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
from clickhouse_driver import Client, errors

from ranksight.store import schema
from ranksight.store.base import Store, StoreError
from ranksight.store.ddl import check_identifier, create_database_sql, create_table_sql
from ranksight.store.frames import conform, frame_from_columns
from ranksight.store.sql import bind

# clickhouse-driver logs a traceback at WARNING for every failed connect; without this,
# Python's last-resort handler prints it to stderr even though we raise StoreError.
logging.getLogger("clickhouse_driver").addHandler(logging.NullHandler())

try:
    import clickhouse_cityhash  # noqa: F401 - lz4 frames carry CityHash checksums
    import lz4  # noqa: F401

    COMPRESSION: str | bool = "lz4"
except ImportError:  # pragma: no cover - both are dependencies; stay usable without them
    COMPRESSION = False

_UNREACHABLE = (errors.NetworkError, errors.SocketTimeoutError, EOFError, OSError)


class ClickHouseStore(Store):
    """Tables in database ``database`` of the server at ``host:port`` (native protocol).

    Connects lazily and reconnects after a failure; one query at a time per store
    (thread-safe). ``connect_timeout`` and ``query_timeout`` are in seconds. Every error
    is a StoreError naming the URL (never the password).
    """

    def __init__(
        self,
        host: str,
        port: int = 9000,
        database: str = "ranksight",
        user: str = "default",
        password: str = "",
        secure: bool = False,
        url: str | None = None,
        connect_timeout: float = 3.0,
        query_timeout: float = 300.0,
    ) -> None:
        self.host, self.port, self.database = host, port, check_identifier(database)
        self.url = url or f"clickhouse://{host}:{port}/{database}"
        options = dict(
            port=port,
            user=user,
            password=password,
            secure=secure,
            compression=COMPRESSION,
            connect_timeout=connect_timeout,
            send_receive_timeout=query_timeout,
            client_name="ranksight",
            settings={"use_numpy": True},  # numpy columns: ~5x faster inserts and reads
        )
        self._client = Client(host, database=database, **options)
        self._admin = Client(host, database="default", **options)  # before the db exists
        self._lock = threading.Lock()

    def ping(self) -> None:
        """Connect and run ``SELECT 1``. Raises StoreError "cannot reach ClickHouse at
        host:port (...)" within about ``connect_timeout`` if the server does not answer."""
        with self._errors():
            self._admin.execute("SELECT 1")

    def init_schema(self) -> None:
        """``CREATE DATABASE`` / ``CREATE TABLE ... IF NOT EXISTS`` for every table (see
        ``store/ddl.py``) and record the schema version. Idempotent; raises StoreError if
        the server holds a newer schema version or refuses the DDL."""
        with self._errors():
            self._admin.execute(create_database_sql(self.database))
            for table in schema.TABLES.values():
                self._admin.execute(create_table_sql(table, self.database))
        if self.check_schema_version() < schema.SCHEMA_VERSION:
            row = {"version": schema.SCHEMA_VERSION, "applied_ns": time.time_ns()}
            self.insert("schema_version", pd.DataFrame([row]))

    def insert(self, table: str, frame: pd.DataFrame) -> int:
        """One columnar INSERT of ``frame`` into ``table``; returns the row count. Raises
        ValueError for an unknown table or bad columns, StoreError if the server fails."""
        data = conform(schema.table(table), frame)
        if data.num_rows == 0:
            return 0
        columns = [_values(column) for column in data.columns]
        sql = f"INSERT INTO {table} ({', '.join(data.column_names)}) VALUES"
        with self._errors():
            self._client.execute(sql, columns, columnar=True)
        return data.num_rows

    def query(self, sql: str, params: dict | None = None) -> pd.DataFrame:
        """Run a SELECT; see :class:`Store`. Raises StoreError with the server's message."""
        with self._errors():
            connection = self._client.connection
            if not connection.connected:
                connection.connect()  # for the server's time zone, used in binding
            tz = connection.server_info.get_timezone()
            try:
                text = bind(sql, params, server_tz=tz)
            except ValueError as exc:
                raise StoreError(f"{self.url}: {exc}") from None
            columns, names_types = self._client.execute(text, columnar=True, with_column_types=True)
        if not columns:  # no rows: the driver returns no column lists
            columns = [[] for _ in names_types]
        return frame_from_columns(columns, names_types, server_tz=tz)

    def close(self) -> None:
        """Close both connections. Safe to call twice."""
        self._client.disconnect()
        self._admin.disconnect()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Serialize use of the connections and turn driver errors into StoreError."""
        with self._lock:
            try:
                yield
            except errors.ServerException as exc:
                raise StoreError(f"{self.url}: server error {exc.code}: {_first(exc)}") from None
            except errors.UnexpectedPacketFromServerError as exc:
                raise StoreError(
                    f"cannot reach ClickHouse at {self.host}:{self.port} (something answers "
                    f"but not in ClickHouse's native protocol; the HTTP port?): "
                    f"{' '.join(str(exc).split())}; store {self.url}"
                ) from None
            except _UNREACHABLE as exc:
                reason = " ".join(str(exc).split()) or type(exc).__name__
                raise StoreError(
                    f"cannot reach ClickHouse at {self.host}:{self.port} ({reason}); "
                    f"store {self.url}"
                ) from None
            except errors.Error as exc:
                raise StoreError(f"{self.url}: {' '.join(str(exc).split())}") from None


def _values(column: pa.ChunkedArray) -> np.ndarray:
    """One column as the numpy array clickhouse-driver sends (strings: object array)."""
    return column.to_numpy()


def _first(exc: errors.ServerException) -> str:
    """The server's message without ``DB::Exception:`` and the stack trace, on one line."""
    text = " ".join(str(exc.message or exc).split())
    text = text.split(" Stack trace:")[0].split(", Stack trace")[0]
    return text.removeprefix("DB::Exception: ")
