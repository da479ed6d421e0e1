"""The server store: a ClickHouse database over clickhouse-driver's native protocol."""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import struct
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from clickhouse_driver import Client, errors

from ranksight.ground.words import counted
from ranksight.store import schema
from ranksight.store.base import Store, StoreError
from ranksight.store.ddl import (
    check_identifier,
    create_database_sql,
    create_table_sql,
    schema_changes_sql,
)
from ranksight.store.frames import conform, frame_from_columns, month_keys, with_batch_id
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
COMPRESSIONS = ("lz4", "none")
"""What ``ClickHouseStore(compression=...)`` takes (``$RANKSIGHT_CH_COMPRESSION``)."""

_QUERY_PREFIX = "ranksight-"
_UNREACHABLE = (errors.NetworkError, errors.SocketTimeoutError, EOFError, OSError)


_LINGER_RESET = struct.pack("ii", 1, 0)


class ClickHouseStore(Store):
    """Tables in database ``database`` of the server at ``host:port`` (native protocol).

    Connects lazily and reconnects after a failure; one query at a time per store
    (thread-safe). ``connect_timeout`` and ``query_timeout`` are in seconds. ``secure``:
    TLS, the server's certificate verified against ``ca_certs`` (a PEM file) or the
    system's CAs. ``compression``: one of :data:`COMPRESSIONS` (None: lz4), for data both
    ways; raises ValueError for another. Every error is a StoreError naming the URL (never
    the password).
    """

    def __init__(
        self,
        host: str,
        port: int = 9000,
        database: str = "ranksight",
        user: str = "default",
        password: str = "",
        secure: bool = False,
        ca_certs: str | None = None,
        url: str | None = None,
        connect_timeout: float = 3.0,
        query_timeout: float = 300.0,
        compression: str | None = None,
    ) -> None:
        if compression not in (None, *COMPRESSIONS):
            raise ValueError(
                f"ClickHouse compression {compression!r} is not one of {', '.join(COMPRESSIONS)}"
            )
        self._params: dict[str, Any] = dict(
            host=host, port=port, database=database, user=user, password=password,
            secure=secure, ca_certs=ca_certs, url=url, connect_timeout=connect_timeout,
            query_timeout=query_timeout, compression=compression,
        )  # fmt: skip
        self.host, self.port, self.database = host, port, check_identifier(database)
        self.url = url or f"clickhouse://{host}:{port}/{database}"
        options: dict[str, Any] = dict(
            port=port,
            user=user,
            password=password,
            secure=secure,
            compression=False if compression == "none" else COMPRESSION,
            connect_timeout=connect_timeout,
            send_receive_timeout=query_timeout,
            client_name="ranksight",
            # numpy columns: ~5x faster inserts and reads. The other two matter only on
            # a cluster's Distributed tables (store/cluster.py): a run's joins and IN
            # sub-queries stay on its shard, and an insert returns once every shard has
            # its rows (the agent's exactly-once check reads them right after).
            settings={
                "use_numpy": True,
                "distributed_product_mode": "local",
                "insert_distributed_sync": 1,
            },
        )
        if secure and ca_certs:
            options["ca_certs"] = ca_certs
        self._options = {**options, "ca_certs": ca_certs if secure else None}
        self._cluster: str | None = None
        self._cluster_known = False
        self._client = Client(host, database=database, **options)
        self._admin = Client(host, database="default", **options)  # before the db exists
        self._lock = threading.Lock()

    def copy(self) -> ClickHouseStore:
        """The same server and settings with new connections (see :meth:`Store.copy`)."""
        return ClickHouseStore(**self._params)

    def reopen_spec(self) -> dict:
        """What :func:`reopen` needs to open this store in another process: the
        constructor's arguments (JSON; the password included, so pass it over a pipe,
        never on a command line)."""
        return {"clickhouse": dict(self._params)}

    def ping(self) -> None:
        """Connect and run ``SELECT 1``. Raises StoreError "cannot reach ClickHouse at
        host:port (...)" within about ``connect_timeout`` if the server does not answer."""
        with self._errors():
            self._admin.execute("SELECT 1")

    def prepare(self) -> None:
        """``CREATE DATABASE`` and the ``schema_version`` table if missing."""
        with self._errors():
            self._admin.execute(create_database_sql(self.database))
            self._admin.execute(create_table_sql(schema.SCHEMA_VERSION_TABLE, self.database))

    def schema_changes(self) -> list[str]:
        """``CREATE TABLE`` for missing tables, ``ALTER TABLE ... ADD COLUMN`` for missing
        columns (see ``store/migrate.py``). On a cluster's database (Distributed tables,
        ``store/cluster.py``) nothing is changed from here: raises StoreError naming the
        ``ranksight db init --cluster`` command if a table or column is missing."""
        found = self._columns()
        cluster = self.cluster()
        if cluster is None:
            return schema_changes_sql(found, self.database)
        from ranksight.store.cluster import cluster_schema_sql

        missing = cluster_schema_sql(self.database, cluster, False, found)
        if missing:
            raise StoreError(
                f"{self.url}: database {self.database} is cluster {cluster}'s and lacks "
                f"{counted(len(missing), 'table or column', 'tables or columns')} of this ranksight's schema; run "
                f"`ranksight db init --cluster {cluster} --store URL` to add them on every node"
            )
        return []

    def admin_rows(self, sql: str, params: dict | None = None) -> list[tuple]:
        """Rows of ``sql`` run in the server's ``default`` database (usable before ours
        exists: ``system.*`` tables). Raises StoreError."""
        with self._errors():
            return self._admin.execute(sql, params)

    def columns(self) -> dict[str, dict[str, str]]:
        """Column name -> type of every table in the database (empty if it does not
        exist). Raises StoreError."""
        return self._columns()

    def cluster(self) -> str | None:
        """The cluster whose Distributed tables this database holds (``store/cluster.py``),
        or None for a single server's tables; looked up once. Raises StoreError."""
        if not self._cluster_known:
            from ranksight.store.cluster import cluster_of

            with self._errors():
                rows = self._admin.execute(
                    "SELECT name, engine_full FROM system.tables WHERE database = %(db)s",
                    {"db": self.database},
                )
            self._cluster = cluster_of(dict(rows))
            self._cluster_known = True
        return self._cluster

    def shard_column(self, table: str) -> str | None:
        """On a cluster, the column whose value picks a row's shard (``run_id`` or
        ``host``); None on a single server. Raises StoreError."""
        if self.cluster() is None:
            return None
        from ranksight.store.cluster import shard_column

        return shard_column(schema.table(table))

    def sibling(self, host: str, port: int) -> ClickHouseStore:
        """A store for the same database, user and password on another server (a
        cluster's node). Not connected until used."""
        options = {k: self._options[k] for k in ("user", "password", "secure", "ca_certs")}
        return ClickHouseStore(
            host, port, self.database, **options,
            url=f"clickhouse{'s' if options['secure'] else ''}://{host}:{port}/{self.database}",
            connect_timeout=self._options["connect_timeout"],
            query_timeout=self._options["send_receive_timeout"],
            compression=self._params["compression"],
        )  # fmt: skip

    def run_ddl(self, statements: Sequence[str], tolerate_existing: bool = False) -> None:
        """Run each statement. ``tolerate_existing``: an ``ADD COLUMN`` that finds the
        column already there (a replica got it from ZooKeeper meanwhile) is not an error.
        Raises StoreError naming the statement that failed."""
        for sql in statements:
            try:
                with self._errors():
                    self._admin.execute(sql)
            except StoreError as exc:
                if tolerate_existing and "already exists" in str(exc):
                    continue
                raise StoreError(f"{exc} (in: {' '.join(sql.split())[:200]})") from None

    def apply_schema_changes(self, statements: Sequence[str]) -> None:
        """Run each statement of :meth:`schema_changes`."""
        with self._errors():
            for sql in statements:
                self._admin.execute(sql)

    def _columns(self) -> dict[str, dict[str, str]]:
        """Column name -> type of every table in the database."""
        with self._errors():
            rows = self._admin.execute(
                "SELECT table, name, type FROM system.columns WHERE database = %(db)s",
                {"db": self.database},
            )
        found: dict[str, dict[str, str]] = {}
        for table, name, ch_type in rows:
            found.setdefault(table, {})[name] = ch_type
        return found

    def insert(self, table: str, frame: pd.DataFrame, *, batch_id: int = 0) -> int:
        """One columnar INSERT of ``frame`` into ``table`` (see :meth:`Store.insert`);
        returns the row count. With ``batch_id`` the insert's query id is
        ``ranksight-<batch_id hex>-<random>`` (see :meth:`inserts_in_flight`). Raises
        ValueError for an unknown table or bad columns, StoreError if the server fails."""
        data = conform(schema.table(table), with_batch_id(table, frame, batch_id))
        if data.num_rows == 0:
            return 0
        columns = [_values(column) for column in data.columns]
        columns = in_sort_key_order(data.column_names, columns, schema.table(table).order_by)
        sql = f"INSERT INTO {table} ({', '.join(data.column_names)}) VALUES"
        query_id = f"{_QUERY_PREFIX}{batch_id:016x}-{secrets.token_hex(4)}" if batch_id else None
        with self._errors():
            if batch_id:
                self._reset_on_close()
            self._client.execute(sql, columns, columnar=True, query_id=query_id)
        return data.num_rows

    def partitions(self, table: str, frame: pd.DataFrame) -> np.ndarray | None:
        """``toYYYYMM(time)`` of each row in the server's time zone (the DDL partitions
        by month, ``store/ddl.py``); ``None`` for unpartitioned tables."""
        spec = schema.table(table)
        if spec.time_column is None or spec.time_column not in frame.columns or frame.empty:
            return None
        with self._errors():
            tz = self._timezone()
        return month_keys(frame[spec.time_column].to_numpy(), tz)

    def inserts_in_flight(self, batch_ids: Sequence[int]) -> set[int]:
        """Ids of ``batch_ids`` whose insert the server still runs (``system.processes``):
        an insert whose client timed out may still be written after it."""
        wanted = {int(b) for b in batch_ids}
        with self._errors():
            rows = self._admin.execute("SELECT query_id FROM system.processes")
        running = set()
        for (query_id,) in rows:
            if query_id.startswith(_QUERY_PREFIX):
                with contextlib.suppress(ValueError):
                    running.add(int(query_id[len(_QUERY_PREFIX) :].split("-")[0], 16))
        return running & wanted

    insert_grace_s = 1.0
    """An insert the server received whole just before it stalled (SIGSTOP, overload)
    starts, and shows in ``system.processes``, within moments of it running again; one
    that had not fully arrived cannot start at all once its connection is reset (see
    :meth:`_reset_on_close`). A retried batch is counted only after its inserts were
    absent for this long (seconds), with the server answering."""

    def _reset_on_close(self) -> None:
        """Connect if needed, and make the connection end with a reset (``SO_LINGER`` 0),
        not a graceful close: when the client gives up on an insert, data the server has
        not received yet is dropped instead of being delivered later, so the insert can
        no longer start after the agent has checked that it is not stored."""
        connection = self._connected()
        if connection.socket is not None:
            connection.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)

    def _timezone(self) -> str:
        """The server's time zone (connects if needed)."""
        return self._connected().server_info.get_timezone()

    def _connected(self):
        """The data connection, connected and past its handshake. One whose connect
        failed (e.g. the database did not exist yet: the driver leaves it marked connected
        with no server info) is dropped and made again, so a store made before its
        database works once the database exists. Raises the driver's errors."""
        connection = self._client.connection
        if connection.connected and connection.server_info is not None:
            return connection
        connection.disconnect()
        try:
            connection.connect()
        except BaseException:
            connection.disconnect()
            raise
        if connection.server_info is None:  # never expected: say so, keep nothing
            connection.disconnect()
            raise errors.Error(f"no handshake from the server for database {self.database}")
        return connection

    def query(self, sql: str, params: dict | None = None) -> pd.DataFrame:
        """Run a SELECT; see :class:`Store`. Raises StoreError with the server's message."""
        with self._errors():
            tz = self._timezone()  # binding renders datetimes in it
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


def _values(column: pa.ChunkedArray) -> np.ndarray | pd.Categorical:
    """One column as the array clickhouse-driver sends. A String column becomes a
    ``pd.Categorical`` of its distinct values as UTF-8 ``bytes`` (the driver writes bytes
    as they are), so a value repeated on every row costs one encode, not one per row, and
    the driver's null check is one comparison of the codes rather than ``pd.isnull`` on an
    object array plus a copy of it (its numpy columns take pandas extension arrays as
    they are): about 0.1-0.2 µs less client CPU a ``collectives`` row than the object array of
    bytes it replaced, which was itself about 4x faster than ``to_numpy()`` plus the
    driver's per-row ``encode`` (``bench/ingest.py``)."""
    if not pa.types.is_string(column.type):
        return column.to_numpy()
    encoded = pc.dictionary_encode(column).combine_chunks()
    words = np.array([w.encode() for w in encoded.dictionary.to_pylist()], dtype=object)
    categories = pd.Index(words, dtype=object)
    return pd.Categorical.from_codes(encoded.indices.to_numpy(zero_copy_only=False), categories)


_SORT_MIN_ROWS = 1000
"""Inserts of fewer rows go as they are (sorting them saves the server next to nothing)."""


def in_sort_key_order(
    names: list[str], columns: list[np.ndarray | pd.Categorical], order_by: Sequence[str]
) -> list[np.ndarray | pd.Categorical]:
    """``columns`` (named ``names``, as :func:`_values` makes them) with their rows in the
    order of the table's sort key ``order_by`` (the MergeTree ``ORDER BY``): a block that
    arrives sorted is written as it is, which cost ClickHouse 18.16 about 0.3 µs of CPU a
    row less on the agent's batches (``collectives``: 0.8-0.9 -> 0.5-0.6 µs), for about
    0.1 µs of ours (a sort on integer keys: String keys by the rank of their distinct
    values, which compare bytewise as the server does; keys constant in the block are
    skipped). Only the order changes, so nothing else about an insert does; under
    ``_SORT_MIN_ROWS`` rows, or with a key column missing, the columns come back as they are."""
    rows = len(columns[0]) if columns else 0
    if rows < _SORT_MIN_ROWS or any(key not in names for key in order_by):
        return columns
    maybe = [_sort_key(columns[names.index(key)]) for key in reversed(order_by)]
    keys = [key for key in maybe if key is not None]
    if not keys:
        return columns
    order = np.lexsort(keys)
    return [column.take(order) for column in columns]


def _sort_key(column: np.ndarray | pd.Categorical) -> np.ndarray | None:
    """Integers that order the rows as ``column``'s values do (None if they are all equal)."""
    if isinstance(column, pd.Categorical):
        words = np.asarray(column.categories, dtype=object)
        if len(words) < 2:
            return None
        rank = np.empty(len(words), dtype=np.int64)
        rank[np.argsort(words, kind="stable")] = np.arange(len(words))
        return rank[column.codes]
    if column.dtype.kind in "iuf" and column.min() == column.max():
        return None
    return column


def reopen(spec: dict) -> ClickHouseStore:
    """The store :meth:`ClickHouseStore.reopen_spec` describes, with new connections.
    Raises ValueError for a spec of another kind."""
    if set(spec) != {"clickhouse"}:
        raise ValueError(f"not a ClickHouse store spec: keys {sorted(spec)}")
    return ClickHouseStore(**spec["clickhouse"])


def _first(exc: errors.ServerException) -> str:
    """The server's message without ``DB::Exception:`` and the stack trace, on one line."""
    text = " ".join(str(exc.message or exc).split())
    text = text.split(" Stack trace:")[0].split(", Stack trace")[0]
    return text.removeprefix("DB::Exception: ")
