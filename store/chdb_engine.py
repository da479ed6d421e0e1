"""One in-memory chdb connection per process, shared by every ChdbStore.

It holds no data (tables are Parquet files read with ``file()``), so it locks no folder
and other processes can read the same store. Keeping it open saves ~40 ms per query
over ``chdb.query()``, which starts and stops the engine each call.

chdb allows one engine path per process: while any code in this process has a chdb
``Session`` open on a folder, this connection cannot start (and vice versa); the error
says so. chdb 4.4 (engine 26.9) has a bug where the result of the query following one
that failed at run time comes back corrupt, so the connection is dropped after any error.
"""

from __future__ import annotations

import os
import threading

import chdb
import pyarrow as pa

_lock = threading.Lock()
_conn = None
_conn_pid: int | None = None


class EngineError(RuntimeError):
    """chdb refused or failed a query; the message is chdb's, on one line."""


def run(sql: str) -> pa.Table:
    """Run one SQL statement on the shared connection; returns its result as Arrow.
    Raises EngineError (chdb's message) on any failure. Thread-safe (one at a time)."""
    global _conn, _conn_pid
    with _lock:
        try:
            if _conn is None or _conn_pid != os.getpid():  # a fork must not share it
                _conn, _conn_pid = chdb.connect(":memory:"), os.getpid()
            return _conn.query(sql, "ArrowTable")
        except Exception as exc:  # noqa: BLE001 - chdb raises RuntimeError and pyarrow errors
            _drop()
            raise EngineError(" ".join(str(exc).split())) from None


def _drop() -> None:
    """Forget the connection (closing it if this process opened it)."""
    global _conn, _conn_pid
    if _conn is not None and _conn_pid == os.getpid():
        try:
            _conn.close()
        except Exception:  # noqa: BLE001 - a broken connection may fail to close
            pass
    _conn, _conn_pid = None, None
