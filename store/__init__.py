"""The store: where runs are written and read. ``open_store(url)`` picks the backend
(chdb embedded folder, or a ClickHouse server); both implement :class:`Store`.

The names below load on first use (PEP 562): ``from ranksight.store.url import
default_store_url`` or ``StoreError`` costs no pandas, pyarrow or driver import, so a
command that never touches a store starts without them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ranksight.store.errors import StoreError

if TYPE_CHECKING:
    from ranksight.store import schema
    from ranksight.store.base import Store
    from ranksight.store.url import open_store

__all__ = ["Store", "StoreError", "open_store", "schema"]

_LAZY = {"Store": "ranksight.store.base", "open_store": "ranksight.store.url"}


def __getattr__(name: str) -> object:
    """``Store`` and ``open_store`` from their modules, imported on first use. Raises
    AttributeError for any other name."""
    if name == "schema":
        return importlib.import_module("ranksight.store.schema")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ranksight.store' has no attribute {name!r}")
