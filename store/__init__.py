"""The store: where runs are written and read. ``open_store(url)`` picks the backend
(chdb embedded folder, or a ClickHouse server); both implement :class:`Store`."""

from ranksight.store import schema
from ranksight.store.base import Store, StoreError
from ranksight.store.url import open_store

__all__ = ["Store", "StoreError", "open_store", "schema"]
